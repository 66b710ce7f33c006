//! Prints the SQL `PostgresStore::migrate` applies, for teams that run their own migration tool.
//!
//! `cargo run -p idempotency-postgres --example print_migrations -- [schema] [table] [unlogged|logged]`

use idempotency_postgres::{PostgresStore, TableMode};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let schema = args.next().unwrap_or_else(|| "public".to_owned());
    let table = args.next().unwrap_or_else(|| "idempotency_keys".to_owned());
    let mode = match args.next().as_deref() {
        None | Some("unlogged") => TableMode::Unlogged,
        Some("logged") => TableMode::Logged,
        Some(other) => {
            return Err(format!("unknown table mode {other:?}: use unlogged or logged").into());
        }
    };
    let sql = PostgresStore::builder("postgres://unused")
        .schema(schema)
        .table(table)
        .table_mode(mode)
        .migration_sql()?;
    println!("{sql}");
    Ok(())
}
