\set k random(1, 2000000000)
\startpipeline
BEGIN;
SELECT l.locked, l.began, r.expires_at > now(), request_hash, lease_token IS NOT NULL, (extract(epoch FROM COALESCE(locked_until, expires_at) - now()) * 1000)::bigint, response FROM (SELECT pg_try_advisory_xact_lock(:k::int8), date_part('epoch', now()), set_config('idle_in_transaction_session_timeout', 60000::int8::text, true)) AS l(locked, began, bound) LEFT JOIN "public"."idempotency_keys" AS r ON r.user_id = 'u' AND r.key = :k::text;
\endpipeline
INSERT INTO tasks (title) VALUES ('task ' || :k);
\startpipeline
INSERT INTO "public"."idempotency_keys" (user_id, key, request_hash, status_code, response, created_at, expires_at) VALUES ('u', :k::text, '\x010101010101010101010101010101010101010101010101010101010101010101'::bytea, 201 / (date_part('epoch', now()) = date_part('epoch', now()))::int, '\xabababababababababababababababababababababababababababababababababababababababab'::bytea, statement_timestamp(), statement_timestamp() + make_interval(secs => 86400.0::float8));
COMMIT;
\endpipeline
