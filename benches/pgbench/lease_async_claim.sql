\set k random(1, 2000000000)
WITH live AS (SELECT request_hash, lease_token IS NOT NULL, (extract(epoch FROM COALESCE(locked_until, expires_at) - now()) * 1000)::bigint, response FROM "public"."idempotency_keys" WHERE user_id = 'u' AND key = :k::text AND expires_at > now()), claimed AS (INSERT INTO "public"."idempotency_keys" AS r (user_id, key, request_hash, lease_token, locked_until, created_at, expires_at) SELECT 'u', :k::text, '\x010101010101010101010101010101010101010101010101010101010101010101'::bytea, md5(:k::text)::uuid, now() + make_interval(secs => 30.0::float8), now(), now() + make_interval(secs => 30.0::float8) WHERE NOT EXISTS (SELECT 1 FROM live) ON CONFLICT (user_id, key) DO UPDATE SET request_hash = EXCLUDED.request_hash, lease_token = EXCLUDED.lease_token, locked_until = EXCLUDED.locked_until, status_code = NULL, response = NULL, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at WHERE r.expires_at <= now() RETURNING 1) SELECT true, NULL::bytea, NULL::bool, NULL::bigint, NULL::bytea FROM claimed UNION ALL SELECT false, * FROM live;
\startpipeline
BEGIN;
SELECT set_config('idempotency.lease_token', md5(:k::text)::uuid::text, true), pg_current_xact_id()::text::int8, set_config('idle_in_transaction_session_timeout', 30000::int8::text, true), set_config('synchronous_commit', 'on', true) FROM "public"."idempotency_keys" WHERE user_id = 'u' AND key = :k::text AND lease_token = md5(:k::text)::uuid AND locked_until > statement_timestamp();
\endpipeline
INSERT INTO tasks (title) VALUES ('task ' || :k);
\startpipeline
WITH done AS (UPDATE "public"."idempotency_keys" SET lease_token = NULL, locked_until = NULL, status_code = 201, response = '\xabababababababababababababababababababababababababababababababababababababababab'::bytea, expires_at = statement_timestamp() + make_interval(secs => 86400.0::float8) WHERE user_id = 'u' AND key = :k::text AND lease_token = md5(:k::text)::uuid AND locked_until > statement_timestamp() AND current_setting('idempotency.lease_token', true) = md5(:k::text)::uuid::text RETURNING 1) SELECT 1 / count(*)::int FROM done;
COMMIT;
\endpipeline
