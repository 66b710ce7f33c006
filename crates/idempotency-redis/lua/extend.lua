-- Extend the lease, if the token still holds the in-flight claim (the heartbeat).
-- KEYS[1] the record   ARGV[1] lease token   ARGV[2] lease ms from now
-- Returns 1 when extended, 0 when the token does not hold the claim (stale).
if redis.call('HGET', KEYS[1], 'tok') ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
