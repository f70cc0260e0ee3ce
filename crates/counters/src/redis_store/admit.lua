-- A request's check and reservation at armed caps' lines, one atomic step over every window it
-- asks about: refused (nothing written) when a window's total plus every live reservation, the
-- asking node's unused spare aside, has reached the limit; otherwise the request's estimate is
-- reserved in each window under its own member, until the deadline or until the asking node's
-- sync removes it (its reservation then holds the estimate). money.lua is prepended.
--
-- KEYS[3i-2], KEYS[3i-1], KEYS[3i]: window i's total hash, reservations hash, deadlines zset
-- ARGV[1] the request's member   ARGV[2] its estimate   ARGV[3] now (unix ms)
-- ARGV[4] the reservation's deadline (unix ms)
-- then for window i, from ARGV[4 + 4(i-1) + 1]: limit, the asking node's writer, that writer's
-- unused spare, the keys' expiry (unix ms)
-- Returns { verdict, window }: 'reserved'; 'line' and the first window at its line (1-based);
-- 'contended' (at the line only if other writers' spare is counted); 'unseeded' and a window
-- whose total the ledger has not vouched for (the node decides from its own view).
local member, estimate, now, deadline = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local windows = #KEYS / 3
local contended = false

for i = 1, windows do
  local w, r, x = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local at = 4 + 4 * (i - 1)
  local limit, writer, own_spare = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  if redis.call('HEXISTS', w, 'seeded') == 0 then return { 'unseeded', i } end
  drop_dead(r, x, now)
  local used = live_reservations(r, x, now, '')
  used[#used + 1] = redis.call('HGET', w, 'total') or '0'
  used[#used + 1] = negate(own_spare)
  used = exact_sum(w, used)
  if not greater(limit, used) then
    local spares = {}
    for _, holder in ipairs(redis.call('ZRANGEBYSCORE', x, '(' .. now, '+inf')) do
      if holder ~= writer then
        local spare = redis.call('HGET', r, 's:' .. holder)
        if spare then spares[#spares + 1] = spare end
      end
    end
    if not greater(limit, exact_sum(w, { used, negate(exact_sum(w, spares)) })) then
      return { 'line', i }
    end
    contended = true
  end
end
if contended then return { 'contended', 0 } end

for i = 1, windows do
  local w, r, x = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local expire_at = ARGV[4 + 4 * (i - 1) + 4]
  redis.call('HSET', r, member, estimate)
  redis.call('ZADD', x, deadline, member)
  redis.call('PEXPIREAT', w, expire_at)
  redis.call('PEXPIREAT', r, expire_at)
  redis.call('PEXPIREAT', x, expire_at)
end
return { 'reserved', 0 }
