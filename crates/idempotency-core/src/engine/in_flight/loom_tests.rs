//! The registry of keys in flight under the schedule checker: every interleaving of two
//! threads' requests entering and leaving (loom, bounded to three preemptions). Run by
//! `scripts/loom`.

#![allow(clippy::unwrap_used)]

use super::*;
use std::sync::Arc;

fn check(test: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(test);
}

/// A request enters and leaves on one thread while another enters and stays: whatever the
/// interleaving, the registry holds the one that stayed, and the oldest start last written (what
/// the gauge shows) is that request's, never the 0 of a registry that was empty for a moment.
fn the_oldest_start_follows_the_registry() {
    let gauges = Arc::new(InFlightGauges::announce("loom"));
    let other = Arc::clone(&gauges);
    let passing = loom::thread::spawn(move || {
        let entry = other.enter();
        other.leave(entry);
    });
    let staying = gauges.enter();
    passing.join().unwrap();
    let registry = gauges.lock();
    assert_eq!(registry.started.len(), 1, "one request still holds its key");
    let start = registry.oldest();
    drop(registry);
    assert!(start > 0.0);
    assert_eq!(
        f64::from_bits(gauges.oldest_written.load(crate::sync::Ordering::SeqCst)),
        start,
        "the gauge shows the oldest start of the request that holds its key"
    );
    gauges.leave(staying);
    assert_eq!(
        f64::from_bits(gauges.oldest_written.load(crate::sync::Ordering::SeqCst)),
        0.0,
        "nothing held: 0"
    );
}

#[test]
fn the_oldest_start_shown_is_the_oldest_held_in_every_interleaving() {
    check(the_oldest_start_follows_the_registry);
}

/// The seeded race (the new oldest start written after the lock is let go) lets a request that
/// left overwrite the start of one that just entered with 0: the checker finds the
/// interleaving and fails.
#[test]
fn the_checker_finds_a_seeded_race_in_the_oldest_start() {
    crate::sync::SEEDED_RACE.store(true, std::sync::atomic::Ordering::Relaxed);
    let found = std::panic::catch_unwind(|| check(the_oldest_start_follows_the_registry));
    crate::sync::SEEDED_RACE.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(found.is_err(), "the seeded race went unnoticed");
}
