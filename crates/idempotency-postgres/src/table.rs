//! What both drivers share about the store's table: its settings, its rendered statements and
//! its state sentinel.

use crate::error::PostgresStoreError;
use crate::schema::{Statements, TableMode, TableName};
use crate::sentinel::Sentinel;
use std::sync::Arc;

/// The default table name (the ADR's).
pub const DEFAULT_TABLE: &str = "idempotency_keys";
/// The default pg_cron schedule of the purge job: hourly, as the ADR says.
pub const DEFAULT_PURGE_SCHEDULE: &str = "0 * * * *";

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
            watch: Arc::new(Sentinel::new(&name)),
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
    pub(crate) watch: Arc<Sentinel>,
}
