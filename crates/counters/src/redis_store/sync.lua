-- One window's sync, atomic: what the writer counts (and the seed taken back if it may hold some
-- of that), the seed (if the window has none and its writers are those the seed left out), one
-- writer's increments (idempotent by sequence; all of them when the store holds no record of
-- it), the records of its requests reserved at the line that its
-- reservation now holds (removed), its reservation (with a deadline) and the spare room it asked
-- for (granted only below the ceiling), then the total and the other writers' live reservations.
-- Money is never computed with Lua's numbers (doubles): see money.lua, prepended to this script.
--
-- KEYS[1] hash: total, seeded, q:<writer> (last sequence), c:<writer> (last cumulative), i (the
--   window's incarnation: the store's clock in microseconds when a write created it), and the
--   seed added to the total: sa (its amount), sn (the nodes it left out: a line '<since> <node id>'
--   each), sc (no receipt in it started at or after this)
-- KEYS[2] hash: <writer> -> reserved amount
-- KEYS[3] zset: <writer> scored by its reservation's deadline (unix ms)
-- KEYS[4] hash: <writer> -> '<since> <node id>': the writer's total holds every receipt of that node
--   in the window that started at or after since (unix ms)
-- ARGV[1] writer   ARGV[2] sequence   ARGV[3] cumulative   ARGV[4] what the writer counts, as in
-- KEYS[4] ('' for none)   ARGV[5] seed: '<total> <sc> <incarnation>', then a line '<since> <node id>'
-- per node it left out ('' for none; incarnation 0 for a window no writer has written yet)
-- ARGV[6] keys expire at (unix ms; '' reads only)
-- ARGV[7] the reservation's time to live (ms, from the store's clock)   ARGV[8] reserved
-- ARGV[9] spare (the part of reserved held for the writer's next requests)   ARGV[10] more spare
-- asked for   ARGV[11] ceiling ('' for a cap that does not refuse)   ARGV[12] the writer's records'
-- prefix   ARGV[13..] the records to remove
-- Returns { total, seeded ('1' or '0'), spare granted, incarnation, n, n writers' counts (as in KEYS[4], for a
-- window not seeded), other members' reservations... }
-- KEYS[2] also holds s:<writer>, the spare part of each writer's reservation.
local w, r, x, g = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local writer, seq, cumulative, counted = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local seed, expire_at, reserved = ARGV[5], ARGV[6], ARGV[8]
local now, reserved_until = store_clock(ARGV[7])
local spare, grow, ceiling, records = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local granted = '0'

-- Whether the writers in `g` count, per node from its earliest since, exactly the lines of `listed`
-- ('<since> <node id>' each): the nodes a seed left out.
local function counts_exactly(g, listed)
  local earliest, nodes = {}, 0
  for _, counts in ipairs(redis.call('HVALS', g)) do
    local since, node = string.match(counts, '^(%S+) (.*)$')
    if not earliest[node] then
      nodes = nodes + 1
      earliest[node] = since
    elseif tonumber(since) < tonumber(earliest[node]) then
      earliest[node] = since
    end
  end
  for line in string.gmatch(listed, '[^\n]+') do
    local since, node = string.match(line, '^(%S+) (.*)$')
    if not earliest[node] or tonumber(earliest[node]) ~= tonumber(since) then return false end
    nodes = nodes - 1
  end
  return nodes == 0
end

-- Whether the window's seed stays beside a writer counting `counts` (as in KEYS[4]): the seed left
-- out its node's receipts from its since on, or holds none that started that late.
local function seed_keeps(w, counts)
  local since, node = string.match(counts, '^(%S+) (.*)$')
  local seed = redis.call('HMGET', w, 'sn', 'sc')
  if tonumber(since) >= tonumber(seed[2]) then return true end
  for line in string.gmatch(seed[1], '[^\n]+') do
    local from, listed_node = string.match(line, '^(%S+) (.*)$')
    if listed_node == node and tonumber(from) <= tonumber(since) then return true end
  end
  return false
end

if expire_at ~= '' then
  if redis.call('EXISTS', w) == 0 then
    -- A new life of the window: a seed read for an earlier one may lack the receipts of writers
    -- that life lost.
    local t = redis.call('TIME')
    redis.call('HSET', w, 'i', t[1] .. string.format('%06d', tonumber(t[2])))
  end
  if counted ~= '' and redis.call('HGET', g, writer) ~= counted then
    redis.call('HSET', g, writer, counted)
    if redis.call('HEXISTS', w, 'sn') == 1 and not seed_keeps(w, counted) then
      -- The seed may hold receipts this writer counts too, or lack some its node delivered since:
      -- it goes, and is read again.
      redis.call('HINCRBY', w, 'total', negate(redis.call('HGET', w, 'sa')))
      redis.call('HDEL', w, 'seeded', 'sa', 'sn', 'sc')
    end
  end
  if seed ~= '' and redis.call('HEXISTS', w, 'seeded') == 0 then
    local amount, covers_before, incarnation, listed = string.match(seed, '^(%S+) (%S+) (%S+)(.*)$')
    local same_life = incarnation == redis.call('HGET', w, 'i') or (incarnation == '0' and redis.call('HLEN', g) == 0)
    if same_life and counts_exactly(g, listed) then
      -- The seed holds none of what the writers count: the two add up.
      redis.call('HINCRBY', w, 'total', amount)
      redis.call('HSET', w, 'seeded', '1', 'sa', amount, 'sn', listed, 'sc', covers_before)
    end
  end
  local applied = redis.call('HMGET', w, 'q:' .. writer, 'c:' .. writer)
  if not applied[1] or tonumber(applied[1]) < seq then
    local base = applied[2] or '0'
    if cumulative ~= base then
      redis.call('HINCRBY', w, 'total', cumulative)
      redis.call('HINCRBY', w, 'total', negate(base))
    end
    redis.call('HSET', w, 'q:' .. writer, seq, 'c:' .. writer, cumulative)
  end
  for i = 13, #ARGV do
    redis.call('HDEL', r, records .. ARGV[i])
    redis.call('ZREM', x, records .. ARGV[i])
  end
  drop_dead(r, x, now)
  if grow ~= '0' and ceiling ~= '' and redis.call('HEXISTS', w, 'seeded') == 1 then
    -- Spare room is granted only on a total the ledger vouches for, and only as far as
    -- everything the window holds, this writer's new figure included, stays at or below the
    -- ceiling: the last stretch to the line is left to requests, decided one by one.
    local held = live_reservations(r, x, now, writer)
    held[#held + 1] = redis.call('HGET', w, 'total') or '0'
    held[#held + 1] = reserved
    local room = exact_sum(w, { ceiling, negate(exact_sum(w, held)) })
    if greater(room, '0') then
      granted = greater(grow, room) and room or grow
    end
  end
  local holds = exact_sum(w, { reserved, granted })
  if holds ~= '0' then
    redis.call('HSET', r, writer, holds, 's:' .. writer, exact_sum(w, { spare, granted }))
    redis.call('ZADD', x, reserved_until, writer)
  else
    redis.call('HDEL', r, writer, 's:' .. writer)
    redis.call('ZREM', x, writer)
  end
  redis.call('PEXPIREAT', w, expire_at)
  redis.call('PEXPIREAT', r, expire_at)
  redis.call('PEXPIREAT', x, expire_at)
  redis.call('PEXPIREAT', g, expire_at)
end

local seeded = redis.call('HEXISTS', w, 'seeded') == 1
local out = { redis.call('HGET', w, 'total') or '0', seeded and '1' or '0', granted, redis.call('HGET', w, 'i') or '0' }
local writers = seeded and {} or redis.call('HVALS', g)
out[#out + 1] = tostring(#writers)
for _, writer_counts in ipairs(writers) do out[#out + 1] = writer_counts end
for _, amount in ipairs(live_reservations(r, x, now, writer)) do out[#out + 1] = amount end
return out
