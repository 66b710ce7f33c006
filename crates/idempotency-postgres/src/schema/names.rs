//! Table names and table modes: validated identifiers, quoting, and the migration templates'
//! placeholders filled for one table.

use crate::error::PostgresStoreError;
use std::str::FromStr;

/// How the table is persisted.
///
/// The ADR chose UNLOGGED; measured end to end it buys nothing once the key's completion rides
/// the handler's commit (`docs/benchmarks.md`, "Through HTTP on PostgreSQL": LOGGED and
/// UNLOGGED within noise of each other in the one-transaction mode, about 530 more WAL bytes
/// per request), while UNLOGGED loses every key on a crash and on a failover. So the default is
/// [`Logged`](TableMode::Logged). A store left at the default keeps an existing UNLOGGED table
/// (made by a version whose default it was) with a warning; choosing a mode explicitly makes
/// `migrate()` refuse a table persisted otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TableMode {
    /// `CREATE UNLOGGED TABLE` (the ADR's choice): no WAL for the key rows, but the table is
    /// emptied by a crash or immediate shutdown and cannot be read on a standby.
    Unlogged,
    /// An ordinary table (the default): every completed record survives a crash once its commit
    /// returned, and is on the standbys.
    #[default]
    Logged,
    /// An ordinary table written with `synchronous_commit = off` on the store's connections, for
    /// the lease mode: a claim that stands alone commits without waiting for its WAL flush, so
    /// a crash can take back the last few hundred milliseconds of claims (their keys are then
    /// free, with nothing written under them), but nothing older. A request's transaction (the
    /// handler's writes and the stored response) turns `synchronous_commit` back on for itself,
    /// so what a client was answered for survives a crash, as with `Logged`. Replicated to
    /// standbys.
    LoggedAsyncCommit,
}

impl TableMode {
    pub(crate) fn persistence_keyword(self) -> &'static str {
        match self {
            TableMode::Unlogged => "UNLOGGED",
            TableMode::Logged | TableMode::LoggedAsyncCommit => "",
        }
    }

    pub(crate) fn persistence_name(self) -> &'static str {
        match self {
            TableMode::Unlogged => "UNLOGGED",
            TableMode::Logged | TableMode::LoggedAsyncCommit => "LOGGED",
        }
    }

    /// The mode's name, as [`Display`](std::fmt::Display) writes it and [`FromStr`] reads it
    /// (for configuration and logs): `unlogged`, `logged`, `logged_async_commit`. Safe inside an
    /// SQL identifier.
    pub fn name(self) -> &'static str {
        match self {
            TableMode::Unlogged => "unlogged",
            TableMode::Logged => "logged",
            TableMode::LoggedAsyncCommit => "logged_async_commit",
        }
    }
}

impl std::fmt::Display for TableMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Reads a mode from configuration: `unlogged`, `logged`, `logged_async_commit` (or
/// `logged-async-commit`), in any case.
///
/// ```
/// use idempotency_postgres::TableMode;
///
/// assert_eq!("logged".parse::<TableMode>().unwrap(), TableMode::Logged);
/// assert_eq!("Logged-Async-Commit".parse::<TableMode>().unwrap(), TableMode::LoggedAsyncCommit);
/// assert!("fast".parse::<TableMode>().is_err());
/// ```
impl FromStr for TableMode {
    type Err = PostgresStoreError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let name = text.trim().to_ascii_lowercase().replace('-', "_");
        [
            TableMode::Unlogged,
            TableMode::Logged,
            TableMode::LoggedAsyncCommit,
        ]
        .into_iter()
        .find(|mode| mode.name() == name)
        .ok_or_else(|| PostgresStoreError::UnknownTableMode(text.to_owned()))
    }
}

/// A validated, quoted schema-qualified table name.
#[derive(Clone, Debug)]
pub(crate) struct TableName {
    pub(crate) schema: String,
    pub(crate) table: String,
}

pub(crate) fn validate_identifier(
    what: &'static str,
    name: &str,
) -> Result<(), PostgresStoreError> {
    let ok = !name.is_empty()
        && name.len() <= 48
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(PostgresStoreError::InvalidIdentifier {
            what,
            name: name.to_owned(),
        })
    }
}

fn quote(ident: &str) -> String {
    // Identifiers are validated to letters, digits and underscores, so quoting cannot be escaped.
    format!("\"{ident}\"")
}

fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

impl TableName {
    pub(crate) fn new(schema: &str, table: &str) -> Result<Self, PostgresStoreError> {
        validate_identifier("schema", schema)?;
        validate_identifier("table", table)?;
        Ok(TableName {
            schema: schema.to_owned(),
            table: table.to_owned(),
        })
    }

    /// `"schema"."table"`
    pub(crate) fn qualified(&self) -> String {
        format!("{}.{}", quote(&self.schema), quote(&self.table))
    }

    pub(crate) fn migrations_table(&self) -> String {
        format!(
            "{}.{}",
            quote(&self.schema),
            quote(&format!("{}_migrations", self.table))
        )
    }

    pub(crate) fn quoted_schema(&self) -> String {
        quote(&self.schema)
    }

    pub(crate) fn purge_job_name(&self) -> String {
        format!("idempotency-purge:{}.{}", self.schema, self.table)
    }

    pub(crate) fn purge_all_sql(&self) -> String {
        format!("DELETE FROM {} WHERE expires_at <= now()", self.qualified())
    }
}

/// Fills the placeholders of a migration: `{table}`, `{migrations}`, `{expires_idx}` (quoted,
/// schema-qualified names), `{persistence}` (`UNLOGGED ` or nothing), `{mode}` (for comments),
/// and `{job_name}`, `{schedule}`, `{purge_command}` (SQL string literals of the pg_cron job).
pub(crate) fn fill_placeholders(
    sql: &str,
    name: &TableName,
    mode: TableMode,
    purge_schedule: &str,
) -> String {
    let persistence = match mode.persistence_keyword() {
        "" => String::new(),
        keyword => format!("{keyword} "),
    };
    sql.replace("{persistence}", &persistence)
        .replace("{mode}", mode.persistence_name())
        .replace("{migrations}", &name.migrations_table())
        .replace("{table}", &name.qualified())
        .replace(
            "{expires_idx}",
            &quote(&format!("{}_expires_at_idx", name.table)),
        )
        .replace("{job_name}", &literal(&name.purge_job_name()))
        .replace("{schedule}", &literal(purge_schedule))
        .replace("{purge_command}", &literal(&name.purge_all_sql()))
}

/// Inserts the sentinel row if it is missing; returns a row only when it was missing. Its scope
/// starts with a control character (\x01), which `Scope::new` refuses, so no caller's record can
/// share its address; it never expires, so purges keep it.
pub(crate) fn sentinel_sql(name: &TableName) -> String {
    format!(
        "INSERT INTO {} (user_id, key, request_hash, status_code, response, expires_at) \
         VALUES (E'\\x01idempotency-state', 'sentinel', '\\x00'::bytea, 0, '\\x'::bytea, 'infinity') \
         ON CONFLICT (user_id, key) DO NOTHING RETURNING 'lost'::text",
        name.qualified()
    )
}
