//! Fuzz target: `idempotency_fuzz::stored_response` (see that function for what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idempotency_fuzz::stored_response(data));
