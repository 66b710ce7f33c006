//! The store: its connection, key names, loss detection and the six primitives (`invoke.rs`:
//! how a script is sent).

use crate::connection::Connection;
use crate::error::{BACKEND, corrupt, redis_error};
use crate::reply::{CLAIMED, COMPLETED, IN_FLIGHT, record_from_reply};
use crate::sentinel;
use crate::{CLAIM, COMPLETE, EXTEND, GET, RELEASE, WATCH};
use async_trait::async_trait;
use idempotency_core::store::{
    ClaimOutcome, FenceOutcome, Record, SettleListener, SettledKeys, StateLoss, wake_id,
};
use idempotency_core::{
    Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Scope, StoreError, StoredResponse,
};
use redis::{RedisError, Value};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub(crate) struct Inner {
    pub(crate) connection: Connection,
    pub(crate) prefix: String,
    /// The state sentinels: one on a single server, one per master of a cluster (masters added
    /// to the cluster later get theirs at the next check).
    pub(crate) sentinels: std::sync::Mutex<Vec<String>>,
    pub(crate) needs_check: AtomicBool,
    pub(crate) losses: StateLoss,
    /// `evicted_keys` per node at the last eviction check.
    pub(crate) evicted_seen: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Evictions seen since the store was built.
    pub(crate) evictions: std::sync::atomic::AtomicU64,
    /// Whether the user allowed an evicting `maxmemory-policy`.
    pub(crate) eviction_allowed: bool,
    /// Replicas to wait for after claims and completions.
    pub(crate) replica_wait: Option<ReplicaWait>,
    /// With `replica_wait`: the connections writes that wait for replicas are sent on, with
    /// their `WAIT`; empty otherwise.
    pub(crate) waiting: Vec<Connection>,
    /// The next of `waiting` to use.
    pub(crate) next_waiting: std::sync::atomic::AtomicUsize,
    /// The session subscribed to the settle notices of waited-for keys.
    pub(crate) listener: SettleListener,
    /// Where that session subscribes: the server, or each node of a cluster in turn (a
    /// cluster passes a `PUBLISH` on to every node).
    pub(crate) subscribe_to: Vec<redis::Client>,
    /// The channel of settle notices: `<prefix>settled`.
    pub(crate) channel: String,
}

/// `WAIT <replicas> <timeout>` after each claim and completion.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReplicaWait {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// The Redis store. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field(
                "cluster",
                &matches!(self.inner.connection, Connection::Cluster(_)),
            )
            .finish()
    }
}

/// Percent-encodes the characters that would break the `{scope:key}` hash tag.
fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            ':' => out.push_str("%3A"),
            '%' => out.push_str("%25"),
            c => out.push(c),
        }
    }
}

fn millis(d: Duration) -> u64 {
    // PEXPIRE 0 deletes the key; a lease or retention always lasts at least a millisecond.
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl RedisStore {
    /// The Redis key name of `(scope, key)`.
    pub fn record_key(&self, scope: &Scope, key: &IdempotencyKey) -> String {
        let mut name = String::with_capacity(
            self.inner.prefix.len() + scope.as_str().len() + key.as_str().len() + 8,
        );
        name.push_str(&self.inner.prefix);
        name.push('{');
        escape_into(&mut name, scope.as_str());
        name.push(':');
        escape_into(&mut name, key.as_str());
        name.push('}');
        name
    }

    /// Sets every sentinel that is missing; returns the ones that were. On a cluster, masters
    /// that serve slots now and did not when the sentinels were chosen (added since) get a
    /// sentinel first, which is not counted as missing: it is their first.
    pub(crate) async fn plant_sentinels(&self) -> Result<Vec<String>, RedisError> {
        if matches!(self.inner.connection, Connection::Cluster(_)) {
            self.adopt_new_masters().await?;
        }
        let known = match self.inner.sentinels.lock() {
            Ok(known) => known.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let mut missing = Vec::new();
        for sentinel in known {
            if self.set_sentinel(&sentinel).await? {
                missing.push(sentinel);
            }
        }
        Ok(missing)
    }

    /// Sets `sentinel` if it is missing; whether it was.
    async fn set_sentinel(&self, sentinel: &str) -> Result<bool, RedisError> {
        let mut command = redis::cmd("SET");
        command.arg(sentinel).arg(1).arg("NX");
        let reply: Option<String> = match &self.inner.connection {
            Connection::Single(c) => command.query_async(&mut c.clone()).await?,
            Connection::Cluster(c) => command.query_async(&mut c.clone()).await?,
        };
        Ok(reply.is_some())
    }

    /// Plants a sentinel on every master that has none of the known ones' names in its slots
    /// (a master added to the cluster since), and remembers it.
    async fn adopt_new_masters(&self) -> Result<(), RedisError> {
        let masters = sentinel::cluster_masters(&self.inner.connection).await?;
        let wanted = sentinel::per_master(&self.inner.prefix, &masters);
        let known = match self.inner.sentinels.lock() {
            Ok(known) => known.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        for name in wanted {
            if known.contains(&name) {
                continue;
            }
            self.set_sentinel(&name).await?;
            tracing::info!(sentinel = %name, "a master joined the cluster: planted its state sentinel");
            match self.inner.sentinels.lock() {
                Ok(mut known) => known.push(name),
                Err(poisoned) => poisoned.into_inner().push(name),
            }
        }
        Ok(())
    }

    /// Checks that Redis still holds what it held: returns `true` (and logs an error and counts
    /// it in `idempotency_store_state_lost_total`, once per master that lost it) when a sentinel
    /// key is gone, which means Redis lost its data (a restart without persistence, a failover to
    /// a replica that had not received it, `FLUSHALL`, or eviction under an evicting
    /// `maxmemory-policy`). On a cluster every master holds a sentinel of its own. The store runs
    /// it by itself before its first call after a connection failure, and its watch runs it
    /// periodically ([`RedisStoreBuilder::watch_interval`](crate::RedisStoreBuilder::watch_interval)).
    /// A store that waits for replicas loads its scripts again when the check finds a loss.
    pub async fn check_state(&self) -> Result<bool, StoreError> {
        let missing = self.plant_sentinels().await.map_err(|e| {
            self.inner.needs_check.store(true, Ordering::Relaxed);
            redis_error(e)
        })?;
        for sentinel in &missing {
            self.inner.losses.found(
                BACKEND,
                sentinel,
                "Redis no longer holds this sentinel key: a restart without persistence, a \
                 failover, FLUSHALL or eviction",
            );
        }
        // A server that lost its data (a restart, a failover) lost its script cache too. The
        // losses are counted first: the sentinels are planted again already, so a later check
        // would not find them missing. A failed load is retried before the next call.
        if !missing.is_empty()
            && let Err(error) = self.reload_scripts().await
        {
            tracing::warn!(error = %idempotency_core::ErrorChain(&error), "could not load the store's scripts after a loss; retried before the next call");
        }
        Ok(!missing.is_empty())
    }

    /// The check the store runs before its first call after a connection failure: the state,
    /// and the script cache, which a restart or a failover empties even when no data is lost
    /// (a replica promoted with every record).
    pub(crate) async fn check_after_failure(&self) -> Result<(), StoreError> {
        if !self.check_state().await? {
            self.reload_scripts().await?;
        }
        Ok(())
    }

    async fn reload_scripts(&self) -> Result<(), StoreError> {
        self.load_scripts().await.map_err(|e| {
            self.inner.needs_check.store(true, Ordering::Relaxed);
            redis_error(e)
        })
    }

    /// How many times this store found Redis' data gone (see [`RedisStore::check_state`]).
    pub fn state_losses(&self) -> u64 {
        self.inner.losses.count()
    }
}

#[async_trait]
impl IdempotencyStore for RedisStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let record = self.record_key(scope, key);
        let mut invocation = CLAIM.key(&record);
        invocation
            .arg(&fingerprint.to_bytes()[..])
            .arg(&token.as_bytes()[..])
            .arg(millis(lease));
        let (reply, replicated): (Vec<Value>, _) =
            self.write(&invocation, &record, "claim").await?;
        let mut items = reply.into_iter();
        match items.next() {
            Some(Value::Int(CLAIMED)) => {
                if let Err(error) = replicated {
                    // Not on enough replicas: give the key back rather than run the handler on
                    // a claim a failover could forget (best effort; the lease bounds it).
                    metrics::counter!("idempotency_redis_replica_wait_shortfalls_total")
                        .increment(1);
                    if let Err(release) = self.release(scope, key, token).await {
                        tracing::debug!(error = %idempotency_core::ErrorChain(&release), "could not release an unacknowledged claim");
                    }
                    return Err(error);
                }
                Ok(ClaimOutcome::Claimed)
            }
            Some(Value::Int(tag @ (IN_FLIGHT | COMPLETED))) => {
                record_from_reply(items, tag).map(ClaimOutcome::Existing)
            }
            _ => Err(corrupt("unexpected claim reply")),
        }
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let record = self.record_key(scope, key);
        let mut invocation = COMPLETE.key(&record);
        invocation
            .arg(&token.as_bytes()[..])
            .arg(&response.encode()[..])
            .arg(millis(retention))
            .arg(&self.inner.channel);
        let (applied, replicated): (u64, _) =
            self.write(&invocation, &record, "completion").await?;
        let outcome = FenceOutcome::from_count(applied);
        if outcome == FenceOutcome::Applied
            && let Err(error) = replicated
        {
            metrics::counter!("idempotency_redis_replica_wait_shortfalls_total").increment(1);
            // The response is stored on the master and the handler has run: an error here would
            // only make the engine store it again (the token is gone, so that attempt reads as a
            // lost lease) while the client gets its response anyway. Say it and count it
            // (`await_replicas` counts shortfalls): a failover before the replicas catch up
            // forgets this completion.
            tracing::warn!(
                error = %idempotency_core::ErrorChain(&error),
                "a completion was stored on the master but not acknowledged by the replicas in \
                 time: a failover now would forget it"
            );
        }
        Ok(outcome)
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let mut invocation = EXTEND.key(self.record_key(scope, key));
        invocation.arg(&token.as_bytes()[..]).arg(millis(lease));
        let applied: u64 = self.invoke(&invocation).await?;
        Ok(FenceOutcome::from_count(applied))
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        let mut invocation = RELEASE.key(self.record_key(scope, key));
        invocation
            .arg(&token.as_bytes()[..])
            .arg(&self.inner.channel);
        let applied: u64 = self.invoke(&invocation).await?;
        Ok(FenceOutcome::from_count(applied))
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let invocation = GET.key(self.record_key(scope, key));
        let reply: Vec<Value> = self.invoke(&invocation).await?;
        let mut items = reply.into_iter();
        match items.next() {
            None => Ok(None),
            Some(Value::Int(tag @ (IN_FLIGHT | COMPLETED))) => {
                record_from_reply(items, tag).map(Some)
            }
            _ => Err(corrupt("unexpected get reply")),
        }
    }

    fn settled_keys(&self) -> Option<&SettledKeys> {
        Some(self.inner.listener.settled_keys())
    }

    /// Subscribes first (once per store, on a connection of its own), so that a settle after
    /// the mark is heard; then marks the running record with the key's wake id.
    async fn watch_settle(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), StoreError> {
        let inner = &self.inner;
        let listening = inner
            .listener
            .ensure(|notices, stop| {
                crate::settle_notices::subscribe(&inner.subscribe_to, &inner.channel, notices, stop)
            })
            .await?;
        if !listening {
            return Ok(());
        }
        let mut invocation = WATCH.key(self.record_key(scope, key));
        invocation.arg(format!("{:016x}", wake_id(scope, key)));
        let _marked: u64 = self.invoke(&invocation).await?;
        Ok(())
    }

    /// Redis expires records by itself (`PEXPIRE`): nothing to purge.
    async fn purge_expired(&self, _limit: usize) -> Result<u64, StoreError> {
        Ok(0)
    }

    fn state_losses(&self) -> u64 {
        self.inner.losses.count()
    }

    async fn check_state(&self) -> Result<bool, StoreError> {
        RedisStore::check_state(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_colons_and_percents_cannot_escape_the_hash_tag() {
        let mut a = String::new();
        escape_into(&mut a, "{x}:%");
        assert_eq!(a, "%7Bx%7D%3A%25");
        // ("a:b", "c") and ("a", "b:c") must not share a name.
        let (mut x, mut y) = (String::new(), String::new());
        escape_into(&mut x, "a:b");
        x.push(':');
        escape_into(&mut x, "c");
        escape_into(&mut y, "a");
        y.push(':');
        escape_into(&mut y, "b:c");
        assert_ne!(x, y);
    }
}
