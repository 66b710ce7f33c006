\set k random(1, 2000000000)
INSERT INTO "public"."idempotency_keys" (user_id, key, request_hash, lease_token, locked_until, created_at, expires_at) VALUES ('u', :k::text, '\x01'::bytea, md5(:k::text)::uuid, now() + interval '30 s', now(), now() + interval '30 s');
BEGIN;
INSERT INTO tasks (title) VALUES ('task ' || :k);
\startpipeline
UPDATE "public"."idempotency_keys" SET lease_token = NULL, locked_until = NULL, status_code = 201, response = '\xab'::bytea, expires_at = now() + interval '1 day' WHERE user_id = 'u' AND key = :k::text;
COMMIT;
\endpipeline
