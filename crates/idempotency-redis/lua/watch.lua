-- Mark a running record as waited for: its completion or release then publishes the key's wake
-- id on the store's channel, so a duplicate waiting on another instance is woken at once.
-- KEYS[1] the record   ARGV[1] the key's wake id (16 hex digits)
-- Returns 1 when marked, 0 when no claim holds the record (completed, or gone).
if redis.call('HEXISTS', KEYS[1], 'tok') == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'w', ARGV[1])
return 1
