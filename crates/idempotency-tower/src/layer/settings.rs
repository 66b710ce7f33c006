//! The builder's settings, whether or not its scope source is chosen: the key, the protocol's
//! timings and policy, bodies, the fingerprint, and how refusals are written.

use super::IdempotencyLayerBuilder;
use crate::refusal::Profile;
use http::request::Parts;
use http::{HeaderName, Method, StatusCode};
use idempotency_core::{
    BodyCanonicalization, ClaimMode, KeyFormat, ReplayPolicy, TransactionAdmission,
};
use std::sync::Arc;
use std::time::Duration;

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
    /// transaction (the PostgreSQL store; the handler takes `Tx<PostgresTransaction>`): the round
    /// trips of a bare `BEGIN; ...; COMMIT`, nothing left behind by a crash. Use it only for
    /// routes whose handlers' side effects are **all** writes in that transaction: whatever a
    /// handler does outside it (an HTTP call, an email, a message) is not made once by it.
    /// On a store without the mode, [`build`](IdempotencyLayerBuilder::build) returns
    /// [`ConfigError::OneTransactionUnsupported`](idempotency_core::ConfigError::OneTransactionUnsupported)
    /// (and [`ConfigError::SpeculativeUnsupported`](idempotency_core::ConfigError::SpeculativeUnsupported)
    /// for [`ClaimMode::OneTransactionSpeculative`] on one that cannot speculate, sqlx);
    /// [`IdempotencyLayer::claim_mode`](crate::IdempotencyLayer::claim_mode) says which mode a built layer runs.
    pub fn claim_mode(mut self, mode: ClaimMode) -> Self {
        self.engine.claim_mode = mode;
        self
    }

    /// How many request transactions run at once on a store whose transactions hold pooled
    /// connections (the PostgreSQL store): [`TransactionAdmission::Adaptive`] (the default)
    /// admits fewer than the pool when the transactions wait on each other (hot rows), so a
    /// default pool holds under contention; [`TransactionAdmission::WholePool`] lets the
    /// pool alone limit them. A request that waits longer than the store timeout for a place
    /// is answered `503 store-busy`; replays and duplicates never wait for one.
    pub fn transaction_admission(mut self, admission: TransactionAdmission) -> Self {
        self.engine.transaction_admission = admission;
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
    /// is not a store call: it is not bounded by the store timeout. A duplicate on the instance
    /// that runs the request is answered as soon as its answer is stored; one on another
    /// instance at its next poll of the store (10 ms, doubling to 250 ms).
    pub fn in_flight_wait(mut self, wait: Duration) -> Self {
        self.engine.in_flight_wait = wait;
        self
    }

    /// With [`in_flight_wait`](Self::in_flight_wait): at most this many duplicates of one key
    /// wait at once (default 16); one more gets `409` at once.
    pub fn max_waiters_per_key(mut self, waiters: usize) -> Self {
        self.engine.max_waiters_per_key = waiters;
        self
    }

    /// With [`in_flight_wait`](Self::in_flight_wait): at most this many duplicates wait at once,
    /// all keys together (default 1024); one more gets `409` at once, so a flood of duplicates
    /// cannot hold the server's requests.
    pub fn max_waiters(mut self, waiters: usize) -> Self {
        self.engine.max_waiters = waiters;
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

    /// The statuses a framework rejects a request with before its handler runs (default: 400,
    /// 411, 413, 415 and 422, what axum's extractors answer a missing `Content-Type`, malformed
    /// JSON or an oversized body with; 404 and 405, what axum's router answers a path or a
    /// method no route serves with). A response with one of them is not stored, and its key is
    /// released (its transaction rolled back), unless the handler marked it
    /// [`Final`](crate::Final): a rejection produced before the handler ran must not answer the
    /// corrected retry for a day. As Stripe: a result is saved only once the endpoint began
    /// executing. A handler's own 400 or 422 without `Final` is not stored either, which costs
    /// nothing when it changed nothing (a validation error: the retry validates again); mark
    /// it `Final` when it did. Pass an empty list to store them all, as before.
    pub fn rejection_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.settings.rejection_statuses = statuses.into_iter().collect();
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
    /// # fn main() -> Result<(), idempotency_core::ConfigError> {
    /// # let builder = IdempotencyLayer::builder(idempotency_memory::MemoryStore::default()).unscoped();
    /// // The key in a query parameter: POST /orders?request_id=...
    /// let layer = builder
    ///     .key_with(|parts| {
    ///         parts.uri.query()?.split('&').find_map(|pair| {
    ///             pair.strip_prefix("request_id=").map(str::to_owned)
    ///         })
    ///     })
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
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
    /// # fn main() -> Result<(), idempotency_core::ConfigError> {
    /// # let builder = IdempotencyLayer::builder(idempotency_memory::MemoryStore::default()).unscoped();
    /// let layer = builder
    ///     .render_refusals(|refusal: &Refusal| {
    ///         http::Response::builder()
    ///             .status(refusal.status())
    ///             .header("content-type", "text/plain")
    ///             .body(bytes::Bytes::from(format!("{}: {}", refusal.code(), refusal.detail())))
    ///             .unwrap_or_default()
    ///     })
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
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
