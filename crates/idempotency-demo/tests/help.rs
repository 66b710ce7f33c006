//! The demo's `--help` never shows the store address it found in the environment (it may carry
//! a password).

#[test]
fn help_hides_the_store_address_from_the_environment() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idempotency-demo"))
        .arg("--help")
        .env(
            "IDEMPOTENCY_STORE",
            "postgres://app:hunter2x@db.internal/app",
        )
        .output()
        .expect("run the demo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("IDEMPOTENCY_STORE"),
        "the variable is named: {text}"
    );
    assert!(!text.contains("hunter2x"), "{text}");
}
