//! The store's accounting (records in flight, bytes, completed records per shard and scope)
//! recomputed from the table, after each of the unit tests and after random operations.

#![allow(clippy::unwrap_used)]

use super::test_support::{fingerprint, response};
use super::*;

/// The accounting the bound and the limits rest on, recomputed from the table.
pub(super) fn check_accounting(records: &Records) {
    let (mut in_flight, mut bytes, mut completed) = (0, 0, 0);
    for index in 0..SHARDS {
        let shard = records.lock(index);
        let mut in_shard = 0;
        for (id, entry) in shard.table.iter() {
            match entry {
                Entry::InFlight(_) => in_flight += 1,
                Entry::Completed(record) => {
                    in_shard += 1;
                    bytes += weight(id.len(), &record.encoded);
                    // Every record can still be found by the eviction order.
                    assert!(
                        shard
                            .recency
                            .iter()
                            .any(|u| u.hash == hash_of(id) && u.stamp == record.stamp),
                        "a record missing from its shard's recency queue"
                    );
                }
            }
        }
        assert_eq!(shard.completed, in_shard, "shard {index}'s completed count");
        // The published oldest use is never later than the shard's true least recent use
        // (else eviction would pass over its records), and says empty only when it is.
        let published = records.oldest[index].load(Ordering::Relaxed);
        let truth = shard
            .recency
            .iter()
            .filter(|u| Shard::is_current(&shard.table, u))
            .map(|u| u.at)
            .min();
        if let Some(truth) = truth {
            assert!(
                published <= truth,
                "shard {index} published {published}, oldest {truth}"
            );
        }
        assert_eq!(
            published == EMPTY,
            shard.recency.is_empty(),
            "shard {index}'s emptiness"
        );
        completed += in_shard;
    }
    if records.shares.limit() != u64::MAX {
        let mut per_scope = std::collections::HashMap::new();
        for index in 0..SHARDS {
            for (id, entry) in records.lock(index).table.iter() {
                if let Entry::Completed(record) = entry {
                    *per_scope
                        .entry(crate::id::scope_of(id).to_vec())
                        .or_insert(0) += weight(id.len(), &record.encoded);
                }
            }
        }
        assert_eq!(records.shares.all(), per_scope, "each scope's weight");
    }
    assert_eq!(records.in_flight(), in_flight, "in-flight count");
    assert_eq!(records.bytes(), bytes, "bytes counted");
    assert_eq!(records.completed(), completed);
}

#[derive(Clone, Debug)]
enum Op {
    Claim { id: u8, lease_ms: u8 },
    Complete { id: u8, retention_ms: u8 },
    Extend { id: u8 },
    Release { id: u8 },
    Get { id: u8 },
    Purge { limit: u8 },
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    // Leases and retentions of 0 or 1 ms expire during a run; 255 ms ones do not.
    let time = prop_oneof![Just(0u8), Just(1u8), Just(255u8)];
    prop_oneof![
        (0..12u8, time.clone()).prop_map(|(id, lease_ms)| Op::Claim { id, lease_ms }),
        (0..12u8, time).prop_map(|(id, retention_ms)| Op::Complete { id, retention_ms }),
        (0..12u8).prop_map(|id| Op::Extend { id }),
        (0..12u8).prop_map(|id| Op::Release { id }),
        (0..12u8).prop_map(|id| Op::Get { id }),
        (0..4u8).prop_map(|limit| Op::Purge { limit }),
    ]
}

/// Ids spread over a few shards, several per shard, in two scopes (`a` and `b`), laid out
/// as the store's ids are (hash, scope length, scope, key).
pub(super) fn spread_id(n: u8) -> Vec<u8> {
    let hash = (u64::from(n % 3) << SHARD_SHIFT) | u64::from(n);
    let mut id = hash.to_le_bytes().to_vec();
    id.extend_from_slice(&1u16.to_le_bytes());
    id.push(b'a' + n % 2);
    id.push(n);
    id
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Whatever the operations, the counts the bounds rest on match the table, and at the
    /// bound an evicting store holds no more than its bound.
    #[test]
    fn the_accounting_matches_the_table_after_any_operations(
        ops in proptest::collection::vec(op(), 1..60),
        refuse in proptest::bool::ANY,
        room in 1..6u64,
        share in proptest::option::of(1..4u64),
    ) {
        let when_full = if refuse { WhenFull::RefuseNewClaims } else { WhenFull::EvictLeastRecentlyUsed };
        let one = weight(spread_id(0).len(), &response().encode());
        let max_bytes = room * one;
        let share = share.map_or(u64::MAX, |n| n * one);
        let records = Records::new(max_bytes, 8, when_full, share);
        let mut tokens = std::collections::HashMap::new();
        for op in ops {
            match op {
                Op::Claim { id, lease_ms } => {
                    let token = LeaseToken::new();
                    let lease = Duration::from_millis(u64::from(lease_ms));
                    let refused_scope = refuse && records.shares.is_full(&spread_id(id));
                    match records.claim(&spread_id(id), &fingerprint(), token, lease) {
                        Ok(ClaimOutcome::Claimed) => {
                            proptest::prop_assert!(!refused_scope, "a scope at its share took a new claim");
                            tokens.insert(id, token);
                        }
                        Err(StoreError::ScopeFull { .. }) => {
                            proptest::prop_assert!(refused_scope, "a scope under its share was refused");
                        }
                        _ => {}
                    }
                }
                Op::Complete { id, retention_ms } => {
                    let token = tokens.get(&id).copied().unwrap_or_else(LeaseToken::new);
                    let retention = Duration::from_millis(u64::from(retention_ms));
                    let _ = records.complete(&spread_id(id), token, &response(), retention);
                    if when_full == WhenFull::EvictLeastRecentlyUsed {
                        proptest::prop_assert!(records.bytes() <= max_bytes);
                    }
                }
                Op::Extend { id } => {
                    let token = tokens.get(&id).copied().unwrap_or_else(LeaseToken::new);
                    let _ = records.extend(&spread_id(id), token, Duration::from_millis(255));
                }
                Op::Release { id } => {
                    let token = tokens.get(&id).copied().unwrap_or_else(LeaseToken::new);
                    let _ = records.release(&spread_id(id), token);
                }
                Op::Get { id } => {
                    records.get(&spread_id(id)).unwrap();
                }
                Op::Purge { limit } => {
                    records.purge_expired(usize::from(limit));
                }
            }
            check_accounting(&records);
            proptest::prop_assert!(records.in_flight() <= 8);
        }
    }
}
