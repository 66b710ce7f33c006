//! The statements of the one-transaction modes: the key's lookup behind `BEGIN`, the record
//! written with `COMMIT`, and a discarded request's record on its own connection.

use super::{BEGAN, DISCARDED_INSERT, KEY, KEY_HOLD, KEYED_INSERT, RECORD_COLUMNS, Sql, XID};

/// What a completed record written over an expired row of its key sets (the takeover at commit
/// and a discarded request's record): every column of the new record, no lease.
const OVERWRITE_WITH_RECORD: &str = "request_hash = EXCLUDED.request_hash, lease_token = NULL, \
     locked_until = NULL, status_code = EXCLUDED.status_code, response = EXCLUDED.response, \
     created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at";

/// The one-transaction modes' statements on table `t` (`synchronous`: what a request's
/// transaction appends to its first statement to commit synchronously, or nothing).
pub(super) struct OneTransactionSql {
    pub(super) begin: Sql,
    pub(super) speculative_lookup: Sql,
    pub(super) insert: Sql,
    pub(super) takeover: Sql,
    pub(super) notifying: Notifying,
    pub(super) discarded_insert: Sql,
    pub(super) watch: Sql,
}

/// `insert` and `takeover` of [`OneTransactionSql`] that also send the key's wake id when the
/// transaction commits: for a request whose key a duplicate on another process watches.
#[derive(Debug)]
pub(crate) struct Notifying {
    pub(crate) insert: Sql,
    pub(crate) takeover: Sql,
}

/// Builds [`OneTransactionSql`] for the qualified table name `t`; `channel` is the table's
/// settle channel and `wake_id` the key's wake id in SQL (from `$1` and `$2`).
pub(super) fn statements(
    t: &str,
    synchronous: &str,
    channel: &str,
    wake_id: &str,
) -> OneTransactionSql {
    // The key's transaction-scoped advisory lock, tried without waiting: its id (`$4`) a
    // 64-bit hash of (scope, key) seeded per table, computed by the store
    // ([`Statements::lock_id`]): hashing in the statement cost the server more than the
    // lock itself (a profile of the backend per transaction).
    let lock = "pg_try_advisory_xact_lock($4)";
    // The key's hold bounded from the server's side: the transaction-local
    // `idle_in_transaction_session_timeout` (`$3`, ms; the engine's lease) ends the session
    // of a process that stopped answering in the middle of its request (frozen, or cut off
    // the network), rolling its transaction back and freeing the key's lock. Without it such
    // a session lives until TCP gives up on it (hours) or for ever (a paused process).
    let bound = "set_config('idle_in_transaction_session_timeout', $3::int8::text, true)";
    let insert_row = format!(
        "INSERT INTO {t} (user_id, key, request_hash, status_code, response, \
           created_at, expires_at) \
         VALUES ($1, $2, $3, $5 / ({BEGAN} = $4)::int, $6, statement_timestamp(), \
           statement_timestamp() + make_interval(secs => $7))"
    );
    let takeover_rows = format!(
        "INSERT INTO {t} AS r (user_id, key, request_hash, lease_token, \
           locked_until, status_code, response, created_at, expires_at) \
         SELECT $1, $2, $3, NULL, NULL, $5, $6, statement_timestamp(), \
           statement_timestamp() + make_interval(secs => $7) \
         WHERE {BEGAN} = $4 \
         ON CONFLICT (user_id, key) DO UPDATE SET {OVERWRITE_WITH_RECORD} \
         WHERE r.expires_at <= statement_timestamp() \
         RETURNING 1"
    );
    let notify = format!("pg_notify('{channel}', {wake_id})::text");
    OneTransactionSql {
        // Sent right behind `BEGIN` (one round trip). The subquery runs once, whatever the
        // join finds: it tries the key's transaction-scoped advisory lock (never waiting:
        // a held lock means a duplicate is running) and reads the transaction's start time,
        // `now()`, which identifies the transaction for the insert at commit (a transaction
        // the handler ended and the one that follows it never start at the same
        // microsecond). The transaction is not marked with a setting: a transaction-local
        // `set_config` makes every commit walk the server's settings (`AtEOXact_GUC`, seen in
        // a profile), so the one setting written is the idle bound (`{bound}`, above), which
        // is a guarantee. The lock id
        // is a 64-bit hash of (scope, key) seeded per table; a collision only makes an
        // unrelated request answer 409 once. Columns: lock taken, the transaction's start,
        // whether the key has a row and whether it is live (NULL: no row; false: an expired
        // row, to be taken over at commit), the transaction's id when the request proceeds
        // (assigned now rather than at its first write; asked later whether it committed,
        // if the handler ends the transaction itself), the record's columns.
        begin: Sql::new(
            format!(
                "SELECT l.locked, l.began, r.expires_at > now(), \
                   CASE WHEN l.locked AND (r.expires_at > now()) IS NOT TRUE THEN {XID} END, \
                   {RECORD_COLUMNS}{synchronous} \
                 FROM (SELECT {lock}, \
                              {BEGAN}, {bound}) AS l(locked, began, bound) \
                 LEFT JOIN {t} AS r ON r.user_id = $1 AND r.key = $2",
            ),
            KEY_HOLD,
        ),
        // The speculative mode's lookup, queued right behind `BEGIN` with the handler's
        // statements behind it: the same lock and reads as `one_transaction_begin`, but when the key
        // is taken (a live row, or the lock held by a duplicate) the division by zero
        // aborts the transaction before anything queued after it runs. Otherwise one row:
        // the transaction's start, whether an expired row is to be taken over, the
        // transaction's id.
        speculative_lookup: Sql::new(
            format!(
                "SELECT l.began, r.expires_at IS NOT NULL, {XID}{synchronous} \
                 FROM (SELECT {lock}, \
                              {BEGAN}, {bound}) AS l(locked, began, bound) \
                 LEFT JOIN {t} AS r ON r.user_id = $1 AND r.key = $2 \
                 WHERE 1 / (l.locked AND (r.expires_at > now()) IS NOT TRUE)::int = 1",
            ),
            KEY_HOLD,
        ),
        // Sent with `COMMIT` right behind it (one round trip): a plain insert of one row of
        // values, the cheapest write of a row (no `SELECT`, no `RETURNING`: the command tag
        // says the row was written; each costs the server another plan node to set up per
        // execution). The check of the transaction's start (`$4`, read at `BEGIN`) is
        // folded into the status it stores, and divides by zero in another transaction (the
        // handler ended the request's transaction itself); a live record of another
        // request makes the unique index refuse the row. Either error aborts the
        // transaction, so the `COMMIT` behind it rolls back the handler's writes. A
        // duplicate's uncommitted row makes it wait for that transaction, then decide.
        insert: Sql::new(insert_row.clone(), KEYED_INSERT),
        // The same when the lookup saw an expired row of the key: takes it over (only
        // while it is still expired), or fails the same ways.
        takeover: Sql::new(
            format!("WITH done AS ({takeover_rows}) SELECT 1 / count(*)::int FROM done"),
            KEYED_INSERT,
        ),
        // The same two, sending the key's wake id as well: `NOTIFY` is sent at the commit,
        // and not at all when the transaction rolls back. Only for a watched key: `NOTIFY`
        // takes a database-wide lock at commit.
        notifying: Notifying {
            insert: Sql::new(
                format!("WITH done AS ({insert_row} RETURNING 1) SELECT {notify} FROM done"),
                KEYED_INSERT,
            ),
            takeover: Sql::new(
                format!(
                    "WITH done AS ({takeover_rows}) \
                     SELECT 1 / count(*)::int, max({notify}) FROM done"
                ),
                KEYED_INSERT,
            ),
        },
        // A duplicate's watch (`$1` scope, `$2` key), on its own connection (autocommit):
        // heard by every process listening, kept by the one whose request holds the key.
        watch: Sql::new(
            format!("SELECT pg_notify('{channel}', 'w' || {wake_id})"),
            KEY,
        ),
        // On its own connection (autocommit), while the request's transaction holds the
        // key's lock: duplicates find the key busy until this lands, and the record after.
        discarded_insert: Sql::new(
            format!(
                "INSERT INTO {t} AS r (user_id, key, request_hash, lease_token, \
                   locked_until, status_code, response, created_at, expires_at) \
                 VALUES ($1, $2, $3, NULL, NULL, $4, $5, now(), \
                   now() + make_interval(secs => $6)) \
                 ON CONFLICT (user_id, key) DO UPDATE SET {OVERWRITE_WITH_RECORD} \
                 WHERE r.expires_at <= now() \
                 RETURNING 1"
            ),
            DISCARDED_INSERT,
        ),
    }
}
