//! The demo service's command line, built inside this test crate so tests can run it as a child
//! process (`env!("CARGO_BIN_EXE_demo-server")`) and kill it.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    idempotency_demo::cli::run().await
}
