//! WAL bytes per store step on PostgreSQL, in every table mode: `cargo bench -p
//! idempotency-bench --bench wal`. Criterion reports bytes instead of time: each batch reads
//! `pg_current_wal_lsn()` before and after on a connection of its own, so the figure is the
//! WAL the server wrote during the batch (other activity on the same server adds to it; run it
//! on a quiet server). The report command measures the same once per run; this makes it a
//! criterion figure with its statistics and history.

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use idempotency::store::{ClaimOutcome, LeaseToken};
use idempotency::{IdempotencyKey, IdempotencyStore, TableMode};
use idempotency_bench::{
    Connected, LEASE, RETENTION, Servers, Target, bench_fingerprint, bench_response, bench_runtime,
    bench_scope, connect, fresh_key,
};
use std::sync::{OnceLock, mpsc};
use std::time::Duration;

/// Reads the server's WAL position on a connection and thread of its own, so it can be asked
/// from inside the benchmark's runtime.
struct WalPosition {
    ask: mpsc::Sender<mpsc::Sender<Result<u64, String>>>,
}

impl WalPosition {
    fn connect(url: &str) -> Result<WalPosition, String> {
        let (ask, asked) = mpsc::channel::<mpsc::Sender<Result<u64, String>>>();
        let (ready, is_ready) = mpsc::channel::<Result<(), String>>();
        let url = url.to_owned();
        std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready.send(Err(e.to_string()));
                    return;
                }
            };
            runtime.block_on(async move {
                let client = match idempotency::postgres::connect_raw(&url).await {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = ready.send(Ok(()));
                while let Ok(reply) = asked.recv() {
                    let lsn = client
                        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
                        .await
                        .map(|row| u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
                        .map_err(|e| e.to_string());
                    let _ = reply.send(lsn);
                }
            });
        });
        is_ready.recv().map_err(|e| e.to_string()).and_then(|r| r)?;
        Ok(WalPosition { ask })
    }

    fn now(&self) -> u64 {
        let (reply, answer) = mpsc::channel();
        self.ask
            .send(reply)
            .unwrap_or_else(|e| panic!("the WAL reader stopped: {e}"));
        answer
            .recv()
            .unwrap_or_else(|e| panic!("the WAL reader stopped: {e}"))
            .unwrap_or_else(|e| panic!("reading the WAL position: {e}"))
    }
}

/// The one WAL reader of this bench, connected on first use.
fn position() -> &'static WalPosition {
    static POSITION: OnceLock<WalPosition> = OnceLock::new();
    POSITION.get_or_init(|| {
        let url = Servers::default().postgres;
        WalPosition::connect(&url).unwrap_or_else(|e| {
            panic!(
                "the WAL bench needs PostgreSQL at {url} (set IDEMPOTENCY_TEST_POSTGRES_URL): {e}"
            )
        })
    })
}

/// Criterion measurement in WAL bytes (the server's, read by [`position`]).
struct WalBytes;

impl Measurement for WalBytes {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        position().now()
    }

    fn end(&self, start: u64) -> u64 {
        position().now().saturating_sub(start)
    }

    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }

    fn zero(&self) -> u64 {
        0
    }

    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        &BytesFormatter
    }
}

struct BytesFormatter;

impl ValueFormatter for BytesFormatter {
    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "B"
    }

    fn scale_throughputs(
        &self,
        _typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        if let Throughput::Elements(n) | Throughput::Bytes(n) = throughput {
            for v in values.iter_mut() {
                *v /= *n as f64;
            }
        }
        "B/op"
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "B"
    }
}

/// Operations in the probe batch that decides whether a step writes WAL at all.
const PROBE_OPS: u64 = 200;

/// A store step measured in WAL bytes.
#[derive(Clone, Copy)]
enum Op {
    ClaimFresh,
    Complete,
    Replay,
    PurgePerRow,
}

impl Op {
    fn group(self) -> &'static str {
        match self {
            Op::ClaimFresh => "wal_claim_fresh",
            Op::Complete => "wal_complete",
            Op::Replay => "wal_replay",
            Op::PurgePerRow => "wal_purge_per_row",
        }
    }

    /// Once per store: the completed record replays are made of.
    async fn prepare(self, store: &dyn IdempotencyStore, replayed: &IdempotencyKey) {
        if let Op::Replay = self {
            let token = LeaseToken::new();
            let claimed = store
                .claim(&bench_scope(), replayed, &bench_fingerprint(), token, LEASE)
                .await;
            assert!(matches!(claimed, Ok(ClaimOutcome::Claimed)));
            let done = store
                .complete(
                    &bench_scope(),
                    replayed,
                    token,
                    &bench_response(),
                    RETENTION,
                )
                .await;
            assert!(done.is_ok());
        }
    }

    /// `iters` operations; the WAL bytes written while the measured part ran.
    async fn batch(
        self,
        store: &dyn IdempotencyStore,
        replayed: &IdempotencyKey,
        position: &WalPosition,
        iters: u64,
    ) -> u64 {
        let (scope, fp, response) = (bench_scope(), bench_fingerprint(), bench_response());
        match self {
            Op::ClaimFresh => {
                let start = position.now();
                for _ in 0..iters {
                    let outcome = store
                        .claim(&scope, &fresh_key(), &fp, LeaseToken::new(), LEASE)
                        .await;
                    assert!(matches!(outcome, Ok(ClaimOutcome::Claimed)));
                }
                position.now().saturating_sub(start)
            }
            Op::Complete => {
                // Not measured: the claims the completions are for.
                let mut claims = Vec::with_capacity(usize::try_from(iters).unwrap_or(0));
                for _ in 0..iters {
                    let (key, token) = (fresh_key(), LeaseToken::new());
                    let _ = store.claim(&scope, &key, &fp, token, LEASE).await;
                    claims.push((key, token));
                }
                let start = position.now();
                for (key, token) in &claims {
                    let done = store
                        .complete(&scope, key, *token, &response, RETENTION)
                        .await;
                    assert!(done.is_ok());
                }
                position.now().saturating_sub(start)
            }
            Op::Replay => {
                let start = position.now();
                for _ in 0..iters {
                    let outcome = store
                        .claim(&scope, replayed, &fp, LeaseToken::new(), LEASE)
                        .await;
                    assert!(matches!(outcome, Ok(ClaimOutcome::Existing(_))));
                }
                position.now().saturating_sub(start)
            }
            Op::PurgePerRow => {
                // Not measured: `iters` records that expire at once.
                for _ in 0..iters {
                    let (key, token) = (fresh_key(), LeaseToken::new());
                    let _ = store.claim(&scope, &key, &fp, token, LEASE).await;
                    let _ = store
                        .complete(&scope, &key, token, &response, Duration::from_millis(1))
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                let start = position.now();
                let mut purged = 0;
                while purged < iters {
                    match store.purge_expired(10_000).await {
                        Ok(0) => break,
                        Ok(n) => purged += n,
                        Err(e) => panic!("purge: {e}"),
                    }
                }
                position.now().saturating_sub(start)
            }
        }
    }
}

fn wal(c: &mut Criterion<WalBytes>) {
    let runtime = bench_runtime();
    let servers = Servers::default();
    let position = position();
    let mut connected: Vec<(Target, Connected)> = Vec::new();
    for mode in [
        TableMode::Unlogged,
        TableMode::Logged,
        TableMode::LoggedAsyncCommit,
    ] {
        let target = Target::Postgres(mode);
        match runtime.block_on(connect(target, &servers, 4)) {
            Ok(store) => connected.push((target, store)),
            Err(why) => panic!("connecting {}: {why}", target.name()),
        }
    }
    for op in [Op::ClaimFresh, Op::Complete, Op::Replay, Op::PurgePerRow] {
        let mut group = c.benchmark_group(op.group());
        // Every sample the same size, so none is too small to move the WAL position.
        group.sampling_mode(SamplingMode::Flat);
        for (target, store) in &connected {
            let store = &*store.store;
            let replayed = fresh_key();
            runtime.block_on(op.prepare(store, &replayed));
            // Criterion cannot analyse a measurement of zero: say so instead.
            let probe = runtime.block_on(op.batch(store, &replayed, position, PROBE_OPS));
            if probe == 0 {
                println!(
                    "{}/{}: 0 WAL bytes in {PROBE_OPS} operations (nothing written; not charted)",
                    op.group(),
                    target.name()
                );
                continue;
            }
            group.bench_function(BenchmarkId::from_parameter(target.name()), |b| {
                b.to_async(&runtime)
                    .iter_custom(|iters| op.batch(store, &replayed, position, iters))
            });
        }
        group.finish();
    }

    for (_, store) in &connected {
        runtime.block_on(store.cleanup());
    }
}

fn config() -> Criterion<WalBytes> {
    Criterion::default()
        .with_measurement(WalBytes)
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
}

criterion_group! {
    name = benches;
    config = config();
    targets = wal
}
criterion_main!(benches);
