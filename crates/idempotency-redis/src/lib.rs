//! The Redis [`IdempotencyStore`]: the ADR's rejected alternative (ElastiCache), kept so the
//! ADR can be re-evaluated at scale. Single node through a [`ConnectionManager`] (reconnects by
//! itself) or Redis Cluster, chosen by configuration.
//!
//! ```no_run
//! use idempotency_redis::RedisStore;
//!
//! # async fn run() -> Result<(), idempotency_redis::RedisStoreError> {
//! let single = RedisStore::connect("redis://127.0.0.1:6379").build().await?;
//! let cluster = RedisStore::connect_cluster(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])
//!     .key_prefix("myapp:idem:")
//!     .build()
//!     .await?;
//! # let _ = (single, cluster); Ok(()) }
//! ```
//!
//! # Layout and guarantees
//! - One hash per `(scope, key)`, named `<prefix>{<scope>:<key>}` with `{`, `}`, `:` and `%`
//!   percent-encoded inside the braces, so the whole record address is the cluster hash tag and
//!   every script touches exactly one slot. Fields: `fp` (fingerprint), `tok` (lease token while
//!   in flight), `resp` (the stored response once completed).
//! - Claim, complete, release and read are Lua scripts (`lua/*.lua`): each checks the token and
//!   sets the TTL in one atomic step; nothing is read and then written from the client.
//! - Time is Redis' own clock: the TTL is the lease while in flight and the retention once
//!   completed (`PEXPIRE`), so expired records do not exist; `purge_expired` has nothing to do.
//! - While Redis is unreachable every call fails with a retryable
//!   [`StoreError::Unavailable`], never "absent"; the connection recovers by itself.
//! - Durability is Redis': with persistence off (`--save "" --appendonly no`) a restart forgets
//!   every key. Use `appendonly yes` and `maxmemory-policy noeviction` in production: an
//!   evicting policy can drop an in-flight claim.

use async_trait::async_trait;
use bytes::Bytes;
use idempotency_core::{
    ClaimOutcome, CorruptRecord, FenceOutcome, Fingerprint, IdempotencyKey, IdempotencyStore,
    LeaseToken, Record, RecordState, Scope, StoreError, StoredResponse,
};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Script, Value};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

pub use redis;

const BACKEND: &str = "redis";

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "idempotency:";

/// The Lua source of each store step (for review, and for the benchmark that runs the same
/// scripts without the library).
pub mod scripts {
    /// Claim: `KEYS[1]` record; `ARGV` fingerprint, token, lease ms.
    pub const CLAIM: &str = include_str!("../lua/claim.lua");
    /// Complete: `KEYS[1]` record; `ARGV` token, response bytes, retention ms.
    pub const COMPLETE: &str = include_str!("../lua/complete.lua");
    /// Extend: `KEYS[1]` record; `ARGV` token, lease ms.
    pub const EXTEND: &str = include_str!("../lua/extend.lua");
    /// Release: `KEYS[1]` record; `ARGV` token.
    pub const RELEASE: &str = include_str!("../lua/release.lua");
    /// Get: `KEYS[1]` record.
    pub const GET: &str = include_str!("../lua/get.lua");
}

static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::CLAIM));
static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::COMPLETE));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::EXTEND));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::RELEASE));
static GET: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::GET));

/// Why the Redis store could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// The URL is invalid or the server could not be reached.
    #[error("could not connect to Redis")]
    Connect(#[source] RedisError),
    /// The key prefix contains `{` or `}`, which would take over the cluster hash tag.
    #[error("the key prefix {0:?} must not contain '{{' or '}}'")]
    InvalidPrefix(String),
}

enum Target {
    Single(String),
    Cluster(Vec<String>),
}

/// Builds a [`RedisStore`].
pub struct RedisStoreBuilder {
    target: Target,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("prefix", &self.prefix)
            .field("cluster", &matches!(self.target, Target::Cluster(_)))
            .finish_non_exhaustive()
    }
}

impl RedisStoreBuilder {
    /// The prefix of every key name (default `idempotency:`). Must not contain braces.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Bound on connecting (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Bound on each command's answer (default 2 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Connects. A single node gets a [`ConnectionManager`], which reconnects in the background
    /// after a failure; a cluster gets the cluster client's connection, which follows slot moves.
    pub async fn build(self) -> Result<RedisStore, RedisStoreError> {
        if self.prefix.contains(['{', '}']) {
            return Err(RedisStoreError::InvalidPrefix(self.prefix));
        }
        let connection = match self.target {
            Target::Single(url) => {
                let client = redis::Client::open(url).map_err(RedisStoreError::Connect)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.response_timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                Connection::Single(
                    ConnectionManager::new_with_config(client, config)
                        .await
                        .map_err(RedisStoreError::Connect)?,
                )
            }
            Target::Cluster(nodes) => {
                let client = redis::cluster::ClusterClient::builder(nodes)
                    .connection_timeout(self.connect_timeout)
                    .response_timeout(self.response_timeout)
                    .retries(2)
                    .build()
                    .map_err(RedisStoreError::Connect)?;
                Connection::Cluster(
                    client
                        .get_async_connection()
                        .await
                        .map_err(RedisStoreError::Connect)?,
                )
            }
        };
        let store = RedisStore {
            inner: Arc::new(Inner {
                connection,
                sentinel: format!("{}state-sentinel", self.prefix),
                prefix: self.prefix,
                needs_check: AtomicBool::new(false),
                losses: AtomicU64::new(0),
            }),
        };
        // The first store on this prefix plants the sentinel; its later absence means Redis lost
        // its data (a restart without persistence, a failover to an empty replica, a FLUSHALL).
        store
            .plant_sentinel()
            .await
            .map_err(RedisStoreError::Connect)?;
        Ok(store)
    }
}

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

struct Inner {
    connection: Connection,
    prefix: String,
    sentinel: String,
    needs_check: AtomicBool,
    losses: AtomicU64,
}

/// The Redis store. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
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

fn redis_error(e: RedisError) -> StoreError {
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || !e.is_unrecoverable_error() && !matches!(e.retry_method(), redis::RetryMethod::NoRetry);
    StoreError::from_failure(BACKEND, transient, e)
}

fn corrupt(what: &'static str) -> StoreError {
    StoreError::corrupt(BACKEND, CorruptRecord::Field(what))
}

fn bytes_of(value: Value) -> Result<Vec<u8>, StoreError> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        _ => Err(corrupt("expected a bulk string")),
    }
}

/// Reads `{2, fp, pttl}` or `{3, fp, resp}`.
fn record_from_reply(mut items: std::vec::IntoIter<Value>, tag: i64) -> Result<Record, StoreError> {
    let fp = bytes_of(items.next().ok_or(corrupt("missing fingerprint"))?)?;
    let fingerprint = Fingerprint::from_bytes(&fp).map_err(|e| StoreError::corrupt(BACKEND, e))?;
    let state = match (tag, items.next()) {
        (2, Some(Value::Int(pttl))) => RecordState::InFlight {
            lease_remaining: Duration::from_millis(pttl.max(0) as u64),
        },
        (3, Some(resp)) => RecordState::Completed {
            response: StoredResponse::decode(Bytes::from(bytes_of(resp)?))
                .map_err(|e| StoreError::corrupt(BACKEND, e))?,
        },
        _ => return Err(corrupt("unexpected script reply")),
    };
    Ok(Record { fingerprint, state })
}

fn millis(d: Duration) -> u64 {
    // PEXPIRE 0 deletes the key; a lease or retention always lasts at least a millisecond.
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl RedisStore {
    /// A store on one Redis server, e.g. `redis://127.0.0.1:6379` or `rediss://...`.
    pub fn connect(url: impl Into<String>) -> RedisStoreBuilder {
        Self::builder(Target::Single(url.into()))
    }

    /// A store on a Redis Cluster, given some of its nodes.
    pub fn connect_cluster<I, S>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder(Target::Cluster(nodes.into_iter().map(Into::into).collect()))
    }

    fn builder(target: Target) -> RedisStoreBuilder {
        RedisStoreBuilder {
            target,
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
        }
    }

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

    /// Sets the sentinel if it is missing; returns whether it was missing.
    async fn plant_sentinel(&self) -> Result<bool, RedisError> {
        let mut command = redis::cmd("SET");
        command.arg(&self.inner.sentinel).arg(1).arg("NX");
        let reply: Option<String> = match &self.inner.connection {
            Connection::Single(c) => command.query_async(&mut c.clone()).await?,
            Connection::Cluster(c) => command.query_async(&mut c.clone()).await?,
        };
        Ok(reply.is_some())
    }

    /// Checks that Redis still holds what it held: returns `true` (and logs an error and counts
    /// it in `idempotency_store_state_lost_total`) when the store's sentinel key is gone, which
    /// means Redis lost its data (a restart without persistence, a failover to an empty replica,
    /// `FLUSHALL`, or eviction under an evicting `maxmemory-policy`). The store runs it by itself
    /// before its first call after a connection failure; call it periodically to also notice a
    /// restart that happened while the store was idle.
    pub async fn check_state(&self) -> Result<bool, StoreError> {
        let lost = self.plant_sentinel().await.map_err(|e| {
            self.inner.needs_check.store(true, Ordering::Relaxed);
            redis_error(e)
        })?;
        if lost {
            self.inner.losses.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("idempotency_store_state_lost_total", "backend" => BACKEND)
                .increment(1);
            tracing::error!(
                prefix = %self.inner.prefix,
                "idempotency records were lost: Redis no longer holds the store's sentinel key \
                 (restart without persistence, failover, FLUSHALL or eviction). Every stored \
                 response and in-flight claim made before it is gone, so retries of those \
                 requests will run again"
            );
        }
        Ok(lost)
    }

    /// How many times this store found Redis' data gone (see [`RedisStore::check_state`]).
    pub fn state_losses(&self) -> u64 {
        self.inner.losses.load(Ordering::Relaxed)
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        if self.inner.needs_check.swap(false, Ordering::Relaxed) {
            self.check_state().await?;
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
        result.map_err(|e| {
            let error = redis_error(e);
            if error.is_retryable() {
                // The connection failed: Redis may come back empty. Check before the next call.
                self.inner.needs_check.store(true, Ordering::Relaxed);
            }
            error
        })
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
        let mut invocation = CLAIM.key(self.record_key(scope, key));
        invocation
            .arg(&fingerprint.to_bytes()[..])
            .arg(&token.as_bytes()[..])
            .arg(millis(lease));
        let reply: Vec<Value> = self.invoke(&invocation).await?;
        let mut items = reply.into_iter();
        match items.next() {
            Some(Value::Int(1)) => Ok(ClaimOutcome::Claimed),
            Some(Value::Int(tag @ (2 | 3))) => {
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
        let mut invocation = COMPLETE.key(self.record_key(scope, key));
        invocation
            .arg(&token.as_bytes()[..])
            .arg(&response.encode()[..])
            .arg(millis(retention));
        let applied: i64 = self.invoke(&invocation).await?;
        Ok(if applied == 1 {
            FenceOutcome::Applied
        } else {
            FenceOutcome::Stale
        })
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
        let applied: i64 = self.invoke(&invocation).await?;
        Ok(if applied == 1 {
            FenceOutcome::Applied
        } else {
            FenceOutcome::Stale
        })
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        let mut invocation = RELEASE.key(self.record_key(scope, key));
        invocation.arg(&token.as_bytes()[..]);
        let applied: i64 = self.invoke(&invocation).await?;
        Ok(if applied == 1 {
            FenceOutcome::Applied
        } else {
            FenceOutcome::Stale
        })
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let invocation = GET.key(self.record_key(scope, key));
        let reply: Vec<Value> = self.invoke(&invocation).await?;
        let mut items = reply.into_iter();
        match items.next() {
            None => Ok(None),
            Some(Value::Int(tag @ (2 | 3))) => record_from_reply(items, tag).map(Some),
            _ => Err(corrupt("unexpected get reply")),
        }
    }

    /// Redis expires records by itself (`PEXPIRE`): nothing to purge.
    async fn purge_expired(&self, _limit: usize) -> Result<u64, StoreError> {
        Ok(0)
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
