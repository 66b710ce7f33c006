-- Waking duplicates across instances: a duplicate that waits for a running request marks its
-- row (`waited`), and the request that settles a marked row sends the key's id on the table's
-- channel (`NOTIFY`) when it commits, so the duplicate's instance, listening there, answers it
-- at once instead of at its next poll. Unmarked rows (nobody waits) send nothing. Adding a
-- column with a constant default rewrites no row (PostgreSQL 11 and later).
ALTER TABLE "public"."idempotency_keys" ADD COLUMN IF NOT EXISTS waited boolean NOT NULL DEFAULT false;
INSERT INTO "public"."idempotency_keys_migrations" (version, name) VALUES (4, '0004_wake_waiting_duplicates')
ON CONFLICT (version) DO NOTHING;
