//! The local replay tier: the conformance suite through it, and the calls it saves or must not
//! save, counted on the store behind it. (The same against PostgreSQL and Redis:
//! `tests/tests/replay_tier.rs` at the workspace root.)
#![allow(clippy::unwrap_used)]

mod through_the_tier {
    idempotency_conformance::conformance_suite!(async {
        idempotency_memory::ReplayTier::new(idempotency_memory::MemoryStore::default())
    });
}

mod calls {
    use bytes::Bytes;
    use idempotency_conformance::faults::{Fault, FaultyStore, StoreOp};
    use idempotency_core::http::{HeaderMap, StatusCode};
    use idempotency_core::store::{ClaimOutcome, FenceOutcome};
    use idempotency_core::{
        Begin, BodyCanonicalization, Engine, EngineConfig, Fingerprint, IdempotencyKey,
        IdempotencyStore, KeyFormat, LeaseToken, Scope, StoredResponse,
    };
    use idempotency_memory::{MemoryStore, ReplayTier};
    use std::time::Duration;

    const HOUR: Duration = Duration::from_secs(3600);

    fn key() -> IdempotencyKey {
        IdempotencyKey::parse(uuid_like().as_bytes(), KeyFormat::opaque()).unwrap()
    }

    fn uuid_like() -> String {
        format!("{:032x}", LeaseToken::new().as_uuid().as_u128())
    }

    fn fp(body: &str) -> Fingerprint {
        Fingerprint::of_request("POST", "/tasks", body.as_bytes(), BodyCanonicalization::Raw)
    }

    fn created() -> StoredResponse {
        StoredResponse::new(
            StatusCode::CREATED,
            HeaderMap::new(),
            Bytes::from_static(b"{\"id\":1}"),
        )
    }

    type Counted = FaultyStore<MemoryStore>;

    /// A tier over a memory store that counts its calls, a scope and a fresh key.
    fn tiered() -> (Counted, ReplayTier<Counted>, Scope, IdempotencyKey) {
        let store = FaultyStore::new(MemoryStore::default());
        let tier = ReplayTier::new(store.clone());
        (store, tier, Scope::new("user").unwrap(), key())
    }

    /// The calls that reach the store.
    fn store_calls(store: &Counted) -> u64 {
        [
            StoreOp::Claim,
            StoreOp::Complete,
            StoreOp::Extend,
            StoreOp::Release,
            StoreOp::Get,
        ]
        .into_iter()
        .map(|op| store.calls(op))
        .sum()
    }

    async fn complete_once(tier: &ReplayTier<Counted>, scope: &Scope, key: &IdempotencyKey) {
        let token = LeaseToken::new();
        assert_eq!(
            tier.claim(scope, key, &fp("a"), token, HOUR).await.unwrap(),
            ClaimOutcome::Claimed
        );
        assert_eq!(
            tier.complete(scope, key, token, &created(), HOUR)
                .await
                .unwrap(),
            FenceOutcome::Applied
        );
    }

    #[tokio::test]
    async fn a_replay_through_the_engine_reaches_no_store() {
        let store = FaultyStore::new(MemoryStore::default());
        let engine = Engine::new(ReplayTier::new(store.clone()), EngineConfig::default())
            .expect("valid engine settings");
        let (scope, key) = (Scope::new("user-1").unwrap(), key());
        let Begin::Proceed(guard) = engine
            .begin(scope.clone(), key.clone(), fp("a"))
            .await
            .unwrap()
        else {
            panic!("a fresh key proceeds")
        };
        guard.complete(created()).await;
        let before = store_calls(&store);
        for _ in 0..3 {
            match engine
                .begin(scope.clone(), key.clone(), fp("a"))
                .await
                .unwrap()
            {
                Begin::Replay(response) => assert_eq!(response, created()),
                other => panic!("expected a replay, got {other:?}"),
            }
        }
        assert_eq!(store_calls(&store), before, "a replay reached the store");
        // A different request with the key is refused as the store would, still without a call.
        assert!(matches!(
            engine
                .begin(scope.clone(), key.clone(), fp("b"))
                .await
                .unwrap(),
            Begin::Mismatch
        ));
        assert_eq!(store_calls(&store), before);
        // Another user's request with the same key is not theirs to replay: it goes to the store.
        let other = Scope::new("user-2").unwrap();
        assert!(matches!(
            engine.begin(other, key, fp("a")).await.unwrap(),
            Begin::Proceed(_)
        ));
        assert_eq!(store_calls(&store), before + 1);
    }

    #[tokio::test]
    async fn in_flight_and_unknown_keys_always_ask_the_store() {
        let (store, tier, scope, key) = tiered();
        assert_eq!(tier.get(&scope, &key).await.unwrap(), None);
        assert_eq!(store.calls(StoreOp::Get), 1);
        let token = LeaseToken::new();
        assert_eq!(
            tier.claim(&scope, &key, &fp("a"), token, HOUR)
                .await
                .unwrap(),
            ClaimOutcome::Claimed
        );
        for i in 1..=3 {
            let again = tier
                .claim(&scope, &key, &fp("a"), LeaseToken::new(), HOUR)
                .await
                .unwrap();
            assert!(matches!(again, ClaimOutcome::Existing(_)));
            assert_eq!(
                store.calls(StoreOp::Claim),
                1 + i,
                "an in-flight key was answered locally"
            );
        }
        assert_eq!(
            tier.release(&scope, &key, token).await.unwrap(),
            FenceOutcome::Applied
        );
        assert_eq!(
            tier.claim(&scope, &key, &fp("b"), LeaseToken::new(), HOUR)
                .await
                .unwrap(),
            ClaimOutcome::Claimed,
            "a released key is free again"
        );
        assert_eq!(tier.hits(), 0);
    }

    #[tokio::test]
    async fn a_record_completed_by_another_instance_enters_on_its_first_replay() {
        let store = FaultyStore::new(MemoryStore::default());
        let (first, second) = (
            ReplayTier::new(store.clone()),
            ReplayTier::new(store.clone()),
        );
        let (scope, key) = (Scope::new("user").unwrap(), key());
        complete_once(&first, &scope, &key).await;
        let before = store.calls(StoreOp::Claim);
        for expected in [before + 1, before + 1, before + 1] {
            let outcome = second
                .claim(&scope, &key, &fp("a"), LeaseToken::new(), HOUR)
                .await
                .unwrap();
            assert!(matches!(outcome, ClaimOutcome::Existing(_)));
            assert_eq!(store.calls(StoreOp::Claim), expected);
        }
        assert_eq!(second.hits(), 2);
    }

    #[tokio::test]
    async fn the_tier_keeps_a_record_no_longer_than_the_store() {
        let (store, tier, scope, key) = tiered();
        let token = LeaseToken::new();
        tier.claim(&scope, &key, &fp("a"), token, HOUR)
            .await
            .unwrap();
        let retention = Duration::from_millis(500);
        assert_eq!(
            tier.complete(&scope, &key, token, &created(), retention)
                .await
                .unwrap(),
            FenceOutcome::Applied
        );
        assert!(tier.get(&scope, &key).await.unwrap().is_some());
        assert_eq!(store.calls(StoreOp::Get), 0);
        tokio::time::sleep(retention + Duration::from_millis(100)).await;
        assert_eq!(
            tier.get(&scope, &key).await.unwrap(),
            None,
            "an expired record replayed"
        );
        assert_eq!(
            store.calls(StoreOp::Get),
            1,
            "past its retention the tier must ask the store"
        );
        assert_eq!(
            tier.claim(&scope, &key, &fp("b"), LeaseToken::new(), HOUR)
                .await
                .unwrap(),
            ClaimOutcome::Claimed
        );
    }

    #[tokio::test]
    async fn cached_replays_go_on_through_a_store_outage() {
        let (store, tier, scope, key) = tiered();
        complete_once(&tier, &scope, &key).await;
        store.set(StoreOp::Claim, Fault::Fail);
        let replay = tier
            .claim(&scope, &key, &fp("a"), LeaseToken::new(), HOUR)
            .await
            .unwrap();
        assert!(matches!(replay, ClaimOutcome::Existing(_)));
        let fresh = tier
            .claim(&scope, &self::key(), &fp("a"), LeaseToken::new(), HOUR)
            .await;
        assert!(fresh.is_err(), "a new key must still need the store");
    }

    #[tokio::test]
    async fn a_completion_retried_after_an_error_still_enters_the_tier() {
        let (store, tier, scope, key) = tiered();
        let token = LeaseToken::new();
        tier.claim(&scope, &key, &fp("a"), token, HOUR)
            .await
            .unwrap();
        store.set(StoreOp::Complete, Fault::Fail);
        assert!(
            tier.complete(&scope, &key, token, &created(), HOUR)
                .await
                .is_err()
        );
        store.clear(StoreOp::Complete);
        assert_eq!(
            tier.complete(&scope, &key, token, &created(), HOUR)
                .await
                .unwrap(),
            FenceOutcome::Applied
        );
        let claims = store.calls(StoreOp::Claim);
        let replay = tier
            .claim(&scope, &key, &fp("a"), LeaseToken::new(), HOUR)
            .await
            .unwrap();
        assert!(matches!(replay, ClaimOutcome::Existing(_)));
        assert_eq!(store.calls(StoreOp::Claim), claims);
    }

    #[tokio::test]
    async fn a_stale_completion_enters_nothing() {
        let (_, tier, scope, key) = tiered();
        let token = LeaseToken::new();
        tier.claim(&scope, &key, &fp("a"), token, Duration::from_millis(200))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The lease ran out and another request took the key over.
        let taker = LeaseToken::new();
        assert_eq!(
            tier.claim(&scope, &key, &fp("a"), taker, HOUR)
                .await
                .unwrap(),
            ClaimOutcome::Claimed
        );
        assert_eq!(
            tier.complete(&scope, &key, token, &created(), HOUR)
                .await
                .unwrap(),
            FenceOutcome::Stale
        );
        let seen = tier
            .claim(&scope, &key, &fp("a"), LeaseToken::new(), HOUR)
            .await
            .unwrap();
        assert!(
            matches!(&seen, ClaimOutcome::Existing(r) if matches!(r.state, idempotency_core::store::RecordState::InFlight { .. })),
            "the stale worker's response must not be replayed: {seen:?}"
        );
    }
}
