//! The `idempotency` span carries the route axum matched and the outcome, never the key.
//!
//! In its own test binary: tracing caches whether a call site is enabled process-wide, so a test
//! running alongside without a subscriber can make this one's subscriber miss the span.
#![allow(clippy::unwrap_used)]

use axum::http::StatusCode;
use tower::ServiceExt;

mod observed;

use observed::{KEY, app, request};

/// Records the fields of every `idempotency` span.
#[derive(Clone, Default)]
struct SpanFields(std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>);

impl tracing::field::Visit for SpanFields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .lock()
            .unwrap()
            .push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0
            .lock()
            .unwrap()
            .push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SpanFields {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if attrs.metadata().name() == "idempotency" {
            attrs.record(&mut self.clone());
        }
    }
    fn on_record(
        &self,
        _: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        values.record(&mut self.clone());
    }
}

#[test]
fn the_span_carries_the_route_and_the_outcome_never_the_key() {
    use tracing_subscriber::layer::SubscriberExt;
    let fields = SpanFields::default();
    let subscriber = tracing_subscriber::registry().with(fields.clone());
    tracing::subscriber::with_default(subscriber, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let app = app();
            let response = app.oneshot(request("a", true)).await.unwrap();
            assert_eq!(response.status(), StatusCode::CREATED);
        });
    });
    let fields = fields.0.lock().unwrap().clone();
    let get = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("route").as_deref(), Some("/x/{id}"), "{fields:?}");
    assert_eq!(get("outcome").as_deref(), Some("executed"), "{fields:?}");
    assert_eq!(get("method").as_deref(), Some("POST"), "{fields:?}");
    assert!(
        fields.iter().all(|(_, v)| !v.contains(KEY)),
        "the key is never in the span: {fields:?}"
    );
}
