//! Migrations: the numbered SQL files of `migrations/`, applied by one loop under an advisory
//! lock, and what `PostgresStore::migrate` reports.

use crate::error::PostgresStoreError;
use crate::schema::{self, TableMode, TableName};
use crate::session::SetupSession;
use crate::table::{Table, TableSettings};
use std::fmt;

/// One numbered migration. Its SQL is a template (`sql/`, the schema's one source) with
/// placeholders the library fills in for the configured schema, table and mode; filled in for
/// the defaults (`public.idempotency_keys`, LOGGED) it is, byte for byte, the file of the same
/// name in `migrations/`, which teams that run their own migration tool apply as it is (a test
/// keeps the rendering and the files identical; the workspace's `migrations/` is the crate's,
/// through a symbolic link). Each records
/// itself in `<table>_migrations`, so the library and a hand-run migration see the same history.
pub(crate) struct Migration {
    pub(crate) version: i32,
    pub(crate) name: &'static str,
    template: &'static str,
    /// Applied only where this extension is installed in the store's database.
    only_with_extension: Option<&'static str>,
}

/// Every migration, in order.
pub(crate) const MIGRATIONS: [Migration; 4] = [
    Migration {
        version: 1,
        name: "0001_create_idempotency_keys",
        template: CREATE_TABLE,
        only_with_extension: None,
    },
    Migration {
        version: 2,
        name: "0002_schedule_purge_with_pg_cron",
        template: SCHEDULE_PURGE,
        only_with_extension: Some("pg_cron"),
    },
    Migration {
        version: 3,
        name: "0003_tune_autovacuum",
        template: TUNE_AUTOVACUUM,
        only_with_extension: None,
    },
    Migration {
        version: 4,
        name: "0004_wake_waiting_duplicates",
        template: WAKE_WAITING_DUPLICATES,
        only_with_extension: None,
    },
];

const CREATE_TABLE: &str = include_str!("../sql/0001_create_idempotency_keys.sql");

const SCHEDULE_PURGE: &str = include_str!("../sql/0002_schedule_purge_with_pg_cron.sql");

const TUNE_AUTOVACUUM: &str = include_str!("../sql/0003_tune_autovacuum.sql");

const WAKE_WAITING_DUPLICATES: &str = include_str!("../sql/0004_wake_waiting_duplicates.sql");

impl Migration {
    /// The SQL for `name` in `mode`, the purge job on `purge_schedule`.
    pub(crate) fn render(&self, name: &TableName, mode: TableMode, purge_schedule: &str) -> String {
        schema::fill_placeholders(self.template, name, mode, purge_schedule)
    }

    /// The file of this migration in the crate's `migrations/` folder.
    pub(crate) fn file_name(&self) -> String {
        format!("{}.sql", self.name)
    }
}

/// Every migration as one script (for `migration_sql`).
pub(crate) fn render_all(name: &TableName, mode: TableMode, purge_schedule: &str) -> String {
    let mut out = String::new();
    if name.schema != "public" {
        out.push_str(&format!(
            "CREATE SCHEMA IF NOT EXISTS {};\n\n",
            name.quoted_schema()
        ));
    }
    for migration in &MIGRATIONS {
        out.push_str(&format!("-- migrations/{}\n", migration.file_name()));
        out.push_str(&migration.render(name, mode, purge_schedule));
        out.push('\n');
    }
    out
}

/// What `PostgresStore::migrate` did.
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
                 scheduled: spawn idempotency::purge_periodically(&store, ..) or run \
                 `idempotency purge` from cron (expired keys are already ignored on read; \
                 purging only reclaims space), or install pg_cron \
                 (shared_preload_libraries = 'pg_cron', CREATE EXTENSION pg_cron) and migrate again"
            ),
        }
    }
}

/// The migration policy, the same for both drivers: run inside a transaction the caller opened
/// on `session` and commits afterwards.
pub(crate) async fn migrate_in(
    session: &mut dyn SetupSession,
    table: &Table,
) -> Result<MigrationReport, PostgresStoreError> {
    let name = &table.name;
    let lock = format!("idempotency-migrate:{}.{}", name.schema, name.table);
    session
        .rows(
            "SELECT ''::text FROM pg_advisory_xact_lock(hashtext($1))",
            &[&lock],
        )
        .await?;
    let schema_exists = session
        .flag(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)::text",
            &[&name.schema],
        )
        .await?;
    if !schema_exists {
        session
            .batch(&format!(
                "CREATE SCHEMA IF NOT EXISTS {}",
                name.quoted_schema()
            ))
            .await?;
    }
    let migrations = name.migrations_table();
    let history = session
        .flag("SELECT (to_regclass($1) IS NOT NULL)::text", &[&migrations])
        .await?;
    let applied_versions: Vec<i32> = if history {
        session
            .rows(&format!("SELECT version::text FROM {migrations}"), &[])
            .await?
            .into_iter()
            .filter_map(|row| row.into_iter().next().flatten()?.parse().ok())
            .collect()
    } else {
        Vec::new()
    };
    let extensions: Vec<String> = session
        .rows("SELECT extname::text FROM pg_extension", &[])
        .await?
        .into_iter()
        .filter_map(|row| row.into_iter().next().flatten())
        .collect();
    let installed = |extension: &str| extensions.iter().any(|e| e == extension);
    let mut applied = Vec::new();
    for migration in &MIGRATIONS {
        let wanted = migration.only_with_extension.is_none_or(installed);
        if wanted && !applied_versions.contains(&migration.version) {
            // Each migration records itself (and 0001 plants the sentinel, so a fresh table
            // is not reported as lost).
            let sql = migration.render(name, table.mode, &table.purge_schedule);
            session.batch(&sql).await?;
            applied.push(migration.name);
        }
    }
    let found = session
        .first(
            "SELECT c.relpersistence::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&name.schema, &name.table],
        )
        .await?;
    let found = if found.as_deref() == Some("u") {
        "UNLOGGED"
    } else {
        "LOGGED"
    };
    if found != table.mode.persistence_name() {
        if !table.mode_chosen && found == "UNLOGGED" {
            // Made by a version whose default was UNLOGGED, and nobody chose a mode since:
            // rewriting a live table is the operator's call, not a side effect of starting up.
            tracing::warn!(
                table = %name.qualified(),
                "the key table is UNLOGGED (the default of earlier versions): kept as it is, so a \
                 database crash or failover loses its keys and their retries run again; \
                 `ALTER TABLE {} SET LOGGED` makes it durable (a rewrite under an exclusive \
                 lock), or choose TableMode::Unlogged to keep it and silence this",
                name.qualified()
            );
        } else {
            return Err(PostgresStoreError::TableModeMismatch {
                table: name.qualified(),
                expected: table.mode.persistence_name(),
                found,
            });
        }
    }
    let purge_job = if installed("pg_cron") {
        // The job as cron.job has it: someone may have unscheduled it, or the configured
        // schedule may have changed since it was scheduled. Put it (back) as configured.
        let job_name = name.purge_job_name();
        let current = session
            .first(
                "SELECT schedule::text FROM cron.job WHERE jobname = $1",
                &[&job_name],
            )
            .await?;
        if current.as_deref() != Some(table.purge_schedule.as_str()) {
            session
                .rows(
                    "SELECT cron.schedule($1, $2, $3)::text",
                    &[&job_name, &table.purge_schedule, &name.purge_all_sql()],
                )
                .await?;
            tracing::info!(
                job = %job_name,
                from = ?current,
                to = %table.purge_schedule,
                "scheduled the pg_cron purge job as configured"
            );
            applied.push("pg_cron purge schedule");
        }
        PurgeJob::Scheduled {
            job_name,
            schedule: table.purge_schedule.clone(),
        }
    } else {
        let database = session
            .first("SELECT current_database()::text", &[])
            .await?
            .unwrap_or_default();
        tracing::warn!(
            %database,
            "pg_cron is not installed: no purge job scheduled; spawn purge_periodically (or run `idempotency purge` from cron)"
        );
        PurgeJob::PgCronUnavailable { database }
    };
    Ok(MigrationReport { applied, purge_job })
}

/// Every migration as one script for `settings`, for teams that run their own migration tool.
pub(crate) fn migration_sql(settings: &TableSettings) -> Result<String, PostgresStoreError> {
    let (name, mode, schedule) = settings.validated()?;
    Ok(render_all(&name, mode, schedule))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DEFAULT_PURGE_SCHEDULE, DEFAULT_TABLE};

    fn defaults() -> TableName {
        TableName::new("public", DEFAULT_TABLE).unwrap()
    }

    /// The files in `migrations/` are the library's rendering of the defaults, byte for byte:
    /// what `psql -f` applies is what `migrate()` applies. After changing a template, run this
    /// test with `IDEMPOTENCY_BLESS=1` to rewrite the files (the crate's and the top-level copy).
    #[test]
    fn the_plain_files_are_the_rendered_defaults() {
        let crate_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = crate_dir.join("migrations");
        if std::env::var_os("IDEMPOTENCY_BLESS").is_some() {
            for migration in &MIGRATIONS {
                let sql =
                    migration.render(&defaults(), TableMode::default(), DEFAULT_PURGE_SCHEDULE);
                for folder in [dir.clone(), crate_dir.join("../../migrations")] {
                    std::fs::create_dir_all(&folder).unwrap();
                    std::fs::write(folder.join(migration.file_name()), &sql).unwrap();
                }
            }
        }
        for migration in &MIGRATIONS {
            let path = dir.join(migration.file_name());
            let file = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let rendered =
                migration.render(&defaults(), TableMode::default(), DEFAULT_PURGE_SCHEDULE);
            assert_eq!(
                file,
                rendered,
                "{} differs from the library's rendering",
                path.display()
            );
        }
    }

    /// The workspace's top-level `migrations/` is the crate's folder itself (a symbolic link),
    /// not a copy.
    #[test]
    fn the_top_level_migrations_are_the_crate_s() {
        let crate_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let ours = crate_dir.join("migrations").canonicalize().unwrap();
        let top = crate_dir.join("../../migrations");
        let theirs = top
            .canonicalize()
            .unwrap_or_else(|e| panic!("{}: {e}", top.display()));
        assert_eq!(
            ours,
            theirs,
            "{} is not the crate's migrations/",
            top.display()
        );
    }

    #[test]
    fn custom_names_and_modes_fill_every_placeholder() {
        let name = TableName::new("app", "keys").unwrap();
        for mode in [TableMode::Unlogged, TableMode::Logged] {
            let sql = render_all(&name, mode, "*/5 * * * *");
            assert!(
                !sql.contains('{') || sql.contains("{\""),
                "unfilled placeholder in {sql}"
            );
            assert!(sql.contains("\"app\".\"keys\""));
            assert!(sql.contains("\"app\".\"keys_migrations\""));
            assert_eq!(
                sql.contains("CREATE UNLOGGED TABLE"),
                mode == TableMode::Unlogged
            );
            assert!(sql.contains("'*/5 * * * *'"));
        }
    }
}
