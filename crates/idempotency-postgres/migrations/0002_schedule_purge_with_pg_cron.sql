-- The ADR's hourly purge of "public"."idempotency_keys", as a pg_cron job, where the pg_cron extension is
-- installed in this database; elsewhere this does nothing (and is not recorded), and
-- PostgresStore::purge_expired, run periodically, does the same work.
-- Purging only reclaims space: expired rows are already ignored on every read.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        PERFORM cron.schedule('idempotency-purge:public.idempotency_keys', '0 * * * *', 'DELETE FROM "public"."idempotency_keys" WHERE expires_at <= now()');
        INSERT INTO "public"."idempotency_keys_migrations" (version, name) VALUES (2, '0002_schedule_purge_with_pg_cron')
        ON CONFLICT (version) DO NOTHING;
    END IF;
END
$$;
