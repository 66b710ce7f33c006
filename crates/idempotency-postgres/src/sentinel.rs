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
