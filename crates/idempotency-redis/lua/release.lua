-- Delete the record, if the token still holds the in-flight claim.
-- KEYS[1] the record   ARGV[1] lease token
-- Returns 1 when released, 0 when the token does not hold the claim (stale).
if redis.call('HGET', KEYS[1], 'tok') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
