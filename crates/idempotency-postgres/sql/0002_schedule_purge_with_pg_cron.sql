-- The ADR's hourly purge of {table}, as a pg_cron job, where the pg_cron extension is
-- installed in this database; elsewhere this does nothing (and is not recorded), and
-- PostgresStore::purge_expired, run periodically, does the same work.
-- Purging only reclaims space: expired rows are already ignored on every read.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        PERFORM cron.schedule({job_name}, {schedule}, {purge_command});
        INSERT INTO {migrations} (version, name) VALUES (2, '0002_schedule_purge_with_pg_cron')
        ON CONFLICT (version) DO NOTHING;
    END IF;
END
$$;
