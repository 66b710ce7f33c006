//! Tests of `service`.

use super::KeyHash;
use idempotency_core::{IdempotencyKey, KeyFormat, Scope};

#[test]
fn the_key_hash_is_short_stable_and_scoped() {
    let key = IdempotencyKey::parse(b"order-1", KeyFormat::opaque()).expect("key");
    let (alice, bob) = (
        Scope::new("alice").expect("scope"),
        Scope::new("bob").expect("scope"),
    );
    let text = KeyHash(&alice, &key).to_string();
    assert_eq!(text.len(), 12);
    assert!(text.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(text, KeyHash(&alice, &key).to_string());
    assert_ne!(text, KeyHash(&bob, &key).to_string());
    assert!(!text.contains("order"));
}
