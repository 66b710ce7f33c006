//! The sqlx driver: the store's statements on an application's pool (the same SQL text as the
//! tokio-postgres driver's), and the request's transaction as a `sqlx::Transaction`.

use super::session::SqlxSession;
use crate::driver::{
    ColumnRead, Driver, DriverError, DriverOps, OwnedParam, Param, Undo, UndoOnDrop,
};
use crate::error::{BACKEND, setup_error, sqlx_error};
use crate::schema::Sql;
use crate::sentinel::Sentinel;
use async_trait::async_trait;
use idempotency_core::StoreError;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{PgPool, Postgres, Row};

/// The sqlx driver (feature `sqlx`): `SqlxPostgresStore` is `PostgresStore<Sqlx>`, on an
/// application's [`sqlx::PgPool`].
pub struct Sqlx {
    pub(crate) pool: PgPool,
}

impl std::fmt::Debug for Sqlx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqlx").finish_non_exhaustive()
    }
}

/// `sql` with `params` bound, as a sqlx query: prepared once per connection and cached there
/// (sqlx's default), so after the first use, one round trip.
fn bound<'q>(sql: &'q Sql, params: &[Param<'q>]) -> sqlx::query::Query<'q, Postgres, PgArguments> {
    params
        .iter()
        .fold(sqlx::query(&sql.text), |query, param| match *param {
            Param::Text(v) => query.bind(v),
            Param::Bytes(v) => query.bind(v),
            Param::Uuid(v) => query.bind(v),
            Param::Int4(v) => query.bind(v),
            Param::Int8(v) => query.bind(v),
            Param::Float8(v) => query.bind(v),
        })
}

fn driver_error(e: sqlx::Error) -> DriverError {
    let sqlstate = match &e {
        sqlx::Error::Database(db) => db.code().map(|code| code.into_owned()),
        _ => None,
    };
    DriverError {
        sqlstate,
        error: sqlx_error(e),
    }
}

impl<'r, T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>> ColumnRead<'r, T> for PgRow {
    fn read(&'r self, i: usize) -> Result<T, ()> {
        self.try_get(i).map_err(drop)
    }
}

/// Sends an [`Undo`] on `connection`; sqlx first reads what the statement before it answers.
/// A connection that fails it is closed rather than pooled.
fn send_undo(
    mut connection: PoolConnection<Postgres>,
    sql: Sql,
    params: Vec<OwnedParam>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let borrowed: Vec<Param<'_>> = params.iter().map(OwnedParam::as_param).collect();
        if let Err(error) = bound(&sql, &borrowed).execute(&mut *connection).await {
            tracing::warn!(
                backend = BACKEND,
                error = %error,
                "could not release an unanswered claim; it frees when its lease runs out"
            );
            connection.close_on_drop();
        }
    })
}

impl Driver for Sqlx {}

#[async_trait]
impl DriverOps for Sqlx {
    /// The application's pool.
    type Options = PgPool;
    type Row = PgRow;
    /// Dropped before it ends, a sqlx transaction is rolled back before its connection is used
    /// again.
    type Tx = sqlx::Transaction<'static, Postgres>;

    async fn query(&self, sql: &Sql, params: &[Param<'_>]) -> Result<Vec<PgRow>, DriverError> {
        bound(sql, params)
            .fetch_all(&self.pool)
            .await
            .map_err(driver_error)
    }

    async fn query_or_undo(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
        undo: Undo<'_>,
    ) -> Result<Vec<PgRow>, DriverError> {
        let connection = self.pool.acquire().await.map_err(driver_error)?;
        let mut pending = UndoOnDrop::new(connection, undo, send_undo);
        let result = bound(sql, params)
            .fetch_all(&mut **pending.connection())
            .await
            .map_err(driver_error);
        pending.answered();
        result
    }

    async fn query_without_waiting(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> Option<Result<Vec<PgRow>, DriverError>> {
        // An idle connection only: sqlx opens new ones for waiting callers.
        let mut connection = self.pool.try_acquire()?;
        Some(
            bound(sql, params)
                .fetch_all(&mut *connection)
                .await
                .map_err(driver_error),
        )
    }

    async fn execute(&self, sql: &Sql, params: &[Param<'_>]) -> Result<u64, DriverError> {
        let done = bound(sql, params)
            .execute(&self.pool)
            .await
            .map_err(driver_error)?;
        Ok(done.rows_affected())
    }

    /// Two round trips: sqlx sends `BEGIN` on its own.
    async fn begin_with(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> Result<(Self::Tx, Vec<PgRow>), DriverError> {
        let mut tx = self.pool.begin().await.map_err(driver_error)?;
        let rows = bound(sql, params)
            .fetch_all(&mut *tx)
            .await
            .map_err(driver_error)?;
        Ok((tx, rows))
    }

    /// Two round trips: sqlx sends `COMMIT` on its own. The `COMMIT` runs in a task of its own,
    /// so a caller that stops waiting (the engine's timeout) never drops sqlx's commit future
    /// halfway, which could leave its connection out of the pool; the commit then ends on the
    /// server's time and the connection goes back.
    async fn commit_with(
        &self,
        mut tx: Self::Tx,
        sql: &Sql,
        params: &[Param<'_>],
    ) -> (Result<u64, DriverError>, Result<(), DriverError>) {
        match bound(sql, params).execute(&mut *tx).await {
            Ok(done) => {
                let committed = match tokio::spawn(tx.commit()).await {
                    Ok(committed) => committed.map_err(driver_error),
                    Err(join) => Err(DriverError {
                        sqlstate: None,
                        error: StoreError::from_failure(BACKEND, true, join),
                    }),
                };
                (Ok(done.rows_affected()), committed)
            }
            Err(error) => {
                if let Err(rollback) = tx.rollback().await {
                    // The connection is gone, and its transaction with it.
                    tracing::debug!(error = %rollback, "could not roll back a refused statement");
                }
                (Err(driver_error(error)), Ok(()))
            }
        }
    }

    async fn rollback(&self, tx: Self::Tx) -> Result<(), DriverError> {
        tx.rollback().await.map_err(driver_error)
    }

    fn pool_status(&self) -> idempotency_core::store::PoolStatus {
        idempotency_core::store::PoolStatus::new(
            self.pool.options().get_max_connections() as usize,
            self.pool.size() as usize,
            self.pool.num_idle(),
            // sqlx does not tell how many wait.
            None,
        )
    }

    async fn listen(
        &self,
        channel: &str,
        notices: tokio::sync::mpsc::UnboundedSender<String>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<bool, DriverError> {
        // A connection of its own, made with the pool's options.
        let mut listener = sqlx::postgres::PgListener::connect_with(&self.pool)
            .await
            .map_err(driver_error)?;
        listener.listen(channel).await.map_err(driver_error)?;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    notice = listener.try_recv() => match notice {
                        Ok(Some(notice)) => {
                            if notices.send(notice.payload().to_owned()).is_err() {
                                break;
                            }
                        }
                        // The connection was lost: notices sent meanwhile are not heard, so the
                        // session ends here (the store opens another at the next wait) rather
                        // than letting sqlx reconnect as if nothing was missed.
                        Ok(None) => break,
                        Err(error) => {
                            tracing::debug!(error = %error, "the store's listening session ended");
                            break;
                        }
                    },
                }
            }
        });
        Ok(true)
    }

    async fn check_state(&self, watch: &Sentinel) -> Result<bool, StoreError> {
        let mut connection = self.pool.acquire().await.map_err(sqlx_error)?;
        watch
            .check_within(
                &mut SqlxSession(&mut connection),
                (self.pool.options().get_acquire_timeout() / 2)
                    .max(std::time::Duration::from_millis(1)),
            )
            .await
            .map_err(setup_error)
    }
}
