//! Chaos on a schedule, as the report runs it: the four runs of `idempotency_e2e::chaos` (the
//! same as CI's `tests/chaos.rs`), one after another on throwaway servers, and their figures.

use idempotency::ClaimMode;
use idempotency_e2e::chaos::{self, ChaosFigures};
use std::fmt::{self, Write as _};
use std::time::Duration;

/// One run's figures and whether its checks held.
#[derive(Debug)]
pub(crate) struct ChaosRun {
    pub(crate) figures: ChaosFigures,
    /// `Err(why)`: a check failed (a key doubled or answered differently, no outage seen).
    pub(crate) verdict: Result<(), String>,
}

/// Runs the four schedules for `secs` each; a run that could not be made (a server that would
/// not start) is returned as a reason, for the report's list of what was skipped.
pub(crate) async fn measure(secs: u64) -> (Vec<ChaosRun>, Vec<String>) {
    let chaos_for = Duration::from_secs(secs);
    let mut runs = Vec::new();
    let mut skipped = Vec::new();
    let mut take = |name: &str, result: Result<ChaosFigures, String>| match result {
        Ok(figures) => {
            let verdict = figures.check();
            runs.push(ChaosRun { figures, verdict });
        }
        Err(why) => skipped.push(format!("chaos, {name}: {why}")),
    };
    take(
        "PostgreSQL, speculative mode",
        chaos::postgres_restarted(ClaimMode::OneTransactionSpeculative, chaos_for).await,
    );
    take(
        "PostgreSQL, lease mode",
        chaos::postgres_restarted(ClaimMode::Lease, chaos_for).await,
    );
    take("Redis", chaos::redis_killed(chaos_for).await);
    take(
        "Redis Cluster",
        chaos::redis_cluster_failed_over(chaos_for)
            .await
            .map(|(figures, _)| figures),
    );
    (runs, skipped)
}

/// The section: what was done, and a row per run.
pub(crate) fn section(w: &mut String, runs: &[ChaosRun], secs: u64) -> fmt::Result {
    writeln!(w, "\n## Chaos on a schedule\n")?;
    writeln!(
        w,
        "Each run: {} clients create one task after another through the demo for {secs} s, each retrying its key \
         (`409`, `503`, after 50 ms) until it has its `201`, while the store's server is taken down every 5-15 s \
         (PostgreSQL: a clean stop, then a crash, in turn, down 0.5-2 s; Redis: killed, its append-only file synced \
         on every write; a Redis Cluster with a replica per master and the store waiting for one: a master killed \
         and taken over, or a coordinated failover, in turn). Then every key is sent once more. Side effects are \
         the demo's tasks (PostgreSQL) or the handler's runs (Redis); \"answered differently\" counts keys whose \
         last answer was not their first `201` byte for byte. The same runs are CI's `tests/chaos.rs`.\n",
        chaos::CLIENTS
    )?;
    writeln!(
        w,
        "| run | outages | keys | attempts | answered 503 | side effects | doubled | answered differently | took | checks |"
    )?;
    writeln!(
        w,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    )?;
    for run in runs {
        let f = &run.figures;
        writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.0} s | {} |",
            f.run,
            f.outages,
            f.keys,
            f.attempts,
            f.unavailable,
            f.effects,
            f.doubled,
            f.changed,
            f.took.as_secs_f64(),
            match &run.verdict {
                Ok(()) => "held".to_owned(),
                Err(why) => format!("**failed**: {why}"),
            }
        )?;
    }
    Ok(())
}
