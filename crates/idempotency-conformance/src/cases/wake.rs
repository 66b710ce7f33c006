//! Waking duplicates across processes ([`IdempotencyStore::settled_keys`] and
//! [`IdempotencyStore::watch_settle`]).

use super::{LONG, claim, fingerprint, key, response, scope};
use idempotency_core::store::{ClaimOutcome, FenceOutcome, OnSettled, wake_id};
use idempotency_core::{IdempotencyStore, LeaseToken};
use std::sync::Arc;
use std::time::Duration;

/// A store that hears of settles: the completion and the release of a watched key are heard
/// (as the key's wake id, in the order they committed), a key nobody watched sends nothing,
/// and a watch of a key that no claim holds marks nothing (its later claim's settle sends
/// nothing). One store stands for two instances: it hears its own settles as another instance
/// over the same data would. A store that hears of none (`settled_keys` is `None`: the memory
/// store, which has no other process) has nothing to show here; its watch must still succeed.
pub async fn watched_settles_are_heard_and_only_those<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let s = scope("wake");
    let Some(settled) = store.settled_keys() else {
        store
            .watch_settle(&s, &key())
            .await
            .expect("a store that hears of no settle watches nothing, without failing");
        return;
    };
    let (tell, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let subscriber: Arc<OnSettled> = Arc::new(move |id| {
        let _ = tell.send(id);
    });
    settled.subscribe(&subscriber);
    let next = async |heard: &mut tokio::sync::mpsc::UnboundedReceiver<u64>| {
        tokio::time::timeout(Duration::from_secs(10), heard.recv())
            .await
            .expect("the settle of a watched key is heard within 10 s")
            .expect("the subscription is open")
    };
    let fp = fingerprint("wake");
    let claimed = async |k| {
        let token = LeaseToken::new();
        assert!(matches!(
            claim(&*store, &s, k, &fp, token, LONG).await,
            ClaimOutcome::Claimed
        ));
        token
    };

    let completed = key();
    let token = claimed(&completed).await;
    store.watch_settle(&s, &completed).await.expect("watch");
    let done = store
        .complete(&s, &completed, token, &response(201, b"{}"), LONG)
        .await
        .expect("complete");
    assert_eq!(done, FenceOutcome::Applied);
    assert_eq!(next(&mut heard).await, wake_id(&s, &completed));

    // Settles heard come in commit order: had the unwatched key's completion sent anything,
    // it would come before the watched key's release.
    let unwatched = key();
    let token = claimed(&unwatched).await;
    let done = store
        .complete(&s, &unwatched, token, &response(201, b"{}"), LONG)
        .await
        .expect("complete");
    assert_eq!(done, FenceOutcome::Applied);
    let late = key();
    store
        .watch_settle(&s, &late)
        .await
        .expect("watching a key nobody holds marks nothing");
    let token = claimed(&late).await;
    let done = store
        .complete(&s, &late, token, &response(201, b"{}"), LONG)
        .await
        .expect("complete");
    assert_eq!(done, FenceOutcome::Applied);
    let released = key();
    let token = claimed(&released).await;
    store.watch_settle(&s, &released).await.expect("watch");
    let done = store.release(&s, &released, token).await.expect("release");
    assert_eq!(done, FenceOutcome::Applied, "the release applies");
    assert_eq!(
        next(&mut heard).await,
        wake_id(&s, &released),
        "a released key is heard; keys nobody watched while they ran sent nothing"
    );
}
