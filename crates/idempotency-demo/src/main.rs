//! The demo service: `cargo run -p idempotency-demo` serves the task API on 127.0.0.1:3000 with
//! the embedded memory store; `--help` lists the options.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    idempotency_demo::cli::run().await
}
