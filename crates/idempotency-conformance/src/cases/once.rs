//! The typed API ([`Engine::once`]) over the store: a job or a message's work runs once per key.

use super::*;
use idempotency_core::{OnceContext, OnceError, Outcome};
use std::sync::atomic::{AtomicU32, Ordering};

/// A job's input, serialized with its fields in declaration order.
#[derive(serde::Serialize)]
struct CreateTask<'a> {
    title: &'a str,
    list: u32,
}

/// The work of a call that must not run it: it panics, naming why, if it is called.
fn never_runs<T>(
    _ctx: OnceContext,
    why: &'static str,
) -> std::future::Ready<Result<T, std::io::Error>> {
    panic!("{why}")
}

fn once_engine<S: IdempotencyStore + ?Sized + 'static>(store: Arc<S>) -> Engine<Arc<S>> {
    Engine::new(store, EngineConfig::default()).expect("the suite's engine settings are valid")
}

/// The first call runs the work and every duplicate gets its value back without running it;
/// the same input serialized in another key order is the same input.
pub async fn once_runs_the_work_once_and_replays_its_value<
    S: IdempotencyStore + ?Sized + 'static,
>(
    store: Arc<S>,
) {
    let engine = once_engine(store);
    let (s, k) = (scope("once"), key());
    let runs = AtomicU32::new(0);
    let input = CreateTask {
        title: "Buy milk",
        list: 7,
    };
    let work = |_ctx| async {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        Ok::<_, std::io::Error>(format!("task-{run}"))
    };
    let first = engine.once(s.clone(), k.clone(), &input, work).await;
    match first {
        Ok(Outcome::Ran { value, completion }) => {
            assert_eq!(value, "task-1");
            assert_eq!(completion, Completion::Stored);
        }
        other => panic!("a fresh key must run the work, got {other:?}"),
    }
    // The same input as a JSON object whose keys come in another order.
    let reordered = serde_json::json!({ "list": 7, "title": "Buy milk" });
    for input in [serde_json::to_value(&input).expect("json"), reordered] {
        let again = engine
            .once(s.clone(), k.clone(), &input, |_ctx| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<String, std::io::Error>("task-again".into())
            })
            .await;
        match again {
            Ok(Outcome::Replayed(value)) => assert_eq!(value, "task-1"),
            other => panic!("a duplicate must replay the first value, got {other:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the work ran more than once"
    );
}

/// The same key with another input is refused and never given the other input's value.
pub async fn once_refuses_another_input_under_the_same_key<
    S: IdempotencyStore + ?Sized + 'static,
>(
    store: Arc<S>,
) {
    let engine = once_engine(store);
    let (s, k) = (scope("once-mismatch"), key());
    let done = engine
        .once(s.clone(), k.clone(), "first", |_ctx| async {
            Ok::<u32, std::io::Error>(1)
        })
        .await;
    assert!(
        matches!(done, Ok(Outcome::Ran { value: 1, .. })),
        "{done:?}"
    );
    let refused = engine
        .once(s, k, "second", |ctx| {
            never_runs::<u32>(ctx, "the work of a mismatched input must not run")
        })
        .await;
    match refused {
        Err(error @ OnceError::<std::io::Error>::Mismatch) => assert!(!error.is_retryable()),
        other => panic!("another input under the same key must be refused, got {other:?}"),
    }
}

/// A work that fails (`Err`) stores nothing and frees its key: the redelivery runs it.
pub async fn once_releases_the_key_when_the_work_fails<S: IdempotencyStore + ?Sized + 'static>(
    store: Arc<S>,
) {
    let engine = once_engine(store);
    let (s, k) = (scope("once-fails"), key());
    let failed = engine
        .once(s.clone(), k.clone(), "job", |_ctx| async {
            Err::<u32, _>(std::io::Error::other("the downstream is down"))
        })
        .await;
    match failed {
        Err(error @ OnceError::Work(_)) => assert!(error.is_retryable()),
        other => panic!("a failing work must answer its error, got {other:?}"),
    }
    let retried = engine
        .once(s, k, "job", |_ctx| async { Ok::<u32, std::io::Error>(2) })
        .await;
    assert!(
        matches!(retried, Ok(Outcome::Ran { value: 2, .. })),
        "the redelivery of a failed work must run it, got {retried:?}"
    );
}

/// A permanent refusal is a value (`Ok(Err(..))`): stored, and every duplicate gets the same
/// refusal without running anything.
pub async fn once_stores_a_permanent_refusal_as_a_value<S: IdempotencyStore + ?Sized + 'static>(
    store: Arc<S>,
) {
    let engine = once_engine(store);
    let (s, k) = (scope("once-refusal"), key());
    type Verdict = Result<u32, String>;
    let refused = engine
        .once(s.clone(), k.clone(), "job", |_ctx| async {
            Ok::<Verdict, std::io::Error>(Err("the list is archived".into()))
        })
        .await;
    assert!(
        matches!(&refused, Ok(Outcome::Ran { value: Err(why), .. }) if why == "the list is archived"),
        "{refused:?}"
    );
    let replayed = engine
        .once(s, k, "job", |ctx| {
            never_runs(ctx, "a stored refusal must be replayed, not run again")
        })
        .await;
    match replayed {
        Ok(Outcome::Replayed(Err::<u32, String>(why))) => assert_eq!(why, "the list is archived"),
        other => panic!("a duplicate must get the stored refusal, got {other:?}"),
    }
}

/// A duplicate that arrives while the work runs is told it is in flight (the engine's default
/// is not to wait), and the work's value is then replayed to it.
pub async fn once_tells_a_concurrent_duplicate_it_is_in_flight<
    S: IdempotencyStore + ?Sized + 'static,
>(
    store: Arc<S>,
) {
    let engine = once_engine(store);
    let (s, k) = (scope("once-concurrent"), key());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (engine, s, k) = (engine.clone(), s.clone(), k.clone());
        tokio::spawn(async move {
            engine
                .once(s, k, "job", |_ctx| async move {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok::<u32, std::io::Error>(3)
                })
                .await
        })
    };
    started_rx.await.expect("the first work starts");
    let duplicate = engine
        .once(s.clone(), k.clone(), "job", |ctx| {
            never_runs::<u32>(ctx, "a concurrent duplicate must not run")
        })
        .await;
    match duplicate {
        Err(error @ OnceError::<std::io::Error>::InFlight { .. }) => {
            assert!(error.is_retryable());
        }
        other => panic!("a concurrent duplicate must be in flight, got {other:?}"),
    }
    let _ = finish_tx.send(());
    let first = first.await.expect("the first work does not panic");
    assert!(
        matches!(first, Ok(Outcome::Ran { value: 3, .. })),
        "{first:?}"
    );
    let later = engine
        .once(s, k, "job", |ctx| {
            never_runs(ctx, "a finished work must be replayed")
        })
        .await;
    assert!(matches!(later, Ok(Outcome::Replayed(3))), "{later:?}");
}
