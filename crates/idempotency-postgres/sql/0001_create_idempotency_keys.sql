-- ADR 009's idempotency_keys table, with the project's amendments (docs/postgres.md explains each
-- deviation from the ADR's schema): {table}, {mode}.
-- Apply in order with `psql -v ON_ERROR_STOP=1 -1 -f <file>`; every statement is idempotent.
-- For other names or an UNLOGGED table, `idempotency print-sql` (or
-- PostgresStoreBuilder::migration_sql) renders these files for them.
CREATE {persistence}TABLE IF NOT EXISTS {table} (
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

CREATE INDEX IF NOT EXISTS {expires_idx} ON {table} (expires_at);

-- The state sentinel: a row that never expires, under a scope no caller can have (it starts
-- with a control character). Its absence tells the store that the table was emptied (crash
-- recovery of an UNLOGGED table, a failover, a TRUNCATE).
INSERT INTO {table} (user_id, key, request_hash, status_code, response, expires_at)
VALUES (E'\x01idempotency-state', 'sentinel', '\x00'::bytea, 0, '\x'::bytea, 'infinity')
ON CONFLICT (user_id, key) DO NOTHING;

CREATE TABLE IF NOT EXISTS {migrations} (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {migrations} (version, name) VALUES (1, '0001_create_idempotency_keys')
ON CONFLICT (version) DO NOTHING;
