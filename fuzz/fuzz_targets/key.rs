//! Fuzz target: `idempotency_fuzz::key` (see that function for what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idempotency_fuzz::key(data));
