//! What the server looks like: persistence and eviction, for `idempotency check` and operators.

use crate::connection::Connection;
use crate::error::redis_error;
use crate::eviction;
use crate::store::RedisStore;
use idempotency_core::StoreError;
use std::fmt;

/// The settings of the Redis server that decide whether records survive, read by
/// [`RedisStore::status`] from `INFO` (on a cluster, from the first master that answers).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStatus {
    /// `redis_version`.
    pub version: String,
    /// `appendonly`: whether writes are logged to disk.
    pub appendonly: bool,
    /// `save`: the snapshot schedule (empty: none); `None` where `CONFIG GET` is refused, as
    /// on ElastiCache, which manages snapshots itself.
    pub save: Option<String>,
    /// `maxmemory` in bytes (0: no limit).
    pub maxmemory: u64,
    /// `maxmemory-policy`.
    pub maxmemory_policy: String,
}

impl StoreStatus {
    /// Whether the eviction policy can drop idempotency records (in-flight claims included).
    pub fn evicts_records(&self) -> bool {
        crate::eviction::policy_evicts(&self.maxmemory_policy)
    }

    /// What is wrong, as sentences an operator can act on; empty when nothing is.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.evicts_records() {
            problems.push(format!(
                "maxmemory-policy is {}: under memory pressure Redis evicts idempotency records, \
                 in-flight claims included, and retries then run again; set noeviction",
                self.maxmemory_policy
            ));
        }
        if !self.appendonly && self.save.as_deref().is_some_and(|s| s.trim().is_empty()) {
            problems.push(
                "persistence is off (appendonly no, no save schedule): a restart forgets every \
                 key; set appendonly yes"
                    .to_owned(),
            );
        }
        problems
    }
}

impl fmt::Display for StoreStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "server: Redis {}", self.version)?;
        let save = match &self.save {
            Some(save) => format!("{save:?}"),
            None => "unknown (CONFIG GET refused)".to_owned(),
        };
        writeln!(
            f,
            "persistence: appendonly {}, save {save}",
            if self.appendonly { "yes" } else { "no" },
        )?;
        writeln!(
            f,
            "memory: maxmemory {}, maxmemory-policy {}",
            self.maxmemory, self.maxmemory_policy
        )
    }
}

impl RedisStore {
    /// Reads the server's persistence and eviction settings from `INFO server`, `INFO
    /// persistence` and `INFO memory`, which managed services (ElastiCache) allow; the snapshot
    /// schedule only `CONFIG GET save` has, so it is `None` where `CONFIG` is refused.
    pub async fn status(&self) -> Result<StoreStatus, StoreError> {
        let first = |nodes: Vec<(String, String)>| nodes.into_iter().next().map(|(_, info)| info);
        let connection = &self.inner.connection;
        let mut info = String::new();
        for section in ["server", "persistence", "memory"] {
            let text = first(
                eviction::info_per_node(connection, section)
                    .await
                    .map_err(redis_error)?,
            )
            .unwrap_or_default();
            info.push_str(&text);
            info.push('\n');
        }
        let value = |name: &str| eviction::field(&info, name).unwrap_or_default().to_owned();
        let mut command = redis::cmd("CONFIG");
        command.arg("GET").arg("save");
        let save: Result<Vec<String>, _> = match connection {
            Connection::Single(c) => command.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => command.query_async(&mut c.clone()).await,
        };
        Ok(StoreStatus {
            version: value("redis_version"),
            appendonly: value("aof_enabled") == "1",
            save: save
                .ok()
                .map(|pair| pair.get(1).cloned().unwrap_or_default()),
            maxmemory: value("maxmemory").parse().unwrap_or(0),
            maxmemory_policy: value("maxmemory_policy"),
        })
    }
}

impl RedisStore {
    /// How long until the record of `(scope, key)` expires (`PTTL`: its lease while in flight,
    /// its retention once completed); `None` when it is absent. For operators.
    pub async fn expires_in(
        &self,
        scope: &idempotency_core::Scope,
        key: &idempotency_core::IdempotencyKey,
    ) -> Result<Option<std::time::Duration>, StoreError> {
        let mut command = redis::cmd("PTTL");
        command.arg(self.record_key(scope, key));
        let pttl: i64 = match &self.inner.connection {
            Connection::Single(c) => command.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => command.query_async(&mut c.clone()).await,
        }
        .map_err(redis_error)?;
        Ok((pttl >= 0).then(|| std::time::Duration::from_millis(pttl as u64)))
    }
}
