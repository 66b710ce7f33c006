//! The SQL text of every statement, and how it is sent; `names.rs`: table names and modes.

mod names;
mod one_transaction;

pub use names::TableMode;
pub(crate) use names::{TableName, fill_placeholders, sentinel_sql};
pub(crate) use one_transaction::Notifying;

/// One statement of the store: its text, and the types of its parameters (which let it be sent
/// unnamed, for connection poolers in transaction mode).
#[derive(Clone, Debug)]
pub struct Sql {
    pub(crate) text: String,
    /// Read by the tokio-postgres driver, which sends statements unnamed behind a pooler; sqlx
    /// binds typed values and needs no list.
    #[cfg_attr(not(feature = "tokio-postgres"), expect(dead_code))]
    pub(crate) types: &'static [ParamType],
}

impl Sql {
    fn new(text: String, types: &'static [ParamType]) -> Self {
        Sql { text, types }
    }
}

/// The type of a statement parameter, as the server is told it when a statement is sent unnamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParamType {
    Text,
    Bytea,
    Uuid,
    Int4,
    Int8,
    Float8,
}

/// The SQL text of each store step; parameters are documented on each field.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct StatementsSql<'a> {
    /// `$1` scope, `$2` key, `$3` fingerprint bytes, `$4` token (uuid), `$5` lease seconds
    /// (float8).
    pub claim: &'a str,
    /// `$1` scope, `$2` key, `$3` token, `$4` status (int4), `$5` response bytes, `$6` retention
    /// seconds (float8).
    pub complete: &'a str,
    /// `$1` scope, `$2` key, `$3` token, `$4` lease seconds (float8).
    pub extend: &'a str,
    /// `$1` scope, `$2` key, `$3` token.
    pub release: &'a str,
    /// `$1` scope, `$2` key.
    pub get: &'a str,
    /// `$1` batch size (int8).
    pub purge: &'a str,
}

/// The SQL of every store operation, rendered once per store.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) claim: Sql,
    pub(crate) complete: Sql,
    pub(crate) extend: Sql,
    pub(crate) release: Sql,
    pub(crate) get: Sql,
    pub(crate) purge: Sql,
    /// The table's size and row count from the catalog (the planner's estimate; before the
    /// table was first analyzed, which autovacuum does after its first few dozen writes, its rows
    /// are counted, up to [`FOOTPRINT_COUNT_CAP`], so that a scrape never reads a large table):
    /// what a scrape may ask without reading the table.
    pub(crate) footprint: Sql,
    /// Opens a request's transaction: checks the claim inside it and marks the transaction.
    pub(crate) tx_check: Sql,
    /// Completes the record inside the request's transaction, or fails (aborting it).
    pub(crate) tx_complete: Sql,
    /// After a refused completion: does the token still hold a live claim?
    pub(crate) tx_diagnose: Sql,
    /// After the handler ended the request's transaction itself: did it commit or roll back?
    pub(crate) tx_status: Sql,
    /// One-transaction mode, sent right behind `BEGIN`: takes the key's transaction lock
    /// without waiting (its id a parameter, [`Statements::lock_id`]), reads the transaction's
    /// start and id, sets the idle bound, and reads the live record.
    pub(crate) one_transaction_begin: Sql,
    /// Speculative mode, queued right behind `BEGIN`: the same lock and reads, aborting the
    /// transaction when the key is taken.
    pub(crate) speculative_lookup: Sql,
    /// Whether an open one-transaction request holds a key's advisory lock (its id `$1`),
    /// read from `pg_locks` without taking the lock: a request beginning at that moment must
    /// not find it taken by the look and answer in flight.
    pub(crate) held_by_transaction: Sql,
    /// Marks a running record as waited for (`$1` scope, `$2` key): its settle then sends the
    /// key's wake id on [`Statements::channel`] when it commits.
    pub(crate) watch: Sql,
    /// The channel on which settles of waited-for records are announced, and listened to.
    pub(crate) channel: String,
    /// The seed of the one-transaction modes' advisory lock ids (see [`Statements::lock_id`]).
    lock_seed: u64,
    /// One-transaction mode, sent with `COMMIT` right behind it: inserts the completed record;
    /// a unique violation (another request's record), or a transaction that did not start when
    /// the lookup's did (the handler ended it), aborts the transaction.
    pub(crate) one_transaction_insert: Sql,
    /// One-transaction mode, when the lookup saw an expired record of the key: the same, taking
    /// that record over.
    pub(crate) one_transaction_takeover: Sql,
    /// The two above, also sending the key's wake id at the commit (a watched key).
    pub(crate) one_transaction_notifying: Notifying,
    /// One-transaction modes: a duplicate's watch of a key held by a request's transaction.
    pub(crate) watch_transaction: Sql,
    /// One-transaction modes, on another connection while the request's transaction still
    /// holds the key: inserts an answer whose writes were discarded as the key's completed
    /// record (taking over an expired row); a row only when it did.
    pub(crate) discarded_insert: Sql,
}

const KEY: &[ParamType] = &[ParamType::Text, ParamType::Text];
const FENCED: &[ParamType] = &[ParamType::Text, ParamType::Text, ParamType::Uuid];
const CLAIM: &[ParamType] = &[
    ParamType::Text,
    ParamType::Text,
    ParamType::Bytea,
    ParamType::Uuid,
    ParamType::Float8,
];
const COMPLETE: &[ParamType] = &[
    ParamType::Text,
    ParamType::Text,
    ParamType::Uuid,
    ParamType::Int4,
    ParamType::Bytea,
    ParamType::Float8,
];
const EXTEND: &[ParamType] = &[
    ParamType::Text,
    ParamType::Text,
    ParamType::Uuid,
    ParamType::Float8,
];
/// The one-transaction modes' lookup: scope, key, the longest the transaction may sit idle
/// (ms), and the key's advisory lock id ([`Statements::lock_id`]).
const KEY_HOLD: &[ParamType] = &[
    ParamType::Text,
    ParamType::Text,
    ParamType::Int8,
    ParamType::Int8,
];
/// The lease mode's check at `BEGIN`: scope, key, token, and the longest the transaction may sit
/// idle (ms).
const FENCED_HOLD: &[ParamType] = &[
    ParamType::Text,
    ParamType::Text,
    ParamType::Uuid,
    ParamType::Int8,
];
/// An answer stored without its writes: scope, key, fingerprint, status, response, retention.
const DISCARDED_INSERT: &[ParamType] = &[
    ParamType::Text,
    ParamType::Text,
    ParamType::Bytea,
    ParamType::Int4,
    ParamType::Bytea,
    ParamType::Float8,
];
const KEYED_INSERT: &[ParamType] = &[
    ParamType::Text,
    ParamType::Text,
    ParamType::Bytea,
    ParamType::Float8,
    ParamType::Int4,
    ParamType::Bytea,
    ParamType::Float8,
];

/// The seed of the one-transaction mode's advisory lock ids for the table `name`, so two tables
/// (two stores on one database) lock apart: 64-bit FNV-1a of the qualified name.
fn lock_seed(name: &TableName) -> u64 {
    fnv1a(FNV_OFFSET, name.qualified().bytes())
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The channel of `name`'s settle notices: a plain identifier (so `LISTEN` needs no quoting)
/// under PostgreSQL's 63 bytes, one per table of a database.
fn settle_channel(name: &TableName) -> String {
    format!("idempotency_settled_{:016x}", lock_seed(name))
}

/// The key's wake id ([`idempotency_core::store::wake_id`]) computed from the statement's `$1`
/// (scope) and `$2` (key), as 16 hex digits.
const WAKE_ID: &str = "left(encode(sha256(convert_to(\
     octet_length(convert_to($1, 'UTF8'))::text || ':' || $1 || $2, 'UTF8')), 'hex'), 16)";

/// 64-bit FNV-1a of `bytes`, continuing from `hash`.
fn fnv1a(mut hash: u64, bytes: impl IntoIterator<Item = u8>) -> u64 {
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The name of the transaction-local setting that marks a request's transaction with its lease
/// token, so the completion can tell that it runs in the transaction the store opened.
pub(crate) const TX_MARK: &str = "idempotency.lease_token";

/// The transaction's start (`now()` inside a transaction) as seconds since the epoch, a
/// `float8` both drivers read (exact to the microsecond: 53 bits hold today's epoch in µs), which
/// the one-transaction mode's insert compares with the value read at `BEGIN`. `date_part`, not
/// `extract`, whose `numeric` arithmetic costs more.
const BEGAN: &str = "date_part('epoch', now())";
/// The current transaction's id (assigned if it has none yet), as an `int8`.
const XID: &str = "pg_current_xact_id()::text::int8";

/// The most rows the footprint counts on a table never analyzed (autovacuum off, or a burst
/// before its first run): a scrape reads at most this many, and a larger table reports this
/// many until it is analyzed.
pub(crate) const FOOTPRINT_COUNT_CAP: u32 = 100_000;

/// The columns a record is read from, in this order: fingerprint, whether it is in flight, the
/// time it has left in ms (its lease while in flight, its retention once completed), response
/// (NULL while in flight).
const RECORD_COLUMNS: &str = "request_hash, lease_token IS NOT NULL, \
     (extract(epoch FROM COALESCE(locked_until, expires_at) - now()) * 1000)::bigint, \
     response";

impl Statements {
    /// The id of the advisory lock the one-transaction modes take for (`scope`, `key`): 64-bit
    /// FNV-1a of the scope, a newline and the key, seeded per table. A collision (two keys, one
    /// id) only makes an unrelated request answer 409 once.
    pub(crate) fn lock_id(&self, scope: &str, key: &str) -> i64 {
        // Three runs over slices, not one chained iterator: a third of the instructions.
        let hash = fnv1a(self.lock_seed, scope.bytes());
        let hash = fnv1a(hash, [b'\n']);
        let hash = fnv1a(hash, key.bytes());
        i64::from_ne_bytes(hash.to_ne_bytes())
    }

    /// The text of the six store steps, for callers.
    pub(crate) fn sql(&self) -> StatementsSql<'_> {
        StatementsSql {
            claim: &self.claim.text,
            complete: &self.complete.text,
            extend: &self.extend.text,
            release: &self.release.text,
            get: &self.get.text,
            purge: &self.purge.text,
        }
    }

    pub(crate) fn new(name: &TableName, mode: TableMode) -> Self {
        let t = name.qualified();
        // `LoggedAsyncCommit`: the store's connections commit asynchronously (a claim that
        // stands alone), but a request's transaction holds the handler's writes and its stored
        // response, so it commits synchronously: a client is never answered for writes a crash
        // can take back. Its durable commit flushes the WAL before it, the claim's included.
        let synchronous = match mode {
            TableMode::LoggedAsyncCommit => ", set_config('synchronous_commit', 'on', true)",
            TableMode::Logged | TableMode::Unlogged => "",
        };
        let channel = settle_channel(name);
        let one_transaction = one_transaction::statements(&t, synchronous, &channel, WAKE_ID);
        // Sends the key's wake id on the table's channel for a waited-for row, and nothing
        // (NULL) otherwise: `NOTIFY` takes a database-wide lock at commit, which a key nobody
        // waits for must not pay. `CASE` evaluates the call only for such a row.
        let notify = format!("CASE WHEN waited THEN pg_notify('{channel}', {WAKE_ID})::text END");
        Statements {
            channel: channel.clone(),
            lock_seed: lock_seed(name),
            // One round trip. A live row visible to this statement is returned as it is, and
            // the insert is not attempted, so replays and in-flight duplicates only read (no
            // row lock, no WAL, no commit flush on a LOGGED table). Otherwise the insert claims
            // the key, or takes over a row whose lease or retention ran out. `$5` is the lease in
            // seconds. The insert names `waited` (migration 0004), which its settle statements
            // read: on a table without it the claim fails before any work runs, rather than the
            // work running and only its completion failing (the key then held to its lease).
            claim: Sql::new(
                format!(
                    "WITH live AS ( \
                       SELECT {RECORD_COLUMNS} FROM {t} \
                       WHERE user_id = $1 AND key = $2 AND expires_at > now()), \
                     claimed AS ( \
                       INSERT INTO {t} AS r \
                         (user_id, key, request_hash, lease_token, locked_until, created_at, \
                          expires_at, waited) \
                       SELECT $1, $2, $3, $4, now() + make_interval(secs => $5), now(), \
                              now() + make_interval(secs => $5), false \
                       WHERE NOT EXISTS (SELECT 1 FROM live) \
                       ON CONFLICT (user_id, key) DO UPDATE SET \
                         request_hash = EXCLUDED.request_hash, lease_token = EXCLUDED.lease_token, \
                         locked_until = EXCLUDED.locked_until, status_code = NULL, response = NULL, \
                         created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at \
                       WHERE r.expires_at <= now() \
                       RETURNING 1) \
                     SELECT true, NULL::bytea, NULL::bool, NULL::bigint, NULL::bytea FROM claimed \
                     UNION ALL \
                     SELECT false, * FROM live"
                ),
                CLAIM,
            ),
            // A row per record completed (the count the engine reads); a waited-for record
            // also sends its key's wake id, at the commit ([`Statements::watch`]).
            complete: Sql::new(
                format!(
                    "WITH done AS ( \
                       UPDATE {t} SET lease_token = NULL, locked_until = NULL, status_code = $4, \
                         response = $5, expires_at = now() + make_interval(secs => $6) \
                       WHERE user_id = $1 AND key = $2 AND lease_token = $3 AND locked_until > now() \
                       RETURNING waited) \
                     SELECT {notify} FROM done"
                ),
                COMPLETE,
            ),
            extend: Sql::new(
                format!(
                    "UPDATE {t} SET locked_until = now() + make_interval(secs => $4), \
                       expires_at = now() + make_interval(secs => $4) \
                     WHERE user_id = $1 AND key = $2 AND lease_token = $3 AND locked_until > now()"
                ),
                EXTEND,
            ),
            // As `complete`: a waited-for key given back wakes its duplicates (one of them runs).
            release: Sql::new(
                format!(
                    "WITH gone AS ( \
                       DELETE FROM {t} \
                       WHERE user_id = $1 AND key = $2 AND lease_token = $3 AND locked_until > now() \
                       RETURNING waited) \
                     SELECT {notify} FROM gone"
                ),
                FENCED,
            ),
            // A duplicate that waits marks the running record, so that its settle notifies
            // (the mark is kept by a takeover: the new claim's settle is what they wait for).
            watch: Sql::new(
                format!(
                    "UPDATE {t} SET waited = true \
                     WHERE user_id = $1 AND key = $2 AND lease_token IS NOT NULL \
                       AND locked_until > now() AND NOT waited"
                ),
                KEY,
            ),
            get: Sql::new(
                format!(
                    "SELECT {RECORD_COLUMNS} FROM {t} \
                     WHERE user_id = $1 AND key = $2 AND expires_at > now()"
                ),
                KEY,
            ),
            // A batch of expired rows by their ctid (a bounded delete without a key order). The
            // outer `expires_at` re-check is what keeps a live row: a row picked while expired
            // and taken over by a claim before the delete reaches it is re-read at its latest
            // version, which is live, so it is not deleted (the conformance case
            // `purge_racing_takeovers_never_deletes_a_live_claim`).
            purge: Sql::new(
                format!(
                    "DELETE FROM {t} WHERE ctid = ANY(ARRAY( \
                       SELECT ctid FROM {t} WHERE expires_at <= now() LIMIT $1)) \
                     AND expires_at <= now()"
                ),
                &[ParamType::Int8],
            ),
            footprint: Sql::new(
                format!(
                    "SELECT CASE WHEN reltuples >= 0 THEN reltuples::int8 \
                                 ELSE (SELECT count(*) FROM (SELECT FROM {t} LIMIT {FOOTPRINT_COUNT_CAP}) AS s) END, \
                            pg_total_relation_size(oid) \
                     FROM pg_class WHERE oid = '{t}'::regclass"
                ),
                &[],
            ),
            // Sent right behind `BEGIN`. A row only while `$3` holds a live claim; it marks the
            // transaction with the token (transaction-local, so it ends with the transaction)
            // and returns its id (assigned now rather than at its first write, which the
            // completion makes anyway), so a transaction the handler ends itself can be asked
            // later whether it committed. Inside a transaction `now()` is the transaction's
            // start, so leases are compared with `statement_timestamp()`.
            // `$4` bounds the transaction's idle time as in the one-transaction modes: a frozen
            // instance's claim lapses after one lease and its retry runs elsewhere, and the
            // retry's handler must not wait for ever on the rows the frozen transaction locked.
            tx_check: Sql::new(
                format!(
                    "SELECT set_config('{TX_MARK}', $3::uuid::text, true), {XID}{synchronous}, \
                       set_config('idle_in_transaction_session_timeout', $4::int8::text, true) \
                     FROM {t} \
                     WHERE user_id = $1 AND key = $2 AND lease_token = $3::uuid \
                       AND locked_until > statement_timestamp()"
                ),
                FENCED_HOLD,
            ),
            // Sent with `COMMIT` right behind it (one round trip). The update locks the row and
            // re-checks token, lease and mark on its latest version; when it matches nothing
            // (the lease was taken over, or the handler ended the store's transaction), the
            // division by zero aborts the transaction, so the `COMMIT` rolls it back and none of
            // the handler's writes survive.
            tx_complete: Sql::new(
                format!(
                    "WITH done AS ( \
                       UPDATE {t} SET lease_token = NULL, locked_until = NULL, status_code = $4, \
                         response = $5, expires_at = statement_timestamp() + make_interval(secs => $6) \
                       WHERE user_id = $1 AND key = $2 AND lease_token = $3::uuid \
                         AND locked_until > statement_timestamp() \
                         AND current_setting('{TX_MARK}', true) = $3::uuid::text \
                       RETURNING waited) \
                     SELECT 1 / count(*)::int, max({notify}) FROM done"
                ),
                COMPLETE,
            ),
            tx_diagnose: Sql::new(
                format!(
                    "SELECT lease_token = $3 AND locked_until > now() FROM {t} \
                     WHERE user_id = $1 AND key = $2"
                ),
                FENCED,
            ),
            // Whether transaction `$1` (read at `BEGIN`) committed, rolled back, or neither
            // (still running, or too old for the server to say).
            tx_status: Sql::new(
                "SELECT s = 'committed', s = 'aborted' \
                 FROM pg_xact_status($1::int8::text::xid8) AS s"
                    .to_owned(),
                &[ParamType::Int8],
            ),
            // A 64-bit advisory lock id is listed as its high half in `classid`, its low half
            // in `objid`, and `objsubid` 1; only this database's locks, and only granted ones.
            held_by_transaction: Sql::new(
                "SELECT EXISTS (SELECT 1 FROM pg_locks \
                   WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
                     AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                     AND classid = (($1::int8 >> 32) & 4294967295)::oid \
                     AND objid = ($1::int8 & 4294967295)::oid)"
                    .to_owned(),
                &[ParamType::Int8],
            ),
            one_transaction_begin: one_transaction.begin,
            speculative_lookup: one_transaction.speculative_lookup,
            one_transaction_insert: one_transaction.insert,
            one_transaction_takeover: one_transaction.takeover,
            one_transaction_notifying: one_transaction.notifying,
            watch_transaction: one_transaction.watch,
            discarded_insert: one_transaction.discarded_insert,
        }
    }
}

#[cfg(test)]
mod tests;
