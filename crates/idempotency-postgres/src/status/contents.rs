//! What the key table holds: its size, its records, the expired ones and the claims in flight.

use crate::error::PostgresStoreError;
use crate::session::SetupSession;
use crate::table::Table;

/// What the key table holds, counted in one pass over it (so `check` reads the whole table:
/// seconds on tens of millions of rows). The state sentinel is not counted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableContents {
    /// `pg_total_relation_size`: the table, its index and its TOAST, in bytes.
    pub size_bytes: u64,
    /// Rows, live and expired.
    pub records: u64,
    /// Rows past their expiry, waiting for the purge (absent on read already).
    pub expired: u64,
    /// Lease-mode claims still in flight (the one-transaction modes hold their keys in an open
    /// transaction and write no row until they commit, so they are not seen here).
    pub in_flight: u64,
    /// How long the oldest of those has been in flight (its heartbeat keeps a live request's
    /// lease running; a claim far older than the requests take is worth a look).
    pub oldest_in_flight: Option<std::time::Duration>,
}

/// Counts what `table` holds, in one pass; every column comes back as text.
pub(super) async fn read_contents(
    session: &mut dyn SetupSession,
    table: &Table,
) -> Result<TableContents, PostgresStoreError> {
    let t = table.name.qualified();
    let in_flight = "lease_token IS NOT NULL AND expires_at > now()";
    let sql = format!(
        "SELECT pg_total_relation_size('{t}')::text, count(*)::text, \
                count(*) FILTER (WHERE expires_at <= now())::text, \
                count(*) FILTER (WHERE {in_flight})::text, \
                ((extract(epoch FROM now() - min(created_at) FILTER (WHERE {in_flight})) \
                  * 1000)::bigint)::text \
         FROM {t} WHERE key <> 'sentinel' OR user_id <> E'\\x01idempotency-state'"
    );
    let row = session
        .rows(&sql, &[])
        .await?
        .into_iter()
        .next()
        .unwrap_or_default();
    let number = |i: usize| -> Result<Option<u64>, PostgresStoreError> {
        match row.get(i).cloned().flatten() {
            None => Ok(None),
            Some(text) => text
                .parse::<i64>()
                .map(|n| Some(n.max(0) as u64))
                .map_err(|_| {
                    PostgresStoreError::UnexpectedAnswer(format!(
                        "the count of {t} answered {text:?}, not a number"
                    ))
                }),
        }
    };
    Ok(TableContents {
        size_bytes: number(0)?.unwrap_or_default(),
        records: number(1)?.unwrap_or_default(),
        expired: number(2)?.unwrap_or_default(),
        in_flight: number(3)?.unwrap_or_default(),
        oldest_in_flight: number(4)?.map(std::time::Duration::from_millis),
    })
}
