//! Idempotency keys for the calls a request makes to other services, derived from its own
//! ([`DerivedKey`]).

use crate::key::IdempotencyKey;

use crate::scope::Scope;
use sha2::{Digest, Sha256};
use std::fmt;

/// The label hashed first, so that no other SHA-256 this library (or anyone) computes over
/// the same bytes gives the same digest; `v1` changes only with the derivation, which would
/// change every derived key (and so must never happen silently).
const DOMAIN: &[u8] = b"idempotency-derived-key/v1";

/// An idempotency key for one outside call of a request, derived from the request's scope, its
/// key and the name of the step. Its text is 64 lowercase hex characters;
/// [`DerivedKey::to_uuid`] gives the UUID-shaped variant.
///
/// A handler that charges a payment provider must send the provider the same key on every run
/// of the same logical request: after a crash, a lapsed lease or a takeover on another instance
/// the request runs again, and only a key that does not change lets the provider replay its
/// first answer instead of charging twice. A fresh UUID per run changes; the client's own key
/// would not, but it would hand the client's key to a third party and collide across the steps
/// of one request (two charges) and across users (two clients who picked the same key).
///
/// [`DerivedKey::derive`] hashes the scope, the client's key and a step name, each
/// length-prefixed so that no two different triples hash alike, with SHA-256 under a label of
/// its own (`idempotency-derived-key/v1`). So the derived key is:
/// - the same on every retry, takeover and instance (it depends on nothing else: no clock, no
///   token, no process state);
/// - different for another scope, another key or another step;
/// - not reversible to the client's key: it is a SHA-256 digest, so recovering a key from it
///   means guessing the key. A UUID v4 key (what the protocol asks clients to send) cannot be
///   guessed; a key a client derives from something public (an order number) can be, and then
///   the derived key says which order it is. It never says anything the scope and the step name
///   did not;
/// - in the shapes downstream APIs take: 64 lowercase hex characters ([`DerivedKey::as_str`],
///   under Stripe's 255 and the IETF draft's structured-field string), or a UUID
///   ([`DerivedKey::to_uuid`], version 8, for an API that asks for a UUID).
///
/// ```
/// use idempotency_core::{DerivedKey, IdempotencyKey, KeyFormat, Scope};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let scope = Scope::new("user-42")?;
/// let key = IdempotencyKey::parse(b"8e03978e-40d5-43e8-bc93-6894a57f9324", KeyFormat::default())?;
/// let charge = DerivedKey::derive(&scope, &key, "charge");
/// assert_eq!(charge, DerivedKey::derive(&scope, &key, "charge"), "the same on every run");
/// assert_ne!(charge, DerivedKey::derive(&scope, &key, "refund"), "one per step");
/// assert_eq!(charge.as_str().len(), 64);
/// assert!(!charge.as_str().contains("8e03978e"), "the client's key does not show");
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DerivedKey {
    digest: [u8; 32],
    /// `digest` in lowercase hex, kept so that [`DerivedKey::as_str`] borrows.
    hex: [u8; 64],
}

impl DerivedKey {
    /// The key of step `step` of the request with `key` in `scope`. Name each outside call of a
    /// handler with a step of its own (`"charge"`, `"email/receipt"`, `"charge/2"` for a second
    /// charge); the name is hashed, never sent.
    pub fn derive(scope: &Scope, key: &IdempotencyKey, step: &str) -> Self {
        let mut hash = Sha256::new();
        for part in [
            DOMAIN,
            scope.as_str().as_bytes(),
            key.as_str().as_bytes(),
            step.as_bytes(),
        ] {
            // Length-prefixed: ("ab", "c") and ("a", "bc") hash apart.
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part);
        }
        let digest: [u8; 32] = hash.finalize().into();
        let mut hex = [0u8; 64];
        for (pair, byte) in hex.chunks_exact_mut(2).zip(digest) {
            const DIGITS: &[u8; 16] = b"0123456789abcdef";
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0x0f)];
        }
        DerivedKey { digest, hex }
    }

    /// The key as 64 lowercase hex characters: what to send as the downstream call's
    /// `Idempotency-Key` (Stripe takes up to 255 characters).
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written to `hex`.
        std::str::from_utf8(&self.hex).unwrap_or_default()
    }

    /// The key as a UUID (version 8, RFC 9562's custom layout: the first 16 bytes of the digest
    /// with the version and variant bits set), for a downstream API that only takes UUIDs.
    /// Derived from the same digest as [`DerivedKey::as_str`], so the two never name different
    /// requests, but they are different strings: pick one form per downstream and keep it.
    pub fn to_uuid(&self) -> uuid::Uuid {
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&self.digest[..16]);
        uuid::Builder::from_custom_bytes(bytes).into_uuid()
    }
}

impl fmt::Display for DerivedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for DerivedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DerivedKey").field(&self.as_str()).finish()
    }
}

impl AsRef<str> for DerivedKey {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn derive(scope: &str, key: &str, step: &str) -> DerivedKey {
        DerivedKey::derive(
            &Scope::new(scope).unwrap(),
            &IdempotencyKey::parse(key.as_bytes(), crate::key::KeyFormat::default()).unwrap(),
            step,
        )
    }

    /// Pinned: a derived key is sent to other services and stored there, so a change of the
    /// derivation would make every retry after an upgrade charge again. This digest was
    /// computed independently: `printf` of the length-prefixed parts piped to `sha256sum`.
    #[test]
    fn the_derivation_is_stable_across_releases() {
        let key = derive("user-1", "k-1", "charge");
        assert_eq!(key.as_str(), PINNED);
        assert_eq!(key.to_string(), PINNED);
        assert_eq!(format!("{key:?}"), format!("DerivedKey(\"{PINNED}\")"));
    }

    const PINNED: &str = "f1c706ae132714134a79d0c8b676524bb9a215b267a1c61467f1be6caad7b352";

    #[test]
    fn another_scope_key_or_step_derives_another_key() {
        let base = derive("user-1", "k-1", "charge");
        let others = [
            derive("user-2", "k-1", "charge"),
            derive("user-1", "k-2", "charge"),
            derive("user-1", "k-1", "refund"),
            derive("user-1", "k-1", ""),
            // The same bytes, cut elsewhere: the length prefixes tell them apart.
            derive("user-1k", "-1", "charge"),
            derive("user-1", "k-1c", "harge"),
        ];
        let mut seen: HashSet<DerivedKey> = HashSet::from([base.clone()]);
        for other in others {
            assert!(seen.insert(other.clone()), "{other:?} seen before");
            assert_ne!(other.to_uuid(), base.to_uuid());
        }
        assert_eq!(base, derive("user-1", "k-1", "charge"));
    }

    #[test]
    fn the_text_is_lowercase_hex_and_the_uuid_is_a_version_8_of_the_same_digest() {
        let key = derive("user-1", "8e03978e-40d5-43e8-bc93-6894a57f9324", "charge");
        assert_eq!(key.as_str().len(), 64);
        assert!(
            key.as_str()
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert!(!key.as_str().contains("8e03978e"));
        let uuid = key.to_uuid();
        assert_eq!(uuid.get_version_num(), 8);
        assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122);
        let simple = uuid.simple().to_string();
        // Apart from the version nibble and the variant bits, the UUID is the text's start.
        assert_eq!(simple[..12], key.as_str()[..12]);
        assert_eq!(simple[13..16], key.as_str()[13..16]);
        assert_eq!(simple[18..], key.as_str()[18..32]);
    }
}
