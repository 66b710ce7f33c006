-- Read a record and its remaining TTL in one consistent step. It never writes, so Redis runs it
-- at maxmemory too.
-- KEYS[1] the record
-- Returns {} when absent, {IN_FLIGHT, fp, pttl} in flight, {COMPLETED, fp, resp, pttl} completed.
-- The reply tags, named the same way in src/reply.rs:
local CLAIMED, IN_FLIGHT, COMPLETED = 1, 2, 3
local rec = redis.call('HMGET', KEYS[1], 'fp', 'tok', 'resp')
local fp, tok, resp = rec[1], rec[2], rec[3]
if not fp then
  return {}
end
if tok then
  return {IN_FLIGHT, fp, redis.call('PTTL', KEYS[1])}
end
if resp then
  return {COMPLETED, fp, resp, redis.call('PTTL', KEYS[1])}
end
return redis.error_reply('IDEMPOTENCY_CORRUPT record has neither a token nor a response')
