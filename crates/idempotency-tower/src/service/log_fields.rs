//! What the layer's log lines and spans say of a request: a hash of its key, never the key, and
//! a panic's message.

use idempotency_core::{IdempotencyKey, Scope};
use sha2::{Digest, Sha256};

/// The message a panic was raised with, for the log.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    match panic.downcast_ref::<&'static str>() {
        Some(message) => message,
        None => panic
            .downcast_ref::<String>()
            .map_or("(not a string)", String::as_str),
    }
}

/// A short, stable, non-reversible id of `(scope, key)` for logs: never the key itself. Hashed
/// when it is formatted, so a span that is never recorded costs nothing (tracing evaluates a
/// disabled span's fields when its `log` feature is on, which sqlx and tower turn on).
pub(super) struct KeyHash<'a>(pub(super) &'a Scope, pub(super) &'a IdempotencyKey);

impl std::fmt::Display for KeyHash<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut h = Sha256::new();
        h.update(self.0.as_str().as_bytes());
        h.update([0]);
        h.update(self.1.as_str().as_bytes());
        for byte in &h.finalize()[..6] {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}
