-- Autovacuum for a table whose rows are all replaced once per retention period: vacuum after
-- each hourly purge (1% of the rows dead, at least 1000) instead of waiting for 20% of them.
-- Measured by the report's "purge at scale" (2M rows over 4 compressed days, see
-- docs/benchmarks.md). `ALTER TABLE {table} RESET (...)` undoes it.
ALTER TABLE {table} SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000
);
INSERT INTO {migrations} (version, name) VALUES (3, '0003_tune_autovacuum')
ON CONFLICT (version) DO NOTHING;
