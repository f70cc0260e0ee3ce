-- Exact money in Lua: its numbers are doubles, so amounts stay decimal strings. Sums go through
-- HINCRBY on a scratch field (exact 64-bit integers); comparisons compare the strings. Prepended
-- to the scripts that need it; expects the window's total hash in the local `w`.

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

-- The exact sum of decimal strings, as a decimal string.
local function exact_sum(w, parts)
  redis.call('HSET', w, '~', '0')
  for _, n in ipairs(parts) do
    if n ~= '0' then redis.call('HINCRBY', w, '~', n) end
  end
  local sum = redis.call('HGET', w, '~')
  redis.call('HDEL', w, '~')
  return sum
end

-- Drops the reservations whose deadline has passed, with their spare.
-- The store's clock in unix ms, and `ttl_ms` after it. Every node's reservations are dated on this
-- one clock, so that nodes whose own clocks disagree still see each other's as live.
local function store_clock(ttl_ms)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return now, now + tonumber(ttl_ms)
end

local function drop_dead(r, x, now)
  local dead = redis.call('ZRANGEBYSCORE', x, '-inf', now)
  if #dead > 0 then
    redis.call('HDEL', r, unpack(dead))
    for _, member in ipairs(dead) do redis.call('HDEL', r, 's:' .. member) end
    redis.call('ZREMRANGEBYSCORE', x, '-inf', now)
  end
end

-- The live reservations of every member but `except`, as a list of decimal strings.
local function live_reservations(r, x, now, except)
  local amounts = {}
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', x, '(' .. now, '+inf')) do
    if member ~= except then
      local amount = redis.call('HGET', r, member)
      if amount then amounts[#amounts + 1] = amount end
    end
  end
  return amounts
end
