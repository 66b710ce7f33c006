#![doc = include_str!("../README.md")]
//!
mod derived_key;
mod engine;
mod error;
mod fingerprint;
mod json;
mod key;
pub mod monitoring;
pub mod once;
mod record;
mod redact;
mod response;
mod scope;
mod state_loss;
pub mod store;
mod sync;
#[cfg(test)]
mod test_store;
mod transaction;

pub use derived_key::DerivedKey;
pub use engine::protocol;
pub use engine::status::KeyStatus;
pub use engine::{
    Begin, ClaimMode, Completion, ConfigError, Drain, Engine, EngineConfig, Guard, KeyClaim,
    ReplayPolicy, Replayed, RollbackCause, ScopeLimit, Superseded, TransactionAdmission,
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
pub use response::{
    DecodeError, IDEMPOTENCY_KEY_EXPIRES, IDEMPOTENCY_ORIGINAL_DATE, IDEMPOTENCY_REFUSAL,
    IDEMPOTENT_REPLAYED, StoredResponse, is_replayable_header,
};
pub use scope::{MAX_SCOPE_LEN, Scope, ScopeError};
pub use store::{IdempotencyStore, purge_periodically};
pub use transaction::{Transaction, TransactionError, TransactionSlot};

/// Re-exported so users name the same `http` and `bytes` versions.
pub use {bytes, http};
