-- ADR 009's idempotency_keys table, with the project's amendments (docs/postgres.md explains each
-- deviation from the ADR's schema).
--
-- Placeholders, filled in by the library (PostgresStore::migration_sql prints the result):
--   {schema}       quoted schema name            {table}  quoted table name
--   {persistence}  UNLOGGED (default, the ADR) or empty for an ordinary LOGGED table
--   {expires_idx}  quoted name of the expiry index
CREATE {persistence} TABLE IF NOT EXISTS {schema}.{table} (
    user_id      text        NOT NULL,  -- the scope: the authenticated principal
    key          text        NOT NULL,  -- the client's Idempotency-Key
    request_hash bytea       NOT NULL,  -- fingerprint: algorithm id (1 byte) + SHA-256 (32 bytes)
    lease_token  uuid,                  -- fencing token while in flight; NULL once completed
    locked_until timestamptz,           -- end of the lease while in flight; NULL once completed
    status_code  integer,               -- stored status (also inside response), for operators
    response     bytea,                 -- stored response: status, headers, body bytes
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,  -- lease end while in flight, retention end once completed
    PRIMARY KEY (user_id, key),
    CHECK ((lease_token IS NULL) = (response IS NOT NULL))
);

CREATE INDEX IF NOT EXISTS {expires_idx} ON {schema}.{table} (expires_at);
