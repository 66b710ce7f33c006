//! The conformance suite against the memory store.

mod memory {
    idempotency_conformance::conformance_suite!(async {
        idempotency_memory::MemoryStore::default()
    });
}

#[test]
fn the_suite_has_every_case() {
    assert!(idempotency_conformance::CASES.len() >= 12);
}
