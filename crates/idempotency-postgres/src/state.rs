//! Noticing that the table lost its rows.

use crate::error::BACKEND;
use crate::schema::{TableName, sentinel_sql};
use idempotency_core::StateLoss;

/// A sentinel row that never expires is re-inserted when missing; each re-insertion is one loss
/// (crash recovery of an UNLOGGED table, a failover, a `TRUNCATE`).
pub(crate) struct StateWatch {
    sentinel: String,
    table: String,
    pub(crate) losses: StateLoss,
}

impl StateWatch {
    pub(crate) fn new(name: &TableName) -> Self {
        StateWatch {
            sentinel: sentinel_sql(name),
            table: name.qualified(),
            losses: StateLoss::default(),
        }
    }

    /// Re-inserts the sentinel if missing; reports whether it was.
    pub(crate) async fn check(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<bool, tokio_postgres::Error> {
        let lost = !client.query_typed(&self.sentinel, &[]).await?.is_empty();
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
