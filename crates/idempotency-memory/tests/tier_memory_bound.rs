//! The replay tier's bound is honest too: a tier filled past its bound takes, in resident
//! memory, at most 1.25x the bound over the empty process (its records sit in a moka cache,
//! weighed with a fixed overhead per entry measured here).
//!
//! In its own test binary so that the process's resident memory is this test's alone.
#![allow(clippy::unwrap_used)]

mod support;

mod tier {
    use super::support::{resident, response};
    use idempotency_core::store::{ClaimOutcome, FenceOutcome};
    use idempotency_core::{
        BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
        Scope,
    };
    use idempotency_memory::{MemoryStore, ReplayTier};
    use std::time::Duration;

    const HOUR: Duration = Duration::from_secs(3600);
    const BOUND: u64 = 32 * 1024 * 1024;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_tier_stays_within_its_bound_in_resident_memory() {
        let empty = resident();
        // The store behind the tier keeps a few records only, so the memory measured is the
        // tier's.
        let store = MemoryStore::builder().max_stored_bytes(64 * 1024).build();
        let tier = ReplayTier::builder(store).max_cached_bytes(BOUND).build();
        let fp = Fingerprint::of_request("POST", "/tasks", b"{}", BodyCanonicalization::Json);
        let scope = Scope::new("user").unwrap();
        // Twice what fits: the second half evicts the first.
        let records = 4 * BOUND / 600;
        for i in 0..records {
            let key = IdempotencyKey::parse(
                format!("00000000-0000-4000-8000-{i:012x}").as_bytes(),
                KeyFormat::opaque(),
            )
            .unwrap();
            let token = LeaseToken::new();
            assert_eq!(
                tier.claim(&scope, &key, &fp, token, HOUR).await.unwrap(),
                ClaimOutcome::Claimed
            );
            assert_eq!(
                tier.complete(&scope, &key, token, &response(i), HOUR)
                    .await
                    .unwrap(),
                FenceOutcome::Applied
            );
        }
        let cached = tier.cached_records();
        let used = resident().saturating_sub(empty);
        eprintln!(
            "tier: {records} records completed, {cached} cached; {} MiB resident over the empty \
             process, bound {} MiB; ratio to bound {:.2}",
            used >> 20,
            BOUND >> 20,
            used as f64 / BOUND as f64
        );
        assert!(cached > 0 && cached < records, "the tier must have filled");
        assert!(
            used as f64 <= 1.25 * BOUND as f64,
            "a full tier takes {used} bytes of resident memory: over 1.25x its {BOUND} byte bound"
        );
    }
}
