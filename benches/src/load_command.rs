//! `idempotency-bench load`: the duplicate-heavy mix against the demo on every store, one
//! Markdown row per store.

use crate::cli::LoadArgs;
use idempotency_bench::load::{LoadConfig, run};

/// Runs the load on every store and prints one Markdown row per store.
pub(crate) async fn load(args: LoadArgs) -> std::process::ExitCode {
    use idempotency::TableMode;
    let logical = args
        .logical
        .unwrap_or(if args.long { 60_000 } else { 5_000 });
    // The long mode's cluster lives until the runs are over.
    let mut cluster = None;
    let stores: Vec<(String, TableMode)> = if !args.store.is_empty() {
        args.store
            .into_iter()
            .map(|s| (s, TableMode::Unlogged))
            .collect()
    } else {
        let postgres = idempotency_testkit::env::postgres_url();
        let mut stores = vec![
            ("memory".to_owned(), TableMode::Unlogged),
            (postgres.clone(), TableMode::Unlogged),
        ];
        if args.long {
            stores.push((postgres, TableMode::Logged));
        }
        stores.push((idempotency_testkit::env::redis_url(), TableMode::Unlogged));
        if args.long {
            match idempotency_testkit::TempRedisCluster::start() {
                Ok(c) => {
                    let nodes: Vec<String> = c
                        .urls()
                        .iter()
                        .map(|u| u.trim_start_matches("redis://").to_owned())
                        .collect();
                    stores.push((
                        format!("redis+cluster://{}", nodes.join(",")),
                        TableMode::Unlogged,
                    ));
                    cluster = Some(c);
                }
                Err(e) => {
                    eprintln!("could not start a throwaway Redis Cluster: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            }
        }
        stores
    };
    println!(
        "| store | logical requests | HTTP requests | duplicates sent | double executions | never created | unexpected | p50 µs | p99 µs | requests/s |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut failed = false;
    for (store, table_mode) in stores {
        let config = LoadConfig {
            store: store.clone(),
            table_mode,
            logical,
            concurrency: args.concurrency,
            users: 16,
            burst: args.burst,
        };
        match run(&config).await {
            Ok(r) => {
                let scheme = store.split("://").next().unwrap_or(&store);
                let label = if scheme.starts_with("postgres") {
                    format!("{scheme} {}", table_mode.name())
                } else {
                    scheme.to_owned()
                };
                println!(
                    "| {label} | {logical} | {} | {} | {} | {} | {} | {} | {} | {:.0} |",
                    r.requests,
                    r.duplicates,
                    r.double_executions,
                    r.never_created,
                    r.unexpected.len(),
                    r.p50_us,
                    r.p99_us,
                    r.requests as f64 / r.elapsed.as_secs_f64()
                );
                if !r.unexpected.is_empty() {
                    eprintln!("{label}: unexpected answers: {:?}", r.unexpected);
                }
                failed |=
                    r.double_executions != 0 || !r.unexpected.is_empty() || r.never_created != 0;
                if args.long && r.duplicates < 100_000 {
                    eprintln!(
                        "{label}: only {} duplicates sent; raise --logical",
                        r.duplicates
                    );
                    failed = true;
                }
            }
            Err(e) => {
                eprintln!("{store}: {e}");
                failed = true;
            }
        }
    }
    drop(cluster);
    if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
