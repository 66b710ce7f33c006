//! Load on the demo service over loopback HTTP, per store:
//! `cargo run --release -p idempotency-e2e --bin load -- --store memory --store postgres://postgres@127.0.0.1/postgres`

use clap::Parser;
use idempotency_e2e::load::{LoadConfig, run};

/// Sends a duplicate-heavy mix to the demo service and counts double executions.
#[derive(Parser, Debug)]
struct Args {
    /// Stores to run on (repeatable). Default: memory, the loopback PostgreSQL and Redis.
    #[arg(long)]
    store: Vec<String>,
    /// Logical requests (distinct keys) per store.
    #[arg(long, default_value_t = 5000)]
    logical: usize,
    /// Clients at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Duplicates per burst.
    #[arg(long, default_value_t = 8)]
    burst: usize,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let stores = if args.store.is_empty() {
        vec![
            "memory".to_owned(),
            idempotency_conformance::env::postgres_url(),
            idempotency_conformance::env::redis_url(),
        ]
    } else {
        args.store
    };
    println!(
        "| store | logical requests | HTTP requests | duplicates sent | double executions | never created | unexpected | p50 µs | p99 µs | requests/s |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut failed = false;
    for store in stores {
        let config = LoadConfig {
            store: store.clone(),
            logical: args.logical,
            concurrency: args.concurrency,
            users: 16,
            burst: args.burst,
        };
        match run(&config).await {
            Ok(r) => {
                let scheme = store.split("://").next().unwrap_or(&store);
                println!(
                    "| {scheme} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |",
                    args.logical,
                    r.requests,
                    r.duplicates,
                    r.double_executions,
                    r.never_created,
                    r.unexpected.len(),
                    r.p50_us,
                    r.p99_us,
                    r.requests as f64 / r.elapsed.as_secs_f64()
                );
                failed |=
                    r.double_executions != 0 || !r.unexpected.is_empty() || r.never_created != 0;
            }
            Err(e) => {
                eprintln!("{store}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
