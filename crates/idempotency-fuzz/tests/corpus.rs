//! Replays the committed corpus of every fuzz target (`fuzz/corpus/<target>/`: the seeds, what
//! the fuzzer kept, and every input that once broke a property) through the target's checks,
//! on the stable toolchain: a regression fails `cargo test`, not only a fuzzing run.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    inputs.sort();
    assert!(
        !inputs.is_empty(),
        "no corpus for {target} in {}",
        dir.display()
    );
    for input in &inputs {
        let data = std::fs::read(input).unwrap();
        if let Err(panic) = std::panic::catch_unwind(|| check(&data)) {
            std::panic::resume_unwind(Box::new(format!(
                "{target}: {} broke a property: {:?}",
                input.display(),
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
            )));
        }
    }
    eprintln!("{target}: {} inputs hold", inputs.len());
}

#[test]
fn the_key_corpus_holds() {
    replay("key", idempotency_fuzz::key);
}

#[test]
fn the_stored_response_corpus_holds() {
    replay("stored_response", idempotency_fuzz::stored_response);
}

#[test]
fn the_json_fingerprint_corpus_holds() {
    replay("json_fingerprint", idempotency_fuzz::json_fingerprint);
}

#[test]
fn the_refusals_corpus_holds() {
    replay("refusals", idempotency_fuzz::refusals);
}
