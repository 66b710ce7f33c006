//! How the store sends a script: on the shared connection, or, when writes wait for replicas,
//! in one pipeline with its `WAIT` on a waiting connection of its own.

use crate::connection::Connection;
use crate::error::{BACKEND, corrupt, redis_error};
use crate::store::{RedisStore, ReplicaWait};
use crate::{CLAIM, COMPLETE, EXTEND, GET, RELEASE, WATCH};
use idempotency_core::StoreError;
use redis::aio::ConnectionLike;
use redis::{RedisError, Value};
use std::sync::atomic::Ordering;

impl RedisStore {
    /// With [`RedisStoreBuilder::wait_for_replicas`](crate::RedisStoreBuilder::wait_for_replicas):
    /// runs `invocation` (on `record`) and `WAIT` in one pipeline on one of the store's waiting
    /// connections. One pipeline, so the `WAIT` counts acknowledgements of this very write: a
    /// `WAIT` sent apart could go, after a reconnect, on a connection that sent no write and
    /// succeed at once. A connection of its own, so the `WAIT` (which blocks its connection
    /// until the replicas answer or its timeout) never holds up other calls. The script's reply,
    /// and beside it `Err(NotReplicated)` when too few replicas acknowledged (which a script
    /// that wrote nothing never waits for).
    pub(crate) async fn invoke_and_wait(
        &self,
        wait: ReplicaWait,
        invocation: &redis::ScriptInvocation<'_>,
        record: &str,
        step: &str,
    ) -> Result<(Value, Result<(), StoreError>), StoreError> {
        if self.inner.needs_check.swap(false, Ordering::Relaxed) {
            self.check_after_failure().await?;
        }
        let waiting = &self.inner.waiting;
        let next = self.inner.next_waiting.fetch_add(1, Ordering::Relaxed);
        let Some(connection) = waiting.get(next % waiting.len().max(1)) else {
            return Err(corrupt("no connection to wait for replicas on"));
        };
        let mut pipeline = redis::pipe();
        pipeline
            .invoke_script(invocation)
            .cmd("WAIT")
            .arg(wait.replicas)
            .arg(u64::try_from(wait.timeout.as_millis()).unwrap_or(u64::MAX));
        let mut sent = send_pipeline(connection, &pipeline, record).await;
        if let Err(error) = &sent
            && error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        {
            // The server lost its script cache (a restart, a failover the store did not
            // notice, `SCRIPT FLUSH`): load every script, so the next write of another script
            // does not wait twice too, then resend.
            sent = match self.load_scripts().await {
                Ok(_) => send_pipeline(connection, &pipeline, record).await,
                Err(error) => Err(error),
            };
        }
        let mut replies = sent.map_err(|e| self.connection_failed(e))?.into_iter();
        let (Some(reply), Some(Value::Int(acknowledged))) = (replies.next(), replies.next()) else {
            return Err(corrupt("unexpected reply to a write and its WAIT"));
        };
        if acknowledged >= i64::from(wait.replicas) {
            return Ok((reply, Ok(())));
        }
        Ok((
            reply,
            Err(StoreError::NotReplicated {
                backend: BACKEND,
                source: format!(
                    "the {step} reached {acknowledged} of {} replicas within {:?}",
                    wait.replicas, wait.timeout
                )
                .into(),
            }),
        ))
    }

    /// With `wait_for_replicas`: loads every script into the script cache of every node (the
    /// server, or each node of a cluster: `SCRIPT LOAD` goes to all of them), so that a write
    /// and its `WAIT`, sent as `EVALSHA` in one pipeline, is not answered `NOSCRIPT` (which
    /// comes only after the pipeline's `WAIT`, and the resent pipeline waits again: with the
    /// replicas behind, twice the timeout). Run when the store is built, when a state check
    /// finds data lost, and before the first call after a connection failure (a restart or a
    /// failover empties the cache). Without a wait, a `NOSCRIPT` costs one extra round trip
    /// and nothing is loaded ahead.
    pub(crate) async fn load_scripts(&self) -> Result<(), RedisError> {
        if self.inner.replica_wait.is_none() {
            return Ok(());
        }
        for script in [&*CLAIM, &*COMPLETE, &*EXTEND, &*RELEASE, &*GET, &*WATCH] {
            match &self.inner.connection {
                Connection::Single(c) => script.load_async(&mut c.clone()).await?,
                Connection::Cluster(c) => script.load_async(&mut c.clone()).await?,
            };
        }
        Ok(())
    }

    /// Runs a script that writes `record` (`step`: the claim, the completion): with
    /// `wait_for_replicas`, with its `WAIT` ([`RedisStore::invoke_and_wait`]); otherwise on the
    /// shared connection, replicated enough by definition. Its reply, and whether enough
    /// replicas acknowledged it.
    pub(crate) async fn write<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        record: &str,
        step: &str,
    ) -> Result<(T, Result<(), StoreError>), StoreError> {
        let Some(wait) = self.inner.replica_wait else {
            return Ok((self.invoke(invocation).await?, Ok(())));
        };
        let (reply, replicated) = self.invoke_and_wait(wait, invocation, record, step).await?;
        let reply = redis::from_redis_value(reply).map_err(|e| redis_error(e.into()))?;
        Ok((reply, replicated))
    }

    /// A connection's failure as a store error; Redis may come back empty, so the state is
    /// checked before the next call.
    pub(crate) fn connection_failed(&self, e: RedisError) -> StoreError {
        let error = redis_error(e);
        // A full Redis (OOM) answered: nothing was lost, and the check (a write) would be
        // refused too.
        if error.is_retryable() && !matches!(error, StoreError::Full { .. }) {
            self.inner.needs_check.store(true, Ordering::Relaxed);
        }
        error
    }

    pub(crate) async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        if self.inner.needs_check.swap(false, Ordering::Relaxed) {
            self.check_after_failure().await?;
        }
        async fn on<C: ConnectionLike, T: redis::FromRedisValue>(
            mut connection: C,
            invocation: &redis::ScriptInvocation<'_>,
        ) -> Result<T, RedisError> {
            invocation.invoke_async(&mut connection).await
        }
        let result = match &self.inner.connection {
            Connection::Single(c) => on(c.clone(), invocation).await,
            Connection::Cluster(c) => on(c.clone(), invocation).await,
        };
        result.map_err(|e| self.connection_failed(e))
    }
}

/// Sends `pipeline` on `connection`; on a cluster, to the master serving `record`'s slot,
/// where its write goes.
async fn send_pipeline(
    connection: &Connection,
    pipeline: &redis::Pipeline,
    record: &str,
) -> Result<Vec<Value>, RedisError> {
    let replies: Vec<Value> = match connection {
        Connection::Single(c) => pipeline.query_async(&mut c.clone()).await?,
        Connection::Cluster(c) => {
            use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
            let route = Route::with_key(record, SlotAddr::Master);
            c.clone()
                .route_pipeline(
                    pipeline.clone(),
                    0,
                    2,
                    SingleNodeRoutingInfo::SpecificNode(route),
                )
                .await?
        }
    };
    // A command's error can come back as a value among the replies.
    replies
        .into_iter()
        .map(|reply| match reply {
            Value::ServerError(error) => Err(RedisError::from(error)),
            reply => Ok(reply),
        })
        .collect()
}
