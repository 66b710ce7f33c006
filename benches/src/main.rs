//! `idempotency-bench report`: re-evaluates ADR 009 with numbers measured on this machine (or
//! against the database and Redis you point it at) and writes a Markdown report with a chart.

mod report;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(version, about = "Benchmarks and the ADR 009 re-evaluation report")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs the workload on every reachable store and table mode and writes the report.
    Report(report::Args),
}

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
    let Command::Report(args) = cli.command;
    match runtime.block_on(report::run(args)) {
        Ok(path) => {
            println!("report written to {}", path.display());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("report failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
