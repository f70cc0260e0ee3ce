-- One window's sync, atomic: the seed (if the window has none), one writer's increments
-- (idempotent by sequence), its reservation (with a deadline), then the total and the other
-- writers' live reservations. Money is never computed in Lua (its numbers are doubles): sums go
-- through HINCRBY on decimal strings, and reservations are returned for the caller to add up.
--
-- KEYS[1] hash: total, seeded, q:<writer> (last sequence), c:<writer> (last cumulative)
-- KEYS[2] hash: <writer> -> reserved amount
-- KEYS[3] zset: <writer> scored by its reservation's deadline (unix ms)
-- ARGV[1] writer   ARGV[2] sequence   ARGV[3] cumulative   ARGV[4] acked (base without a record)
-- ARGV[5] seed ('' for none)   ARGV[6] keys expire at (unix ms; '' reads only)
-- ARGV[7] now (unix ms)   ARGV[8] reserved   ARGV[9] reservation deadline (unix ms)
-- Returns { total, seeded ('1' or '0'), other writers' reservations... }
local w, r, x = KEYS[1], KEYS[2], KEYS[3]
local writer, seq, cumulative, acked = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local seed, expire_at, now, reserved, reserved_until = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]

local function negate(n)
  if n == '0' then return '0' end
  if string.sub(n, 1, 1) == '-' then return string.sub(n, 2) end
  return '-' .. n
end

-- Whether the integer a is greater than b, both decimal strings without leading zeros, compared
-- as strings so that no digit is lost to a double.
local function greater(a, b)
  local a_negative, b_negative = string.sub(a, 1, 1) == '-', string.sub(b, 1, 1) == '-'
  if a_negative ~= b_negative then return b_negative end
  if a_negative then return greater(string.sub(b, 2), string.sub(a, 2)) end
  if #a ~= #b then return #a > #b end
  return a > b
end

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
  if reserved ~= '0' then
    redis.call('HSET', r, writer, reserved)
    redis.call('ZADD', x, reserved_until, writer)
  else
    redis.call('HDEL', r, writer)
    redis.call('ZREM', x, writer)
  end
  local dead = redis.call('ZRANGEBYSCORE', x, '-inf', now)
  if #dead > 0 then
    redis.call('HDEL', r, unpack(dead))
    redis.call('ZREMRANGEBYSCORE', x, '-inf', now)
  end
  redis.call('PEXPIREAT', w, expire_at)
  redis.call('PEXPIREAT', r, expire_at)
  redis.call('PEXPIREAT', x, expire_at)
end

local out = { redis.call('HGET', w, 'total') or '0', redis.call('HEXISTS', w, 'seeded') == 1 and '1' or '0' }
for _, member in ipairs(redis.call('ZRANGEBYSCORE', x, '(' .. now, '+inf')) do
  if member ~= writer then
    local amount = redis.call('HGET', r, member)
    if amount then out[#out + 1] = amount end
  end
end
return out
