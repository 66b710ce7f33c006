\set k random(1, 2000000000)
\startpipeline
BEGIN;
SELECT request_hash, lease_token IS NOT NULL, response FROM idempotency_keys WHERE user_id = 'u' AND key = :k::text;
INSERT INTO tasks (title) VALUES ('task ' || :k);
\endpipeline
\startpipeline
INSERT INTO idempotency_keys (user_id, key, request_hash, status_code, response, created_at, expires_at) VALUES ('u', :k::text, '\x010101010101010101010101010101010101010101010101010101010101010101'::bytea, 201, '\xabababababababababababababababababababababababababababababababababababababababab'::bytea, statement_timestamp(), statement_timestamp() + interval '1 day');
COMMIT;
\endpipeline
