//! Each retry class of the protocol, against a server that answers from a script and records
//! what it was sent: a class the middleware gets wrong (a `422` retried, a replay retried, a
//! business `409` retried, a new key on a retry) fails its test.
#![allow(clippy::unwrap_used)]

use idempotency_client::{Attempts, ClientError, IdempotentRetry, Profile};
use std::time::Duration;

mod common;

use common::{Answer, client, fast, scripted};

/// Sends one POST through `retry` to a server answering `script`: the final status, what the
/// caller learns, and how many attempts the server saw.
async fn post(retry: IdempotentRetry, script: Vec<Answer>) -> (u16, Attempts, usize) {
    let (url, seen) = scripted(script).await;
    let response = client(retry).post(&url).body("{}").send().await.unwrap();
    let attempts = response.extensions().get::<Attempts>().unwrap().clone();
    let seen = seen.lock().unwrap();
    let first = seen.keys[0].clone().unwrap();
    assert!(
        seen.keys
            .iter()
            .all(|k| k.as_deref() == Some(first.as_str())),
        "every attempt carries the same key: {:?}",
        seen.keys
    );
    assert_eq!(attempts.key, first);
    assert_eq!(attempts.attempts as usize, seen.keys.len());
    (response.status().as_u16(), attempts, seen.keys.len())
}

#[tokio::test]
async fn the_keys_own_not_now_is_retried_until_the_answer() {
    for not_now in [
        (
            409,
            vec![("idempotency-refusal", "in-flight"), ("retry-after", "0")],
        ),
        (
            503,
            vec![
                ("idempotency-refusal", "outcome-unknown"),
                ("retry-after", "0"),
            ],
        ),
        (503, vec![]),
        (429, vec![("retry-after", "0")]),
        (502, vec![]),
        (504, vec![]),
    ] {
        let (status, attempts, seen) = post(fast(), vec![not_now.clone(), (201, vec![])]).await;
        assert_eq!((status, seen), (201, 2), "{not_now:?} is retried");
        assert!(!attempts.replayed);
    }
}

#[tokio::test]
async fn final_answers_are_never_sent_again() {
    for status in [200, 201, 400, 401, 403, 404, 422, 500] {
        let (got, _, seen) = post(fast(), vec![(status, vec![]), (201, vec![])]).await;
        assert_eq!((got, seen), (status, 1), "{status} is final");
    }
    // A business 409 (the handler's: no refusal header, no Retry-After).
    let (got, _, seen) = post(fast(), vec![(409, vec![]), (201, vec![])]).await;
    assert_eq!((got, seen), (409, 1), "a stored business 409 is final");
}

#[tokio::test]
async fn a_replay_is_the_keys_answer_whatever_its_status() {
    for status in [201, 409, 503] {
        let (got, attempts, seen) = post(
            fast(),
            vec![
                (
                    status,
                    vec![("idempotent-replayed", "true"), ("retry-after", "0")],
                ),
                (201, vec![]),
            ],
        )
        .await;
        assert_eq!((got, seen), (status, 1));
        assert!(attempts.replayed);
    }
}

#[tokio::test]
async fn the_attempt_budget_and_the_retry_after_cap_hand_over_the_last_answer() {
    let (got, attempts, seen) = post(
        IdempotentRetry::builder()
            .max_attempts(3)
            .backoff(Duration::from_millis(1), Duration::from_millis(2))
            .build(),
        vec![(503, vec![])],
    )
    .await;
    assert_eq!((got, attempts.attempts, seen), (503, 3, 3));
    // A Retry-After past the cap: the answer is handed over, not waited for.
    let (got, _, seen) = post(
        IdempotentRetry::builder()
            .max_retry_after(Duration::from_secs(2))
            .build(),
        vec![(503, vec![("retry-after", "120")]), (201, vec![])],
    )
    .await;
    assert_eq!((got, seen), (503, 1));
}

#[tokio::test]
async fn the_callers_key_is_kept_and_a_made_one_is_a_uuid_v4() {
    let (url, seen) = scripted(vec![(503, vec![]), (201, vec![])]).await;
    let response = client(fast())
        .post(&url)
        .header("idempotency-key", "order-42")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(
        seen.lock().unwrap().keys,
        [Some("order-42".to_owned()), Some("order-42".to_owned())]
    );
    let (_, attempts, _) = post(fast(), vec![(201, vec![])]).await;
    let made = uuid::Uuid::parse_str(&attempts.key).unwrap();
    assert_eq!(made.get_version_num(), 4);
}

#[tokio::test]
async fn other_methods_pass_through_without_a_key_or_a_retry() {
    let (url, seen) = scripted(vec![(503, vec![]), (200, vec![])]).await;
    let response = client(fast()).get(&url).send().await.unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.extensions().get::<Attempts>().is_none());
    assert_eq!(seen.lock().unwrap().keys, [None]);
}

#[tokio::test]
async fn stripes_advice_decides() {
    let stripe = || {
        IdempotentRetry::builder()
            .profile(Profile::Stripe)
            .backoff(Duration::from_millis(1), Duration::from_millis(2))
            .build()
    };
    let (got, _, seen) = post(
        stripe(),
        vec![(409, vec![("stripe-should-retry", "false")]), (201, vec![])],
    )
    .await;
    assert_eq!((got, seen), (409, 1));
    let (got, _, seen) = post(stripe(), vec![(409, vec![]), (201, vec![])]).await;
    assert_eq!(
        (got, seen),
        (201, 2),
        "Stripe's 409 is a request in progress"
    );
}

#[tokio::test]
async fn a_streamed_body_is_refused_before_anything_is_sent() {
    let (url, seen) = scripted(vec![(201, vec![])]).await;
    let stream = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from("{}"))]);
    let error = client(fast())
        .post(&url)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("a middleware error, got {error:?}")
    };
    assert!(matches!(
        error.downcast_ref::<ClientError>(),
        Some(ClientError::BodyNotReplayable)
    ));
    assert!(seen.lock().unwrap().keys.is_empty(), "nothing was sent");
}

#[tokio::test]
async fn no_answer_is_retried_and_giving_up_names_the_key() {
    // A port nothing listens on: every attempt is refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/orders", listener.local_addr().unwrap());
    drop(listener);
    let error = client(
        IdempotentRetry::builder()
            .max_attempts(3)
            .backoff(Duration::from_millis(1), Duration::from_millis(2))
            .build(),
    )
    .post(&url)
    .header("idempotency-key", "k-1")
    .body("{}")
    .send()
    .await
    .unwrap_err();
    let reqwest_middleware::Error::Middleware(error) = error else {
        panic!("a middleware error, got {error:?}")
    };
    match error.downcast_ref::<ClientError>() {
        Some(ClientError::GaveUp { key, attempts, .. }) => {
            assert_eq!((key.as_str(), *attempts), ("k-1", 3));
        }
        other => panic!("gave up, got {other:?}"),
    }
}
