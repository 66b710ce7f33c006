//! Duplicates that wait for a running request (`EngineConfig::in_flight_wait`) on the memory
//! store: woken when a request of the same engine settles the key, not at their next poll;
//! bounded per key and in all; and, on another engine (another instance), still answered by
//! polling. Time is paused: a duplicate answered at the very instant the original settled was
//! woken (a poll would have taken it at least 10 ms of the clock later).
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use idempotency_core::http::{HeaderMap, StatusCode};
use idempotency_core::{
    Begin, BodyCanonicalization, Completion, Engine, EngineConfig, Fingerprint, Guard,
    IdempotencyKey, KeyFormat, Scope, StoredResponse,
};
use idempotency_memory::MemoryStore;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

type Store = Arc<MemoryStore>;

fn engine(store: &Store, config: EngineConfig) -> Engine<Store> {
    Engine::new(Arc::clone(store), config).unwrap()
}

fn waiting() -> EngineConfig {
    EngineConfig::default().in_flight_wait(Duration::from_secs(10))
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::parse(name.as_bytes(), KeyFormat::opaque()).unwrap()
}

fn scope() -> Scope {
    Scope::new("waiting").unwrap()
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of_request("POST", "/orders", b"{}", BodyCanonicalization::Raw)
}

fn created() -> StoredResponse {
    StoredResponse::new(
        StatusCode::CREATED,
        HeaderMap::new(),
        Bytes::from_static(b"order 1"),
    )
}

async fn proceed(engine: &Engine<Store>, key: &IdempotencyKey) -> Guard<Store> {
    match engine
        .begin(scope(), key.clone(), fingerprint())
        .await
        .unwrap()
    {
        Begin::Proceed(guard) => guard,
        other => panic!("a fresh key must proceed, got {other:?}"),
    }
}

/// A duplicate started now on `engine`: its answer and the instant it came.
fn duplicate(
    engine: &Engine<Store>,
    key: &IdempotencyKey,
) -> tokio::task::JoinHandle<(Begin<Store>, Instant)> {
    let (engine, key) = (engine.clone(), key.clone());
    tokio::spawn(async move {
        let answer = engine.begin(scope(), key, fingerprint()).await.unwrap();
        (answer, Instant::now())
    })
}

#[tokio::test(start_paused = true)]
async fn a_waiting_duplicate_is_answered_when_the_key_is_stored_not_at_its_next_poll() {
    let store = Store::default();
    let engine = engine(&store, waiting());
    let k = key("stored");
    let guard = proceed(&engine, &k).await;
    let waiter = duplicate(&engine, &k);
    // Long enough for the duplicate to be between two polls (250 ms apart by then).
    tokio::time::sleep(Duration::from_millis(1_130)).await;
    assert_eq!(guard.complete(created()).await, Completion::Stored);
    let stored = Instant::now();
    let (answer, answered) = waiter.await.unwrap();
    match answer {
        Begin::Replay(replayed) => assert_eq!(replayed, created()),
        other => panic!("the duplicate must replay, got {other:?}"),
    }
    assert_eq!(
        answered,
        stored,
        "woken when the answer was stored, not at a poll {:?} later",
        answered - stored
    );
}

#[tokio::test(start_paused = true)]
async fn a_released_key_wakes_its_duplicate_which_runs() {
    let store = Store::default();
    let engine = engine(&store, waiting());
    let k = key("released");
    let guard = proceed(&engine, &k).await;
    let waiter = duplicate(&engine, &k);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(guard.release().await, Completion::Released);
    let released = Instant::now();
    let (answer, answered) = waiter.await.unwrap();
    assert!(
        matches!(answer, Begin::Proceed(_)),
        "the duplicate takes the freed key"
    );
    assert_eq!(answered, released);
}

#[tokio::test(start_paused = true)]
async fn duplicates_past_the_bounds_are_answered_in_flight_at_once() {
    let store = Store::default();
    let engine = engine(&store, waiting().max_waiters_per_key(2).max_waiters(3));
    let (a, b) = (key("a"), key("b"));
    let on_a = proceed(&engine, &a).await;
    let on_b = proceed(&engine, &b).await;
    let waiters_of_a = [duplicate(&engine, &a), duplicate(&engine, &a)];
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A third duplicate of `a`: past the bound of its key, while `a` still runs.
    let started = Instant::now();
    match engine
        .begin(scope(), a.clone(), fingerprint())
        .await
        .unwrap()
    {
        Begin::InFlight { retry_after } => assert!(retry_after > Duration::ZERO),
        other => panic!("past the key's bound, in flight at once, got {other:?}"),
    }
    assert_eq!(Instant::now(), started, "answered without waiting");
    let waiter_of_b = duplicate(&engine, &b);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A second duplicate of `b`: within its key's bound, past the engine's (3 wait).
    let started = Instant::now();
    assert!(matches!(
        engine
            .begin(scope(), b.clone(), fingerprint())
            .await
            .unwrap(),
        Begin::InFlight { .. }
    ));
    assert_eq!(Instant::now(), started, "answered without waiting");
    // The ones that waited get the answers.
    assert_eq!(on_a.complete(created()).await, Completion::Stored);
    assert_eq!(on_b.complete(created()).await, Completion::Stored);
    for waiter in waiters_of_a.into_iter().chain([waiter_of_b]) {
        assert!(matches!(waiter.await.unwrap().0, Begin::Replay(_)));
    }
    // Their places are given back: a new duplicate of a running key waits again.
    let c = key("c");
    let on_c = proceed(&engine, &c).await;
    let waiter = duplicate(&engine, &c);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "it waits");
    assert_eq!(on_c.complete(created()).await, Completion::Stored);
    assert!(matches!(waiter.await.unwrap().0, Begin::Replay(_)));
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_on_another_instance_is_answered_at_its_next_poll() {
    let store = Store::default();
    let original = engine(&store, waiting());
    let other = engine(&store, waiting());
    let k = key("elsewhere");
    let guard = proceed(&original, &k).await;
    let waiter = duplicate(&other, &k);
    tokio::time::sleep(Duration::from_millis(1_130)).await;
    assert_eq!(guard.complete(created()).await, Completion::Stored);
    let stored = Instant::now();
    let (answer, answered) = waiter.await.unwrap();
    assert!(matches!(answer, Begin::Replay(_)));
    // No wake crosses engines here: the next poll finds it, at most 250 ms on.
    assert!(answered > stored && answered - stored <= Duration::from_millis(250));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_guard_wakes_its_duplicate_once_its_key_is_released() {
    let store = Store::default();
    let engine = engine(&store, waiting());
    let k = key("dropped");
    let guard = proceed(&engine, &k).await;
    let waiter = duplicate(&engine, &k);
    tokio::time::sleep(Duration::from_millis(700)).await;
    // A handler's panic or its cancelled future: the key is released in the background.
    drop(guard);
    let dropped = Instant::now();
    let (answer, answered) = waiter.await.unwrap();
    assert!(
        matches!(answer, Begin::Proceed(_)),
        "the duplicate takes the freed key"
    );
    assert_eq!(answered, dropped, "woken by the release, not at a poll");
}
