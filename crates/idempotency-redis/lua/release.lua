-- Delete the record, if the token still holds the in-flight claim.
-- KEYS[1] the record   ARGV[1] lease token   ARGV[2] the store's channel of settle notices
-- Returns 1 when released, 0 when the token does not hold the claim (stale). A record a waiting
-- duplicate marked publishes its wake id (one of its duplicates then runs).
local rec = redis.call('HMGET', KEYS[1], 'tok', 'w')
if rec[1] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if rec[2] then
  redis.call('PUBLISH', ARGV[2], rec[2])
end
return 1
