//! Building a store: from a URL or an existing pool, with its table, mode and pool settings.

use super::session::TokioSession;
use super::store::{Inner, PostgresStore, TokioDriver};
use super::tls::{self, Connector};
use crate::error::PostgresStoreError;
use crate::schema::TableMode;
use crate::session::check_writer;
use crate::table::TableSettings;
use deadpool_postgres::{Hook, Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Where the store's connections come from.
enum Source {
    Url(String),
    Pool(Pool),
}

/// Builds a [`PostgresStore`].
pub struct PostgresStoreBuilder {
    source: Source,
    table: TableSettings,
    pool_size: usize,
    connect_timeout: Duration,
    transactions: bool,
    prepared_statements: bool,
}

impl fmt::Debug for PostgresStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStoreBuilder")
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .finish_non_exhaustive()
    }
}

impl PostgresStoreBuilder {
    crate::table::table_setters!();

    fn new(source: Source) -> Self {
        PostgresStoreBuilder {
            source,
            table: TableSettings::default(),
            pool_size: 16,
            connect_timeout: Duration::from_secs(5),
            transactions: true,
            prepared_statements: true,
        }
    }

    /// Whether the store's statements are prepared once per connection (default true, the
    /// fastest). Turn it off behind a connection pooler in transaction mode (PgBouncer,
    /// RDS Proxy): statements are then sent unnamed with their parameter types, still one round
    /// trip each, and nothing outlives a transaction on the server connection the pooler lent.
    /// The URL parameter `prepared_statements=false` does the same. (Your own statements must
    /// follow the same rule: `query_typed` / `execute_typed`, never `prepare_cached`.)
    pub fn prepared_statements(mut self, prepared: bool) -> Self {
        self.prepared_statements = prepared;
        self
    }

    /// Whether handlers are offered a transaction in which their writes commit together with
    /// the stored response ([`PgTransaction`](crate::PgTransaction); default true). Off, every request is completed
    /// on its own statement, as with the other stores.
    pub fn transactions(mut self, offer: bool) -> Self {
        self.transactions = offer;
        self
    }

    /// Connections in the pool built from a URL (default 16). Size it by the database server's
    /// cores, not by your request concurrency: about 2-4 connections per core, shared by any
    /// number of concurrent requests. On a 2-core server, 64 concurrent clients did best on 8
    /// connections and 0.71x as well on 64 (`docs/benchmarks.md`, "PostgreSQL with many
    /// clients").
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// Bound on connecting and on waiting for a pooled connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Builds the pool (for a URL), checks that the server is a writer and, for
    /// [`TableMode::LoggedAsyncCommit`], that commits are asynchronous.
    pub async fn build(self) -> Result<PostgresStore, PostgresStoreError> {
        let table = self.table.table()?;
        let mode = table.mode;
        let mut url_prepared = true;
        let pool = match self.source {
            Source::Pool(pool) => pool,
            Source::Url(url) => {
                let (url, tls) = tls::split(&url)?;
                url_prepared = tls.prepared_statements;
                let mut config = tokio_postgres::Config::from_str(&url)
                    .map_err(PostgresStoreError::InvalidUrl)?;
                if let Some(why) = tls.password_exposure(&config) {
                    tracing::warn!("{why}");
                }
                config.ssl_mode(tls.tokio_postgres_mode());
                config.connect_timeout(self.connect_timeout);
                if mode == TableMode::LoggedAsyncCommit {
                    let options = match config.get_options() {
                        Some(existing) => format!("{existing} -c synchronous_commit=off"),
                        None => "-c synchronous_commit=off".to_owned(),
                    };
                    config.options(&options);
                }
                let manager_config = ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                };
                let manager = match Connector::for_settings(&tls)? {
                    Connector::Plain(tls) => Manager::from_config(config, tls, manager_config),
                    #[cfg(feature = "tls")]
                    Connector::Rustls(tls) => Manager::from_config(config, tls, manager_config),
                };
                // LIFO hands out the connection used last: at low concurrency every step
                // reuses one warm connection (and one warm backend process) instead of
                // rotating through the whole pool.
                let hook_watch = Arc::clone(&table.watch);
                Pool::builder(manager)
                    .max_size(self.pool_size)
                    .queue_mode(QueueMode::Lifo)
                    // Every new connection checks the sentinel: after a crash every connection
                    // is new, so the first one notices that the table was emptied.
                    .post_create(Hook::async_fn(move |client, _| {
                        let watch = Arc::clone(&hook_watch);
                        Box::pin(async move {
                            // Before `migrate` the table does not exist yet: not a loss.
                            if let Err(error) = watch.check(&mut TokioSession(&**client)).await {
                                tracing::debug!(error = %idempotency_core::ErrorChain(&error), "could not check the state sentinel");
                            }
                            Ok(())
                        })
                    }))
                    .runtime(Runtime::Tokio1)
                    .wait_timeout(Some(self.connect_timeout))
                    .create_timeout(Some(self.connect_timeout))
                    .build()
                    .map_err(PostgresStoreError::BuildPool)?
            }
        };
        let client = pool.get().await?;
        check_writer(&mut TokioSession(&**client), mode).await?;
        drop(client);
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                table,
                driver: TokioDriver {
                    pool,
                    prepared: Arc::new(std::sync::atomic::AtomicBool::new(
                        self.prepared_statements && url_prepared,
                    )),
                },
                transactions: self.transactions,
            }),
        })
    }
}

impl PostgresStore {
    /// A builder for a store that makes its own pool from a `postgres://` URL.
    pub fn builder(url: impl Into<String>) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(Source::Url(url.into()))
    }

    /// A builder for a store on a pool the application already has. For
    /// [`TableMode::LoggedAsyncCommit`], its connections must run with
    /// `synchronous_commit = off`.
    pub fn builder_from_pool(pool: Pool) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(Source::Pool(pool))
    }

    /// Connects to `url` with the defaults (table `public.idempotency_keys`, LOGGED, 16
    /// connections). Runs no DDL: create the table with [`PostgresStore::migrate`].
    pub async fn connect(url: impl Into<String>) -> Result<PostgresStore, PostgresStoreError> {
        Self::builder(url).build().await
    }
}
