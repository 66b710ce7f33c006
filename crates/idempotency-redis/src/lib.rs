#![doc = include_str!("../README.md")]
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
//!   [`StoreError::Unavailable`](idempotency_core::StoreError::Unavailable), never "absent"; the connection recovers by itself.
//! - Durability is Redis': with persistence off (`--save "" --appendonly no`) a restart forgets
//!   every key. Use `appendonly yes` and `maxmemory-policy noeviction` in production.
//! - **An evicting `maxmemory-policy` is refused** when the store is built (read from
//!   `INFO memory` of every master): any policy but `noeviction` can drop records, in-flight
//!   claims included, and their retries run again. [`RedisStoreBuilder::allow_eviction`]
//!   accepts the risk. A watch ([`RedisStoreBuilder::watch_interval`], every minute by default)
//!   runs the loss check, counts Redis' `evicted_keys` growth
//!   (`idempotency_redis_evicted_keys_total`, and a warning in the log) and reports a policy
//!   changed at run time.
//! - **Loss detection per master**: a sentinel key on the server, or one on every master of a
//!   cluster ([`RedisStore::check_state`]).
//! - **Replication is asynchronous**: a failover can forget the last writes.
//!   [`RedisStoreBuilder::wait_for_replicas`] waits for replicas after each claim and completion
//!   (`docs/redis.md`, "Replicas and failover").

//!
//! # Files
//! `builder.rs` (connecting), `store.rs` (the primitives, key names, loss detection),
//! `eviction.rs` (the policy check and the eviction watch), `sentinel.rs` (the loss sentinels,
//! one per master), `status.rs` (server settings),
//! `reply.rs` (the scripts' replies), `error.rs`, and the scripts in `lua/`.

mod builder;
mod connection;
mod error;
mod eviction;
mod invoke;
mod reply;
mod sentinel;
mod settle_notices;
mod status;
mod store;

use redis::Script;
use std::sync::LazyLock;

pub use builder::RedisStoreBuilder;
pub use error::RedisStoreError;
pub use redis;
pub use status::StoreStatus;
pub use store::RedisStore;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "idempotency:";

/// The Lua source of each store step (`lua/`; the benchmark that runs the same scripts
/// without the library reads those files).
pub(crate) mod scripts {
    /// Claim: `KEYS[1]` record; `ARGV` fingerprint, token, lease ms.
    pub(crate) const CLAIM: &str = include_str!("../lua/claim.lua");
    /// Complete: `KEYS[1]` record; `ARGV` token, response bytes, retention ms, settle channel.
    pub(crate) const COMPLETE: &str = include_str!("../lua/complete.lua");
    /// Extend: `KEYS[1]` record; `ARGV` token, lease ms.
    pub(crate) const EXTEND: &str = include_str!("../lua/extend.lua");
    /// Release: `KEYS[1]` record; `ARGV` token, settle channel.
    pub(crate) const RELEASE: &str = include_str!("../lua/release.lua");
    /// Watch (a waiting duplicate marks the running record): `KEYS[1]` record; `ARGV` the
    /// key's wake id.
    pub(crate) const WATCH: &str = include_str!("../lua/watch.lua");
    /// Get: `KEYS[1]` record.
    pub(crate) const GET: &str = include_str!("../lua/get.lua");
}

pub(crate) static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::CLAIM));
pub(crate) static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::COMPLETE));
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::EXTEND));
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::RELEASE));
pub(crate) static GET: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::GET));
pub(crate) static WATCH: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::WATCH));
