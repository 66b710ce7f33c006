//! A record's address, `(scope, key)`, as one byte string: its hash (8 bytes), the scope's
//! length (2 bytes), the scope, the key. Unambiguous whatever bytes the scope holds, one
//! allocation when kept, and none when looked up: the lookup form is built on the stack.
//!
//! The hash is computed once, when the id is built, with a per-store random seed (foldhash), and
//! carried in the id: the memory store's table and the replay tier's moka cache both read it
//! instead of hashing the bytes again. A table hashes a key several times over its life (on
//! lookup, insert, maintenance and each resize); the profile of fresh keys showed that hashing
//! at 8% of the server's CPU before ids carried their hash.

use idempotency_core::{IdempotencyKey, MAX_KEY_LEN, MAX_SCOPE_LEN, Scope};
use std::hash::{BuildHasher, Hasher};

/// Bytes of the hash at the start of an id.
const HASH_LEN: usize = 8;

/// The longest id: the hash, a length prefix, the longest scope and the longest key.
const MAX_ID_LEN: usize = HASH_LEN + 2 + MAX_SCOPE_LEN + MAX_KEY_LEN;

/// A record id as kept in the maps.
pub(crate) type RecordId = Box<[u8]>;

/// The id of `(scope, key)`, built on the stack for lookups.
pub(crate) struct IdBuf {
    bytes: [u8; MAX_ID_LEN],
    len: usize,
}

impl IdBuf {
    /// The id of `(scope, key)`, hashed with `seed`.
    pub(crate) fn new(
        seed: &foldhash::fast::RandomState,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> IdBuf {
        let (scope, key) = (scope.as_str().as_bytes(), key.as_str().as_bytes());
        let mut bytes = [0u8; MAX_ID_LEN];
        // Scope and key lengths are bounded by their constructors.
        let scope_len = scope.len().min(MAX_SCOPE_LEN);
        let key_len = key.len().min(MAX_KEY_LEN);
        let start = HASH_LEN;
        bytes[start..start + 2].copy_from_slice(&(scope_len as u16).to_le_bytes());
        bytes[start + 2..start + 2 + scope_len].copy_from_slice(&scope[..scope_len]);
        let len = start + 2 + scope_len + key_len;
        bytes[start + 2 + scope_len..len].copy_from_slice(&key[..key_len]);
        let hash = seed.hash_one(&bytes[start..len]);
        bytes[..HASH_LEN].copy_from_slice(&hash.to_le_bytes());
        IdBuf { bytes, len }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// The id to keep in a map.
    pub(crate) fn to_owned_id(&self) -> RecordId {
        Box::from(self.as_bytes())
    }
}

/// The hash an id carries.
pub(crate) fn hash_of(id: &[u8]) -> u64 {
    let mut hash = [0u8; HASH_LEN];
    if let Some(prefix) = id.get(..HASH_LEN) {
        hash.copy_from_slice(prefix);
    }
    u64::from_le_bytes(hash)
}

/// Hashes ids by the hash they carry: for the replay tier's cache, whose keys are ids
/// (`Box<[u8]>` owned, `[u8]` borrowed; both hash as a length, then the bytes in one `write`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CarriedHash;

impl BuildHasher for CarriedHash {
    type Hasher = CarriedHasher;

    fn build_hasher(&self) -> CarriedHasher {
        CarriedHasher(0)
    }
}

/// See [`CarriedHash`].
#[derive(Debug)]
pub(crate) struct CarriedHasher(u64);

impl Hasher for CarriedHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = hash_of(bytes);
    }

    /// The length prefix of a slice: the hash already covers it.
    fn write_usize(&mut self, _: usize) {}

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The scope's bytes in an id built by [`IdBuf::new`] (empty for a shorter byte string).
pub(crate) fn scope_of(id: &[u8]) -> &[u8] {
    let Some(&[low, high]) = id.get(HASH_LEN..HASH_LEN + 2) else {
        return &[];
    };
    let len = usize::from(u16::from_le_bytes([low, high]));
    id.get(HASH_LEN + 2..HASH_LEN + 2 + len).unwrap_or(&[])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use idempotency_core::KeyFormat;

    #[test]
    fn ids_are_unambiguous_and_fit_the_longest_scope_and_key() {
        let seed = foldhash::fast::RandomState::default();
        let id = |s: &str, k: &str| {
            IdBuf::new(
                &seed,
                &Scope::new(s).unwrap(),
                &IdempotencyKey::parse(k.as_bytes(), KeyFormat::opaque()).unwrap(),
            )
            .to_owned_id()
        };
        assert_ne!(id("ab", "c"), id("a", "bc"));
        assert_eq!(id("a", "b"), id("a", "b"));
        let longest = id(&"s".repeat(MAX_SCOPE_LEN), &"k".repeat(MAX_KEY_LEN));
        assert_eq!(longest.len(), MAX_ID_LEN);
        assert_ne!(
            IdBuf::new(
                &seed,
                &Scope::unscoped(),
                &IdempotencyKey::parse(b"k", KeyFormat::opaque()).unwrap()
            )
            .as_bytes(),
            id("k", "k").as_ref()
        );
    }

    #[test]
    fn owned_and_borrowed_ids_hash_alike_by_the_hash_they_carry() {
        let seed = foldhash::fast::RandomState::default();
        let id = IdBuf::new(
            &seed,
            &Scope::new("alice").unwrap(),
            &IdempotencyKey::parse(b"8e03978e-40d5-43e8-bc93-6894a57f9324", KeyFormat::opaque())
                .unwrap(),
        );
        let owned = id.to_owned_id();
        let carried = hash_of(id.as_bytes());
        assert_eq!(CarriedHash.hash_one(&owned), carried);
        assert_eq!(CarriedHash.hash_one(id.as_bytes()), carried);
        let other = IdBuf::new(
            &seed,
            &Scope::new("bob").unwrap(),
            &IdempotencyKey::parse(b"8e03978e-40d5-43e8-bc93-6894a57f9324", KeyFormat::opaque())
                .unwrap(),
        );
        assert_ne!(hash_of(other.as_bytes()), carried);
    }
}
