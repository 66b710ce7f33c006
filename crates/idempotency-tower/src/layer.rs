//! The layer and its builder.

use crate::config::{ScopeSource, Settings, Shared};
use crate::refusal::Profile;
use crate::service::IdempotencyService;
use http::request::Parts;
use http::{HeaderName, Method};
use idempotency_core::{
    BodyCanonicalization, ClaimMode, Engine, EngineConfig, IdempotencyStore, KeyFormat,
    ReplayPolicy, Scope,
};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

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
    /// and DELETE (the ADR), key required, any 1..=255 visible-ASCII key, lease 60 s, retention 24 h, request
    /// bodies up to 1 MiB, responses stored up to 1 MiB, 2xx-4xx stored (not 401/403/408/429),
    /// fail closed, no waiting for in-flight duplicates, IETF profile, JSON bodies canonicalised
    /// for the fingerprint, each store call bounded by 5 s.
    pub fn builder(store: S) -> IdempotencyLayerBuilder<S, ScopeNotSet> {
        IdempotencyLayerBuilder {
            store,
            engine: EngineConfig::default(),
            settings: Settings::default(),
            scope: ScopeNotSet,
            store_timeout_chosen: false,
        }
    }

    /// The engine (and through it the store) the layer uses.
    pub fn engine(&self) -> &Engine<S> {
        &self.shared.engine
    }

    /// What a server's graceful shutdown awaits after it stops accepting requests: every request
    /// the layer runs (a handler moved to its own task when its client left included) and the
    /// engine's background work (responses stored or keys released after a store failure), so
    /// nothing is cut in half and no key is left claimed.
    ///
    /// ```no_run
    /// # async fn run(app: axum::Router, layer: idempotency_tower::IdempotencyLayer<idempotency_memory::MemoryStore>, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
    /// let drain = layer.drain();
    /// let listener = tokio::net::TcpListener::bind("0.0.0.0:3000").await?;
    /// axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
    /// let _ = tokio::time::timeout(std::time::Duration::from_secs(30), drain.drained()).await;
    /// # Ok(()) }
    /// ```
    pub fn drain(&self) -> idempotency_core::Drain {
        self.shared.engine.drain()
    }
}

impl<Inner, S> Layer<Inner> for IdempotencyLayer<S> {
    type Service = IdempotencyService<Inner, S>;

    fn layer(&self, inner: Inner) -> Self::Service {
        IdempotencyService::new(inner, Arc::clone(&self.shared))
    }
}

/// Marks a builder whose scope source is not chosen yet: it has no `build`.
#[derive(Debug, Clone, Copy)]
pub struct ScopeNotSet;

/// Marks a builder whose scope source is chosen; it carries that source to `build`.
#[derive(Clone, Debug)]
pub struct ScopeSet(ScopeSource);

/// Builds an [`IdempotencyLayer`]. `Sc` records whether the scope source was chosen.
pub struct IdempotencyLayerBuilder<S, Sc> {
    store: S,
    engine: EngineConfig,
    settings: Settings,
    scope: Sc,
    /// `store_timeout` was set: `build()` then keeps it as it is.
    store_timeout_chosen: bool,
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
        self.with_scope(ScopeSource::Extract(Arc::new(move |parts| {
            Ok(extract(parts))
        })))
    }

    /// Takes each request's scope from the request extension of type `T` (for example the
    /// `Scope` or the user's `uuid::Uuid` that the authentication layer inserted), converted
    /// with `Scope: TryFrom<T>`, so an infallible `From<T> for Scope` works too. A request
    /// without the extension is refused with 401 `scope-missing`; one whose value the
    /// conversion refuses, with 401 `scope-invalid` (and a warning in the log): never a shared
    /// scope. Write `TryFrom` when the value may not make a valid [`Scope`] (a user name with
    /// control characters, say), never a `From` that falls back to [`Scope::unscoped`]:
    ///
    /// ```
    /// use idempotency_core::{Scope, ScopeError};
    ///
    /// #[derive(Clone)]
    /// struct User(String); // put in the request extensions by your authentication layer
    ///
    /// impl TryFrom<User> for Scope {
    ///     type Error = ScopeError;
    ///     fn try_from(user: User) -> Result<Scope, ScopeError> {
    ///         Scope::new(user.0)
    ///     }
    /// }
    /// ```
    pub fn scope_from_extension<T>(self) -> IdempotencyLayerBuilder<S, ScopeSet>
    where
        T: Clone + Send + Sync + 'static,
        Scope: TryFrom<T>,
        <Scope as TryFrom<T>>::Error: std::fmt::Display,
    {
        self.with_scope(ScopeSource::Extract(Arc::new(|parts: &Parts| {
            parts
                .extensions
                .get::<T>()
                .cloned()
                .map(Scope::try_from)
                .transpose()
                .map_err(|e| e.to_string())
        })))
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
            store_timeout_chosen: self.store_timeout_chosen,
        }
    }
}

impl<S: IdempotencyStore + 'static> IdempotencyLayerBuilder<S, ScopeSet> {
    /// Builds the layer.
    ///
    /// # Panics
    ///
    /// When the engine settings cannot run a request safely ([`EngineConfig::check`]): with
    /// the heartbeat on, a lease shorter than three store timeouts set with `store_timeout`
    /// (left unset, the store timeout shrinks to a third of the lease).
    pub fn build(mut self) -> IdempotencyLayer<S> {
        if !self.store_timeout_chosen {
            self.engine.store_timeout = self
                .engine
                .store_timeout
                .min(self.engine.lease / EngineConfig::MIN_LEASE_IN_STORE_TIMEOUTS);
        }
        if self.engine.claim_mode == ClaimMode::OneTransaction
            && !self
                .store
                .transactional()
                .is_some_and(|store| store.supports_one_transaction())
        {
            tracing::error!(
                backend = self.store.backend(),
                "ClaimMode::OneTransaction needs a store whose transactions support it (the \
                 PostgreSQL store with transactions on); every covered request will be answered 503"
            );
        }
        IdempotencyLayer {
            shared: Arc::new(Shared {
                engine: Engine::new(self.store, self.engine),
                scope: self.scope.0,
                render: self.settings.renderer(),
                bodies: crate::body::BodyBudget::new(self.settings.max_buffered_request_bytes),
                settings: self.settings,
                routes: Default::default(),
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

    /// Which keys are accepted: by default any 1..=255 visible-ASCII key, bare or quoted
    /// ([`KeyFormat::opaque`], what Stripe's and Stainless-generated SDKs send);
    /// [`KeyFormat::UuidV4`] to require UUID v4s.
    pub fn key_format(mut self, format: KeyFormat) -> Self {
        self.settings.key_format = format;
        self
    }

    /// How long an in-flight claim holds its key without a heartbeat (default 60 s; with the
    /// heartbeat on, at least three store timeouts if you set `store_timeout`, or `build()`
    /// panics; left unset, the store timeout shrinks to fit). From the
    /// claim until the response is stored, the heartbeat extends it every third of its length;
    /// it bounds how long the key of a crashed or hung worker stays blocked, and how long a
    /// response whose storing failed is retried in the background.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.engine.lease = lease;
        self
    }

    /// How a request that proceeds holds its key (default [`ClaimMode::Lease`]).
    ///
    /// [`ClaimMode::OneTransaction`] puts the key's whole life in the handler's one database
    /// transaction (the PostgreSQL store; the handler takes `Tx<PgTransaction>`): the round
    /// trips of a bare `BEGIN; ...; COMMIT`, nothing left behind by a crash. Use it only for
    /// routes whose handlers' side effects are **all** writes in that transaction: whatever a
    /// handler does outside it (an HTTP call, an email, a message) is not made once by it.
    /// A store without the mode answers every covered request 503 and logs why.
    pub fn claim_mode(mut self, mode: ClaimMode) -> Self {
        self.engine.claim_mode = mode;
        self
    }

    /// At most `keys` new keys per caller (scope) per `per`, in this process (default: no
    /// limit). A request that would start one more is answered 429 `scope-full` with the time
    /// left in the window as `Retry-After`, its handler not run and its key released; the
    /// caller's used keys still replay, and other callers go on. PostgreSQL and Redis stores
    /// evict nothing, so without it one caller can grow the key table, or fill Redis to
    /// `maxmemory` (after which every caller's claims fail), as fast as it can send new keys.
    /// The memory store gives each caller a share of its bound instead
    /// (`MemoryStoreBuilder::max_bytes_per_scope`). With N instances, a caller gets N times
    /// `keys`.
    pub fn new_keys_per_scope(mut self, keys: u32, per: Duration) -> Self {
        self.engine.new_keys_per_scope = Some(idempotency_core::ScopeLimit { keys, per });
        self
    }

    /// How long a response is kept and replayed (default 24 h).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.engine.retention = retention;
        self
    }

    /// Whether the lease is extended while the request runs (default true). Without it, a
    /// request slower than its lease can be taken over by a retry and run twice.
    pub fn heartbeat(mut self, heartbeat: bool) -> Self {
        self.engine.heartbeat = heartbeat;
        self
    }

    /// Which handler statuses are stored (default 2xx-4xx except 401, 403, 408 and 429).
    pub fn replay_policy(mut self, policy: ReplayPolicy) -> Self {
        self.engine.replay_policy = policy;
        self
    }

    /// How long a duplicate waits for the running request before `409` (default zero). Waiting
    /// is not a store call: it is not bounded by the store timeout.
    pub fn in_flight_wait(mut self, wait: Duration) -> Self {
        self.engine.in_flight_wait = wait;
        self
    }

    /// The longest `Retry-After` a `409 in-flight` suggests (default 1 s; never more than the
    /// running request's remaining lease). Set it near your slowest route's usual handler time:
    /// a client that honours `Retry-After` waits this long per duplicate.
    pub fn in_flight_retry_after(mut self, hint: Duration) -> Self {
        self.engine.in_flight_retry_after = hint;
        self
    }

    /// Largest request body a covered request may carry (default 1 MiB); larger ones get 413
    /// and nothing is stored.
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.settings.max_request_body = bytes;
        self
    }

    /// How long a covered request's body may take to arrive (default 30 s), counted from when
    /// the layer starts reading it. The layer reads the whole body before the key is claimed
    /// (the fingerprint needs it), so a client that stalls its body would otherwise hold up to
    /// [`max_request_body`](Self::max_request_body) of memory for as long as its connection
    /// lives; past the deadline it gets `408 body-timeout`, nothing ran and nothing is stored.
    pub fn request_body_timeout(mut self, timeout: Duration) -> Self {
        self.settings.request_body_timeout = timeout;
        self
    }

    /// The bytes of covered requests' bodies the layer holds at once, across every request it
    /// serves (default 128 MiB; `usize::MAX`: no bound). A body is held from its first byte
    /// until its request's response is produced; a request whose body would pass the bound is
    /// answered `503 busy` with `Retry-After: 1` at once, nothing ran and nothing is stored. With
    /// [`request_body_timeout`](Self::request_body_timeout) it bounds what slow or stalled
    /// uploads can pin: a thousand of them held a gigabyte without it.
    pub fn max_buffered_request_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_buffered_request_bytes = bytes;
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
    /// does not run the handler; `true` runs the handler without idempotency. Even then, a
    /// request whose key the store showed held by another request is answered 409, never run.
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        self.settings.fail_open = fail_open;
        self
    }

    /// IETF (default) or Stripe conventions.
    pub fn profile(mut self, profile: Profile) -> Self {
        self.settings.profile = profile;
        self
    }

    /// How the body enters the fingerprint (default: JSON canonicalised, others raw). Shorthand
    /// for the body part of [`fingerprint_with`](Self::fingerprint_with).
    pub fn body_canonicalization(mut self, canonicalization: BodyCanonicalization) -> Self {
        self.settings.fingerprint = self.settings.fingerprint.body(canonicalization);
        self
    }

    /// Which parts of a request make it "the same request" (default: method, path and query as
    /// the client sent them, and the body with JSON canonicalised): add headers, ignore or keep
    /// JSON fields. See [`FingerprintSpec`](idempotency_core::FingerprintSpec).
    pub fn fingerprint_with(mut self, spec: idempotency_core::FingerprintSpec) -> Self {
        self.settings.fingerprint = spec;
        self
    }

    /// Where the key comes from, instead of the `Idempotency-Key` header: `None` is a missing
    /// key (400 when keys are required). The key is then validated with the key format.
    ///
    /// ```
    /// # use idempotency_tower::IdempotencyLayer;
    /// # let builder = IdempotencyLayer::builder(idempotency_memory::MemoryStore::default()).unscoped();
    /// // The key in a query parameter: POST /orders?request_id=...
    /// let layer = builder
    ///     .key_with(|parts| {
    ///         parts.uri.query()?.split('&').find_map(|pair| {
    ///             pair.strip_prefix("request_id=").map(str::to_owned)
    ///         })
    ///     })
    ///     .build();
    /// ```
    pub fn key_with(
        mut self,
        key: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.settings.key_with = Some(Arc::new(key));
        self
    }

    /// Which requests of the covered methods are covered: those for which `cover` returns true
    /// (default: all). Others pass through untouched.
    pub fn cover_if(mut self, cover: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        self.settings.cover_if = Some(Arc::new(cover));
        self
    }

    /// Bound on each single store call (default 5 s, or a third of the lease when that is
    /// shorter, so that a short lease needs no second setting): the claim, storing the
    /// response, each heartbeat, a release, opening and committing a transaction. A claim past
    /// it is answered as if the store were unreachable; waiting for an in-flight duplicate is
    /// not bounded by it.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.engine.store_timeout = timeout;
        self.store_timeout_chosen = true;
        self
    }

    /// Writes the layer's refusals (400, 401, 409, 413, 422, 500, 503) your way, instead of the
    /// profile's (RFC 9457 problem+json; Stripe's error envelope in [`Profile::Stripe`]). The
    /// layer adds `Retry-After` to 409 and 503 if the renderer did not.
    ///
    /// ```
    /// # use idempotency_tower::{IdempotencyLayer, Refusal};
    /// # let builder = IdempotencyLayer::builder(idempotency_memory::MemoryStore::default()).unscoped();
    /// let layer = builder
    ///     .render_refusals(|refusal: &Refusal| {
    ///         http::Response::builder()
    ///             .status(refusal.status())
    ///             .header("content-type", "text/plain")
    ///             .body(bytes::Bytes::from(format!("{}: {}", refusal.code(), refusal.detail())))
    ///             .unwrap_or_default()
    ///     })
    ///     .build();
    /// ```
    pub fn render_refusals(
        mut self,
        render: impl Fn(&crate::Refusal) -> http::Response<bytes::Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.settings.render = Some(Arc::new(render));
        self
    }

    /// The header a replayed response is marked with (default `Idempotent-Replayed: true`).
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        self.settings.replay_header = name;
        self
    }

    /// Prefix of the `type` URI of problem responses (default `urn:idempotency:problem:`).
    pub fn problem_type_base(mut self, base: impl Into<String>) -> Self {
        self.settings.problem_type_base = base.into();
        self
    }
}
