//! The layer and its builder (`settings.rs`: the builder's settings).

mod settings;

use crate::config::{ScopeSource, Settings, Shared};
use crate::service::IdempotencyService;
use http::request::Parts;
use idempotency_core::{ClaimMode, ConfigError, Engine, EngineConfig, IdempotencyStore, Scope};
use std::fmt;
use std::sync::Arc;
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

    /// What the layer's services share.
    pub(crate) fn shared(&self) -> &Arc<Shared<S>> {
        &self.shared
    }

    /// The engine (and through it the store) the layer uses.
    pub fn engine(&self) -> &Engine<S> {
        &self.shared.engine
    }

    /// How the layer's requests hold their keys ([`Engine::claim_mode`]).
    pub fn claim_mode(&self) -> ClaimMode {
        self.shared.engine.claim_mode()
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

/// Per-route variants: layers that share one engine (its store, claim mode, lease, background
/// work and drain), the scope source and the body budget, each with its own request settings.
/// Each method is named as the builder's setting it changes, and returns a new layer: this one
/// is unchanged.
impl<S: IdempotencyStore + 'static> IdempotencyLayer<S> {
    /// This layer with another fingerprint for the routes it is put on (say, one route whose
    /// bodies carry a field that changes on every retry), sharing this layer's engine and drain:
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use idempotency_core::FingerprintSpec;
    /// use idempotency_tower::IdempotencyLayer;
    /// # async fn create() {}
    /// # async fn charge() {}
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = IdempotencyLayer::builder(idempotency_memory::MemoryStore::default())
    ///     .unscoped()
    ///     .build()?;
    /// let charges = layer.fingerprint_with(FingerprintSpec::new().ignore_json("/sent_at")?);
    /// let app: Router = Router::new()
    ///     .route("/tasks", post(create).route_layer(layer.clone()))
    ///     .route("/charges", post(charge).route_layer(charges));
    /// // One drain awaits the requests of both routes.
    /// let _drain = layer.drain();
    /// # Ok(()) }
    /// ```
    pub fn fingerprint_with(&self, spec: idempotency_core::FingerprintSpec) -> Self {
        self.variant(|settings| settings.fingerprint = spec)
    }

    /// This layer taking the key from `key` instead of the header (see
    /// [`IdempotencyLayerBuilder::key_with`]), sharing this layer's engine and drain.
    pub fn key_with(&self, key: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.variant(|settings| settings.key_with = Some(Arc::new(key)))
    }

    /// This layer storing the statuses `policy` stores instead of the engine's policy,
    /// sharing this layer's engine and drain.
    pub fn replay_policy(&self, policy: idempotency_core::ReplayPolicy) -> Self {
        self.variant(|settings| settings.replay_policy = policy)
    }

    /// This layer with other
    /// [`rejection_statuses`](IdempotencyLayerBuilder::rejection_statuses), sharing this
    /// layer's engine and drain.
    pub fn rejection_statuses(&self, statuses: impl IntoIterator<Item = http::StatusCode>) -> Self {
        let statuses: Vec<_> = statuses.into_iter().collect();
        self.variant(|settings| settings.rejection_statuses = statuses)
    }

    /// A layer on the same engine, scope source and body budget with `change` made to a copy
    /// of the settings. Its per-route counters are its own.
    fn variant(&self, change: impl FnOnce(&mut Settings)) -> Self {
        let shared = &self.shared;
        let mut settings = shared.settings.clone();
        change(&mut settings);
        IdempotencyLayer {
            shared: Arc::new(Shared {
                engine: shared.engine.clone(),
                scope: shared.scope.clone(),
                render: Arc::clone(&shared.render),
                bodies: shared.bodies.clone(),
                settings,
                routes: Default::default(),
            }),
        }
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
    /// Builds the layer, or says why its engine settings cannot run on its store
    /// ([`ConfigError`]): with the heartbeat on, a lease shorter than three store timeouts set
    /// with `store_timeout` (left unset, the store timeout shrinks to a third of the lease); a
    /// one-transaction mode on a store that cannot hold a key in a transaction; the speculative
    /// mode with a wait, or on a store that cannot speculate.
    pub fn build(mut self) -> Result<IdempotencyLayer<S>, ConfigError> {
        if !self.store_timeout_chosen {
            self.engine.store_timeout = self
                .engine
                .store_timeout
                .min(self.engine.lease / EngineConfig::MIN_LEASE_IN_STORE_TIMEOUTS);
        }
        let engine = Engine::new(self.store, self.engine)?;
        // The layer decides what is stored; per-route variants may replace it.
        self.settings.replay_policy = engine.config().replay_policy.clone();
        Ok(IdempotencyLayer {
            shared: Arc::new(Shared {
                engine,
                scope: self.scope.0,
                render: self.settings.renderer(),
                bodies: crate::body::BodyBudget::new(self.settings.max_buffered_request_bytes),
                settings: self.settings,
                routes: Default::default(),
            }),
        })
    }
}
