//! Core of the idempotency-key library: validated keys and scopes, request fingerprints, the
//! stored response and its encoding, the [`IdempotencyStore`] trait every backend implements,
//! and the [`Engine`] that holds the protocol policy once for all of them.
//!
//! A retried `POST` runs its side effect once: the first request claims `(scope, key)`, runs,
//! and stores its response; a retry with the same fingerprint gets that response back, a
//! concurrent duplicate is told the first is still running, and a different request with the
//! same key is refused.
//!
//! ```
//! use idempotency_core::{
//!     Begin, BodyCanonicalization, Engine, EngineConfig, Fingerprint, IdempotencyKey,
//!     KeyFormat, Scope, StoredResponse,
//! };
//! use idempotency_memory::MemoryStore;
//! use bytes::Bytes;
//! use http::{HeaderMap, StatusCode};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Any IdempotencyStore works here: memory, Postgres, Redis.
//! let store = MemoryStore::builder().build();
//! let engine = Engine::new(store, EngineConfig::default());
//! let scope = Scope::new("user-42")?;
//! let key = IdempotencyKey::parse(b"8e03978e-40d5-43e8-bc93-6894a57f9324", KeyFormat::UuidV4)?;
//! let body = br#"{"title":"Buy milk"}"#;
//! let fp = Fingerprint::of_request("POST", "/tasks", body, BodyCanonicalization::Json);
//!
//! // First request: it holds the key, runs, and stores its response.
//! let Begin::Proceed(guard) = engine.begin(scope.clone(), key.clone(), fp).await? else {
//!     unreachable!("a fresh key is always free")
//! };
//! let response = StoredResponse::capture(StatusCode::CREATED, &HeaderMap::new(), Bytes::from_static(b"{\"id\":1}"));
//! guard.complete(response).await;
//!
//! // The retry is answered from the store, byte for byte.
//! match engine.begin(scope, key, fp).await? {
//!     Begin::Replay(stored) => assert_eq!(stored.body().as_ref(), b"{\"id\":1}"),
//!     other => panic!("expected a replay, got {other:?}"),
//! }
//! # Ok(()) }
//! ```

mod engine;
mod error;
mod fingerprint;
mod json;
mod key;
pub mod once;
mod record;
mod redact;
mod response;
mod scope;
mod state_loss;
pub mod store;
mod transaction;

#[cfg(feature = "axum")]
pub use engine::LeaseRejection;
pub use engine::{
    Begin, ClaimMode, Completion, Drain, Engine, EngineConfig, Guard, Lease, ReplayPolicy,
    RollbackCause, ScopeLimit, Superseded,
};
pub use error::{BoxError, ErrorChain, StoreError};
pub use fingerprint::{
    BodyCanonicalization, FINGERPRINT_LEN, Fingerprint, FingerprintAlgorithm, FingerprintError,
    FingerprintSpec,
};
pub use json::{JsonPointer, JsonPointerError};
pub use key::{IdempotencyKey, KeyError, KeyFormat, MAX_KEY_LEN};
pub use once::{OnceContext, OnceError, Outcome};
pub use record::LeaseToken;
pub use redact::redact_credentials;
pub use response::{DecodeError, IDEMPOTENT_REPLAYED, StoredResponse, is_replayable_header};
pub use scope::{MAX_SCOPE_LEN, Scope, ScopeError};
pub use store::{IdempotencyStore, purge_periodically};
pub use transaction::{Transaction, TransactionError, TransactionSlot};

/// Re-exported so users name the same `http` and `bytes` versions.
pub use {bytes, http};
