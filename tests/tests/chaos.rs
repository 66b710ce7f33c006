//! Chaos on a schedule (`idempotency_e2e::chaos`): the store's server taken down every 5-15 s
//! while 16 clients create one task after another through the demo, each retrying its key until
//! it has its `201`; then every key is sent once more. Each run checks every key has one side
//! effect and replays what its client saw, and that no key went without its answer.
//!
//! PostgreSQL (throwaway servers) in the speculative mode and in the lease mode; Redis with an
//! append-only file synced on every write, killed and restarted; a Redis Cluster with a replica
//! per master, a master failed over to its replica (killed and taken over, or a coordinated
//! failover, in turn) with the store waiting for one replica's acknowledgement. 40 s of chaos
//! each by default (`IDEMPOTENCY_CHAOS_SECS` for longer runs); the counts are printed. The
//! report (`idempotency-bench report`) runs the same four and prints their figures.
#![allow(clippy::unwrap_used)]

use idempotency::ClaimMode;
use idempotency_e2e::chaos::{self, ChaosFigures};
use std::time::Duration;

fn chaos_for() -> Duration {
    let secs = std::env::var("IDEMPOTENCY_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    Duration::from_secs(secs)
}

/// Prints the run's figures and fails on any broken promise.
fn checked(figures: Result<ChaosFigures, String>) {
    let figures = figures.unwrap_or_else(|why| panic!("the run failed: {why}"));
    eprintln!("{figures}");
    if let Err(why) = figures.check() {
        panic!("{why}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_on_a_schedule_in_the_speculative_mode() {
    checked(chaos::postgres_restarted(ClaimMode::OneTransactionSpeculative, chaos_for()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_on_a_schedule_in_the_lease_mode() {
    checked(chaos::postgres_restarted(ClaimMode::Lease, chaos_for()).await);
}

/// The counting app on a throwaway Redis whose append-only file is synced on every write,
/// killed (SIGKILL) and started again on the schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_on_a_schedule() {
    checked(chaos::redis_killed(chaos_for()).await);
}

/// A Redis Cluster's masters failed over on the schedule, both ways: the store follows the new
/// masters with no key stuck, no answer changed and no state loss falsely counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_failed_over_on_a_schedule() {
    let (figures, failovers) = chaos::redis_cluster_failed_over(chaos_for())
        .await
        .unwrap_or_else(|why| panic!("the run failed: {why}"));
    eprintln!("{figures}; failovers (crash, old master, new master): {failovers:?}");
    assert!(
        failovers.iter().any(|f| f.0) && failovers.iter().any(|f| !f.0),
        "both kinds of failover ran: {failovers:?}"
    );
    checked(Ok(figures));
}
