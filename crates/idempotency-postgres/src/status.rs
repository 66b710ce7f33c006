//! What the server and the table look like now: for `idempotency check`, health checks, and
//! operators.

use crate::error::PostgresStoreError;
use crate::migrate::MIGRATIONS;
use crate::session::SetupSession;
use crate::table::Table;
use idempotency_core::{IdempotencyKey, Scope};
use std::fmt;

mod contents;
mod runs;

pub use contents::TableContents;
use contents::read_contents;
pub use runs::PurgeRun;
use runs::read_purge_runs;

/// The state of the store's table and its surroundings, read by `status()` on either store.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStatus {
    /// `SELECT version()`.
    pub server_version: String,
    /// The database connected to.
    pub database: String,
    /// The quoted, schema-qualified table name.
    pub table: String,
    /// The table's persistence as found (`UNLOGGED` / `LOGGED`), or `None` when it does not exist.
    pub persistence: Option<&'static str>,
    /// The persistence the store is configured for.
    pub expected_persistence: &'static str,
    /// Whether that persistence was chosen (`table_mode`) rather than left at the default: a
    /// store left at the default accepts an existing UNLOGGED table.
    pub persistence_chosen: bool,
    /// Migrations recorded as applied.
    pub applied: Vec<i32>,
    /// Migrations not applied yet (the pg_cron one only where pg_cron is installed).
    pub pending: Vec<&'static str>,
    /// The pg_cron purge job as found in `cron.job`.
    pub purge: PurgeStatus,
    /// The schedule the store is configured to give the purge job.
    pub expected_schedule: String,
    /// What the table holds now, when it exists.
    pub contents: Option<TableContents>,
    /// The pg_cron purge job's last runs, newest first (at most five, from
    /// `cron.job_run_details`); empty without pg_cron or before its first run.
    pub purge_runs: Vec<PurgeRun>,
}

/// The pg_cron purge job, as `cron.job` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PurgeStatus {
    /// pg_cron is not installed in this database: purge with `purge_periodically` (or
    /// `idempotency purge`) instead.
    PgCronNotInstalled,
    /// pg_cron is installed but no job of this name exists (never scheduled, or unscheduled).
    Missing {
        /// The job's expected name.
        job_name: String,
    },
    /// The job exists.
    Scheduled {
        /// Its name.
        job_name: String,
        /// Its schedule in `cron.job`.
        schedule: String,
        /// Whether it is active.
        active: bool,
    },
}

impl StoreStatus {
    /// What is wrong, as sentences an operator can act on; empty when nothing is.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        match self.persistence {
            None => problems.push(format!(
                "table {} does not exist: run `idempotency migrate` (or the SQL of migrations/)",
                self.table
            )),
            Some("UNLOGGED")
                if !self.persistence_chosen && self.expected_persistence != "UNLOGGED" =>
            {
                problems.push(format!(
                    "table {table} is UNLOGGED (the default of earlier versions): a database crash \
                     or failover empties it and the retries of its keys run again; \
                     `ALTER TABLE {table} SET LOGGED` makes it durable, or choose \
                     TableMode::Unlogged to keep it",
                    table = self.table
                ))
            }
            Some(found) if found != self.expected_persistence => problems.push(format!(
                "table {} is {found}, but the store is configured for {}",
                self.table, self.expected_persistence
            )),
            Some(_) => {}
        }
        if !self.pending.is_empty() && self.persistence.is_some() {
            problems.push(format!(
                "migrations not applied: {} (run `idempotency migrate`)",
                self.pending.join(", ")
            ));
        }
        match &self.purge {
            PurgeStatus::PgCronNotInstalled => {}
            PurgeStatus::Missing { job_name } => problems.push(format!(
                "the pg_cron purge job {job_name:?} is missing from cron.job: run \
                 `idempotency migrate` to schedule it again"
            )),
            PurgeStatus::Scheduled {
                job_name,
                schedule,
                active,
            } => {
                if schedule != &self.expected_schedule {
                    problems.push(format!(
                        "the pg_cron purge job {job_name:?} runs on {schedule:?}, not the configured \
                         {:?}: run `idempotency migrate` to apply the configured schedule",
                        self.expected_schedule
                    ));
                }
                if !active {
                    problems.push(format!("the pg_cron purge job {job_name:?} is not active"));
                }
                if let Some(last) = self.purge_runs.first()
                    && last.status == "failed"
                {
                    problems.push(format!(
                        "the last run of the pg_cron purge job {job_name:?} failed (started {}): {}",
                        last.started_at, last.message
                    ));
                }
            }
        }
        problems
    }
}

impl fmt::Display for StoreStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "server: {} (primary, writable)", self.server_version)?;
        writeln!(f, "database: {}", self.database)?;
        match self.persistence {
            Some(found) => writeln!(f, "table: {} ({found})", self.table)?,
            None => writeln!(f, "table: {} (missing)", self.table)?,
        }
        writeln!(f, "migrations applied: {:?}", self.applied)?;
        if let Some(contents) = &self.contents {
            writeln!(
                f,
                "records: {} ({} expired, waiting for the purge; {} in flight{}), {:.1} MiB",
                contents.records,
                contents.expired,
                contents.in_flight,
                contents
                    .oldest_in_flight
                    .map(|age| format!(", the oldest for {:.0} s", age.as_secs_f64()))
                    .unwrap_or_default(),
                contents.size_bytes as f64 / (1024.0 * 1024.0)
            )?;
        }
        match &self.purge {
            PurgeStatus::PgCronNotInstalled => writeln!(
                f,
                "purge: pg_cron is not installed here; run `idempotency purge` periodically"
            ),
            PurgeStatus::Missing { job_name } => {
                writeln!(f, "purge: pg_cron job {job_name:?} missing")
            }
            PurgeStatus::Scheduled {
                job_name,
                schedule,
                active,
            } => writeln!(
                f,
                "purge: pg_cron job {job_name:?} on {schedule:?}{}",
                if *active { "" } else { " (inactive)" }
            ),
        }?;
        for run in &self.purge_runs {
            let took = run
                .duration
                .map(|d| format!(" in {} ms", d.as_millis()))
                .unwrap_or_default();
            writeln!(
                f,
                "  run {} {}{took}: {}",
                run.started_at, run.status, run.message
            )?;
        }
        Ok(())
    }
}

/// Reads the state of `table`, its migrations and its pg_cron purge job (from `cron.job`, so a
/// job someone unscheduled or changed shows). Reads only; every column comes back as text.
pub(crate) async fn read_status(
    session: &mut dyn SetupSession,
    table: &Table,
) -> Result<StoreStatus, PostgresStoreError> {
    let name = &table.name;
    let migrations_table = name.migrations_table();
    let rows = session
        .rows(
            "SELECT version(), current_database(), \
               (SELECT c.relpersistence::text FROM pg_class c \
                  JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2), \
               (to_regclass($3) IS NOT NULL)::text, \
               EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron')::text",
            &[&name.schema, &name.table, &migrations_table].map(String::as_str),
        )
        .await?;
    let row = rows.into_iter().next().unwrap_or_default();
    let text = |i: usize| row.get(i).cloned().flatten();
    let persistence = text(2).map(|p| match p.as_str() {
        "u" => "UNLOGGED",
        _ => "LOGGED",
    });
    let history = text(3).as_deref() == Some("true");
    let pg_cron = text(4).as_deref() == Some("true");
    let mut applied = Vec::new();
    if history {
        let sql = format!("SELECT version::text FROM {migrations_table} ORDER BY version");
        for version in session.rows(&sql, &[]).await? {
            let version = version.into_iter().next().flatten().unwrap_or_default();
            applied.push(version.parse::<i32>().map_err(|_| {
                PostgresStoreError::UnexpectedAnswer(format!(
                    "{migrations_table} holds the version {version:?}, not a number"
                ))
            })?);
        }
    }
    let pending = MIGRATIONS
        .iter()
        .filter(|m| m.version == 1 || pg_cron)
        .filter(|m| !applied.contains(&m.version))
        .map(|m| m.name)
        .collect();
    let job_name = name.purge_job_name();
    let purge = if pg_cron {
        let job = session
            .rows(
                "SELECT schedule, active::text FROM cron.job WHERE jobname = $1",
                &[job_name.as_str()],
            )
            .await?
            .into_iter()
            .next();
        match job {
            Some(job) => PurgeStatus::Scheduled {
                job_name,
                schedule: job.first().cloned().flatten().unwrap_or_default(),
                active: job.get(1).cloned().flatten().as_deref() == Some("true"),
            },
            None => PurgeStatus::Missing { job_name },
        }
    } else {
        PurgeStatus::PgCronNotInstalled
    };
    let purge_runs = match &purge {
        PurgeStatus::Scheduled { job_name, .. } => read_purge_runs(session, job_name).await?,
        _ => Vec::new(),
    };
    let contents = match persistence {
        Some(_) => Some(read_contents(session, table).await?),
        None => None,
    };
    Ok(StoreStatus {
        server_version: text(0).unwrap_or_default(),
        database: text(1).unwrap_or_default(),
        table: name.qualified(),
        persistence,
        expected_persistence: table.mode.persistence_name(),
        persistence_chosen: table.mode_chosen,
        applied,
        pending,
        purge,
        expected_schedule: table.purge_schedule.clone(),
        contents,
        purge_runs,
    })
}

/// When the live record of `(scope, key)` in `table` was created and how long until it expires
/// (its lease while in flight, its retention once completed); `None` when it is absent.
pub(crate) async fn read_record_times(
    session: &mut dyn SetupSession,
    table: &Table,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<Option<RecordTimes>, PostgresStoreError> {
    let sql = format!(
        "SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), \
                ((extract(epoch FROM expires_at - now()) * 1000)::bigint)::text \
         FROM {} WHERE user_id = $1 AND key = $2 AND expires_at > now()",
        table.name.qualified()
    );
    let Some(row) = session
        .rows(&sql, &[scope.as_str(), key.as_str()])
        .await?
        .into_iter()
        .next()
    else {
        return Ok(None);
    };
    let column = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    let millis = column(1);
    let millis: i64 = millis.parse().map_err(|_| {
        PostgresStoreError::UnexpectedAnswer(format!("expires in {millis:?} ms is not a number"))
    })?;
    Ok(Some(RecordTimes {
        created_at: column(0),
        expires_in: std::time::Duration::from_millis(millis.max(0) as u64),
    }))
}

/// When a record was made and when it goes (`record_times()` on either store).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordTimes {
    /// Creation time, RFC 3339 in UTC.
    pub created_at: String,
    /// Time left until it expires.
    pub expires_in: std::time::Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheduled(runs: Vec<PurgeRun>) -> StoreStatus {
        StoreStatus {
            server_version: "PostgreSQL 15".into(),
            database: "app".into(),
            table: "\"public\".\"idempotency_keys\"".into(),
            persistence: Some("LOGGED"),
            expected_persistence: "LOGGED",
            persistence_chosen: false,
            applied: vec![1, 2, 3],
            pending: Vec::new(),
            purge: PurgeStatus::Scheduled {
                job_name: "idempotency-purge:public.idempotency_keys".into(),
                schedule: "0 * * * *".into(),
                active: true,
            },
            expected_schedule: "0 * * * *".into(),
            contents: None,
            purge_runs: runs,
        }
    }

    fn run(status: &str, message: &str) -> PurgeRun {
        PurgeRun {
            status: status.into(),
            started_at: "2026-12-03T14:00:00Z".into(),
            duration: Some(std::time::Duration::from_millis(12)),
            message: message.into(),
        }
    }

    /// Only the newest run counts: a failure an hour ago that the next run cured is no problem.
    #[test]
    fn a_failed_last_purge_run_is_a_problem_an_earlier_one_is_not() {
        let failed = scheduled(vec![
            run("failed", "ERROR: canceling statement due to lock timeout"),
            run("succeeded", "DELETE 1500"),
        ]);
        let problems = failed.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("failed (started 2026-12-03T14:00:00Z)")
                && problems[0].contains("lock timeout"),
            "{problems:?}"
        );
        assert!(
            failed
                .to_string()
                .contains("  run 2026-12-03T14:00:00Z succeeded in 12 ms: DELETE 1500"),
            "{failed}"
        );
        let cured = scheduled(vec![
            run("succeeded", "DELETE 3"),
            run("failed", "ERROR: canceling statement due to lock timeout"),
        ]);
        assert!(cured.problems().is_empty(), "{:?}", cured.problems());
    }
}
