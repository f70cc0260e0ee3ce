-- A request's check and reservation at armed caps' lines, one atomic step over every window it
-- asks about: refused (nothing written) when a window's total plus every live reservation has
-- reached the limit even with every writer's spare room left out; 'contended' when only that
-- spare makes it so (the asking node's own included: the node gave it up in memory when it asked,
-- and it stays counted here until that node's next push hands it back); otherwise the request's
-- estimate is reserved in each window under its own member, until the deadline or until the
-- asking node's sync removes it (its reservation then holds the estimate). money.lua is prepended.
--
-- KEYS[3i-2], KEYS[3i-1], KEYS[3i]: window i's total hash, reservations hash, deadlines zset
-- ARGV[1] the request's member   ARGV[2] its estimate   ARGV[3] the reservation's time to live
-- (ms, from the store's clock)   ARGV[4] '1' when the estimate itself must fit below each limit
-- (a batch), '0' when the spend and reservations already there must be below it
-- then for window i, from ARGV[4 + 2(i-1) + 1]: limit, the keys' expiry (unix ms)
-- Returns { verdict, window }: 'reserved'; 'line' and the first window at its line (1-based);
-- 'contended' (at the line only if writers' spare is counted); 'unseeded' and a window
-- whose total the ledger has not vouched for (the node decides from its own view).
local member, estimate, fit = ARGV[1], ARGV[2], ARGV[4] == '1'
local now, deadline = store_clock(ARGV[3])
local windows = #KEYS / 3
local contended = false

-- Whether `used` is over the line: at or past it for a request, past it once the estimate is added
-- for a batch.
local function over(w, limit, used)
  if fit then return greater(exact_sum(w, { used, estimate }), limit) end
  return not greater(limit, used)
end

for i = 1, windows do
  local w, r, x = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local limit = ARGV[4 + 2 * (i - 1) + 1]
  if redis.call('HEXISTS', w, 'seeded') == 0 then return { 'unseeded', i } end
  drop_dead(r, x, now)
  local used = live_reservations(r, x, now, '')
  used[#used + 1] = redis.call('HGET', w, 'total') or '0'
  used = exact_sum(w, used)
  if over(w, limit, used) then
    local spares = {}
    for _, holder in ipairs(redis.call('ZRANGEBYSCORE', x, '(' .. now, '+inf')) do
      local spare = redis.call('HGET', r, 's:' .. holder)
      if spare then spares[#spares + 1] = spare end
    end
    if over(w, limit, exact_sum(w, { used, negate(exact_sum(w, spares)) })) then
      return { 'line', i }
    end
    contended = true
  end
end
if contended then return { 'contended', 0 } end

for i = 1, windows do
  local w, r, x = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local expire_at = ARGV[4 + 2 * (i - 1) + 2]
  redis.call('HSET', r, member, estimate)
  redis.call('ZADD', x, deadline, member)
  redis.call('PEXPIREAT', w, expire_at)
  redis.call('PEXPIREAT', r, expire_at)
  redis.call('PEXPIREAT', x, expire_at)
end
return { 'reserved', 0 }
