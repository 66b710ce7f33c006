//! `idempotency`: the operator's command line. See `idempotency --help`.
//!
//! Exit codes: 0 fine; 1 `check` found a problem, or `inspect` found no record; 2 bad usage;
//! 3 the store could not be reached or failed.

use clap::{Parser, Subcommand, ValueEnum};
use idempotency::postgres::PostgresStoreBuilder;
use idempotency::store::RecordState;
use idempotency::{
    ErrorChain, IdempotencyKey, IdempotencyStore, KeyFormat, PostgresStore, RedisStore, Scope,
    TableMode,
};
use std::process::ExitCode;

/// Operate the idempotency store of a deployment.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// The store: `postgres://...` (TLS per `sslmode`; `prepared_statements=false` behind a
    /// transaction pooler) or `redis://...` / `rediss://...`.
    #[arg(long, env = "IDEMPOTENCY_STORE", global = true, hide_env_values = true)]
    url: Option<String>,
    /// The schema of the PostgreSQL table.
    #[arg(long, default_value = "public", global = true)]
    schema: String,
    /// The PostgreSQL table.
    #[arg(long, default_value = idempotency::postgres::DEFAULT_TABLE, global = true)]
    table: String,
    /// The PostgreSQL table mode. Left out: the library's default (a new table is LOGGED, an
    /// existing UNLOGGED table is kept with a warning); given: a table persisted otherwise is
    /// refused.
    #[arg(long, value_enum, global = true)]
    mode: Option<Mode>,
    /// The pg_cron schedule of the purge job.
    #[arg(long, default_value = idempotency::postgres::DEFAULT_PURGE_SCHEDULE, global = true)]
    purge_schedule: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Creates or updates the PostgreSQL table, and schedules the pg_cron purge where pg_cron is
    /// installed (idempotent, under an advisory lock).
    Migrate,
    /// Prints the SQL `migrate` applies, for your own migration tool. Needs no server.
    PrintSql,
    /// Deletes expired records in batches (where pg_cron does not). Reclaims space only: expired
    /// records are already absent on read.
    Purge {
        /// Rows per statement.
        #[arg(long, default_value_t = 10_000)]
        batch: usize,
    },
    /// Checks a deployment: the server answers and is writable, the table exists in the
    /// configured mode with every migration, the pg_cron job is in cron.job on the configured
    /// schedule; for Redis, persistence and an eviction policy that keeps records.
    Check,
    /// Shows the record of one key: state, expiry, fingerprint, status and headers (the body
    /// only with --body).
    Inspect {
        /// The idempotency key.
        key: String,
        /// The scope (the user or principal) the key belongs to.
        #[arg(long)]
        scope: String,
        /// Also print the stored body.
        #[arg(long)]
        body: bool,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Unlogged,
    Logged,
    LoggedAsyncCommit,
}

impl From<Mode> for TableMode {
    fn from(mode: Mode) -> TableMode {
        match mode {
            Mode::Unlogged => TableMode::Unlogged,
            Mode::Logged => TableMode::Logged,
            Mode::LoggedAsyncCommit => TableMode::LoggedAsyncCommit,
        }
    }
}

/// Why the command failed, and with which exit code.
enum Failure {
    /// 1: the command ran and found something wrong.
    Found(String),
    /// 2: the command cannot run as given.
    Usage(String),
    /// 3: the store could not be reached or failed.
    Store(String),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: could not start the runtime: {e}");
            return ExitCode::from(3);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Found(what)) => {
            eprintln!("{what}");
            ExitCode::from(1)
        }
        Err(Failure::Usage(what)) => {
            eprintln!("error: {what}");
            ExitCode::from(2)
        }
        Err(Failure::Store(what)) => {
            eprintln!("error: {what}");
            ExitCode::from(3)
        }
    }
}

fn store_error(e: &(dyn std::error::Error + 'static)) -> Failure {
    Failure::Store(ErrorChain(e).to_string())
}

/// The kind of store a URL names.
enum Kind {
    Postgres,
    Redis,
}

fn kind(url: &str) -> Result<Kind, Failure> {
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("postgres" | "postgresql") => Ok(Kind::Postgres),
        Some("redis" | "rediss") => Ok(Kind::Redis),
        _ => Err(Failure::Usage(format!(
            "unsupported store URL {:?}: use postgres://... or redis://... (rediss://...)",
            url.split("://").next().unwrap_or(url)
        ))),
    }
}

fn postgres_builder(cli: &Cli, url: &str) -> PostgresStoreBuilder {
    let builder = PostgresStore::builder(url)
        .schema(&cli.schema)
        .table(&cli.table)
        .purge_schedule(&cli.purge_schedule)
        .pool_size(2);
    match cli.mode {
        Some(mode) => builder.table_mode(mode.into()),
        None => builder,
    }
}

async fn postgres(cli: &Cli, url: &str) -> Result<PostgresStore, Failure> {
    postgres_builder(cli, url)
        .build()
        .await
        .map_err(|e| match e {
            idempotency::postgres::PostgresStoreError::ReadOnlyServer => {
                Failure::Found(format!("problem: {e}"))
            }
            e => store_error(&e),
        })
}

async fn redis(url: &str) -> Result<RedisStore, Failure> {
    RedisStore::connect(url).await.map_err(|e| store_error(&e))
}

fn url(cli: &Cli) -> Result<&str, Failure> {
    cli.url
        .as_deref()
        .ok_or_else(|| Failure::Usage("no store: pass --url or set IDEMPOTENCY_STORE".to_owned()))
}

async fn run(cli: Cli) -> Result<(), Failure> {
    match &cli.command {
        Command::PrintSql => {
            let sql = postgres_builder(&cli, "postgres://unused")
                .migration_sql()
                .map_err(|e| Failure::Usage(ErrorChain(&e).to_string()))?;
            print!("{sql}");
            Ok(())
        }
        Command::Migrate => {
            let url = url(&cli)?;
            match kind(url)? {
                Kind::Redis => {
                    println!("Redis needs no migration");
                    Ok(())
                }
                Kind::Postgres => {
                    let store = postgres(&cli, url).await?;
                    let report = store.migrate().await.map_err(|e| store_error(&e))?;
                    println!("{report}");
                    Ok(())
                }
            }
        }
        Command::Purge { batch } => {
            let url = url(&cli)?;
            match kind(url)? {
                Kind::Redis => {
                    println!("Redis expires records by itself: nothing to purge");
                    Ok(())
                }
                Kind::Postgres => {
                    let store = postgres(&cli, url).await?;
                    let batch = (*batch).max(1);
                    let mut total = 0u64;
                    loop {
                        let n = store
                            .purge_expired(batch)
                            .await
                            .map_err(|e| store_error(&e))?;
                        total += n;
                        if n < batch as u64 {
                            break;
                        }
                    }
                    println!("purged {total} expired records");
                    Ok(())
                }
            }
        }
        Command::Check => {
            let url = url(&cli)?;
            let problems = match kind(url)? {
                Kind::Postgres => {
                    let store = postgres(&cli, url).await?;
                    let status = store.status().await.map_err(|e| store_error(&e))?;
                    print!("{status}");
                    status.problems()
                }
                Kind::Redis => {
                    let store = redis(url).await?;
                    let info = store.status().await.map_err(|e| store_error(&e))?;
                    print!("{info}");
                    info.problems()
                }
            };
            if problems.is_empty() {
                println!("ok");
                Ok(())
            } else {
                Err(Failure::Found(
                    problems
                        .iter()
                        .map(|p| format!("problem: {p}"))
                        .collect::<Vec<_>>()
                        .join("\n"),
                ))
            }
        }
        Command::Inspect { key, scope, body } => {
            let url = url(&cli)?;
            let key = IdempotencyKey::parse(key.as_bytes(), KeyFormat::opaque())
                .map_err(|e| Failure::Usage(format!("key: {e}")))?;
            let scope =
                Scope::new(scope.clone()).map_err(|e| Failure::Usage(format!("scope: {e}")))?;
            let (record, expiry) = match kind(url)? {
                Kind::Postgres => {
                    let store = postgres(&cli, url).await?;
                    let record = store.get(&scope, &key).await.map_err(|e| store_error(&e))?;
                    let times = store
                        .record_times(&scope, &key)
                        .await
                        .map_err(|e| store_error(&e))?;
                    let expiry = times.map(|t| {
                        format!("created {}, expires in {:?}", t.created_at, t.expires_in)
                    });
                    (record, expiry)
                }
                Kind::Redis => {
                    let store = redis(url).await?;
                    let record = store.get(&scope, &key).await.map_err(|e| store_error(&e))?;
                    let ttl = store
                        .expires_in(&scope, &key)
                        .await
                        .map_err(|e| store_error(&e))?;
                    (record, ttl.map(|t| format!("expires in {t:?}")))
                }
            };
            let Some(record) = record else {
                return Err(Failure::Found(
                    "no live record for this key and scope (never used, expired or purged)"
                        .to_owned(),
                ));
            };
            let digest: String = record
                .fingerprint
                .digest()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            println!(
                "fingerprint: {:?} sha256:{digest}",
                record.fingerprint.algorithm()
            );
            if let Some(expiry) = expiry {
                println!("expiry: {expiry}");
            }
            match record.state {
                RecordState::InFlight { lease_remaining } => {
                    println!("state: in flight, lease ends in {lease_remaining:?}");
                }
                RecordState::Completed {
                    response,
                    retention_remaining,
                } => {
                    println!("state: completed, expires in {retention_remaining:?}");
                    println!("status: {}", response.status());
                    for (name, value) in response.headers() {
                        println!(
                            "header: {name}: {}",
                            String::from_utf8_lossy(value.as_bytes())
                        );
                    }
                    if response.body_omitted() {
                        println!("body: omitted (over the storage cap when stored)");
                    } else if *body {
                        println!("body:\n{}", String::from_utf8_lossy(response.body()));
                    } else {
                        println!("body: {} bytes (--body prints it)", response.body().len());
                    }
                }
            }
            Ok(())
        }
    }
}
