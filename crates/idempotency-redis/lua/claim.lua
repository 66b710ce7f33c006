-- Claim a key, atomically.
-- KEYS[1]  the record (a hash: fp = fingerprint, tok = lease token while in flight,
--          resp = stored response once completed); its TTL is the lease, then the retention.
-- ARGV[1]  fingerprint bytes   ARGV[2] lease token bytes   ARGV[3] lease in milliseconds
-- Returns  {CLAIMED}                 claimed (also when this token already holds it: a resent claim)
--          {IN_FLIGHT, fp, pttl}     in flight, with the lease left in milliseconds
--          {COMPLETED, fp, resp, pttl} completed, with the retention left in milliseconds
-- Expired records do not exist for Redis, so "no record" is "free".
-- The reply tags, named the same way in src/reply.rs:
local CLAIMED, IN_FLIGHT, COMPLETED = 1, 2, 3
local rec = redis.call('HMGET', KEYS[1], 'fp', 'tok', 'resp')
local fp, tok, resp = rec[1], rec[2], rec[3]
if fp then
  if tok then
    if tok == ARGV[2] then
      return {CLAIMED}
    end
    return {IN_FLIGHT, fp, redis.call('PTTL', KEYS[1])}
  end
  if resp then
    return {COMPLETED, fp, resp, redis.call('PTTL', KEYS[1])}
  end
  -- A hash without a state is not a record this library wrote; refuse to touch it.
  return redis.error_reply('IDEMPOTENCY_CORRUPT record has neither a token nor a response')
end
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'tok', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {CLAIMED}
