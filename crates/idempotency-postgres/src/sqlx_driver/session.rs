//! Setup statements over sqlx.

use crate::error::PostgresStoreError;
use crate::session::SetupSession;
use async_trait::async_trait;
use sqlx::{Executor, PgConnection, Row};

/// A sqlx connection (or transaction) as a [`SetupSession`]. Statements are not cached on the
/// connection (`persistent(false)`): setup runs rarely, and leaves nothing behind a pooler.
pub(crate) struct SqlxSession<'a>(pub(crate) &'a mut PgConnection);

#[async_trait]
impl SetupSession for SqlxSession<'_> {
    async fn batch(&mut self, sql: &str) -> Result<(), PostgresStoreError> {
        self.0.execute(sqlx::raw_sql(sql)).await?;
        Ok(())
    }

    async fn rows(
        &mut self,
        sql: &str,
        params: &[&str],
    ) -> Result<Vec<Vec<Option<String>>>, PostgresStoreError> {
        let mut query = sqlx::query(sql).persistent(false);
        for param in params {
            query = query.bind(*param);
        }
        let rows = self.0.fetch_all(query).await?;
        rows.iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| row.try_get::<Option<String>, _>(i))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<_, _>>()
            .map_err(PostgresStoreError::from)
    }
}
