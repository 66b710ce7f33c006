//! The layer and its builder.

use crate::service::IdempotencyService;
use http::request::Parts;
use http::{HeaderName, Method};
use idempotency_core::{
    BodyCanonicalization, Engine, EngineConfig, IdempotencyStore, KeyFormat, Scope, StorePolicy,
};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

/// Which wire conventions the layer follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Profile {
    /// The IETF draft (`draft-ietf-httpapi-idempotency-key-header`): a key reused with another
    /// request is `422 Unprocessable Content`.
    #[default]
    Ietf,
    /// Stripe's API: a key reused with another request is `400` with code `idempotency_error`,
    /// an in-flight duplicate is `409` with code `idempotency_key_in_use`.
    Stripe,
}

type ScopeFn = Arc<dyn Fn(&Parts) -> Option<Scope> + Send + Sync>;

/// Where the scope (the authenticated principal) of a request comes from.
#[derive(Clone)]
pub(crate) enum ScopeSource {
    Unscoped,
    Extract(ScopeFn),
}

/// Marks a builder whose scope source is not chosen yet: it has no `build`.
#[derive(Debug, Clone, Copy)]
pub struct ScopeNotSet;

/// Marks a builder whose scope source is chosen.
#[derive(Clone)]
pub struct ScopeSet(pub(crate) ScopeSource);

impl fmt::Debug for ScopeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            ScopeSource::Unscoped => f.write_str("ScopeSet(Unscoped)"),
            ScopeSource::Extract(_) => f.write_str("ScopeSet(Extract)"),
        }
    }
}

/// The layer's settings, shared by every service it makes.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) header: HeaderName,
    pub(crate) methods: Vec<Method>,
    pub(crate) key_required: bool,
    pub(crate) scope: ScopeSource,
    pub(crate) max_request_body: usize,
    pub(crate) max_stored_body: usize,
    pub(crate) fail_open: bool,
    pub(crate) profile: Profile,
    pub(crate) canonicalization: BodyCanonicalization,
    pub(crate) store_timeout: Duration,
    pub(crate) problem_type_base: String,
}

pub(crate) struct Shared<S> {
    pub(crate) engine: Engine<S>,
    pub(crate) settings: Settings,
}

/// Makes a retried `POST`, `PATCH` or `DELETE` run once: the first request with an
/// `Idempotency-Key` claims it, runs, and its response is stored; a retry gets that response
/// back byte for byte with `Idempotent-Replayed: true`.
///
/// Build one with [`IdempotencyLayer::builder`]; the builder has no `build` until the scope is
/// chosen ([`scope_with`](IdempotencyLayerBuilder::scope_with),
/// [`scope_from_extension`](IdempotencyLayerBuilder::scope_from_extension) or the dangerous
/// [`unscoped`](IdempotencyLayerBuilder::unscoped)).
pub struct IdempotencyLayer<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for IdempotencyLayer<S> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: IdempotencyStore> fmt::Debug for IdempotencyLayer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("engine", &self.shared.engine)
            .field("header", &self.shared.settings.header)
            .field("methods", &self.shared.settings.methods)
            .finish_non_exhaustive()
    }
}

impl<S: IdempotencyStore + 'static> IdempotencyLayer<S> {
    /// A builder over `store` with the defaults: header `Idempotency-Key`, methods POST, PATCH
    /// and DELETE (the ADR), key required, UUID v4 keys, lease 60 s, retention 24 h, request
    /// bodies up to 1 MiB, responses stored up to 1 MiB, 2xx-4xx stored (not 408/429),
    /// fail closed, no waiting for in-flight duplicates, IETF profile, JSON bodies canonicalised
    /// for the fingerprint, store calls bounded by 5 s.
    pub fn builder(store: S) -> IdempotencyLayerBuilder<S, ScopeNotSet> {
        IdempotencyLayerBuilder {
            store,
            engine: EngineConfig::default(),
            settings: Settings {
                header: HeaderName::from_static("idempotency-key"),
                methods: vec![Method::POST, Method::PATCH, Method::DELETE],
                key_required: true,
                scope: ScopeSource::Unscoped,
                max_request_body: 1024 * 1024,
                max_stored_body: 1024 * 1024,
                fail_open: false,
                profile: Profile::Ietf,
                canonicalization: BodyCanonicalization::Json,
                store_timeout: Duration::from_secs(5),
                problem_type_base: "urn:idempotency:problem:".to_owned(),
            },
            scope: ScopeNotSet,
        }
    }

    /// The engine (and through it the store) the layer uses.
    pub fn engine(&self) -> &Engine<S> {
        &self.shared.engine
    }
}

impl<Inner, S> Layer<Inner> for IdempotencyLayer<S> {
    type Service = IdempotencyService<Inner, S>;

    fn layer(&self, inner: Inner) -> Self::Service {
        IdempotencyService::new(inner, Arc::clone(&self.shared))
    }
}

/// Builds an [`IdempotencyLayer`]. `Sc` records whether the scope source was chosen.
pub struct IdempotencyLayerBuilder<S, Sc> {
    store: S,
    engine: EngineConfig,
    settings: Settings,
    scope: Sc,
}

impl<S, Sc: fmt::Debug> fmt::Debug for IdempotencyLayerBuilder<S, Sc> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .field("engine", &self.engine)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl<S> IdempotencyLayerBuilder<S, ScopeNotSet> {
    /// Takes each request's scope from `extract`, typically reading what the authentication
    /// layer put in the request extensions. A covered request for which it returns `None` is
    /// refused with `401` (problem `scope-missing`): without a principal, keys cannot be kept
    /// apart.
    pub fn scope_with(
        self,
        extract: impl Fn(&Parts) -> Option<Scope> + Send + Sync + 'static,
    ) -> IdempotencyLayerBuilder<S, ScopeSet> {
        self.with_scope(ScopeSource::Extract(Arc::new(extract)))
    }

    /// Takes each request's scope from the request extension of type `T` (for example the
    /// `Scope` or the user's `uuid::Uuid` that the authentication layer inserted).
    pub fn scope_from_extension<T>(self) -> IdempotencyLayerBuilder<S, ScopeSet>
    where
        T: Clone + Send + Sync + 'static,
        Scope: From<T>,
    {
        self.scope_with(|parts| parts.extensions.get::<T>().cloned().map(Scope::from))
    }

    /// **Dangerous.** Every caller shares one key space: a caller who learns or guesses another
    /// caller's key is served that caller's stored response, or blocks it. Only for services
    /// with a single trusted caller.
    pub fn unscoped(self) -> IdempotencyLayerBuilder<S, ScopeSet> {
        self.with_scope(ScopeSource::Unscoped)
    }

    fn with_scope(self, source: ScopeSource) -> IdempotencyLayerBuilder<S, ScopeSet> {
        IdempotencyLayerBuilder {
            store: self.store,
            engine: self.engine,
            settings: self.settings,
            scope: ScopeSet(source),
        }
    }
}

impl<S: IdempotencyStore + 'static> IdempotencyLayerBuilder<S, ScopeSet> {
    /// Builds the layer.
    pub fn build(self) -> IdempotencyLayer<S> {
        let mut settings = self.settings;
        settings.scope = self.scope.0;
        IdempotencyLayer {
            shared: Arc::new(Shared {
                engine: Engine::new(self.store, self.engine),
                settings,
            }),
        }
    }
}

impl<S, Sc> IdempotencyLayerBuilder<S, Sc> {
    /// The request header that carries the key (default `Idempotency-Key`).
    pub fn header_name(mut self, name: HeaderName) -> Self {
        self.settings.header = name;
        self
    }

    /// The methods the layer covers (default POST, PATCH, DELETE). Other methods pass through
    /// untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.settings.methods = methods.into_iter().collect();
        self
    }

    /// Whether a covered request without a key is refused with 400 (default true). When false
    /// it passes through without idempotency.
    pub fn key_required(mut self, required: bool) -> Self {
        self.settings.key_required = required;
        self
    }

    /// Which keys are accepted (default UUID v4).
    pub fn key_format(mut self, format: KeyFormat) -> Self {
        self.engine.key_format = format;
        self
    }

    /// How long an in-flight claim holds its key without a heartbeat (default 60 s). While the
    /// handler runs, the heartbeat extends it every third of its length; it bounds how long the
    /// key of a crashed or hung worker stays blocked.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.engine.lease = lease;
        self
    }

    /// How long a response is kept and replayed (default 24 h).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.engine.retention = retention;
        self
    }

    /// Whether the lease is extended while the handler runs (default true). Without it, a
    /// handler slower than its lease can be taken over by a retry and run twice.
    pub fn heartbeat(mut self, heartbeat: bool) -> Self {
        self.engine.heartbeat = heartbeat;
        self
    }

    /// Which handler statuses are stored (default 2xx-4xx except 408 and 429).
    pub fn store_policy(mut self, policy: StorePolicy) -> Self {
        self.engine.store_policy = policy;
        self
    }

    /// How long a duplicate waits for the running request before `409` (default zero).
    pub fn in_flight_wait(mut self, wait: Duration) -> Self {
        self.engine.in_flight_wait = wait;
        self
    }

    /// Largest request body a covered request may carry (default 1 MiB); larger ones get 413
    /// and nothing is stored.
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.settings.max_request_body = bytes;
        self
    }

    /// Largest response body stored (default 1 MiB). A larger response still goes to the
    /// client in full; its record keeps status and headers only, so a retry is answered with
    /// them and an empty body (and `Idempotent-Replay-Body: omitted`), never by running the
    /// handler again.
    pub fn max_stored_response_body(mut self, bytes: usize) -> Self {
        self.settings.max_stored_body = bytes;
        self
    }

    /// When the store cannot be reached: `false` (default) answers 503 with `Retry-After` and
    /// does not run the handler; `true` runs the handler without idempotency.
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        self.settings.fail_open = fail_open;
        self
    }

    /// IETF (default) or Stripe conventions.
    pub fn profile(mut self, profile: Profile) -> Self {
        self.settings.profile = profile;
        self
    }

    /// How the body enters the fingerprint (default: JSON canonicalised, others raw).
    pub fn body_canonicalization(mut self, canonicalization: BodyCanonicalization) -> Self {
        self.settings.canonicalization = canonicalization;
        self
    }

    /// Bound on each store call (default 5 s); past it the request is answered as if the store
    /// were unreachable.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.settings.store_timeout = timeout;
        self
    }

    /// Prefix of the `type` URI of problem responses (default `urn:idempotency:problem:`).
    pub fn problem_type_base(mut self, base: impl Into<String>) -> Self {
        self.settings.problem_type_base = base.into();
        self
    }
}
