//! The heartbeat schedule under the schedule checker: requests registering, finishing (stored,
//! released, or their guard dropped) and taking freed slots while the driver makes its pass,
//! in every interleaving (loom, bounded to three preemptions), and the start of its driver.
//! Run by `scripts/loom`.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::record::LeaseToken;
use crate::test_store::scope_and_key;

fn check(test: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(test);
}

const LEASE: Duration = Duration::from_secs(30);

fn claim(key: &str) -> KeyClaim {
    let (scope, key) = scope_and_key(key);
    KeyClaim::new(scope, key, LeaseToken::new(), LEASE, Instant::now())
}

/// Long after every registration is due.
fn later() -> Instant {
    Instant::now() + LEASE * 10
}

/// Request A registers and finishes (its guard stores or drops) on one thread; request B
/// registers on another, and may take the slot the driver's pass freed from A; the driver makes
/// its pass meanwhile. Whatever the interleaving: B, still running, is handed to a heartbeat
/// exactly once (by that pass or the next), never lost to A's finishing; A gets no heartbeat
/// that still wants to run once it finished.
fn a_finished_request_never_takes_another_s_slot() {
    let schedule = Arc::new(Schedule::new(LEASE));
    let (a, b) = (claim("a"), claim("b"));
    let finishing = loom::thread::spawn({
        let (schedule, a) = (Arc::clone(&schedule), a.clone());
        move || {
            let registration = schedule.insert(&a);
            schedule.finished(&a, registration);
        }
    });
    let running = loom::thread::spawn({
        let (schedule, b) = (Arc::clone(&schedule), b.clone());
        move || {
            schedule.insert(&b);
        }
    });
    let (first, _) = schedule.due_heartbeats(later());
    finishing.join().unwrap();
    running.join().unwrap();
    let (second, next) = schedule.due_heartbeats(later());
    assert_eq!(next, None, "nothing left in the schedule");
    let handed: Vec<LeaseToken> = first.iter().chain(&second).map(KeyClaim::token).collect();
    assert_eq!(
        handed.iter().filter(|t| **t == b.token()).count(),
        1,
        "the running request gets its heartbeat, once"
    );
    assert!(
        handed.iter().filter(|t| **t == a.token()).count() <= 1,
        "the finished request at most once, before it finished"
    );
    assert!(
        !a.heartbeat_wanted(),
        "a heartbeat started for A ends at its first look"
    );
}

#[test]
fn a_running_request_keeps_its_heartbeat_in_every_interleaving() {
    check(a_finished_request_never_takes_another_s_slot);
}

/// The seeded race (a finished request's slot emptied whoever holds it now) lets A's finishing
/// take B out of the schedule after the driver freed A's slot and B took it: B never gets its
/// heartbeat, and its lease would run out under a running request. The checker finds it.
#[test]
fn the_checker_finds_a_seeded_race_in_the_slots() {
    crate::sync::SEEDED_SLOT_RACE.store(true, std::sync::atomic::Ordering::Relaxed);
    let found = std::panic::catch_unwind(|| check(a_finished_request_never_takes_another_s_slot));
    crate::sync::SEEDED_SLOT_RACE.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(found.is_err(), "the seeded race went unnoticed");
}

/// Two requests register at once on an engine whose driver is not running: exactly one of
/// them starts it; once it ended (its `DriverAlive` dropped), the next registration starts
/// another.
fn one_driver_at_a_time() {
    let schedule = Arc::new(Schedule::new(LEASE));
    let other = {
        let schedule = Arc::clone(&schedule);
        loom::thread::spawn(move || schedule.claim_driver())
    };
    let here = schedule.claim_driver();
    let there = other.join().unwrap();
    assert!(
        here ^ there,
        "one driver started, not {}",
        u8::from(here) + u8::from(there)
    );
    drop(DriverAlive(Arc::clone(&schedule)));
    assert!(
        schedule.claim_driver(),
        "a driver that ended is started again"
    );
}

#[test]
fn one_driver_runs_in_every_interleaving() {
    check(one_driver_at_a_time);
}

/// The seeded race (the flag read, then set, rather than swapped) lets both requests start a
/// driver. The checker finds it.
#[test]
fn the_checker_finds_a_seeded_race_in_the_driver_s_start() {
    crate::sync::SEEDED_DRIVER_RACE.store(true, std::sync::atomic::Ordering::Relaxed);
    let found = std::panic::catch_unwind(|| check(one_driver_at_a_time));
    crate::sync::SEEDED_DRIVER_RACE.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(found.is_err(), "the seeded race went unnoticed");
}
