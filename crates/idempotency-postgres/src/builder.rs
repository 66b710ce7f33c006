//! Building a store: the settings every driver shares (the table, its mode, the purge schedule,
//! whether transactions are offered), once for both; what only one driver takes (a URL and pool
//! settings, or an sqlx pool) and `build` are in `tokio_store.rs` and `sqlx_store.rs`.

use crate::driver::Driver;
use crate::error::PostgresStoreError;
use crate::flavour::defaults_to_tokio_postgres;
use crate::schema::TableMode;
use crate::table::TableSettings;
use std::fmt;

defaults_to_tokio_postgres! {
/// Builds a [`PostgresStore<D>`](crate::PostgresStore): `PostgresStore::builder(url)` (or
/// `builder_from_pool`) for tokio-postgres, `PostgresStore::builder_from_sqlx_pool(pool)` for
/// sqlx.
pub struct PostgresStoreBuilder<D: Driver> {
    pub(crate) table: TableSettings,
    pub(crate) transactions: bool,
    /// What only this driver takes.
    pub(crate) options: D::Options,
}
}

impl<D: Driver> fmt::Debug for PostgresStoreBuilder<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStoreBuilder")
            .field("driver", &std::any::type_name::<D>())
            .field("table", &self.table)
            .field("transactions", &self.transactions)
            .finish_non_exhaustive()
    }
}

impl<D: Driver> PostgresStoreBuilder<D> {
    /// A builder with the default table, mode and schedule, transactions on.
    pub(crate) fn with_options(options: D::Options) -> Self {
        PostgresStoreBuilder {
            table: TableSettings::default(),
            transactions: true,
            options,
        }
    }

    /// The schema of the table (default `public`). Letters, digits and underscores.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.table.schema = schema.into();
        self
    }

    /// The table name (default `idempotency_keys`). Letters, digits and underscores.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table.table = table.into();
        self
    }

    /// LOGGED (default), UNLOGGED, or LOGGED with asynchronous commit. Left at the default, an
    /// existing UNLOGGED table is kept with a warning; chosen here, `migrate()` refuses a table
    /// persisted otherwise.
    pub fn table_mode(mut self, mode: TableMode) -> Self {
        self.table.mode = mode;
        self.table.mode_chosen = true;
        self
    }

    /// The pg_cron schedule the store's `migrate()` gives the purge job (default hourly,
    /// `0 * * * *`).
    pub fn purge_schedule(mut self, schedule: impl Into<String>) -> Self {
        self.table.purge_schedule = schedule.into();
        self
    }

    /// Whether handlers are offered a transaction in which their writes commit together with
    /// the stored response ([`PostgresTransaction`](crate::PostgresTransaction); default true). Off, every
    /// request is completed on its own statement, as with the other stores.
    pub fn transactions(mut self, offer: bool) -> Self {
        self.transactions = offer;
        self
    }

    /// The SQL the store's `migrate()` would apply (the same on both drivers), for teams that
    /// run their own migration tool. It does not connect.
    pub fn migration_sql(&self) -> Result<String, PostgresStoreError> {
        crate::migrate::migration_sql(&self.table)
    }
}
