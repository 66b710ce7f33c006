//! What the layer is configured with, shared by every service it makes.

use crate::refusal::{Profile, RenderRefusal, problem_json, stripe_error};
use http::request::Parts;
use http::{HeaderName, Method};
use idempotency_core::{Engine, FingerprintSpec, KeyFormat, Scope};
use std::fmt;
use std::sync::Arc;

/// The default prefix of problem `type` URIs.
pub(crate) const DEFAULT_PROBLEM_TYPE_BASE: &str = "urn:idempotency:problem:";

/// A request's scope: `Ok(None)` when it has no principal (401 `scope-missing`), `Err` with why
/// when its principal cannot form a scope (401 `scope-invalid`): never a shared scope.
type ScopeFn = Arc<dyn Fn(&Parts) -> Result<Option<Scope>, String> + Send + Sync>;
pub(crate) type KeyFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;
pub(crate) type CoverFn = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;

/// Where the scope (the authenticated principal) of a request comes from. Chosen on the
/// builder; the layer cannot be built without it.
#[derive(Clone)]
pub(crate) enum ScopeSource {
    /// Every caller shares one key space (the dangerous opt-out).
    Unscoped,
    /// Taken from the request; a request without one is refused with 401.
    Extract(ScopeFn),
}

impl fmt::Debug for ScopeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeSource::Unscoped => f.write_str("Unscoped"),
            ScopeSource::Extract(_) => f.write_str("Extract"),
        }
    }
}

/// The layer's HTTP settings (the protocol's are the engine's).
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) header: HeaderName,
    pub(crate) methods: Vec<Method>,
    pub(crate) key_required: bool,
    pub(crate) key_format: KeyFormat,
    pub(crate) max_request_body: usize,
    /// How long a covered request's body may take to arrive.
    pub(crate) request_body_timeout: std::time::Duration,
    /// The bytes of covered requests' bodies held at once, across every request.
    pub(crate) max_buffered_request_bytes: usize,
    pub(crate) max_stored_body: usize,
    pub(crate) fail_open: bool,
    pub(crate) profile: Profile,
    pub(crate) fingerprint: FingerprintSpec,
    /// Where the key comes from, when not the header.
    pub(crate) key_with: Option<KeyFn>,
    /// Which requests are covered, beyond their method.
    pub(crate) cover_if: Option<CoverFn>,
    pub(crate) problem_type_base: String,
    /// Writes refusals; `None`: the profile's default.
    pub(crate) render: Option<RenderRefusal>,
    /// The header a replay is marked with.
    pub(crate) replay_header: HeaderName,
    /// Statuses a framework rejects a request with before its handler runs: a response with
    /// one of them is stored only when the handler marked it [`Final`](crate::Final).
    pub(crate) rejection_statuses: Vec<http::StatusCode>,
    /// Which statuses are stored: the engine's policy, set by `build()`, or a per-route
    /// variant's own.
    pub(crate) replay_policy: idempotency_core::ReplayPolicy,
}

/// The statuses a framework answers with before the handler runs: axum's extractors (`Json`,
/// `Form`, `Query`, `Path`, `Bytes`, body limits: 400, 411, 413, 415, 422) and its router (404
/// for a path no route serves, 405 for a method the route does not).
pub(crate) const REJECTION_STATUSES: [http::StatusCode; 7] = [
    http::StatusCode::BAD_REQUEST,
    http::StatusCode::NOT_FOUND,
    http::StatusCode::METHOD_NOT_ALLOWED,
    http::StatusCode::LENGTH_REQUIRED,
    http::StatusCode::PAYLOAD_TOO_LARGE,
    http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
    http::StatusCode::UNPROCESSABLE_ENTITY,
];

impl Settings {
    /// The renderer refusals go through: the configured one, or the profile's.
    pub(crate) fn renderer(&self) -> RenderRefusal {
        if let Some(render) = &self.render {
            return Arc::clone(render);
        }
        match self.profile {
            Profile::Ietf => {
                let base = self.problem_type_base.clone();
                Arc::new(move |refusal| problem_json(refusal, &base))
            }
            Profile::Stripe => Arc::new(stripe_error),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            header: HeaderName::from_static("idempotency-key"),
            methods: vec![Method::POST, Method::PATCH, Method::DELETE],
            key_required: true,
            key_format: KeyFormat::default(),
            max_request_body: 1024 * 1024,
            request_body_timeout: std::time::Duration::from_secs(30),
            max_buffered_request_bytes: 128 * 1024 * 1024,
            max_stored_body: 1024 * 1024,
            fail_open: false,
            profile: Profile::Ietf,
            fingerprint: FingerprintSpec::new(),
            key_with: None,
            cover_if: None,
            problem_type_base: DEFAULT_PROBLEM_TYPE_BASE.to_owned(),
            render: None,
            replay_header: idempotency_core::IDEMPOTENT_REPLAYED,
            rejection_statuses: REJECTION_STATUSES.to_vec(),
            replay_policy: idempotency_core::ReplayPolicy::standard(),
        }
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("header", &self.header)
            .field("methods", &self.methods)
            .field("profile", &self.profile)
            .finish_non_exhaustive()
    }
}

/// Everything a service needs, built once by the layer.
pub(crate) struct Shared<S> {
    pub(crate) engine: Engine<S>,
    pub(crate) scope: ScopeSource,
    pub(crate) settings: Settings,
    /// `settings.renderer()`, resolved once.
    pub(crate) render: RenderRefusal,
    /// The counters' keys of the routes served so far.
    pub(crate) routes: crate::route::RouteKeys,
    /// The bytes of request bodies held at once, across every request.
    pub(crate) bodies: crate::body::BodyBudget,
}
