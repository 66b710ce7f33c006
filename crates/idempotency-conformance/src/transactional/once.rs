//! The typed API ([`Engine::once`]) on a transactional store: a message's writes and its stored
//! value commit together, in each claim mode.

use super::{SETTLE, TransactionalHarness, engine};
use crate::cases::{key, scope};
use idempotency_core::{ClaimMode, Completion, OnceContext, OnceError, Outcome};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The work of a "create task" message: one side-effect row in the transaction, then its value.
async fn write_task<H: TransactionalHarness>(
    harness: &H,
    ctx: &OnceContext,
    tag: &str,
) -> Result<String, idempotency_core::BoxError> {
    let slot = ctx
        .transaction_slot()
        .expect("a transactional store offers the work a transaction");
    harness.write(slot, tag).await?;
    Ok(format!("task {tag}"))
}

/// The work's write and its value commit together; a redelivery replays the value and writes
/// nothing.
pub async fn tx_once_commits_the_work_writes_with_its_value<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let engine = engine(&*harness, mode);
    let (s, k, tag) = (scope("tx_once"), key(), uuid::Uuid::new_v4().to_string());
    let (h, t) = (&*harness, tag.as_str());
    for delivery in 0..3 {
        let outcome = engine
            .once(s.clone(), k.clone(), &tag, |ctx| async move {
                write_task(h, &ctx, t).await
            })
            .await;
        match (delivery, outcome) {
            (0, Ok(Outcome::Ran { value, completion })) => {
                assert_eq!(value, format!("task {tag}"));
                assert_eq!(completion, Completion::Stored);
            }
            (1.., Ok(Outcome::Replayed(value))) => assert_eq!(value, format!("task {tag}")),
            (n, other) => panic!("delivery {n}: unexpected {other:?}"),
        }
    }
    assert_eq!(
        harness.count(&tag).await,
        1,
        "the message's write stands once"
    );
}

/// A redelivery whose work unwraps its write (panics when the write is refused, as it is in the
/// speculative mode, where the work starts before the key's lookup has answered) still gets
/// the stored value: the panic is caught, the key read, and its value returned. Before, the
/// speculative mode let the panic through to the caller.
pub async fn tx_once_panicking_redelivery_replays<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let engine = engine(&*harness, mode);
    let (s, k, tag) = (
        scope("tx_once_panic"),
        key(),
        uuid::Uuid::new_v4().to_string(),
    );
    let (h, t) = (&*harness, tag.as_str());
    let ran = engine
        .once(s.clone(), k.clone(), &tag, |ctx| async move {
            write_task(h, &ctx, t).await
        })
        .await;
    assert!(matches!(ran, Ok(Outcome::Ran { .. })), "{ran:?}");
    for delivery in 1..4 {
        let replayed = engine
            .once(s.clone(), k.clone(), &tag, |ctx| async move {
                Ok::<_, idempotency_core::BoxError>(
                    write_task(h, &ctx, t)
                        .await
                        .expect("the work unwraps its write"),
                )
            })
            .await;
        match replayed {
            Ok(Outcome::Replayed(value)) => assert_eq!(value, format!("task {tag}")),
            other => panic!("delivery {delivery} must replay, got {other:?}"),
        }
    }
    assert_eq!(harness.count(&tag).await, 1, "the write stands once");
}

/// A work that wrote, then decided on a permanent refusal and discarded its writes
/// ([`OnceContext::discard_writes`]): the refusal is stored without the write, and every
/// redelivery gets it back without running.
pub async fn tx_once_discarded_writes_store_the_refusal_alone<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let engine = engine(&*harness, mode);
    let (s, k, tag) = (
        scope("tx_once_discard"),
        key(),
        uuid::Uuid::new_v4().to_string(),
    );
    let (h, t) = (&*harness, tag.as_str());
    for delivery in 0..3 {
        let outcome = engine
            .once(s.clone(), k.clone(), &tag, |ctx| async move {
                write_task(h, &ctx, t).await?;
                ctx.discard_writes()?;
                Ok::<_, idempotency_core::BoxError>(Err::<String, _>("refused for ever".to_owned()))
            })
            .await;
        match (delivery, outcome) {
            (0, Ok(Outcome::Ran { value, completion })) => {
                assert_eq!(value, Err("refused for ever".to_owned()));
                assert_eq!(completion, Completion::Stored);
            }
            (1.., Ok(Outcome::Replayed(value))) => {
                assert_eq!(value, Err("refused for ever".to_owned()));
            }
            (n, other) => panic!("delivery {n}: unexpected {other:?}"),
        }
    }
    assert_eq!(
        harness.count(&tag).await,
        0,
        "the discarded write never stood"
    );
}

/// A work that wrote and then failed leaves no write, and its redelivery runs once.
pub async fn tx_once_failed_work_leaves_no_write<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let engine = engine(&*harness, mode);
    let (s, k, tag) = (
        scope("tx_once_fail"),
        key(),
        uuid::Uuid::new_v4().to_string(),
    );
    let (h, t) = (&*harness, tag.as_str());
    let failed = engine
        .once(s.clone(), k.clone(), &tag, |ctx| async move {
            write_task(h, &ctx, t).await?;
            Err::<String, idempotency_core::BoxError>("the downstream refused".into())
        })
        .await;
    assert!(matches!(failed, Err(OnceError::Work(_))), "{failed:?}");
    assert_eq!(
        harness.count(&tag).await,
        0,
        "the failed work's write rolled back"
    );
    let until = Instant::now() + SETTLE;
    loop {
        let retried = engine
            .once(s.clone(), k.clone(), &tag, |ctx| async move {
                write_task(h, &ctx, t).await
            })
            .await;
        match retried {
            Ok(Outcome::Ran { .. }) => break,
            Err(OnceError::InFlight { .. }) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("the redelivery of a failed work must run it, got {other:?}"),
        }
    }
    assert_eq!(harness.count(&tag).await, 1, "the redelivery wrote once");
}

/// Eight deliveries of one message at once: one writes, the others replay its value or are told
/// it is in flight, and a later delivery replays it.
pub async fn tx_once_concurrent_duplicates_write_once<H: TransactionalHarness>(
    harness: Arc<H>,
    mode: ClaimMode,
) {
    let engine = engine(&*harness, mode);
    let (s, k, tag) = (
        scope("tx_once_race"),
        key(),
        uuid::Uuid::new_v4().to_string(),
    );
    let deliveries = (0..8).map(|_| {
        let (engine, harness, s, k, tag) = (
            engine.clone(),
            Arc::clone(&harness),
            s.clone(),
            k.clone(),
            tag.clone(),
        );
        tokio::spawn(async move {
            let (h, t) = (&*harness, tag.as_str());
            engine
                .once(s, k, t, |ctx| async move { write_task(h, &ctx, t).await })
                .await
        })
    });
    let mut ran = 0;
    for delivery in deliveries.collect::<Vec<_>>() {
        match delivery.await.expect("a delivery does not panic") {
            Ok(Outcome::Ran { .. }) => ran += 1,
            Ok(Outcome::Replayed(_)) | Err(OnceError::InFlight { .. }) => {}
            other => panic!("a duplicate delivery: unexpected {other:?}"),
        }
    }
    assert!(ran <= 1, "{ran} deliveries ran the work");
    let (h, t) = (&*harness, tag.as_str());
    let until = Instant::now() + SETTLE;
    loop {
        let later = engine
            .once(s.clone(), k.clone(), &tag, |ctx| async move {
                write_task(h, &ctx, t).await
            })
            .await;
        match later {
            Ok(Outcome::Replayed(_)) => break,
            Ok(Outcome::Ran { .. }) if ran == 0 => {
                ran = 1;
                break;
            }
            Err(OnceError::InFlight { .. }) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("a later delivery must replay, got {other:?}"),
        }
    }
    assert_eq!(ran, 1);
    assert_eq!(
        harness.count(&tag).await,
        1,
        "the message's write stands once"
    );
}
