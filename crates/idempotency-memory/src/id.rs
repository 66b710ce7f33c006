//! A record's address, `(scope, key)`, as one byte string: the scope's length (2 bytes), the
//! scope, the key. Unambiguous whatever bytes the scope holds, one allocation when kept, and
//! none when looked up: the lookup form is built on the stack.

use idempotency_core::{IdempotencyKey, MAX_KEY_LEN, MAX_SCOPE_LEN, Scope};

/// The longest id: a length prefix, the longest scope and the longest key.
const MAX_ID_LEN: usize = 2 + MAX_SCOPE_LEN + MAX_KEY_LEN;

/// A record id as kept in the maps.
pub(crate) type RecordId = Box<[u8]>;

/// The id of `(scope, key)`, built on the stack for lookups.
pub(crate) struct IdBuf {
    bytes: [u8; MAX_ID_LEN],
    len: usize,
}

impl IdBuf {
    pub(crate) fn new(scope: &Scope, key: &IdempotencyKey) -> IdBuf {
        let (scope, key) = (scope.as_str().as_bytes(), key.as_str().as_bytes());
        let mut bytes = [0u8; MAX_ID_LEN];
        // Scope and key lengths are bounded by their constructors.
        let scope_len = scope.len().min(MAX_SCOPE_LEN);
        let key_len = key.len().min(MAX_KEY_LEN);
        bytes[..2].copy_from_slice(&(scope_len as u16).to_le_bytes());
        bytes[2..2 + scope_len].copy_from_slice(&scope[..scope_len]);
        bytes[2 + scope_len..2 + scope_len + key_len].copy_from_slice(&key[..key_len]);
        IdBuf {
            bytes,
            len: 2 + scope_len + key_len,
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// The id to keep in a map.
    pub(crate) fn to_owned_id(&self) -> RecordId {
        Box::from(self.as_bytes())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use idempotency_core::KeyFormat;

    #[test]
    fn ids_are_unambiguous_and_fit_the_longest_scope_and_key() {
        let id = |s: &str, k: &str| {
            IdBuf::new(
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
                &Scope::unscoped(),
                &IdempotencyKey::parse(b"k", KeyFormat::opaque()).unwrap()
            )
            .as_bytes(),
            id("k", "k").as_ref()
        );
    }
}
