//! The few statements the store's setup runs (migrations, the writer check, the state
//! sentinel), over either driver. Setup is not on the hot path: its statements take and return
//! text, so one small trait covers both drivers (`tokio_driver/session.rs`, `sqlx_driver/session.rs`),
//! and the policy that uses them is written once.

use crate::error::PostgresStoreError;
use crate::schema::TableMode;
use async_trait::async_trait;

/// A connection (or a transaction on one) that runs setup statements.
#[async_trait]
pub(crate) trait SetupSession: Send {
    /// Runs `sql`, which may hold several statements and no parameters.
    async fn batch(&mut self, sql: &str) -> Result<(), PostgresStoreError>;

    /// Runs one statement with text parameters and returns its rows, every column as text
    /// (`NULL` as `None`): the statement casts what it selects to `text`.
    async fn rows(
        &mut self,
        sql: &str,
        params: &[&str],
    ) -> Result<Vec<Vec<Option<String>>>, PostgresStoreError>;

    /// The first column of the first row, if any.
    async fn first(
        &mut self,
        sql: &str,
        params: &[&str],
    ) -> Result<Option<String>, PostgresStoreError> {
        let rows = self.rows(sql, params).await?;
        Ok(rows
            .into_iter()
            .next()
            .and_then(|row| row.into_iter().next().flatten()))
    }

    /// The first column of the first row read as a boolean (`true` / `false`).
    async fn flag(&mut self, sql: &str, params: &[&str]) -> Result<bool, PostgresStoreError> {
        Ok(self.first(sql, params).await?.as_deref() == Some("true"))
    }
}

/// Refuses a standby or read-only server and, for [`TableMode::LoggedAsyncCommit`], a session
/// whose commits are synchronous. Both drivers run it when a store is built.
pub(crate) async fn check_writer(
    session: &mut dyn SetupSession,
    mode: TableMode,
) -> Result<(), PostgresStoreError> {
    let rows = session
        .rows(
            "SELECT pg_is_in_recovery()::text, current_setting('transaction_read_only'), \
                    current_setting('synchronous_commit')",
            &[],
        )
        .await?;
    let row = rows.into_iter().next().unwrap_or_default();
    let text = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    if text(0) == "true" || text(1) == "on" {
        return Err(PostgresStoreError::ReadOnlyServer);
    }
    let synchronous_commit = text(2);
    if mode == TableMode::LoggedAsyncCommit && synchronous_commit != "off" {
        return Err(PostgresStoreError::SynchronousCommitOn {
            found: synchronous_commit,
        });
    }
    Ok(())
}
