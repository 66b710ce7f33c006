-- The ADR's hourly purge, as a pg_cron job. Applied only where the pg_cron extension is installed
-- in the store's database; elsewhere PostgresStore::purge_expired (run
-- periodically by idempotency_core::purge_periodically) does the same.
-- Purging only reclaims space: expired rows are already ignored on every read.
--
-- Placeholders: {job_name}, {schedule} (cron syntax, default '0 * * * *') and {purge_command}
-- are SQL string literals filled in by the library.
SELECT cron.schedule({job_name}, {schedule}, {purge_command});
