//! `idempotency-bench`: `report` re-evaluates ADR 009 with numbers measured on this machine (or
//! against the database and Redis you point it at) and writes a Markdown report with a chart;
//! `load` sends a duplicate-heavy mix to the demo service over loopback HTTP and counts double
//! executions.

mod cli;
mod load_command;
mod report;

use cli::*;

use clap::Parser;
use idempotency_bench::http;
use load_command::load;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("could not start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Report(args) => match runtime.block_on(report::run(*args)) {
            Ok(path) => {
                println!("report written to {}", path.display());
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("report failed: {e}");
                std::process::ExitCode::FAILURE
            }
        },
        Command::Load(args) => runtime.block_on(load(args)),
        Command::Http(args) => runtime.block_on(http(args)),
        Command::Purge(args) => {
            let churn = report::purge::Churn {
                live_rows: args.live_rows,
                days: args.days.max(1),
                step: std::time::Duration::from_millis(args.hour_ms),
            };
            match runtime.block_on(report::purge::measure(churn)) {
                Ok(runs) => {
                    let mut md = String::new();
                    match report::render::purge_section(&mut md, &runs, &churn) {
                        Ok(()) => {
                            println!("{md}");
                            std::process::ExitCode::SUCCESS
                        }
                        Err(e) => {
                            eprintln!("purge: {e}");
                            std::process::ExitCode::FAILURE
                        }
                    }
                }
                Err(e) => {
                    eprintln!("purge: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
        Command::Drivers(args) => {
            let servers = idempotency_bench::Servers::default();
            let measured =
                runtime.block_on(report::drivers::measure(&servers, args.rounds, args.ops));
            let mut md = String::new();
            match measured.and_then(|rows| {
                report::drivers::section(&mut md, &rows, args.rounds, args.ops)
                    .map_err(|e| e.to_string())
            }) {
                Ok(()) => {
                    println!("{md}");
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("drivers: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
        Command::Replicas(args) => {
            let measured = runtime.block_on(report::replicas::measure(args.rounds, args.ops));
            let mut md = String::new();
            match measured.and_then(|cost| {
                report::replicas::section(&mut md, &cost, args.rounds, args.ops)
                    .map_err(|e| e.to_string())
            }) {
                Ok(()) => {
                    println!("{md}");
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("replicas: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
        Command::Chaos(args) => {
            let (runs, not_run) = runtime.block_on(report::chaos::measure(args.secs));
            let mut md = String::new();
            if let Err(e) = report::chaos::section(&mut md, &runs, args.secs) {
                eprintln!("chaos: {e}");
                return std::process::ExitCode::FAILURE;
            }
            println!("{md}");
            for why in &not_run {
                eprintln!("not run: {why}");
            }
            if not_run.is_empty() && runs.iter().all(|run| run.verdict.is_ok()) {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            }
        }
        Command::HttpPg(args) => runtime.block_on(http_pg(args)),
        Command::ServePgTasks(args) => {
            // `RUST_LOG=idempotency_core=debug` shows the admitted transactions' limit.
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_writer(std::io::stderr)
                .try_init();
            let Some(variant) = idempotency_bench::http_pg::PgVariant::parse(&args.variant) else {
                eprintln!("serve-pg-tasks: unknown variant {}", args.variant);
                return std::process::ExitCode::FAILURE;
            };
            match runtime.block_on(idempotency_bench::http_pg::serve(
                args.listen,
                variant,
                &args.url,
                args.pool,
            )) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("serve-pg-tasks: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
        Command::Contention(args) => runtime.block_on(contention(args)),
        Command::Wake(args) => runtime.block_on(wake(args)),
        Command::ServeShop(args) => {
            // `RUST_LOG=idempotency_core=debug` shows the admitted transactions' limit.
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_writer(std::io::stderr)
                .try_init();
            let Some(mode) = idempotency_bench::contention::parse_mode(&args.mode) else {
                eprintln!("serve-shop: unknown claim mode {}", args.mode);
                return std::process::ExitCode::FAILURE;
            };
            let settings = idempotency_bench::contention::shop::ShopSettings {
                url: args.url,
                schema: args.schema,
                mode,
                pool: args.pool,
                lease: args.lease_ms.map(std::time::Duration::from_millis),
                store_timeout: args.store_timeout_ms.map(std::time::Duration::from_millis),
                admission: if args.whole_pool {
                    idempotency::TransactionAdmission::WholePool
                } else {
                    idempotency::TransactionAdmission::Adaptive
                },
                keep_refused_writes: args.keep_refused_writes,
            };
            match runtime.block_on(idempotency_bench::contention::shop::serve(
                args.listen,
                settings,
            )) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("serve-shop: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
        Command::ServeTasks(args) => match runtime.block_on(http::serve(args.listen, args.layer)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("serve-tasks: {e}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

/// Runs the contention bench and prints its Markdown table: each mode and pool size `rounds`
/// times, interleaved, the median run (by throughput) shown.
async fn contention(args: ContentionArgs) -> std::process::ExitCode {
    use idempotency_bench::contention::{self, Settings, shop::ShopSettings};
    let Ok(binary) = std::env::current_exe() else {
        eprintln!("contention: cannot find the bench binary");
        return std::process::ExitCode::FAILURE;
    };
    let mut runs = Vec::new();
    for mode in &args.modes {
        let Some(mode) = contention::parse_mode(mode) else {
            eprintln!("contention: unknown claim mode {mode}");
            return std::process::ExitCode::FAILURE;
        };
        for pool in &args.pools {
            let pool = match pool.as_str() {
                "default" => 0,
                n => match n.parse() {
                    Ok(n) => n,
                    Err(_) => {
                        eprintln!("contention: pool size {n} is not a number");
                        return std::process::ExitCode::FAILURE;
                    }
                },
            };
            for admission in &args.admission {
                let admission = match admission.as_str() {
                    "adaptive" => idempotency::TransactionAdmission::Adaptive,
                    "whole-pool" => idempotency::TransactionAdmission::WholePool,
                    other => {
                        eprintln!("contention: unknown admission {other}");
                        return std::process::ExitCode::FAILURE;
                    }
                };
                runs.push((mode, pool, admission));
            }
        }
    }
    let schema = "idempotency_contention".to_owned();
    let mut outcomes: Vec<Vec<contention::Outcome>> = vec![Vec::new(); runs.len()];
    let mut failed = false;
    for round in 0..args.rounds.max(1) {
        for (i, &(mode, pool, admission)) in runs.iter().enumerate() {
            let settings = Settings {
                binary: binary.clone(),
                shop: ShopSettings {
                    url: args.url.clone(),
                    schema: schema.clone(),
                    mode,
                    pool,
                    lease: args.lease_ms.map(std::time::Duration::from_millis),
                    store_timeout: None,
                    admission,
                    keep_refused_writes: false,
                },
                instances: 2,
                clients: args.clients,
                duration: std::time::Duration::from_secs_f64(args.seconds),
                items: args.items,
                behaviour: contention::client::ClientBehaviour::default(),
                resend_share: 0.25,
                kill: None,
                settle: std::time::Duration::from_secs(30),
            };
            match contention::run(&settings).await {
                Ok(outcome) => {
                    eprintln!(
                        "round {round}: {} pool {pool}: {:.1} orders/s, replay p50 {:?}, {} violations",
                        contention::mode_name(mode),
                        outcome.throughput,
                        outcome.replay_p50,
                        outcome.violations.len()
                    );
                    for violation in outcome.violations.iter().take(5) {
                        eprintln!("  {violation}");
                    }
                    failed |= !outcome.violations.is_empty();
                    outcomes[i].push(outcome);
                }
                Err(e) => {
                    eprintln!("contention: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            }
        }
    }
    let _ = contention::cleanup(&args.url, &schema).await;
    let medians: Vec<contention::Outcome> = outcomes
        .into_iter()
        .filter_map(|mut runs| {
            runs.sort_by(|a, b| a.throughput.total_cmp(&b.throughput));
            runs.get(runs.len() / 2).cloned()
        })
        .collect();
    println!("{}", contention::markdown_table(&medians));
    if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}

/// Runs the HTTP comparison on PostgreSQL and prints its Markdown table.
async fn http_pg(args: HttpPgArgs) -> std::process::ExitCode {
    let Ok(length) = std::time::Duration::try_from_secs_f64(args.seconds) else {
        eprintln!("http-pg: --seconds must be a positive number");
        return std::process::ExitCode::FAILURE;
    };
    use idempotency_bench::http_pg::PgVariant;
    let mut variants = vec![PgVariant::BareTransaction];
    if args.variants.is_empty() {
        variants = PgVariant::ALL.to_vec();
    }
    for name in &args.variants {
        match PgVariant::parse(name) {
            Some(PgVariant::BareTransaction) => {}
            Some(variant) => variants.push(variant),
            None => {
                let names: Vec<&str> = PgVariant::ALL.iter().map(|v| v.name()).collect();
                eprintln!(
                    "http-pg: unknown variant {name} (one of {})",
                    names.join(", ")
                );
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    match idempotency_bench::http_pg::compare(
        &args.url,
        &variants,
        &args.clients,
        args.rounds.max(1),
        length,
    )
    .await
    {
        Ok(rows) => {
            println!("{}", idempotency_bench::http_pg::markdown_table(&rows));
            if let Some(path) = &args.chart
                && let Err(e) = report::chart::draw_http_pg(path, &rows)
            {
                eprintln!("http-pg: the chart: {e}");
                return std::process::ExitCode::FAILURE;
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("http-pg: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the HTTP comparison and prints one Markdown row per workload.
async fn http(args: HttpArgs) -> std::process::ExitCode {
    match http_rows(&args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("http: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn http_rows(args: &HttpArgs) -> Result<(), String> {
    let length = std::time::Duration::try_from_secs_f64(args.seconds).map_err(|e| e.to_string())?;
    let compares = http::compare_workloads(
        args.connections,
        args.rounds,
        length,
        args.store,
        args.baseline,
    )
    .await?;
    print!("{}", http::markdown_table(&compares));
    Ok(())
}

/// Runs the wake bench on each store and prints its table.
async fn wake(args: WakeArgs) -> std::process::ExitCode {
    let mut rows = Vec::new();
    for url in &args.stores {
        let other_instance = !url.starts_with("memory");
        let hold = args.hold_min_ms..=args.hold_max_ms.max(args.hold_min_ms);
        let mode = match args.claim_mode.as_str() {
            "one-transaction" => idempotency::ClaimMode::OneTransaction,
            _ => idempotency::ClaimMode::Lease,
        };
        match idempotency_bench::wake::measure(url, args.trials, other_instance, hold, mode).await {
            Ok(measured) => rows.extend(measured),
            Err(e) => {
                eprintln!(
                    "wake: {}: {}",
                    idempotency::redact_credentials(url),
                    idempotency::ErrorChain(&*e)
                );
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    println!("{}", idempotency_bench::wake::table(&rows));
    std::process::ExitCode::SUCCESS
}
