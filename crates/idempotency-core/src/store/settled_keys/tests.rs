//! `SettledKeys` and `SettleListener`: ids, watches, the session's upkeep.

use super::*;
use std::sync::atomic::{AtomicU64, Ordering};

#[test]
fn the_id_is_the_digest_a_store_computes_in_sql() {
    // `printf '2:sckey' | sha256sum | cut -c1-16`, and PostgreSQL's expression above.
    let scope = Scope::new("sc").unwrap();
    let key = IdempotencyKey::parse(b"key", Default::default()).unwrap();
    assert_eq!(wake_id(&scope, &key), 0x01da_965a_a267_5244);
    assert_eq!(
        parse_wake_id("01da965aa2675244"),
        Some(0x01da_965a_a267_5244)
    );
    let other = Scope::new("sck").unwrap();
    let rest = IdempotencyKey::parse(b"ey", Default::default()).unwrap();
    assert_ne!(
        wake_id(&other, &rest),
        wake_id(&scope, &key),
        "the scope's length keeps ('sck', 'ey') apart from ('sc', 'key')"
    );
}

#[test]
fn anything_but_sixteen_hex_digits_is_no_id() {
    for text in [
        "",
        "01da965aa267524",
        "01da965aa26752440",
        "01da965aa267524g",
        "+1da965aa2675244",
    ] {
        assert_eq!(parse_wake_id(text), None, "{text:?}");
    }
}

#[tokio::test]
async fn a_session_is_opened_once_reopened_after_it_ends_and_never_where_none_can_be() {
    use std::sync::atomic::AtomicUsize;
    let listener = SettleListener::new();
    let seen = Arc::new(AtomicU64::new(0));
    let told = Arc::clone(&seen);
    let subscriber: Arc<OnSettled> = Arc::new(move |id| told.store(id, Ordering::SeqCst));
    listener.settled_keys().subscribe(&subscriber);
    let opened = Arc::new(AtomicUsize::new(0));
    let (session, mut ended) = tokio::sync::mpsc::unbounded_channel::<UnboundedSender<String>>();
    let open = |notices: UnboundedSender<String>, _stop| {
        opened.fetch_add(1, Ordering::SeqCst);
        let session = session.clone();
        async move {
            session.send(notices).expect("the test holds the session");
            Ok(true)
        }
    };
    assert!(listener.ensure(open).await.expect("opened"));
    assert!(listener.ensure(open).await.expect("listening"));
    assert_eq!(
        opened.load(Ordering::SeqCst),
        1,
        "one session while it lasts"
    );
    let notices = ended.recv().await.expect("the session's sender");
    notices.send("00000000000000ff".to_owned()).expect("heard");
    notices.send("not an id".to_owned()).expect("heard");
    notices.send("0000000000000007".to_owned()).expect("heard");
    drop(notices);
    // The session ended: the next wait opens another.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while listener.listening.load(Ordering::Acquire) {
        assert!(tokio::time::Instant::now() < deadline, "the end is noticed");
        tokio::task::yield_now().await;
    }
    assert_eq!(
        seen.load(Ordering::SeqCst),
        7,
        "ids passed on, in order; the rest ignored"
    );
    assert!(listener.ensure(open).await.expect("reopened"));
    assert_eq!(opened.load(Ordering::SeqCst), 2);

    let unable = SettleListener::new();
    let tried = AtomicUsize::new(0);
    for _ in 0..2 {
        let listening = unable
            .ensure(|_, _| {
                tried.fetch_add(1, Ordering::SeqCst);
                async { Ok(false) }
            })
            .await
            .expect("an answer");
        assert!(!listening);
    }
    assert_eq!(
        tried.load(Ordering::SeqCst),
        1,
        "a store that cannot is not asked again"
    );
}

#[test]
fn a_watch_is_kept_for_the_commit_that_takes_it_and_never_mistaken_for_a_settle() {
    let keys = SettledKeys::new();
    let seen = Arc::new(AtomicU64::new(0));
    let seen_by = Arc::clone(&seen);
    let subscriber: Arc<OnSettled> = Arc::new(move |id| {
        seen_by.store(id, Ordering::SeqCst);
    });
    keys.subscribe(&subscriber);
    let scope = Scope::new("sc").unwrap();
    let key = IdempotencyKey::parse(b"key", Default::default()).unwrap();
    let other = IdempotencyKey::parse(b"other", Default::default()).unwrap();
    assert!(!keys.take_waited_for(&scope, &key), "nothing heard yet");
    keys.heard("w01da965aa2675244");
    keys.heard("wnot an id");
    assert_eq!(seen.load(Ordering::SeqCst), 0, "a watch wakes nobody");
    assert!(keys.is_waited_for(0x01da_965a_a267_5244));
    assert!(
        !keys.take_waited_for(&scope, &other),
        "another key's commit"
    );
    assert!(keys.take_waited_for(&scope, &key), "the holder's commit");
    assert!(
        !keys.take_waited_for(&scope, &key),
        "one commit answers a watch"
    );
    assert_eq!(keys.watch_count.load(Ordering::SeqCst), 0);
    keys.heard("01da965aa2675244");
    assert_eq!(seen.load(Ordering::SeqCst), 0x01da_965a_a267_5244);
    assert!(
        !keys.is_waited_for(0x01da_965a_a267_5244),
        "a settle is no watch"
    );
}

#[test]
fn watches_past_the_bound_are_not_kept() {
    let keys = SettledKeys::new();
    for id in 0..MOST_WATCHES_KEPT as u64 + 10 {
        keys.waited_for(id);
    }
    assert_eq!(keys.watch_count.load(Ordering::SeqCst), MOST_WATCHES_KEPT);
    assert!(keys.is_waited_for(0), "the first ones are kept");
    assert!(
        !keys.is_waited_for(MOST_WATCHES_KEPT as u64),
        "the rest are not"
    );
}

#[test]
fn a_background_opening_is_tried_at_most_once_a_second() {
    let listener = SettleListener::new();
    assert!(listener.open_in_background(), "the first one");
    assert!(!listener.open_in_background(), "not again at once");
    listener.listening.store(true, Ordering::Release);
    listener.next_background_try.store(0, Ordering::Relaxed);
    assert!(!listener.open_in_background(), "not while one listens");
}

#[test]
fn subscribers_are_told_while_they_are_kept() {
    let keys = SettledKeys::new();
    let seen = Arc::new(AtomicU64::new(0));
    let seen_by = Arc::clone(&seen);
    let subscriber: Arc<OnSettled> = Arc::new(move |id| {
        seen_by.store(id, Ordering::SeqCst);
    });
    keys.subscribe(&subscriber);
    keys.settled(7);
    assert_eq!(seen.load(Ordering::SeqCst), 7);
    drop(subscriber);
    keys.settled(9);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        7,
        "a dropped subscriber is not told"
    );
    let again: Arc<OnSettled> = Arc::new(|_| {});
    keys.subscribe(&again);
    assert_eq!(keys.lock().len(), 1, "the dropped one is forgotten");
}
