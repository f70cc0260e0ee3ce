-- The store's clock, and when its data began: KEYS[1] holds the store's clock (unix microseconds:
-- no two lives of the data share it) when the first sync found it missing, after a start without
-- persistence, a restart or a flush.
-- Returns { seconds, microseconds, began (unix microseconds) }.
local t = redis.call('TIME')
redis.call('SET', KEYS[1], t[1] .. string.format('%06d', tonumber(t[2])), 'NX')
return { t[1], t[2], redis.call('GET', KEYS[1]) }
