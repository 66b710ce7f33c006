//! Building a store: one server or a cluster, its prefix and timeouts.

use crate::DEFAULT_PREFIX;
use crate::connection::Connection;
use crate::error::{BACKEND, RedisStoreError};
use crate::store::{Inner, RedisStore, ReplicaWait};
use crate::{eviction, sentinel};
use idempotency_core::store::SettleListener;
use idempotency_core::store::StateLoss;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// The roots to trust for TLS (`None`: the system's).
struct TlsRoots {
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    root_cert: Option<Vec<u8>>,
}

enum Target {
    Single(String),
    Cluster(Vec<String>),
}

/// How many connections of its own the store opens for writes that wait for replicas
/// ([`RedisStoreBuilder::wait_for_replicas`]), taken in turn: up to this many such writes wait
/// at once, each blocking its connection while it waits (more queue behind them), and none
/// blocks the connection every other call uses.
const WAITING_CONNECTIONS: usize = 8;

/// A configured client, which opens the store's connections.
enum Client {
    Single(redis::Client, ConnectionManagerConfig),
    Cluster(redis::cluster::ClusterClient),
}

impl Client {
    async fn connect(&self) -> Result<Connection, RedisStoreError> {
        Ok(match self {
            Client::Single(client, config) => Connection::Single(
                ConnectionManager::new_with_config(client.clone(), config.clone())
                    .await
                    .map_err(RedisStoreError::Connect)?,
            ),
            Client::Cluster(client) => Connection::Cluster(
                client
                    .get_async_connection()
                    .await
                    .map_err(RedisStoreError::Connect)?,
            ),
        })
    }
}

/// Builds a [`RedisStore`].
pub struct RedisStoreBuilder {
    target: Target,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    tls_root_cert: Option<std::path::PathBuf>,
    allow_eviction: bool,
    watch_interval: Option<Duration>,
    replica_wait: Option<ReplicaWait>,
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

    /// Accept a server whose `maxmemory-policy` can evict records (any but `noeviction`);
    /// without it [`build`](RedisStoreBuilder::build) refuses such a server with
    /// [`RedisStoreError::EvictingPolicy`]. Under memory pressure an evicted record's retry runs
    /// its request again, and an evicted in-flight claim lets a concurrent duplicate run;
    /// evictions are then counted (`idempotency_redis_evicted_keys_total`) and logged.
    pub fn allow_eviction(mut self) -> Self {
        self.allow_eviction = true;
        self
    }

    /// How often the store's watch runs (default every 60 s; `None`: no watch): the loss check
    /// ([`RedisStore::check_state`]), the eviction count ([`RedisStore::check_evictions`]), and a
    /// log line if a node's policy was changed to an evicting one. The watch is a task on the
    /// runtime that builds the store, and ends when the store is dropped.
    pub fn watch_interval(mut self, every: Option<Duration>) -> Self {
        self.watch_interval = every;
        self
    }

    /// After each claim and each completion, waits (Redis `WAIT`) until `replicas` replicas of
    /// the record's master acknowledged it, for up to `timeout`; fewer acknowledgements are a
    /// retryable error (503 at the HTTP layer), and a claim that was not acknowledged is released
    /// again. Off by default.
    ///
    /// Redis replicates asynchronously: a failover to a replica that had not received a claim
    /// forgets it, and a retry then runs the request a second time while the first still runs.
    /// With this, a handler runs only once its claim is on `replicas` replicas. A completion the
    /// replicas do not acknowledge in time stays stored on the master and the client gets its
    /// response (the handler has run; refusing would not undo it): it is logged and counted in
    /// `idempotency_redis_replica_wait_shortfalls_total`. It costs a replica round trip per step (the report's
    /// "Redis: waiting for replicas" measures it), and with fewer than `replicas` replicas up
    /// every request fails. `timeout` must be shorter than the response timeout.
    ///
    /// A write and its `WAIT` go in one pipeline, so a server without the script would answer
    /// `NOSCRIPT` only after waiting, and the resent write would wait again: the store loads its
    /// scripts on every node when it is built, after a loss its check finds and after a
    /// connection failure. After a script-cache flush it did not notice (`SCRIPT FLUSH`), one
    /// write can wait twice `timeout`; keep that under the engine's store timeout.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_wait = Some(ReplicaWait { replicas, timeout });
        self
    }

    /// Trust the roots in this PEM file (your CA, or ElastiCache's) for `rediss://` connections,
    /// instead of the system's roots. Needs the `tls` feature.
    pub fn tls_root_cert(mut self, pem_file: impl Into<std::path::PathBuf>) -> Self {
        self.tls_root_cert = Some(pem_file.into());
        self
    }

    /// The TLS certificates to trust, if TLS is asked for; an error if this build cannot do it.
    fn tls(&self) -> Result<Option<TlsRoots>, RedisStoreError> {
        let urls: Vec<&str> = match &self.target {
            Target::Single(url) => vec![url],
            Target::Cluster(nodes) => nodes.iter().map(String::as_str).collect(),
        };
        let wants_tls = urls.iter().any(|u| u.starts_with("rediss://"));
        if !wants_tls && self.tls_root_cert.is_none() {
            return Ok(None);
        }
        if !cfg!(feature = "tls") {
            return Err(RedisStoreError::InvalidTls(
                "rediss:// needs TLS, and this build has none: enable the `tls` feature of \
                 idempotency-redis (or `redis-tls` of idempotency)"
                    .to_owned(),
            ));
        }
        // The redis crate builds its rustls configuration with the process' default crypto
        // provider; make it ring's unless the application chose one.
        #[cfg(feature = "tls")]
        let _ = rustls::crypto::ring::default_provider().install_default();
        let root_cert = match &self.tls_root_cert {
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                RedisStoreError::InvalidTls(format!("cannot read {}: {e}", path.display()))
            })?),
            None => None,
        };
        Ok(Some(TlsRoots { root_cert }))
    }

    /// Connects. A single node gets a [`ConnectionManager`], which reconnects in the background
    /// after a failure; a cluster gets the cluster client's connection, which follows slot moves.
    /// `rediss://` URLs connect over TLS (feature `tls`), trusting the system's roots or the
    /// file given to [`tls_root_cert`](RedisStoreBuilder::tls_root_cert).
    pub async fn build(self) -> Result<RedisStore, RedisStoreError> {
        if self.prefix.contains(['{', '}']) {
            return Err(RedisStoreError::InvalidPrefix(self.prefix));
        }
        if let Some(wait) = self.replica_wait
            && (wait.replicas == 0
                || wait.timeout.is_zero()
                || wait.timeout >= self.response_timeout)
        {
            return Err(RedisStoreError::ReplicaWait(format!(
                "ask for at least one replica, and a timeout above zero and shorter than the \
                 response timeout ({:?}); got {} replicas within {:?}",
                self.response_timeout, wait.replicas, wait.timeout
            )));
        }
        let tls = self.tls()?;
        // The settle notices are subscribed to on the server's own client, or on a plain client
        // of each node of a cluster, with the store's TLS settings.
        let (client, subscribe_to) = match self.target {
            Target::Single(url) => {
                let client = node_client(&url, tls.as_ref())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.response_timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                (Client::Single(client.clone(), config), vec![client])
            }
            Target::Cluster(nodes) => {
                let subscribe_to = nodes
                    .iter()
                    .map(|url| node_client(url, tls.as_ref()))
                    .collect::<Result<Vec<_>, _>>()?;
                let builder = redis::cluster::ClusterClient::builder(nodes)
                    .connection_timeout(self.connect_timeout)
                    .response_timeout(self.response_timeout)
                    .retries(2);
                #[cfg(feature = "tls")]
                let builder = match tls {
                    Some(TlsRoots {
                        root_cert: Some(root_cert),
                    }) => builder.certs(redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(root_cert),
                    }),
                    _ => builder,
                };
                #[cfg(not(feature = "tls"))]
                let _ = tls;
                let client = builder.build().map_err(RedisStoreError::Connect)?;
                (Client::Cluster(client), subscribe_to)
            }
        };
        let connection = client.connect().await?;
        // Writes that wait for replicas go, with their WAIT, on connections of their own: WAIT
        // blocks the connection it is sent on until the replicas answer.
        let mut waiting = Vec::new();
        if self.replica_wait.is_some() {
            for _ in 0..WAITING_CONNECTIONS {
                waiting.push(client.connect().await?);
            }
        }
        // One sentinel per master of a cluster, so a master that comes back empty is noticed
        // whichever it is.
        let sentinels = match sentinel::cluster_masters(&connection)
            .await
            .map_err(RedisStoreError::Inspect)?
        {
            masters if masters.is_empty() => sentinel::single(&self.prefix),
            masters => sentinel::per_master(&self.prefix, &masters),
        };
        let store = RedisStore {
            inner: Arc::new(Inner {
                connection,
                sentinels: std::sync::Mutex::new(sentinels),
                needs_check: AtomicBool::new(false),
                losses: StateLoss::watching(BACKEND),
                evicted_seen: Default::default(),
                evictions: Default::default(),
                eviction_allowed: self.allow_eviction,
                replica_wait: self.replica_wait,
                waiting,
                next_waiting: Default::default(),
                listener: SettleListener::new(),
                subscribe_to,
                channel: format!("{}settled", self.prefix),
                prefix: self.prefix,
            }),
        };
        // The first store on this prefix plants the sentinel; its later absence means Redis lost
        // its data (a restart without persistence, a failover to an empty replica, a FLUSHALL).
        store
            .plant_sentinels()
            .await
            .map_err(RedisStoreError::Connect)?;
        store
            .load_scripts()
            .await
            .map_err(RedisStoreError::Connect)?;
        let policies = eviction::policies(&store.inner.connection)
            .await
            .map_err(RedisStoreError::Inspect)?;
        if let Some(evicting) = eviction::first_evicting(&policies) {
            if !self.allow_eviction {
                return Err(RedisStoreError::EvictingPolicy {
                    node: evicting.node.clone(),
                    policy: evicting.policy.clone(),
                });
            }
            tracing::warn!(
                node = %evicting.node,
                policy = %evicting.policy,
                "Redis can evict idempotency records (allowed by allow_eviction): their retries \
                 run again under memory pressure"
            );
        }
        if let Some(wait) = self.replica_wait {
            let replicas = eviction::connected_replicas(&store.inner.connection)
                .await
                .map_err(RedisStoreError::Inspect)?;
            if let Some((node, connected)) = replicas
                .into_iter()
                .find(|(_, n)| *n < u64::from(wait.replicas))
            {
                return Err(RedisStoreError::ReplicaWait(format!(
                    "{node} has {connected} replicas in sync and the store waits for {}: \
                     every request would fail",
                    wait.replicas
                )));
            }
        }
        // The baseline of the eviction count.
        let evicted = eviction::evicted_per_node(&store.inner.connection)
            .await
            .map_err(RedisStoreError::Inspect)?;
        store.inner.note_evicted(evicted);
        if let Some(period) = self.watch_interval {
            eviction::spawn_watch(&store.inner, period);
        }
        Ok(store)
    }
}

impl RedisStore {
    /// A builder for a store on one Redis server, e.g. `redis://127.0.0.1:6379`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        Self::builder_for(Target::Single(url.into()))
    }

    /// A builder for a store on a Redis Cluster, given some of its nodes.
    pub fn cluster_builder<I, S>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder_for(Target::Cluster(nodes.into_iter().map(Into::into).collect()))
    }

    /// Connects to one Redis server with the defaults.
    pub async fn connect(url: impl Into<String>) -> Result<RedisStore, RedisStoreError> {
        Self::builder(url).build().await
    }

    /// Connects to a Redis Cluster with the defaults.
    pub async fn connect_cluster<I, S>(nodes: I) -> Result<RedisStore, RedisStoreError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::cluster_builder(nodes).build().await
    }

    fn builder_for(target: Target) -> RedisStoreBuilder {
        RedisStoreBuilder {
            target,
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
            tls_root_cert: None,
            allow_eviction: false,
            watch_interval: Some(Duration::from_secs(60)),
            replica_wait: None,
        }
    }
}

/// A plain client of the node at `url`, with the store's TLS roots (for a session of its own:
/// the store's settle notices).
fn node_client(url: &str, tls: Option<&TlsRoots>) -> Result<redis::Client, RedisStoreError> {
    match tls {
        #[cfg(feature = "tls")]
        Some(TlsRoots {
            root_cert: Some(root_cert),
        }) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root_cert.clone()),
            },
        ),
        _ => redis::Client::open(url),
    }
    .map_err(RedisStoreError::Connect)
}
