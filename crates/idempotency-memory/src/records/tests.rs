//! Tests of `records`.

#![allow(clippy::unwrap_used)]

use super::accounting_tests::{check_accounting, spread_id};
use super::shard::Eviction;
use super::test_support::{HOUR, fingerprint, response};
use super::*;
use bytes::Bytes;
use idempotency_core::http::{HeaderMap, StatusCode};

/// An id in shard 0 (its carried hash has the top bits clear), distinct per `n`.
fn id(n: u8) -> Vec<u8> {
    let mut id = u64::from(n).to_le_bytes().to_vec();
    id.extend_from_slice(&[0, 0, n]);
    id
}

fn weight_of_one() -> u64 {
    weight(id(0).len(), &response().encode())
}

fn store(records: &Records, n: u8) {
    let token = LeaseToken::new();
    let claimed = records.claim(&id(n), &fingerprint(), token, HOUR).unwrap();
    assert_eq!(claimed, ClaimOutcome::Claimed);
    let completed = records.complete(&id(n), token, &response(), HOUR);
    assert_eq!(completed, FenceOutcome::Applied);
}

#[test]
fn the_shard_bits_are_neither_hashbrown_s_tag_nor_its_bucket_bits() {
    let shard_bits = SHARD_SHIFT..SHARD_SHIFT + SHARDS.trailing_zeros();
    assert!(SHARDS.is_power_of_two());
    assert!(shard_bits.end <= 64 - 7, "overlaps the tag: {shard_bits:?}");
    assert!(
        shard_bits.start >= 24,
        "overlaps the bucket bits: {shard_bits:?}"
    );
    // Two hashes that differ only in their tag bits share a shard; in the shard bits, not.
    assert_eq!(shard_index(0), shard_index(0x7f << 57));
    assert_ne!(shard_index(0), shard_index(1 << SHARD_SHIFT));
}

#[test]
fn the_least_recently_used_record_is_evicted_first() {
    let records = Records::new(
        3 * weight_of_one(),
        100,
        WhenFull::EvictLeastRecentlyUsed,
        u64::MAX,
    );
    for n in 1..=3 {
        store(&records, n);
    }
    assert_eq!(records.bytes(), 3 * weight_of_one());
    // Reading record 1 makes record 2 the least recently used.
    assert!(records.get(&id(1)).unwrap().is_some());
    store(&records, 4);
    assert_eq!(records.evicted(), 1);
    assert!(records.get(&id(2)).unwrap().is_none(), "2 was evicted");
    for n in [1, 3, 4] {
        assert!(records.get(&id(n)).unwrap().is_some(), "{n} was kept");
    }
    assert_eq!(records.bytes(), 3 * weight_of_one());
    assert_eq!(records.completed(), 3);
}

#[test]
fn a_completion_never_evicts_the_record_it_stored() {
    let one = weight(spread_id(0).len(), &response().encode());
    let records = Records::new(
        one + one / 2,
        100,
        WhenFull::EvictLeastRecentlyUsed,
        u64::MAX,
    );
    // An older record in shard 1, then a new one in shard 0, which holds nothing older
    // than the new record (the cursor of an earlier version of eviction started there).
    let (older, newer) = (spread_id(1), spread_id(0));
    assert_eq!(
        (shard_index(hash_of(&older)), shard_index(hash_of(&newer))),
        (1, 0)
    );
    for id in [&older, &newer] {
        let token = LeaseToken::new();
        records.claim(id, &fingerprint(), token, HOUR).unwrap();
        let done = records.complete(id, token, &response(), HOUR);
        assert_eq!(done, FenceOutcome::Applied);
    }
    assert_eq!(records.evicted(), 1);
    assert!(
        records.get(&newer).unwrap().is_some(),
        "the new record was kept"
    );
    assert!(
        records.get(&older).unwrap().is_none(),
        "the older one was evicted"
    );
}

/// Stores `id` and waits for the store's millisecond clock to move on, so the next use is
/// later by its clock.
fn store_id_then_tick(records: &Records, id: &[u8]) {
    let token = LeaseToken::new();
    records.claim(id, &fingerprint(), token, HOUR).unwrap();
    let done = records.complete(id, token, &response(), HOUR);
    assert_eq!(done, FenceOutcome::Applied);
    std::thread::sleep(Duration::from_millis(2));
}

/// Whether `id` has a completed record, without counting as a use.
fn holds(records: &Records, id: &[u8]) -> bool {
    let hash = hash_of(id);
    let shard = records.shard_of(hash);
    let found = shard.table.find(hash, |(k, _)| **k == *id);
    matches!(found, Some((_, Entry::Completed(_))))
}

#[test]
fn eviction_takes_the_store_s_least_recently_used_record_whatever_its_shard() {
    let one = weight(spread_id(0).len(), &response().encode());
    let records = Records::new(3 * one, 100, WhenFull::EvictLeastRecentlyUsed, u64::MAX);
    // Three records in shards 2, 1 and 0, oldest first; then the oldest is read again,
    // so the one in shard 1 is the least recently used. Shard 0 comes first in any scan,
    // and shard 2 held the oldest record before the read.
    let ids = [spread_id(2), spread_id(1), spread_id(0)];
    for id in &ids {
        store_id_then_tick(&records, id);
    }
    assert!(records.get(&ids[0]).unwrap().is_some());
    std::thread::sleep(Duration::from_millis(2));
    // A fourth record, in shard 0, passes the bound: one record goes.
    store_id_then_tick(&records, &spread_id(3));
    assert_eq!(records.evicted(), 1);
    assert!(!holds(&records, &ids[1]), "shard 1's record was evicted");
    for kept in [&ids[0], &ids[2], &spread_id(3)] {
        assert!(holds(&records, kept), "{kept:?} was kept");
    }
    // And the next: shard 0's first record is now the least recently used.
    store_id_then_tick(&records, &spread_id(4));
    assert_eq!(records.evicted(), 2);
    assert!(
        !holds(&records, &ids[2]),
        "shard 0's first record was evicted"
    );
    for kept in [&ids[0], &spread_id(3), &spread_id(4)] {
        assert!(holds(&records, kept), "{kept:?} was kept");
    }
}

/// An id in shard `shard`, distinct per `n`.
fn id_in(shard: u64, n: u16) -> Vec<u8> {
    let hash = (shard << SHARD_SHIFT) | u64::from(n);
    let mut id = hash.to_le_bytes().to_vec();
    id.extend_from_slice(&n.to_le_bytes());
    id
}

#[test]
fn one_completion_evicting_hundreds_of_records_keeps_the_order() {
    let one = weight(id_in(0, 0).len(), &response().encode());
    // 300 records in shard 1, one a millisecond; one in shard 2 among them (after the
    // 279th), read again after the last, so its shard says it is older than it is.
    let records = Records::new(301 * one, 1000, WhenFull::EvictLeastRecentlyUsed, u64::MAX);
    let read_again = id_in(2, 0);
    for n in 1..=300 {
        store_id_then_tick(&records, &id_in(1, n));
        if n == 279 {
            store_id_then_tick(&records, &read_again);
        }
    }
    assert!(records.get(&read_again).unwrap().is_some());
    assert_eq!(records.evicted(), 0);
    // One large response in shard 3 takes the room of 286 small records.
    let large = StoredResponse::new(
        StatusCode::OK,
        HeaderMap::new(),
        Bytes::from(vec![b'x'; 286 * one as usize - COMPLETED_OVERHEAD]),
    );
    let (id, token) = (id_in(3, 0), LeaseToken::new());
    records.claim(&id, &fingerprint(), token, HOUR).unwrap();
    let done = records.complete(&id, token, &large, HOUR);
    assert_eq!(done, FenceOutcome::Applied);
    assert!(records.evicted() >= 286, "{} evicted", records.evicted());
    assert!(
        holds(&records, &read_again),
        "the record read last was evicted before older ones"
    );
    assert!(
        holds(&records, &id_in(1, 300)),
        "the newest small record was kept"
    );
    assert!(!holds(&records, &id_in(1, 280)), "an older one was evicted");
}

#[test]
fn a_replayed_record_does_not_grow_the_recency_queue_without_bound() {
    let records = Records::new(1 << 20, 100, WhenFull::EvictLeastRecentlyUsed, u64::MAX);
    store(&records, 1);
    for _ in 0..10_000 {
        assert!(records.get(&id(1)).unwrap().is_some());
    }
    let queued = records.lock(0).recency.len();
    assert!(queued <= 2 + 64 + 1, "{queued} pairs queued for one record");
    // The record's own pair survived compaction: it is still evictable.
    assert_eq!(
        records
            .lock(0)
            .evict_least_recently_used(None, EMPTY, &records.shares, |_| true),
        Eviction::Freed(weight_of_one())
    );
}

#[test]
fn a_claim_over_an_expired_record_takes_its_slot_and_frees_its_bytes() {
    let records = Records::new(1 << 20, 100, WhenFull::EvictLeastRecentlyUsed, u64::MAX);
    let token = LeaseToken::new();
    records.claim(&id(1), &fingerprint(), token, HOUR).unwrap();
    let done = records.complete(&id(1), token, &response(), Duration::ZERO);
    assert_eq!(done, FenceOutcome::Applied);
    assert_eq!(records.bytes(), weight_of_one());
    let again = records
        .claim(&id(1), &fingerprint(), LeaseToken::new(), HOUR)
        .unwrap();
    assert_eq!(again, ClaimOutcome::Claimed);
    assert_eq!((records.bytes(), records.completed()), (0, 0));
    assert_eq!(records.in_flight(), 1);
    // Its old recency pair is stale: nothing is left to evict.
    assert_eq!(
        records
            .lock(0)
            .evict_least_recently_used(None, EMPTY, &records.shares, |_| true),
        Eviction::Nothing
    );
}

#[test]
fn a_store_refusing_claims_sweeps_expired_records_and_takes_claims_again() {
    let records = Records::new(
        2 * weight_of_one(),
        100,
        WhenFull::RefuseNewClaims,
        u64::MAX,
    );
    for n in 1..=2 {
        let token = LeaseToken::new();
        records.claim(&id(n), &fingerprint(), token, HOUR).unwrap();
        let ttl = Duration::from_millis(if n == 1 { 0 } else { 3_600_000 });
        let done = records.complete(&id(n), token, &response(), ttl);
        assert_eq!(done, FenceOutcome::Applied);
    }
    // Record 1 has expired; the bound still counts it until a sweep.
    assert_eq!(records.bytes(), 2 * weight_of_one());
    let claimed = records
        .claim(&id(3), &fingerprint(), LeaseToken::new(), HOUR)
        .unwrap();
    assert_eq!(claimed, ClaimOutcome::Claimed);
    assert_eq!(records.bytes(), weight_of_one());
    assert_eq!(records.evicted(), 0);
}

/// An id of scope `scope` (one byte) and key `n`, laid out as the store's ids are, in shard
/// `n % 4`.
fn scoped_id(scope: u8, n: u16) -> Vec<u8> {
    let hash = (u64::from(n % 4) << SHARD_SHIFT) | u64::from(n) | (u64::from(scope) << 16);
    let mut id = hash.to_le_bytes().to_vec();
    id.extend_from_slice(&1u16.to_le_bytes());
    id.push(scope);
    id.extend_from_slice(&n.to_le_bytes());
    id
}

fn store_in(records: &Records, id: &[u8]) {
    let token = LeaseToken::new();
    let claimed = records.claim(id, &fingerprint(), token, HOUR);
    assert!(matches!(claimed, Ok(ClaimOutcome::Claimed)), "{claimed:?}");
    assert_eq!(
        records.complete(id, token, &response(), HOUR),
        FenceOutcome::Applied
    );
}

#[test]
fn a_scope_flooding_a_full_store_evicts_only_its_own_records() {
    let one = weight(scoped_id(0, 0).len(), &response().encode());
    let records = Records::new(10 * one, 100, WhenFull::EvictLeastRecentlyUsed, 2 * one);
    // The victim's records are the store's least recently used when the flood starts.
    let victim: Vec<Vec<u8>> = (0..2).map(|n| scoped_id(b'b', n)).collect();
    victim.iter().for_each(|id| store_in(&records, id));
    for n in 0..500 {
        store_in(&records, &scoped_id(b'a', n));
        check_accounting(&records);
        assert!(records.bytes() <= 10 * one);
    }
    for id in &victim {
        assert!(
            holds(&records, id),
            "the flood evicted another scope's record"
        );
    }
    // The flooding scope kept its newest records, within the bound.
    assert!(holds(&records, &scoped_id(b'a', 499)));
    assert!(!holds(&records, &scoped_id(b'a', 0)));
    assert!(records.evicted() >= 490);
}

#[test]
fn without_shares_the_same_flood_evicts_the_other_scope_s_records() {
    // What the shares prevent: one least-recently-used order for every scope.
    let one = weight(scoped_id(0, 0).len(), &response().encode());
    let records = Records::new(10 * one, 100, WhenFull::EvictLeastRecentlyUsed, u64::MAX);
    let victim = scoped_id(b'b', 0);
    store_in(&records, &victim);
    for n in 0..20 {
        store_in(&records, &scoped_id(b'a', n));
    }
    assert!(!holds(&records, &victim));
}

#[test]
fn a_refusing_store_refuses_the_scope_at_its_share_and_not_the_others() {
    let one = weight(scoped_id(0, 0).len(), &response().encode());
    let records = Records::new(10 * one, 100, WhenFull::RefuseNewClaims, 2 * one);
    store_in(&records, &scoped_id(b'a', 0));
    store_in(&records, &scoped_id(b'a', 1));
    let refused = records.claim(&scoped_id(b'a', 2), &fingerprint(), LeaseToken::new(), HOUR);
    assert!(
        matches!(refused, Err(StoreError::ScopeFull { .. })),
        "{refused:?}"
    );
    // Its stored keys still answer, and another scope still claims.
    assert!(matches!(
        records.claim(&scoped_id(b'a', 0), &fingerprint(), LeaseToken::new(), HOUR),
        Ok(ClaimOutcome::Existing(_))
    ));
    store_in(&records, &scoped_id(b'b', 0));
    check_accounting(&records);
}
