//! The speculative begin: `BEGIN` and the key's lookup sent on a connection and handed out before
//! their answer, so the handler's first statement follows them in the same round trip; a task
//! of its own reads their answers.

use super::driver::{TokioPostgres, lost_a_prepared_statement, sql_params};
use super::driver_error::driver_error;
use super::transaction::TokioTx;
use crate::driver::{DriverError, OwnedParam, Param, PendingRows};
use crate::schema::Sql;
use idempotency_core::store::LookupAnswered;
use std::future::Future as _;
use std::sync::Arc;
use tokio_postgres::Row;

impl TokioPostgres {
    /// `DriverOps::begin_queued`: `BEGIN` and `sql` are sent on a pooled connection before
    /// this returns, and their answers read by a task of their own.
    pub(super) async fn begin_queued_on_a_connection(
        &self,
        sql: &Sql,
        params: &[Param<'_>],
        answered: LookupAnswered,
    ) -> Result<(TokioTx, PendingRows<Row>), DriverError> {
        let client = self.client().await?;
        let (ready, prepared) = self.ready_before_begin(&client, sql).await?;
        let ready = ready.into_owned();
        let tx = TokioTx::new(client);
        let Some(shared) = tx.0.clone() else {
            unreachable!("a new transaction holds its connection")
        };
        let params = OwnedParam::all(params);
        let statements_prepared = Arc::clone(&self.prepared);
        let reader = async move {
            let params: Vec<Param<'_>> = params.iter().map(OwnedParam::as_param).collect();
            let refs = sql_params(&params);
            let (begun, rows) = tokio::join!(
                shared.batch_execute("BEGIN"),
                ready.query(&shared, &refs[..params.len()])
            );
            begun.map_err(driver_error)?;
            // As in `begin_with`: the next request's statements go out unnamed.
            rows.inspect_err(|error| {
                lost_a_prepared_statement(&statements_prepared, prepared, error);
            })
            .map_err(driver_error)
        };
        let (answer, pending) = tokio::sync::oneshot::channel();
        let mut reader = Box::pin(async move {
            let _ = answer.send(reader.await);
            answered.answered();
        });
        // Polled once here, `BEGIN` and the statement are sent (each future sends its request
        // when first polled, in `join!`'s order) before the caller can send anything on the
        // transaction; the task then reads their answers.
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        if reader.as_mut().poll(&mut context).is_pending() {
            tokio::spawn(reader);
        }
        Ok((tx, pending))
    }
}
