//! The two PostgreSQL drivers side by side: tokio-postgres (`PostgresStore`) and sqlx
//! (`SqlxPostgresStore`), each as the library and as the same statements sent with the driver
//! directly, and a transactional request on each; one client, interleaved rounds, UNLOGGED.

use super::measure::claim_complete;
use fmt::Write as _;
use idempotency::postgres::tokio_postgres;
use idempotency::store::{CommitOutcome, LeaseToken, StoredResponse};
use idempotency::{IdempotencyStore, PostgresStore, SqlxPostgresStore};
use idempotency_bench::{
    LEASE, RETENTION, Servers, bench_fingerprint, bench_response, bench_scope, err, fresh_key,
    median, pg_claim_complete,
};
use sqlx::Connection as _;
use sqlx::postgres::{PgConnection, PgPoolOptions};
use std::fmt;
use std::time::Instant;

/// What one side of the comparison sends per operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// Claim and complete with tokio-postgres, prepared, on one connection.
    TokioRaw,
    /// Claim and complete through `PostgresStore`.
    TokioLibrary,
    /// Claim and complete with sqlx (the same SQL text, cached), on one connection.
    SqlxRaw,
    /// Claim and complete through `SqlxPostgresStore` on a default `PgPool`
    /// (`test_before_acquire` on: sqlx pings each connection it hands out).
    SqlxLibrary,
    /// The same on a pool built with `test_before_acquire(false)`.
    SqlxLibraryNoPing,
    /// Claim, open the request's transaction, complete and commit: `PostgresStore`.
    TokioTransactional,
    /// The same on `SqlxPostgresStore`, default pool.
    SqlxTransactional,
    /// The same on `SqlxPostgresStore`, pool without the ping.
    SqlxTransactionalNoPing,
}

impl Side {
    const ALL: [Side; 8] = [
        Side::TokioRaw,
        Side::TokioLibrary,
        Side::SqlxRaw,
        Side::SqlxLibrary,
        Side::SqlxLibraryNoPing,
        Side::TokioTransactional,
        Side::SqlxTransactional,
        Side::SqlxTransactionalNoPing,
    ];

    fn label(self) -> &'static str {
        match self {
            Side::TokioRaw => "tokio-postgres, raw (prepared, one connection)",
            Side::TokioLibrary => "`PostgresStore`",
            Side::SqlxRaw => "sqlx, raw (same SQL, cached, one connection)",
            Side::SqlxLibrary => "`SqlxPostgresStore`, default `PgPool`",
            Side::SqlxLibraryNoPing => "`SqlxPostgresStore`, `test_before_acquire(false)`",
            Side::TokioTransactional => "transactional request, `PostgresStore`",
            Side::SqlxTransactional => "transactional request, `SqlxPostgresStore`, default pool",
            Side::SqlxTransactionalNoPing => {
                "transactional request, `SqlxPostgresStore`, `test_before_acquire(false)`"
            }
        }
    }

    /// The side its ratio is taken against.
    fn baseline(self) -> Side {
        match self {
            Side::TokioRaw | Side::TokioLibrary | Side::TokioTransactional => Side::TokioRaw,
            _ => Side::SqlxRaw,
        }
    }
}

/// One side's result.
#[derive(Debug)]
pub(crate) struct DriverRow {
    pub(crate) side: Side,
    /// Median over rounds of the round's median, µs.
    pub(crate) median_us: f64,
    /// Median over rounds of (this side / its driver's raw side).
    pub(crate) to_raw: f64,
    /// Median over rounds of (this side / `PostgresStore`'s same operation).
    pub(crate) to_tokio: f64,
}

/// What the sides run on.
struct Stores {
    tokio: PostgresStore,
    sqlx: SqlxPostgresStore,
    sqlx_no_ping: SqlxPostgresStore,
    tokio_raw: (
        tokio_postgres::Client,
        tokio_postgres::Statement,
        tokio_postgres::Statement,
    ),
    sqlx_raw: PgConnection,
}

const SCHEMA: &str = "idem_bench_drivers";

async fn open(servers: &Servers) -> Result<Stores, String> {
    let url = servers.postgres.as_str();
    let tokio = PostgresStore::builder(url)
        .schema(SCHEMA)
        .pool_size(8)
        .build()
        .await
        .map_err(|e| format!("PostgreSQL at {url} unusable: {}", err(e)))?;
    let client = tokio.pool().get().await.map_err(err)?;
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{SCHEMA}\" CASCADE"))
        .await
        .map_err(err)?;
    drop(client);
    tokio.migrate().await.map_err(err)?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(url)
        .await
        .map_err(err)?;
    let sqlx = SqlxPostgresStore::builder_from_sqlx_pool(pool)
        .schema(SCHEMA)
        .build()
        .await
        .map_err(err)?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .test_before_acquire(false)
        .connect(url)
        .await
        .map_err(err)?;
    let sqlx_no_ping = SqlxPostgresStore::builder_from_sqlx_pool(pool)
        .schema(SCHEMA)
        .build()
        .await
        .map_err(err)?;
    let raw = idempotency_postgres::connect_raw(url).await.map_err(err)?;
    let claim = raw.prepare(tokio.statements().claim).await.map_err(err)?;
    let complete = raw
        .prepare(tokio.statements().complete)
        .await
        .map_err(err)?;
    let sqlx_raw = PgConnection::connect(url).await.map_err(err)?;
    Ok(Stores {
        tokio,
        sqlx,
        sqlx_no_ping,
        tokio_raw: (raw, claim, complete),
        sqlx_raw,
    })
}

/// Claim, open the request's transaction, complete and commit in it.
async fn transactional(
    store: &dyn IdempotencyStore,
    response: &StoredResponse,
) -> Result<(), String> {
    let (scope, key, token) = (bench_scope(), fresh_key(), LeaseToken::new());
    store
        .claim(&scope, &key, &bench_fingerprint(), token, LEASE)
        .await
        .map_err(err)?;
    let tx = store
        .transactional()
        .ok_or("the store offers no transactions")?
        .begin_transaction(&scope, &key, token, LEASE)
        .await
        .map_err(err)?
        .ok_or("a fresh claim's transaction was refused")?;
    match tx
        .complete_and_commit(response, RETENTION)
        .await
        .map_err(err)?
    {
        CommitOutcome::Committed => Ok(()),
        other => Err(format!("a fresh claim's commit was refused: {other:?}")),
    }
}

/// Claim and complete of a fresh key with sqlx directly: the store's SQL text.
async fn sqlx_raw(
    connection: &mut PgConnection,
    store: &SqlxPostgresStore,
    encoded: &[u8],
) -> Result<(), String> {
    let (scope, key, token) = (bench_scope(), fresh_key(), LeaseToken::new());
    let fp = bench_fingerprint().to_bytes();
    sqlx::query(store.statements().claim)
        .bind(scope.as_str())
        .bind(key.as_str())
        .bind(&fp[..])
        .bind(token.as_uuid())
        .bind(LEASE.as_secs_f64())
        .fetch_optional(&mut *connection)
        .await
        .map_err(err)?;
    sqlx::query(store.statements().complete)
        .bind(scope.as_str())
        .bind(key.as_str())
        .bind(token.as_uuid())
        .bind(201i32)
        .bind(encoded)
        .bind(RETENTION.as_secs_f64())
        .execute(&mut *connection)
        .await
        .map_err(err)?;
    Ok(())
}

/// Every side, `rounds` interleaved rounds of `ops` operations each.
pub(crate) async fn measure(
    servers: &Servers,
    rounds: usize,
    ops: usize,
) -> Result<Vec<DriverRow>, String> {
    let mut stores = open(servers).await?;
    let (scope, fp, response) = (bench_scope(), bench_fingerprint(), bench_response());
    let encoded = response.encode();
    let n = Side::ALL.len();
    let (mut medians, mut to_raw, mut to_tokio) = (
        vec![Vec::new(); n],
        vec![Vec::new(); n],
        vec![Vec::new(); n],
    );
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..n).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut this_round = vec![0.0; n];
        for &i in &order {
            let mut times = Vec::with_capacity(ops);
            for _ in 0..ops {
                let t = Instant::now();
                match Side::ALL[i] {
                    Side::TokioRaw => {
                        let (client, claim, complete) = &stores.tokio_raw;
                        pg_claim_complete(client, claim, complete, fresh_key().as_str(), &encoded)
                            .await?
                    }
                    Side::TokioLibrary => {
                        claim_complete(&stores.tokio, &scope, &fp, &response).await?
                    }
                    Side::SqlxRaw => sqlx_raw(&mut stores.sqlx_raw, &stores.sqlx, &encoded).await?,
                    Side::SqlxLibrary => {
                        claim_complete(&stores.sqlx, &scope, &fp, &response).await?
                    }
                    Side::SqlxLibraryNoPing => {
                        claim_complete(&stores.sqlx_no_ping, &scope, &fp, &response).await?
                    }
                    Side::TokioTransactional => transactional(&stores.tokio, &response).await?,
                    Side::SqlxTransactional => transactional(&stores.sqlx, &response).await?,
                    Side::SqlxTransactionalNoPing => {
                        transactional(&stores.sqlx_no_ping, &response).await?
                    }
                }
                times.push(t.elapsed().as_secs_f64() * 1e6);
            }
            this_round[i] = median(&mut times);
        }
        for (i, side) in Side::ALL.iter().enumerate() {
            let base = Side::ALL.iter().position(|s| *s == side.baseline());
            let tokio_same = match side {
                Side::SqlxRaw => Side::TokioRaw,
                Side::SqlxLibrary | Side::SqlxLibraryNoPing => Side::TokioLibrary,
                Side::SqlxTransactional | Side::SqlxTransactionalNoPing => Side::TokioTransactional,
                other => *other,
            };
            let tokio_same = Side::ALL.iter().position(|s| *s == tokio_same);
            medians[i].push(this_round[i]);
            if let (Some(b), Some(t)) = (base, tokio_same) {
                to_raw[i].push(this_round[i] / this_round[b]);
                to_tokio[i].push(this_round[i] / this_round[t]);
            }
        }
    }
    let client = stores.tokio.pool().get().await.map_err(err)?;
    let _ = client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{SCHEMA}\" CASCADE"))
        .await;
    Ok(Side::ALL
        .iter()
        .enumerate()
        .map(|(i, side)| DriverRow {
            side: *side,
            median_us: median(&mut medians[i]),
            to_raw: median(&mut to_raw[i]),
            to_tokio: median(&mut to_tokio[i]),
        })
        .collect())
}

/// The section's Markdown.
pub(crate) fn section(
    w: &mut String,
    rows: &[DriverRow],
    rounds: usize,
    ops: usize,
) -> fmt::Result {
    writeln!(
        w,
        "\n## PostgreSQL on tokio-postgres and on sqlx\n\nThe same UNLOGGED table and the same SQL text, one client, {rounds} \
         interleaved rounds of {ops} operations per side (the order reversed every other round). An operation is a claim and a \
         complete of a fresh key; a transactional request is a claim, opening the request's transaction (`BEGIN` and the \
         claim's check), and the completion with its `COMMIT`. Medians of the per-round medians, and medians of the per-round \
         ratios: to the same driver's raw side, and to `PostgresStore` doing the same.\n"
    )?;
    writeln!(w, "| side | µs | / its raw driver | / `PostgresStore` |")?;
    writeln!(w, "| --- | ---: | ---: | ---: |")?;
    for row in rows {
        writeln!(
            w,
            "| {} | {:.0} | {:.2} | {:.2} |",
            row.side.label(),
            row.median_us,
            row.to_raw,
            row.to_tokio
        )?;
    }
    writeln!(
        w,
        "\nRound trips per operation: claim+complete is 2 on every side, plus one `SELECT 1` per step for the default \
         `PgPool`, which pings each connection it hands out (`test_before_acquire`). A transactional request is 3 round trips \
         on tokio-postgres, which pipelines `BEGIN` with the check and the completion with `COMMIT`, and 5 on sqlx, which \
         sends `BEGIN` and `COMMIT` on their own (plus the pings on a default pool)."
    )
}
