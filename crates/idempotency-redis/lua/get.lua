-- Read a record and its remaining TTL in one consistent step.
-- KEYS[1] the record
-- Returns {} when absent, {2, fp, pttl} in flight, {3, fp, resp} completed.
local rec = redis.call('HMGET', KEYS[1], 'fp', 'tok', 'resp')
local fp, tok, resp = rec[1], rec[2], rec[3]
if not fp then
  return {}
end
if tok then
  return {2, fp, redis.call('PTTL', KEYS[1])}
end
if resp then
  return {3, fp, resp}
end
return redis.error_reply('IDEMPOTENCY_CORRUPT record has neither a token nor a response')
