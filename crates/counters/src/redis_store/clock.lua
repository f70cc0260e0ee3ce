-- The store's clock, and when its data began: KEYS[1] holds the store's clock (unix ms) when the
-- first sync found it missing, after a start without persistence, a restart or a flush.
-- Returns { seconds, microseconds, began (unix ms) }.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[1], tostring(now), 'NX')
return { t[1], t[2], redis.call('GET', KEYS[1]) }
