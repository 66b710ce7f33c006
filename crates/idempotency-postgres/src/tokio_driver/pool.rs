//! The store's connections on tokio-postgres: the deadpool pool built from a URL (TLS,
//! timeouts, asynchronous commit for `LoggedAsyncCommit`, the sentinel checked on every new
//! connection) or the application's own, and the check that the server is a writer.

use super::driver::TokioPostgres;
use super::listen::ListenTarget;
use super::options::{Source, TokioOptions};
use super::session::TokioSession;
use super::tls::{self, Connector};
use crate::error::PostgresStoreError;
use crate::schema::TableMode;
use crate::sentinel::Sentinel;
use crate::session::check_writer;
use deadpool_postgres::{Hook, Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// The driver on `options`' connections for a table in `mode` whose sentinel is `watch`:
/// builds the pool (for a URL), checks that the server is a writer and, for
/// [`TableMode::LoggedAsyncCommit`], that commits are asynchronous.
pub(crate) async fn connect(
    options: TokioOptions,
    mode: TableMode,
    watch: &Arc<Sentinel>,
) -> Result<TokioPostgres, PostgresStoreError> {
    let mut url_prepared = true;
    let mut listen_target = None;
    let pool = match options.source {
        Source::Pool(pool) => pool,
        Source::Url(url) => {
            let (url, tls) = tls::split(&url)?;
            url_prepared = tls.prepared_statements;
            let mut config =
                tokio_postgres::Config::from_str(&url).map_err(PostgresStoreError::InvalidUrl)?;
            if let Some(why) = tls.password_exposure(&config) {
                tracing::warn!("{why}");
            }
            config.ssl_mode(tls.tokio_postgres_mode());
            config.connect_timeout(options.connect_timeout);
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
            listen_target = Some(Arc::new(ListenTarget {
                config: config.clone(),
                connector: Connector::for_settings(&tls)?,
            }));
            let manager = match Connector::for_settings(&tls)? {
                Connector::Plain(tls) => Manager::from_config(config, tls, manager_config),
                #[cfg(feature = "tls")]
                Connector::Rustls(tls) => Manager::from_config(config, tls, manager_config),
            };
            // LIFO hands out the connection used last: at low concurrency every step
            // reuses one warm connection (and one warm backend process) instead of
            // rotating through the whole pool.
            let hook_watch = Arc::clone(watch);
            let hook_bound = setup_bound(options.connect_timeout);
            Pool::builder(manager)
                    .max_size(options.pool_size)
                    .queue_mode(QueueMode::Lifo)
                    // Every new connection checks the sentinel: after a crash every connection
                    // is new, so the first one notices that the table was emptied.
                    .post_create(Hook::async_fn(move |client, _| {
                        let watch = Arc::clone(&hook_watch);
                        Box::pin(async move {
                            // Before `migrate` the table does not exist yet: not a loss.
                            // Bounded from the server's side within the creation's own
                            // bound: a check the table's lock holds up ends on the server
                            // before the pool gives up on the connection (which it would then
                            // drop, its backend still waiting, and open another).
                            let session = &mut TokioSession(&**client);
                            if let Err(error) = watch.check_within(session, hook_bound).await {
                                tracing::debug!(error = %idempotency_core::ErrorChain(&error), "could not check the state sentinel");
                            }
                            Ok(())
                        })
                    }))
                    .runtime(Runtime::Tokio1)
                    .wait_timeout(Some(options.connect_timeout))
                    .create_timeout(Some(options.connect_timeout))
                    .build()
                    .map_err(PostgresStoreError::BuildPool)?
        }
    };
    let client = pool.get().await?;
    check_writer(&mut TokioSession(&**client), mode).await?;
    drop(client);
    let wait = pool.timeouts().wait.unwrap_or(options.connect_timeout);
    Ok(TokioPostgres {
        pool,
        prepared: Arc::new(AtomicBool::new(options.prepared_statements && url_prepared)),
        setup_bound: setup_bound(wait),
        listen_target,
    })
}

/// The server-side bound of what the store runs on a connection outside a request (the state
/// sentinel's check when a connection is made, and at each readiness probe): half of the
/// pool's own bound on making a connection, so the server gives up first.
pub(crate) fn setup_bound(connect_timeout: std::time::Duration) -> std::time::Duration {
    (connect_timeout / 2).max(std::time::Duration::from_millis(1))
}
