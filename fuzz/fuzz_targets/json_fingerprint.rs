//! Fuzz target: `idempotency_fuzz::json_fingerprint` (see that function for what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idempotency_fuzz::json_fingerprint(data));
