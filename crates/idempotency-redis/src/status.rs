//! What the server looks like: persistence and eviction, for `idempotency check` and operators.

use crate::error::redis_error;
use crate::store::{Connection, RedisStore};
use idempotency_core::StoreError;
use std::fmt;

/// The settings of the Redis server that decide whether records survive, read by
/// [`RedisStore::server_info`] (on a cluster, from the node the client picks).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerInfo {
    /// `redis_version`.
    pub version: String,
    /// `appendonly`: whether writes are logged to disk.
    pub appendonly: bool,
    /// `save`: the snapshot schedule (empty: none).
    pub save: String,
    /// `maxmemory` in bytes (0: no limit).
    pub maxmemory: u64,
    /// `maxmemory-policy`.
    pub maxmemory_policy: String,
}

impl ServerInfo {
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
        if !self.appendonly && self.save.trim().is_empty() {
            problems.push(
                "persistence is off (appendonly no, no save schedule): a restart forgets every \
                 key; set appendonly yes"
                    .to_owned(),
            );
        }
        problems
    }
}

impl fmt::Display for ServerInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "server: Redis {}", self.version)?;
        writeln!(
            f,
            "persistence: appendonly {}, save {:?}",
            if self.appendonly { "yes" } else { "no" },
            self.save
        )?;
        writeln!(
            f,
            "memory: maxmemory {}, maxmemory-policy {}",
            self.maxmemory, self.maxmemory_policy
        )
    }
}

impl RedisStore {
    /// Reads the server's persistence and eviction settings (`INFO server`, `CONFIG GET`).
    pub async fn server_info(&self) -> Result<ServerInfo, StoreError> {
        async fn config<C: redis::aio::ConnectionLike>(
            connection: &mut C,
            name: &str,
        ) -> Result<String, redis::RedisError> {
            let pair: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async(connection)
                .await?;
            Ok(pair.get(1).cloned().unwrap_or_default())
        }
        async fn read<C: redis::aio::ConnectionLike>(
            mut c: C,
        ) -> Result<ServerInfo, redis::RedisError> {
            let info: String = redis::cmd("INFO").arg("server").query_async(&mut c).await?;
            let version = info
                .lines()
                .find_map(|l| l.strip_prefix("redis_version:"))
                .unwrap_or("?")
                .trim()
                .to_owned();
            Ok(ServerInfo {
                version,
                appendonly: config(&mut c, "appendonly").await? == "yes",
                save: config(&mut c, "save").await?,
                maxmemory: config(&mut c, "maxmemory").await?.parse().unwrap_or(0),
                maxmemory_policy: config(&mut c, "maxmemory-policy").await?,
            })
        }
        match &self.inner.connection {
            Connection::Single(c) => read(c.clone()).await,
            Connection::Cluster(c) => read(c.clone()).await,
        }
        .map_err(redis_error)
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
