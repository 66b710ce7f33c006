//! Migrations: the numbered SQL files of `migrations/`, applied by one loop under an advisory
//! lock, and what [`PostgresStore::migrate`] reports.

use crate::error::PostgresStoreError;
use crate::schema::{self, TableMode, TableName};
use crate::store::PostgresStore;
use std::fmt;

/// One numbered migration: a file of `migrations/` whose placeholders the library fills in.
pub(crate) struct Migration {
    pub(crate) version: i32,
    pub(crate) name: &'static str,
    template: &'static str,
    /// Applied only where this extension is installed in the store's database.
    only_with_extension: Option<&'static str>,
}

/// Every migration, in order.
pub(crate) const MIGRATIONS: [Migration; 2] = [
    Migration {
        version: 1,
        name: "0001_create_idempotency_keys",
        template: include_str!("../../../migrations/0001_create_idempotency_keys.sql"),
        only_with_extension: None,
    },
    Migration {
        version: 2,
        name: "0002_schedule_purge_with_pg_cron",
        template: include_str!("../../../migrations/0002_schedule_purge_with_pg_cron.sql"),
        only_with_extension: Some("pg_cron"),
    },
];

impl Migration {
    /// The SQL for `name` in `mode`, the purge job on `purge_schedule`: the file without its
    /// whole-line comments (they describe the placeholders), headed by the file's name.
    pub(crate) fn render(&self, name: &TableName, mode: TableMode, purge_schedule: &str) -> String {
        let mut out = format!("-- migrations/{}.sql\n", self.name);
        for line in self.template.lines() {
            if !line.trim_start().starts_with("--") {
                out.push_str(line);
                out.push('\n');
            }
        }
        schema::fill_placeholders(&out, name, mode, purge_schedule)
    }
}

/// Every migration and the sentinel, as one script (for `migration_sql`).
pub(crate) fn render_all(name: &TableName, mode: TableMode, purge_schedule: &str) -> String {
    let mut out = String::new();
    for migration in &MIGRATIONS {
        if let Some(extension) = migration.only_with_extension {
            out.push_str(&format!(
                "\n-- Only where the {extension} extension is installed:\n"
            ));
        }
        out.push_str(&migration.render(name, mode, purge_schedule));
        if migration.version == 1 {
            out.push_str(
                "\n-- The state sentinel: a row that never expires, whose absence tells the store \
                 that the table was emptied.\n",
            );
            out.push_str(&schema::sentinel_sql(name));
            out.push_str(";\n");
        }
    }
    out
}

/// What [`PostgresStore::migrate`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrationReport {
    /// Migrations applied by this call (empty when the schema was up to date).
    pub applied: Vec<&'static str>,
    /// Whether the pg_cron purge job is scheduled.
    pub purge_job: PurgeJob,
}

/// The state of the pg_cron purge job.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PurgeJob {
    /// The job is scheduled in pg_cron.
    Scheduled {
        /// The job's name in `cron.job`.
        job_name: String,
        /// Its schedule.
        schedule: String,
    },
    /// pg_cron is not installed in this database: nothing was scheduled.
    PgCronUnavailable {
        /// The database the store is connected to.
        database: String,
    },
}

impl fmt::Display for MigrationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.applied.is_empty() {
            f.write_str("idempotency schema up to date")?;
        } else {
            write!(f, "applied migrations: {}", self.applied.join(", "))?;
        }
        match &self.purge_job {
            PurgeJob::Scheduled { job_name, schedule } => {
                write!(
                    f,
                    "; pg_cron job {job_name:?} purges expired keys on {schedule:?}"
                )
            }
            PurgeJob::PgCronUnavailable { database } => write!(
                f,
                "; pg_cron is not installed in database {database:?}, so no purge job was \
                 scheduled: call PostgresStore::purge_expired periodically (expired keys are \
                 already ignored on read; purging only reclaims space), or install pg_cron \
                 (shared_preload_libraries = 'pg_cron', CREATE EXTENSION pg_cron) and migrate again"
            ),
        }
    }
}

impl PostgresStore {
    /// Creates the table and index if missing, and schedules the pg_cron purge job where pg_cron
    /// is installed. Idempotent; runs in one transaction under an advisory lock, so several
    /// instances starting at once do not collide. Fails if the existing table's persistence
    /// differs from the configured mode.
    pub async fn migrate(&self) -> Result<MigrationReport, PostgresStoreError> {
        let name = &self.inner.name;
        let mut client = self.inner.pool.get().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1))",
            &[&format!(
                "idempotency-migrate:{}.{}",
                name.schema, name.table
            )],
        )
        .await?;
        let schema_exists: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
                &[&name.schema],
            )
            .await?
            .get(0);
        if !schema_exists {
            tx.batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {}",
                name.quoted_schema()
            ))
            .await?;
        }
        let migrations = name.migrations_table();
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {migrations} ( \
               version integer PRIMARY KEY, name text NOT NULL, \
               applied_at timestamptz NOT NULL DEFAULT now())"
        ))
        .await?;
        let applied_versions: Vec<i32> = tx
            .query(&format!("SELECT version FROM {migrations}"), &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let extensions: Vec<String> = tx
            .query("SELECT extname::text FROM pg_extension", &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let installed = |extension: &str| extensions.iter().any(|e| e == extension);
        let mut applied = Vec::new();
        let record = format!("INSERT INTO {migrations} (version, name) VALUES ($1, $2)");
        for migration in &MIGRATIONS {
            let wanted = migration.only_with_extension.is_none_or(installed);
            if wanted && !applied_versions.contains(&migration.version) {
                let sql = migration.render(name, self.inner.mode, &self.inner.purge_schedule);
                tx.batch_execute(&sql).await?;
                tx.execute(&record, &[&migration.version, &migration.name])
                    .await?;
                applied.push(migration.name);
            }
        }
        // A fresh table gets its sentinel here, so creating it is not reported as a loss.
        tx.query(&schema::sentinel_sql(name), &[]).await?;
        let found: i8 = tx
            .query_one(
                "SELECT c.relpersistence::\"char\" FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&name.schema, &name.table],
            )
            .await?
            .get(0);
        let found = if found as u8 == b'u' {
            "UNLOGGED"
        } else {
            "LOGGED"
        };
        if found != self.inner.mode.persistence_name() {
            return Err(PostgresStoreError::TableModeMismatch {
                table: name.qualified(),
                expected: self.inner.mode.persistence_name(),
                found,
            });
        }
        let purge_job = if installed("pg_cron") {
            PurgeJob::Scheduled {
                job_name: name.purge_job_name(),
                schedule: self.inner.purge_schedule.clone(),
            }
        } else {
            let database: String = tx.query_one("SELECT current_database()", &[]).await?.get(0);
            tracing::warn!(
                %database,
                "pg_cron is not installed: no purge job scheduled; call purge_expired periodically"
            );
            PurgeJob::PgCronUnavailable { database }
        };
        tx.commit().await?;
        Ok(MigrationReport { applied, purge_job })
    }
}
