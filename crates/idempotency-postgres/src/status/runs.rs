//! The pg_cron purge job's last runs, from `cron.job_run_details`.

use crate::error::PostgresStoreError;
use crate::session::SetupSession;

/// One run of the pg_cron purge job, as `cron.job_run_details` keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PurgeRun {
    /// `succeeded`, `failed`, `running`, ...
    pub status: String,
    /// When it started, RFC 3339 in UTC.
    pub started_at: String,
    /// How long it took; `None` while it runs.
    pub duration: Option<std::time::Duration>,
    /// What the server answered: `DELETE 1500` (the rows purged), or the error.
    pub message: String,
}

/// The last five runs of the pg_cron job `job_name`, newest first; every column as text.
pub(super) async fn read_purge_runs(
    session: &mut dyn SetupSession,
    job_name: &str,
) -> Result<Vec<PurgeRun>, PostgresStoreError> {
    let rows = session
        .rows(
            "SELECT d.status, \
                    to_char(d.start_time AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
                    ((extract(epoch FROM d.end_time - d.start_time) * 1000)::bigint)::text, \
                    coalesce(d.return_message, '') \
             FROM cron.job_run_details d JOIN cron.job j ON j.jobid = d.jobid \
             WHERE j.jobname = $1 ORDER BY d.start_time DESC NULLS LAST LIMIT 5",
            &[job_name],
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let text = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
            PurgeRun {
                status: text(0),
                started_at: text(1),
                duration: text(2)
                    .parse::<i64>()
                    .ok()
                    .map(|ms| std::time::Duration::from_millis(ms.max(0) as u64)),
                message: text(3),
            }
        })
        .collect())
}
