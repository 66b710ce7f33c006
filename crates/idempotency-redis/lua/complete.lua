-- Store the response, if the token still holds the in-flight claim.
-- KEYS[1] the record   ARGV[1] lease token   ARGV[2] response bytes   ARGV[3] retention ms
-- Returns 1 when stored, 0 when the token does not hold the claim (stale).
if redis.call('HGET', KEYS[1], 'tok') ~= ARGV[1] then
  return 0
end
redis.call('HDEL', KEYS[1], 'tok')
redis.call('HSET', KEYS[1], 'resp', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
