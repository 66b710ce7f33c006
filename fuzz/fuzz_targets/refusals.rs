//! Fuzz target: `idempotency_fuzz::refusals` (see that function for what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idempotency_fuzz::refusals(data));
