//! What the layer counts per request: the route axum matched and the request's outcome, in
//! `idempotency_requests_total{outcome, route}` and on the request's span.
//!
//! `metrics::counter!` with a label value that is not a literal builds its key on every call (a
//! vector of labels, the route copied into it, a hash). A layer serves a handful of routes, so
//! it builds the keys of a route (one per outcome) the first time it sees the route and keeps
//! them; each request asks the recorder installed at that moment for its counter with them
//! (nothing is cached but the keys, so a recorder installed later, or a test's thread-local
//! one, still gets every count).

use http::request::Parts;
use metrics::{Key, Label, Level, Metadata};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

const REQUESTS: &str = "idempotency_requests_total";

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Routes whose keys are kept, at most; a layer past it (say, one on a router with hundreds of
/// routes) builds the keys of the others per request, as the macro would.
const MAX_ROUTES: usize = 256;

/// What happened to a covered request: one value gives the span's `outcome` field and the
/// `idempotency_requests_total{outcome}` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// No key, and keys are optional: passed through without idempotency.
    Passthrough,
    KeyMissing,
    KeyInvalid,
    ScopeMissing,
    BodyTooLarge,
    BodyUnreadable,
    /// The store failed; answered 503.
    StoreError,
    /// The store failed; run without idempotency (`fail_open`).
    StoreErrorFailOpen,
    Replayed,
    Conflict,
    Mismatch,
    /// The request held its key and its handler ran.
    Executed,
    /// The handler panicked or its response body failed.
    HandlerFailed,
    /// The caller holds its share of the store; answered 429.
    ScopeFull,
    /// The layer holds as many request bodies as it may; answered 503.
    Busy,
}

impl Outcome {
    /// Every outcome, in the order of their discriminants.
    const ALL: [Outcome; 15] = [
        Outcome::Passthrough,
        Outcome::KeyMissing,
        Outcome::KeyInvalid,
        Outcome::ScopeMissing,
        Outcome::BodyTooLarge,
        Outcome::BodyUnreadable,
        Outcome::StoreError,
        Outcome::StoreErrorFailOpen,
        Outcome::Replayed,
        Outcome::Conflict,
        Outcome::Mismatch,
        Outcome::Executed,
        Outcome::HandlerFailed,
        Outcome::ScopeFull,
        Outcome::Busy,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::Passthrough => "passthrough",
            Outcome::KeyMissing => "key_missing",
            Outcome::KeyInvalid => "key_invalid",
            Outcome::ScopeMissing => "scope_missing",
            Outcome::BodyTooLarge => "body_too_large",
            Outcome::BodyUnreadable => "body_unreadable",
            Outcome::StoreError => "store_error",
            Outcome::StoreErrorFailOpen => "store_error_fail_open",
            Outcome::Replayed => "replayed",
            Outcome::Conflict => "conflict",
            Outcome::Mismatch => "mismatch",
            Outcome::Executed => "executed",
            Outcome::HandlerFailed => "handler_failed",
            Outcome::ScopeFull => "scope_full",
            Outcome::Busy => "busy",
        }
    }

    /// Counts the outcome under its route and records it on the current span.
    pub(crate) fn record(self, route: &Route) {
        if let Some(counted) = &route.counted
            && counted.swap(true, Ordering::Relaxed)
        {
            return;
        }
        metrics::with_recorder(|recorder| {
            recorder
                .register_counter(&route.keys[self as usize], &METADATA)
                .increment(1)
        });
        tracing::Span::current().record("outcome", self.label());
    }
}

/// The keys of one route, one per outcome.
type OutcomeKeys = [Key; Outcome::ALL.len()];

fn outcome_keys(route: &str) -> Arc<OutcomeKeys> {
    Arc::new(Outcome::ALL.map(|outcome| {
        Key::from_parts(
            REQUESTS,
            vec![
                Label::new("outcome", outcome.label()),
                Label::new("route", route.to_owned()),
            ],
        )
    }))
}

/// The keys of the routes a layer has served.
#[derive(Default)]
pub(crate) struct RouteKeys {
    routes: RwLock<Vec<(Box<str>, Arc<OutcomeKeys>)>>,
}

impl RouteKeys {
    fn of(&self, route: &str) -> Arc<OutcomeKeys> {
        // A panic never happens under these locks; a poisoned one still holds a valid list.
        let found = self
            .routes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(known, _)| **known == *route)
            .map(|(_, keys)| Arc::clone(keys));
        if let Some(keys) = found {
            return keys;
        }
        let keys = outcome_keys(route);
        let mut routes = self.routes.write().unwrap_or_else(PoisonError::into_inner);
        if routes.len() < MAX_ROUTES && !routes.iter().any(|(known, _)| **known == *route) {
            routes.push((route.into(), Arc::clone(&keys)));
            // A new route: its every outcome exported at zero, so ratios and alerts on an
            // outcome see the series before its first request.
            metrics::with_recorder(|recorder| {
                for key in keys.iter() {
                    recorder.register_counter(key, &METADATA).increment(0);
                }
            });
        }
        keys
    }
}

/// The route axum matched (`/tasks/{id}`), or "" elsewhere, with its counters' keys. Cloning
/// it copies no text (axum keeps the matched path in an `Arc`).
#[derive(Clone)]
pub(crate) struct Route {
    #[cfg(feature = "axum")]
    matched: Option<axum::extract::MatchedPath>,
    keys: Arc<OutcomeKeys>,
    /// Set when two tasks may count the request (see [`Route::counted_once`]): whether it was.
    counted: Option<Arc<AtomicBool>>,
}

impl Route {
    /// The route of a request, with its keys from `known`.
    pub(crate) fn of(parts: &Parts, known: &RouteKeys) -> Route {
        #[cfg(feature = "axum")]
        let matched = parts
            .extensions
            .get::<axum::extract::MatchedPath>()
            .cloned();
        #[cfg(feature = "axum")]
        let keys = known.of(matched.as_ref().map_or("", |m| m.as_str()));
        #[cfg(not(feature = "axum"))]
        let keys = {
            let _ = parts;
            known.of("")
        };
        Route {
            #[cfg(feature = "axum")]
            matched,
            keys,
            counted: None,
        }
    }

    /// The same route, for a request that may be answered by one task while another runs it
    /// on: whichever of the clones counts first counts it, and the others not.
    pub(crate) fn counted_once(self) -> Route {
        Route {
            counted: Some(Arc::new(AtomicBool::new(false))),
            ..self
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        #[cfg(feature = "axum")]
        if let Some(matched) = &self.matched {
            return matched.as_str();
        }
        ""
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(key: &Key) -> Vec<String> {
        key.labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect()
    }

    #[test]
    fn a_route_s_keys_are_built_once_and_name_its_outcomes() {
        let known = RouteKeys::default();
        let tasks = known.of("/tasks");
        assert!(Arc::ptr_eq(&tasks, &known.of("/tasks")));
        assert!(!Arc::ptr_eq(&tasks, &known.of("/tasks/{id}")));
        for outcome in Outcome::ALL {
            let key = &tasks[outcome as usize];
            assert_eq!(key.name(), REQUESTS);
            assert_eq!(
                labels(key),
                [
                    format!("outcome={}", outcome.label()),
                    "route=/tasks".into()
                ]
            );
        }
    }

    #[test]
    fn past_the_bound_keys_are_still_right_but_not_kept() {
        let known = RouteKeys::default();
        for n in 0..MAX_ROUTES {
            known.of(&format!("/r{n}"));
        }
        let extra = known.of("/extra");
        assert_eq!(labels(&extra[0])[1], "route=/extra");
        assert!(!Arc::ptr_eq(&extra, &known.of("/extra")));
        let first = known.of("/r0");
        assert!(Arc::ptr_eq(&first, &known.of("/r0")));
    }
}
