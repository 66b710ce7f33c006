//! What the middleware tells tracing: one `idempotent_request` span per logical request, with how
//! many attempts it took and its final status, and one `attempt` span per sending, with that
//! attempt's status and when the next one goes; never the key, only a digest of it.
//!
//! In its own test binary: tracing caches whether a call site is enabled process-wide, so a test
//! running alongside without a subscriber could make this one's subscriber miss the spans.
#![allow(clippy::unwrap_used)]

mod common;

use common::{client, fast, scripted};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A span's name and the fields recorded on it, in order.
type Recorded = (String, Vec<(String, String)>);

/// Every span, by span id.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<HashMap<u64, Recorded>>>);

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut spans = self.0.lock().unwrap();
        let (_, fields) = spans
            .entry(id.into_u64())
            .or_insert_with(|| (attrs.metadata().name().to_owned(), Vec::new()));
        attrs.record(&mut Fields(fields));
    }
    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some((_, fields)) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
}

/// The last value recorded for `name` among `fields`.
fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn each_attempt_has_a_span_and_the_request_its_outcome_never_the_key() {
    use tracing_subscriber::layer::SubscriberExt;
    const KEY: &str = "order-7f3e-secret-key";
    let spans = Spans::default();
    // This thread's default for the test's whole (current-thread) runtime.
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let (url, _seen) = scripted(vec![
        (503, vec![("retry-after", "0")]),
        (
            409,
            vec![("idempotency-refusal", "in-flight"), ("retry-after", "0")],
        ),
        (201, vec![("idempotent-replayed", "true")]),
    ])
    .await;
    let response = client(fast())
        .post(&url)
        .header("idempotency-key", KEY)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    let spans = spans.0.lock().unwrap().clone();
    let requests: Vec<_> = spans
        .values()
        .filter(|(name, _)| name == "idempotent_request")
        .collect();
    assert_eq!(
        requests.len(),
        1,
        "one span for the logical request: {spans:?}"
    );
    let request = &requests[0].1;
    assert_eq!(field(request, "attempts"), Some("3"), "{request:?}");
    assert_eq!(field(request, "status"), Some("201"), "{request:?}");
    assert_eq!(field(request, "replayed"), Some("true"), "{request:?}");
    assert_eq!(field(request, "method"), Some("POST"), "{request:?}");
    assert_eq!(field(request, "path"), Some("/orders"), "{request:?}");
    assert_eq!(
        field(request, "key_digest").map(str::len),
        Some(16),
        "a digest names the key: {request:?}"
    );
    let mut attempts: Vec<(String, String, Option<String>)> = spans
        .values()
        .filter(|(name, _)| name == "attempt")
        .map(|(_, fields)| {
            (
                field(fields, "n").unwrap_or_default().to_owned(),
                field(fields, "status").unwrap_or_default().to_owned(),
                field(fields, "retry_in_ms").map(str::to_owned),
            )
        })
        .collect();
    attempts.sort();
    assert_eq!(
        attempts,
        [
            ("1".to_owned(), "503".to_owned(), Some("0".to_owned())),
            ("2".to_owned(), "409".to_owned(), Some("0".to_owned())),
            ("3".to_owned(), "201".to_owned(), None),
        ],
        "one span per attempt, its status, and when the next went"
    );
    assert!(
        spans
            .values()
            .flat_map(|(_, fields)| fields)
            .all(|(_, value)| !value.contains(KEY)),
        "the key is never in a span: {spans:?}"
    );
}
