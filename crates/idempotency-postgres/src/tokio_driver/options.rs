//! What the store's builder takes for tokio-postgres only: where connections come from, and the
//! pool's settings.

use deadpool_postgres::Pool;
use std::time::Duration;

/// Where the store's connections come from.
pub(crate) enum Source {
    /// A URL: the store builds its pool.
    Url(String),
    /// The application's pool.
    Pool(Pool),
}

/// What the builder takes for tokio-postgres only.
pub struct TokioOptions {
    pub(crate) source: Source,
    pub(crate) pool_size: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) prepared_statements: bool,
}

impl std::fmt::Debug for TokioOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may hold a password.
        f.debug_struct("TokioOptions")
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("prepared_statements", &self.prepared_statements)
            .finish_non_exhaustive()
    }
}

impl TokioOptions {
    /// The defaults for connections from `source`: 8 connections (the pool size measured best
    /// on hot rows and about even with 16 without them, `docs/benchmarks.md`), 5 s to connect,
    /// prepared statements.
    pub(crate) fn new(source: Source) -> Self {
        TokioOptions {
            source,
            pool_size: 8,
            connect_timeout: Duration::from_secs(5),
            prepared_statements: true,
        }
    }
}
