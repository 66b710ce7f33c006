//! The store's tables under the schedule checker: every interleaving of two threads' claims,
//! completions, releases and reads (loom, bounded to three preemptions), checked against the
//! counts the store keeps without a lock over the whole table. Run by `scripts/loom`.

#![allow(clippy::unwrap_used)]

use super::test_support::{HOUR, fingerprint, response};
use super::*;
use std::sync::Arc;

/// An id whose carried hash puts it in shard `shard`, distinct per `n`.
fn id_in(shard: u64, n: u8) -> Vec<u8> {
    let hash = (shard << SHARD_SHIFT) | u64::from(n);
    let mut id = hash.to_le_bytes().to_vec();
    id.extend_from_slice(&[0, 0, n]);
    id
}

fn weight_of_one() -> u64 {
    weight(id_in(0, 0).len(), &response().encode())
}

fn check(test: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(test);
}

/// The in-flight claims the table holds, counted under each shard's lock.
fn claims_held(records: &Records) -> usize {
    (0..SHARDS)
        .map(|i| {
            records
                .lock(i)
                .table
                .iter()
                .filter(|(_, entry)| matches!(entry, Entry::InFlight(_)))
                .count()
        })
        .sum()
}

/// Two claims of one key at once: exactly one takes it, the other finds its claim, and the
/// count of claims in flight is one.
#[test]
fn racing_claims_of_one_key_have_one_winner() {
    check(|| {
        let records = Arc::new(Records::new(u64::MAX, 8, WhenFull::default(), u64::MAX));
        let other = Arc::clone(&records);
        let racing = loom::thread::spawn(move || {
            other.claim(&id_in(0, 1), &fingerprint(), LeaseToken::new(), HOUR)
        });
        let mine = records.claim(&id_in(0, 1), &fingerprint(), LeaseToken::new(), HOUR);
        let theirs = racing.join().unwrap();
        let won = [mine.unwrap(), theirs.unwrap()]
            .iter()
            .filter(|outcome| **outcome == ClaimOutcome::Claimed)
            .count();
        assert_eq!(won, 1);
        assert_eq!(records.in_flight(), 1);
        assert_eq!(claims_held(&records), 1);
    });
}

/// Two claims of two keys (in two shards) at once under a bound of one claim in flight:
/// exactly one is taken, the other refused, and the count says one.
fn the_in_flight_bound_holds() {
    let records = Arc::new(Records::new(u64::MAX, 1, WhenFull::default(), u64::MAX));
    let other = Arc::clone(&records);
    let racing = loom::thread::spawn(move || {
        other.claim(&id_in(1, 1), &fingerprint(), LeaseToken::new(), HOUR)
    });
    let mine = records.claim(&id_in(2, 2), &fingerprint(), LeaseToken::new(), HOUR);
    let theirs = racing.join().unwrap();
    let taken = [&mine, &theirs]
        .iter()
        .filter(|outcome| outcome.is_ok())
        .count();
    assert_eq!(taken, 1, "{mine:?} and {theirs:?}");
    assert_eq!(records.in_flight(), 1);
    assert_eq!(claims_held(&records), 1);
}

#[test]
fn racing_claims_never_pass_the_in_flight_bound() {
    check(the_in_flight_bound_holds);
}

/// The seeded race (a check, then an act, on the count of claims in flight) lets two claims
/// past a bound of one: the checker finds the interleaving and fails.
#[test]
fn the_checker_finds_a_seeded_race_in_the_in_flight_bound() {
    crate::sync::SEEDED_RACE.store(true, std::sync::atomic::Ordering::Relaxed);
    let found = std::panic::catch_unwind(|| check(the_in_flight_bound_holds));
    crate::sync::SEEDED_RACE.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(found.is_err(), "the seeded race went unnoticed");
}

/// A completion, a release with the same token and a read of the key at once: the fence lets
/// one of the two changes through, and the counts of claims and of stored bytes agree with the
/// table whichever it was.
#[test]
fn a_completion_racing_a_release_and_a_read_keeps_the_counts() {
    check(|| {
        let records = Arc::new(Records::new(u64::MAX, 8, WhenFull::default(), u64::MAX));
        let token = LeaseToken::new();
        let id = id_in(3, 3);
        assert_eq!(
            records.claim(&id, &fingerprint(), token, HOUR).unwrap(),
            ClaimOutcome::Claimed
        );
        let (completer, releaser) = (Arc::clone(&records), Arc::clone(&records));
        let (id_c, id_r) = (id.clone(), id.clone());
        let completing =
            loom::thread::spawn(move || completer.complete(&id_c, token, &response(), HOUR));
        let releasing = loom::thread::spawn(move || releaser.release(&id_r, token));
        let read = records.get(&id).unwrap();
        let completed = completing.join().unwrap();
        let released = releasing.join().unwrap();
        assert!(
            (completed == FenceOutcome::Applied) != (released == FenceOutcome::Applied),
            "exactly one of {completed:?} and {released:?} applies"
        );
        if let Some(record) = read {
            assert_eq!(record.fingerprint, fingerprint());
        }
        assert_eq!(records.in_flight(), 0);
        assert_eq!(claims_held(&records), 0);
        let stored = u64::from(completed == FenceOutcome::Applied) * weight_of_one();
        assert_eq!(records.bytes(), stored);
        assert_eq!(records.completed() as u64 * weight_of_one(), stored);
    });
}

/// Two completions in two shards at once, with room for one record: whatever each evicts, the
/// stored bytes count what the table holds, and every record is either kept or counted as
/// evicted.
#[test]
fn racing_completions_that_evict_keep_the_bytes_counted() {
    check(|| {
        let records = Arc::new(Records::new(
            weight_of_one(),
            8,
            WhenFull::EvictLeastRecentlyUsed,
            u64::MAX,
        ));
        let (a, b) = (LeaseToken::new(), LeaseToken::new());
        let (id_a, id_b) = (id_in(4, 4), id_in(5, 5));
        for (id, token) in [(&id_a, a), (&id_b, b)] {
            assert_eq!(
                records.claim(id, &fingerprint(), token, HOUR).unwrap(),
                ClaimOutcome::Claimed
            );
        }
        let other = Arc::clone(&records);
        let racing = loom::thread::spawn(move || other.complete(&id_b, b, &response(), HOUR));
        let mine = records.complete(&id_a, a, &response(), HOUR);
        let theirs = racing.join().unwrap();
        assert_eq!(
            (mine, theirs),
            (FenceOutcome::Applied, FenceOutcome::Applied)
        );
        let kept = records.completed() as u64;
        assert_eq!(records.bytes(), kept * weight_of_one());
        assert_eq!(kept + records.evicted(), 2);
        assert!(kept >= 1, "a completion never evicts the record it stored");
        assert_eq!(records.in_flight(), 0);
    });
}
