//! Setup statements over tokio-postgres.

use crate::error::PostgresStoreError;
use crate::session::SetupSession;
use async_trait::async_trait;
use tokio_postgres::types::{ToSql, Type};

/// A tokio-postgres client or transaction as a [`SetupSession`]. Statements are sent unnamed
/// with their parameter types, so setup works behind a transaction-mode pooler too.
pub(crate) struct TokioSession<'a, C>(pub(crate) &'a C);

#[async_trait]
impl<C: tokio_postgres::GenericClient + Sync> SetupSession for TokioSession<'_, C> {
    async fn batch(&mut self, sql: &str) -> Result<(), PostgresStoreError> {
        Ok(self.0.batch_execute(sql).await?)
    }

    async fn rows(
        &mut self,
        sql: &str,
        params: &[&str],
    ) -> Result<Vec<Vec<Option<String>>>, PostgresStoreError> {
        let typed: Vec<(&(dyn ToSql + Sync), Type)> = params
            .iter()
            .map(|p| (p as &(dyn ToSql + Sync), Type::TEXT))
            .collect();
        let rows = self.0.query_typed(sql, &typed).await?;
        rows.iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| row.try_get::<_, Option<String>>(i))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<_, _>>()
            .map_err(PostgresStoreError::from)
    }
}
