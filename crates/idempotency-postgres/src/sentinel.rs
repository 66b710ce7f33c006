//! Noticing that the table lost its rows.

use crate::error::{BACKEND, PostgresStoreError};
use crate::schema::{TableName, sentinel_sql};
use crate::session::SetupSession;
use idempotency_core::store::StateLoss;

/// A sentinel row that never expires is re-inserted when missing; each re-insertion is one loss
/// (crash recovery of an UNLOGGED table, a failover, a `TRUNCATE`).
#[derive(Debug)]
pub struct Sentinel {
    sentinel: String,
    table: String,
    pub(crate) losses: StateLoss,
}

impl Sentinel {
    pub(crate) fn new(name: &TableName) -> Self {
        Sentinel {
            sentinel: sentinel_sql(name),
            table: name.qualified(),
            losses: StateLoss::watching(BACKEND),
        }
    }

    /// [`Sentinel::check`] bounded from the server's side: in a transaction of its own whose
    /// `lock_timeout` and `statement_timeout` are `bound`, so that a check which cannot run (the
    /// table locked by a `VACUUM FULL` or an `ALTER`) ends on the server when its caller gives
    /// up, instead of leaving a backend waiting on the lock for as long as the lock lasts (a
    /// pool that opens a new connection for each one it dropped then holds more backends than
    /// its size, until the server refuses every client). Leaves the session outside any
    /// transaction.
    pub(crate) async fn check_within(
        &self,
        session: &mut dyn SetupSession,
        bound: std::time::Duration,
    ) -> Result<bool, PostgresStoreError> {
        let ms = bound.as_millis().clamp(1, i32::MAX as u128);
        session
            .batch(&format!(
                "BEGIN; SET LOCAL lock_timeout = {ms}; SET LOCAL statement_timeout = {ms}"
            ))
            .await?;
        let checked = self.check(session).await;
        // Rolls back instead when the check failed (the transaction is aborted).
        let ended = session.batch("COMMIT").await;
        let lost = checked?;
        ended?;
        Ok(lost)
    }

    /// Re-inserts the sentinel if missing; reports whether it was.
    pub(crate) async fn check(
        &self,
        session: &mut dyn SetupSession,
    ) -> Result<bool, PostgresStoreError> {
        let lost = !session.rows(&self.sentinel, &[]).await?.is_empty();
        if lost {
            self.losses.found(
                BACKEND,
                &self.table,
                "the table was emptied: crash recovery of an UNLOGGED table, a failover or a TRUNCATE",
            );
        }
        Ok(lost)
    }
}
