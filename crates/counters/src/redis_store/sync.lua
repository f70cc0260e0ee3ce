-- One window's sync, atomic: the seed (if the window has none), one writer's increments
-- (idempotent by sequence), the records of its requests reserved at the line that its
-- reservation now holds (removed), its reservation (with a deadline) and the spare room it asked
-- for (granted only below the ceiling), then the total and the other writers' live reservations.
-- Money is never computed with Lua's numbers (doubles): see money.lua, prepended to this script.
--
-- KEYS[1] hash: total, seeded, q:<writer> (last sequence), c:<writer> (last cumulative)
-- KEYS[2] hash: <writer> -> reserved amount
-- KEYS[3] zset: <writer> scored by its reservation's deadline (unix ms)
-- ARGV[1] writer   ARGV[2] sequence   ARGV[3] cumulative   ARGV[4] acked (base without a record)
-- ARGV[5] seed ('' for none)   ARGV[6] keys expire at (unix ms; '' reads only)
-- ARGV[7] the reservation's time to live (ms, from the store's clock)   ARGV[8] reserved
-- ARGV[9] spare (the part of reserved held for the writer's next requests)   ARGV[10] more spare
-- asked for   ARGV[11] ceiling ('' for a cap that does not refuse)   ARGV[12] the writer's records'
-- prefix   ARGV[13..] the records to remove
-- Returns { total, seeded ('1' or '0'), spare granted, other members' reservations... }
-- KEYS[2] also holds s:<writer>, the spare part of each writer's reservation.
local w, r, x = KEYS[1], KEYS[2], KEYS[3]
local writer, seq, cumulative, acked = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local seed, expire_at, reserved = ARGV[5], ARGV[6], ARGV[8]
local now, reserved_until = store_clock(ARGV[7])
local spare, grow, ceiling, records = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local granted = '0'

if expire_at ~= '' then
  if seed ~= '' and redis.call('HEXISTS', w, 'seeded') == 0 then
    -- Increments pushed before the seed are spend too, and the ledger may not have their receipts
    -- yet: both are lower bounds of the truth, so the larger one stands.
    if greater(seed, redis.call('HGET', w, 'total') or '0') then
      redis.call('HSET', w, 'total', seed)
    end
    redis.call('HSET', w, 'seeded', '1')
  end
  local applied = redis.call('HMGET', w, 'q:' .. writer, 'c:' .. writer)
  if not applied[1] or tonumber(applied[1]) < seq then
    local base = applied[2] or acked
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
end

local out = { redis.call('HGET', w, 'total') or '0', redis.call('HEXISTS', w, 'seeded') == 1 and '1' or '0', granted }
for _, amount in ipairs(live_reservations(r, x, now, writer)) do out[#out + 1] = amount end
return out
