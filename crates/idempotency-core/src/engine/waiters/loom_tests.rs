//! The waiters under the schedule checker: every interleaving of two threads' joins, wakes and
//! leaves (loom, bounded to three preemptions). Run by `scripts/loom`.

#![allow(clippy::unwrap_used)]

use super::*;
use std::task::{Context, Poll};

use crate::test_store::scope_and_key as key;

/// Two duplicates join at once, `(scope, a)` here and `(scope, b)` on another thread, each
/// keeping its place until both have joined; how many got one.
fn places_taken(waiters: Arc<Waiters>, a: &str, b: &'static str) -> usize {
    let (theirs_joined, mine_joined) = (
        Arc::new(loom::sync::Notify::new()),
        Arc::new(loom::sync::Notify::new()),
    );
    let (other, their_signal, my_signal) = (
        Arc::clone(&waiters),
        Arc::clone(&theirs_joined),
        Arc::clone(&mine_joined),
    );
    let racing = loom::thread::spawn(move || {
        let (s, b) = key(b);
        let place = other.join(&s, &b);
        their_signal.notify();
        my_signal.wait();
        usize::from(place.is_some())
    });
    let (s, a) = key(a);
    let mine = waiters.join(&s, &a);
    mine_joined.notify();
    theirs_joined.wait();
    let taken = usize::from(mine.is_some()) + racing.join().unwrap();
    drop(mine);
    assert_eq!(waiters.waiting.load(Ordering::SeqCst), 0);
    assert!(waiters.lock().is_empty(), "no entry outlives its waiters");
    taken
}

fn check(test: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(test);
}

/// Two duplicates of two keys join at once under a bound of one waiter in all: exactly one gets
/// a place, and once both leave nothing is counted or kept.
#[test]
fn racing_joins_never_pass_the_bound_in_all() {
    check(|| assert_eq!(places_taken(Arc::new(Waiters::new(4, 1)), "a", "b"), 1));
}

/// Two duplicates of one key join at once under a bound of one waiter per key: exactly one gets
/// a place.
#[test]
fn racing_joins_never_pass_the_bound_per_key() {
    check(|| assert_eq!(places_taken(Arc::new(Waiters::new(1, 16)), "a", "a"), 1));
}

/// Under bounds that hold both, both duplicates get a place (the test can tell).
#[test]
fn racing_joins_within_the_bounds_both_wait() {
    check(|| assert_eq!(places_taken(Arc::new(Waiters::new(2, 2)), "a", "a"), 2));
}

/// A duplicate (joined, its wake armed, the store asked, in the order `arm_first` says) and
/// the request that settles the key in the store and then wakes: whether the duplicate saw the
/// settled key or was woken.
fn settle_seen_or_woken(arm_first: bool) {
    let waiters = Arc::new(Waiters::new(4, 16));
    let store = Arc::new(Mutex::new(false));
    let (settler, settled) = (Arc::clone(&waiters), Arc::clone(&store));
    let settling = loom::thread::spawn(move || {
        *settled.lock().unwrap() = true;
        let (s, a) = key("a");
        settler.wake(&s, &a);
    });
    let (s, a) = key("a");
    let place = waiters.join(&s, &a).unwrap();
    let (seen, mut woken) = if arm_first {
        let woken = place.notified();
        (*store.lock().unwrap(), woken)
    } else {
        let seen = *store.lock().unwrap();
        (seen, place.notified())
    };
    settling.join().unwrap();
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let arrived = woken.as_mut().poll(&mut cx) == Poll::Ready(());
    assert!(seen || arrived, "the settle was neither seen nor woken");
}

/// The engine's order (`Engine::begin`): a duplicate joins, arms its wake, then asks the store.
/// Whatever the interleaving with the request that settles the key, the duplicate either sees
/// the settled key or is woken: no wake is lost, though `wake` skips the map when it counts no
/// waiter.
#[test]
fn a_settle_is_seen_or_its_wake_arrives() {
    check(|| settle_seen_or_woken(true));
}

/// The seeded race: a wake armed only after the store was asked misses a settle that lands in
/// between, and the checker finds it.
#[test]
fn the_checker_finds_a_wake_armed_after_the_store_is_asked() {
    let found = std::panic::catch_unwind(|| check(|| settle_seen_or_woken(false)));
    assert!(found.is_err(), "the lost wake went unnoticed");
}
