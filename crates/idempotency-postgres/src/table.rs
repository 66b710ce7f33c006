//! What both drivers share about the store's table: its settings, its rendered statements, its
//! state sentinel, and how a record is read back from the columns every read selects.

use crate::error::{BACKEND, PostgresStoreError};
use crate::schema::{Statements, TableMode, TableName};
use crate::state::StateWatch;
use crate::{DEFAULT_PURGE_SCHEDULE, DEFAULT_TABLE};
use bytes::Bytes;
use idempotency_core::{
    CorruptRecord, Fingerprint, Record, RecordState, StoreError, StoredResponse,
};
use std::sync::Arc;
use std::time::Duration;

/// The table a store was configured with, before it is validated.
#[derive(Clone, Debug)]
pub(crate) struct TableSettings {
    pub(crate) schema: String,
    pub(crate) table: String,
    pub(crate) mode: TableMode,
    /// The mode was chosen with `table_mode` (not left at the default).
    pub(crate) mode_chosen: bool,
    pub(crate) purge_schedule: String,
}

impl Default for TableSettings {
    fn default() -> Self {
        TableSettings {
            schema: "public".to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            mode: TableMode::default(),
            mode_chosen: false,
            purge_schedule: DEFAULT_PURGE_SCHEDULE.to_owned(),
        }
    }
}

impl TableSettings {
    /// Validates the names and the schedule and renders the statements.
    pub(crate) fn table(&self) -> Result<Table, PostgresStoreError> {
        let name = TableName::new(&self.schema, &self.table)?;
        validate_schedule(&self.purge_schedule)?;
        Ok(Table {
            watch: Arc::new(StateWatch::new(&name)),
            statements: Statements::new(&name, self.mode),
            name,
            mode: self.mode,
            mode_chosen: self.mode_chosen,
            purge_schedule: self.purge_schedule.clone(),
        })
    }

    /// The validated name, the mode and the schedule (what the migrations are rendered with).
    pub(crate) fn validated(&self) -> Result<(TableName, TableMode, &str), PostgresStoreError> {
        let name = TableName::new(&self.schema, &self.table)?;
        validate_schedule(&self.purge_schedule)?;
        Ok((name, self.mode, &self.purge_schedule))
    }
}

/// The builder methods that name and shape the table, and render its migrations, the same on
/// both drivers' builders
/// (each has a `table: TableSettings` field); called inside their `impl` blocks.
macro_rules! table_setters {
    () => {
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

        /// LOGGED (default), UNLOGGED, or LOGGED with asynchronous commit. Left at the
        /// default, an existing UNLOGGED table is kept with a warning; chosen here, `migrate()`
        /// refuses a table persisted otherwise.
        pub fn table_mode(mut self, mode: $crate::TableMode) -> Self {
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

        /// The SQL the store's `migrate()` would apply (the same on both drivers), for teams
        /// that run their own migration tool. It does not connect.
        pub fn migration_sql(&self) -> Result<String, $crate::PostgresStoreError> {
            $crate::migrate::migration_sql(&self.table)
        }
    };
}

pub(crate) use table_setters;

/// A pg_cron schedule goes into a dollar-quoted block of the migration: refuse what could end it.
fn validate_schedule(schedule: &str) -> Result<(), PostgresStoreError> {
    if schedule.is_empty()
        || schedule.contains(['$', ';'])
        || schedule.chars().any(char::is_control)
    {
        return Err(PostgresStoreError::InvalidPurgeSchedule(
            schedule.to_owned(),
        ));
    }
    Ok(())
}

/// A validated table: the same for the tokio-postgres and the sqlx flavour of the store.
#[derive(Debug)]
pub(crate) struct Table {
    pub(crate) name: TableName,
    pub(crate) mode: TableMode,
    /// The mode was chosen, not left at the default.
    pub(crate) mode_chosen: bool,
    /// The SQL text of every step, which both drivers send as it is.
    pub(crate) statements: Statements,
    pub(crate) purge_schedule: String,
    pub(crate) watch: Arc<StateWatch>,
}

/// A record's columns, in the order the statements select them (`RECORD_COLUMNS`), as either
/// driver read them.
pub(crate) struct RecordColumns<'a> {
    pub(crate) request_hash: &'a [u8],
    pub(crate) in_flight: bool,
    /// The lease left while in flight, the retention left once completed.
    pub(crate) remaining_ms: i64,
    pub(crate) response: Option<Vec<u8>>,
}

/// A column that could not be read as its type.
pub(crate) fn corrupt_field(what: &'static str) -> StoreError {
    StoreError::corrupt(BACKEND, CorruptRecord::Field(what))
}

impl RecordColumns<'_> {
    /// The record these columns hold.
    pub(crate) fn into_record(self) -> Result<Record, StoreError> {
        let fingerprint = Fingerprint::from_bytes(self.request_hash)
            .map_err(|e| StoreError::corrupt(BACKEND, e))?;
        let remaining = Duration::from_millis(self.remaining_ms.max(0) as u64);
        let state = match (self.in_flight, self.response) {
            (true, None) => RecordState::InFlight {
                lease_remaining: remaining,
            },
            (false, Some(bytes)) => RecordState::Completed {
                response: StoredResponse::decode(Bytes::from(bytes))
                    .map_err(|e| StoreError::corrupt(BACKEND, e))?,
                retention_remaining: remaining,
            },
            _ => {
                return Err(corrupt_field("a row must be either in flight or completed"));
            }
        };
        Ok(Record { fingerprint, state })
    }
}
