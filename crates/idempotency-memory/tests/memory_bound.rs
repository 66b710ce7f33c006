//! The memory bound is honest: a store filled past its bound (so it has been evicting for a
//! while) takes, in resident memory, at most 1.25x the bound over the empty process.
//!
//! In its own test binary so that the process's resident memory is this test's alone.
#![allow(clippy::unwrap_used)]

mod support;

mod memory {
    use super::support::{resident, response};
    use idempotency_core::store::{ClaimOutcome, FenceOutcome};
    use idempotency_core::{
        BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
        Scope,
    };
    use idempotency_memory::MemoryStore;
    use std::time::Duration;

    const HOUR: Duration = Duration::from_secs(3600);
    const BOUND: u64 = 32 * 1024 * 1024;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_store_stays_within_its_bound_in_resident_memory() {
        let empty = resident();
        let store = MemoryStore::builder().max_stored_bytes(BOUND).build();
        let fp = Fingerprint::of_request("POST", "/tasks", b"{}", BodyCanonicalization::Json);
        // Twice what fits, from two threads: the second half evicts the first.
        let per_worker = 4 * BOUND / 700 / 2;
        let mut workers = Vec::new();
        for worker in 0..2u64 {
            let store = store.clone();
            workers.push(tokio::spawn(async move {
                let scope = Scope::new(format!("{:08x}-user-{worker}", worker)).unwrap();
                for i in 0..per_worker {
                    let key =
                        IdempotencyKey::parse(uuid_like(worker, i).as_bytes(), KeyFormat::opaque())
                            .unwrap();
                    let token = LeaseToken::new();
                    assert_eq!(
                        store.claim(&scope, &key, &fp, token, HOUR).await.unwrap(),
                        ClaimOutcome::Claimed
                    );
                    assert_eq!(
                        store
                            .complete(&scope, &key, token, &response(i), HOUR)
                            .await
                            .unwrap(),
                        FenceOutcome::Applied
                    );
                }
            }));
        }
        for w in workers {
            w.await.unwrap();
        }
        let counted = store.stored_bytes();
        let full = resident();
        let used = full.saturating_sub(empty);
        eprintln!(
            "empty process {} MiB; full store {} MiB resident over it, {} MiB counted, bound {} MiB; {} evicted; ratio to bound {:.2}",
            empty >> 20,
            used >> 20,
            counted >> 20,
            BOUND >> 20,
            store.evicted_records(),
            used as f64 / BOUND as f64
        );
        assert!(store.evicted_records() > 0, "the store must have filled");
        assert!(counted <= BOUND, "counted {counted} over the bound");
        assert!(
            used as f64 <= 1.25 * BOUND as f64,
            "a full store takes {used} bytes of resident memory: over 1.25x its {BOUND} byte bound"
        );
    }

    /// A UUID-shaped key, distinct per worker and index.
    fn uuid_like(worker: u64, i: u64) -> String {
        format!("{worker:08x}-0000-4000-8000-{i:012x}")
    }
}
