//! Eviction: an evicting `maxmemory-policy` is refused when the store is built (unless the user
//! allows it), and a watch counts and logs Redis' `evicted_keys` growth.
//!
//! Under an evicting policy Redis drops records, in-flight claims included, and nothing else
//! notices: `volatile-*` policies evict only keys with a TTL, which every record has and the
//! state sentinel has not, so the loss check cannot see it. Both read `INFO` (not `CONFIG`,
//! which managed services such as ElastiCache disable), from every master of a cluster.

use crate::connection::Connection;
use crate::error::{BACKEND, redis_error};
use crate::store::{Inner, RedisStore};
use idempotency_core::StoreError;
use redis::{RedisError, Value};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Whether Redis' `maxmemory-policy` can evict idempotency records: every policy but
/// `noeviction` (`volatile-*` too: every record has a TTL).
pub(crate) fn policy_evicts(policy: &str) -> bool {
    policy != "noeviction"
}

/// `INFO <section>` of every node the command reaches: the one server, or each master of a
/// cluster; as `(node, text)`.
pub(crate) async fn info_per_node(
    connection: &Connection,
    section: &str,
) -> Result<Vec<(String, String)>, RedisError> {
    let mut command = redis::cmd("INFO");
    command.arg(section);
    let reply: Value = match connection {
        Connection::Single(c) => command.query_async(&mut c.clone()).await?,
        Connection::Cluster(c) => command.query_async(&mut c.clone()).await?,
    };
    fn text(value: Value) -> Result<String, RedisError> {
        match value {
            Value::BulkString(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            Value::VerbatimString { text, .. } | Value::SimpleString(text) => Ok(text),
            Value::ServerError(error) => Err(error.into()),
            other => Err(RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "INFO answered with an unexpected value",
                format!("{other:?}"),
            ))),
        }
    }
    match reply {
        // A cluster answers with one reply per master, by address.
        Value::Map(pairs) => pairs
            .into_iter()
            .map(|(node, info)| Ok((text(node)?, text(info)?)))
            .collect(),
        single => Ok(vec![("server".to_owned(), text(single)?)]),
    }
}

/// The value of `name:` in an `INFO` text.
pub(crate) fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// The replicas of every master that are in sync (`INFO replication`: `slaveN:` lines with
/// `state=online`; one still loading its first copy cannot acknowledge), as `(node, replicas)`.
pub(crate) async fn connected_replicas(
    connection: &Connection,
) -> Result<Vec<(String, u64)>, RedisError> {
    Ok(info_per_node(connection, "replication")
        .await?
        .into_iter()
        .map(|(node, info)| {
            let online = info
                .lines()
                .filter(|line| line.starts_with("slave") && line.contains("state=online"))
                .count() as u64;
            (node, online)
        })
        .collect())
}

/// What the eviction check found on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodePolicy {
    pub(crate) node: String,
    pub(crate) policy: String,
}

/// The `maxmemory-policy` of every node (`INFO memory`).
pub(crate) async fn policies(connection: &Connection) -> Result<Vec<NodePolicy>, RedisError> {
    Ok(info_per_node(connection, "memory")
        .await?
        .into_iter()
        .map(|(node, info)| NodePolicy {
            policy: field(&info, "maxmemory_policy")
                .unwrap_or("unknown")
                .to_owned(),
            node,
        })
        .collect())
}

/// The first node whose policy can evict records.
pub(crate) fn first_evicting(policies: &[NodePolicy]) -> Option<&NodePolicy> {
    policies.iter().find(|p| policy_evicts(&p.policy))
}

impl RedisStore {
    /// Reads `evicted_keys` of the server (every master of a cluster) and returns how many keys
    /// Redis evicted since the last check (the first check, when the store is built, sets the
    /// baseline). Growth is added to `idempotency_redis_evicted_keys_total` and logged as a
    /// warning: the count covers every key of the server, so idempotency records may be among
    /// them, and a retry of an evicted record runs its request again. The store's watch
    /// ([`RedisStoreBuilder::watch_interval`](crate::RedisStoreBuilder::watch_interval)) calls
    /// it periodically.
    pub async fn check_evictions(&self) -> Result<u64, StoreError> {
        let nodes = evicted_per_node(&self.inner.connection)
            .await
            .map_err(redis_error)?;
        let grown = self.inner.note_evicted(nodes);
        if grown > 0 {
            self.inner.evictions.fetch_add(grown, Ordering::Relaxed);
            metrics::counter!("idempotency_redis_evicted_keys_total", "backend" => BACKEND)
                .increment(grown);
            tracing::warn!(
                evicted = grown,
                prefix = %self.inner.prefix,
                "Redis evicted keys since the last check: idempotency records may be among them, \
                 and their retries run again; give Redis more memory or set maxmemory-policy \
                 noeviction"
            );
        }
        Ok(grown)
    }

    /// Keys Redis evicted, as seen by [`RedisStore::check_evictions`] since the store was
    /// built.
    pub fn evicted_keys_seen(&self) -> u64 {
        self.inner.evictions.load(Ordering::Relaxed)
    }
}

/// `evicted_keys` of every node (`INFO stats`).
pub(crate) async fn evicted_per_node(
    connection: &Connection,
) -> Result<Vec<(String, u64)>, RedisError> {
    Ok(info_per_node(connection, "stats")
        .await?
        .into_iter()
        .map(|(node, info)| {
            let evicted = field(&info, "evicted_keys")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            (node, evicted)
        })
        .collect())
}

impl Inner {
    /// Records the nodes' `evicted_keys`; returns the growth over the last reading (a node's
    /// first reading is its baseline).
    pub(crate) fn note_evicted(&self, nodes: Vec<(String, u64)>) -> u64 {
        let mut seen: std::sync::MutexGuard<'_, HashMap<String, u64>> = self
            .evicted_seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut grown = 0;
        for (node, now) in nodes {
            // A counter that went down was reset (a restart, CONFIG RESETSTAT).
            if let Some(before) = seen.insert(node, now) {
                grown += now.saturating_sub(before);
            }
        }
        grown
    }
}

/// Every `period` while the store lives: the loss check (the sentinel), the eviction count,
/// and a warning if a node's policy became an evicting one. Ends when the last clone of the
/// store is dropped.
pub(crate) fn spawn_watch(inner: &Arc<Inner>, period: Duration) {
    let weak: Weak<Inner> = Arc::downgrade(inner);
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let Some(inner) = weak.upgrade() else { return };
            let store = RedisStore { inner };
            if let Err(error) = store.check_state().await {
                tracing::debug!(error = %idempotency_core::ErrorChain(&error), "Redis watch: loss check failed");
                continue;
            }
            if let Err(error) = store.check_evictions().await {
                tracing::debug!(error = %idempotency_core::ErrorChain(&error), "Redis watch: eviction check failed");
            }
            if !store.inner.eviction_allowed
                && let Ok(policies) = policies(&store.inner.connection).await
                && let Some(p) = first_evicting(&policies)
            {
                tracing::error!(
                    node = %p.node,
                    policy = %p.policy,
                    "Redis' maxmemory-policy was changed to an evicting one: idempotency records \
                     can be evicted and their retries run again; set it back to noeviction"
                );
            }
        }
    });
}
