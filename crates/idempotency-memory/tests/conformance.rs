//! The conformance suite against the memory store.

mod memory {
    idempotency_conformance::conformance_suite!(async {
        idempotency_memory::MemoryStore::default()
    });
}
