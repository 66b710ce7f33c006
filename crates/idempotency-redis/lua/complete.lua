-- Store the response, if the token still holds the in-flight claim.
-- KEYS[1] the record   ARGV[1] lease token   ARGV[2] response bytes   ARGV[3] retention ms
-- ARGV[4] the store's channel of settle notices
-- Returns 1 when stored, 0 when the token does not hold the claim (stale). A record a waiting
-- duplicate marked (`w`, see watch.lua) publishes its wake id; others publish nothing.
local rec = redis.call('HMGET', KEYS[1], 'tok', 'w')
if rec[1] ~= ARGV[1] then
  return 0
end
redis.call('HDEL', KEYS[1], 'tok', 'w')
redis.call('HSET', KEYS[1], 'resp', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if rec[2] then
  redis.call('PUBLISH', ARGV[4], rec[2])
end
return 1
