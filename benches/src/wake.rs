//! How soon a waiting duplicate gets the answer (issue 48 item 3): a request holds a key for a
//! while, a duplicate with an `in_flight_wait` waits for it, and the time from the original's
//! `complete` returning (its answer stored) to the duplicate's `begin` returning its replay is
//! measured. On the same engine (one instance) a settled key wakes its waiters; on another
//! engine over the same store (another instance, its own pool) the duplicate learns of it from
//! the store's notice of the settle (PostgreSQL `LISTEN`/`NOTIFY`, Redis pub/sub; the lease
//! mode), or at its next poll (10 ms, doubling to 250 ms: the one-transaction modes, whose
//! running key has no record to mark).

use idempotency::{
    Begin, BodyCanonicalization, ClaimMode, Completion, Engine, EngineConfig, Fingerprint,
    IdempotencyKey, IdempotencyStore, Scope, StoredResponse,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Where the duplicate runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Instance {
    /// On the engine of the original request.
    Same,
    /// On another engine over another connection to the same store.
    Other,
}

/// One row of the table: a store, where the duplicate ran, the delays measured.
#[derive(Debug)]
pub struct Row {
    /// The store's URL scheme.
    pub store: String,
    /// Where the duplicate ran.
    pub instance: Instance,
    /// Delay from the original's answer stored to the duplicate's replay, per trial.
    pub delays: Vec<Duration>,
}

impl Row {
    /// The `q` quantile of the delays (0.5: the median).
    pub fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.delays.clone();
        sorted.sort();
        sorted
            .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    }
}

fn config(mode: ClaimMode) -> EngineConfig {
    EngineConfig::default()
        .claim_mode(mode)
        .in_flight_wait(Duration::from_secs(5))
}

/// Measures `trials` duplicates on the store at `url`, on the same engine and (when
/// `other_instance`) on another; the original holds its key for a time spread evenly over
/// `hold` (milliseconds), so the duplicate's polls land anywhere in their backoff. Both engines
/// run in `mode` (a one-transaction mode needs a store that holds a key in a transaction).
pub async fn measure(
    url: &str,
    trials: usize,
    other_instance: bool,
    hold: std::ops::RangeInclusive<u64>,
    mode: ClaimMode,
) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let store: Arc<dyn IdempotencyStore> = idempotency::connect(url).await?;
    let original = Engine::new(store, config(mode))?;
    let mut instances = vec![(Instance::Same, original.clone())];
    if other_instance {
        let store: Arc<dyn IdempotencyStore> = idempotency::connect(url).await?;
        instances.push((Instance::Other, Engine::new(store, config(mode))?));
    }
    let scheme = url.split_once("://").map_or(url, |(s, _)| s);
    let scheme = match mode {
        ClaimMode::Lease => scheme.to_owned(),
        mode => format!("{scheme} ({mode:?})"),
    };
    let mut rows: Vec<Row> = instances
        .iter()
        .map(|(instance, _)| Row {
            store: scheme.clone(),
            instance: *instance,
            delays: Vec::with_capacity(trials),
        })
        .collect();
    let scope = Scope::new(format!("wake-bench-{}", uuid::Uuid::new_v4()))?;
    let fingerprint = Fingerprint::of_request("POST", "/orders", b"{}", BodyCanonicalization::Raw);
    let response = StoredResponse::new(
        idempotency::http::StatusCode::CREATED,
        idempotency::http::HeaderMap::new(),
        bytes::Bytes::from_static(b"{\"id\":1}"),
    );
    for trial in 0..trials {
        // Interleaved: each trial runs every instance once, in turn.
        for (row, (_, duplicate_engine)) in rows.iter_mut().zip(&instances) {
            let key = IdempotencyKey::parse(
                uuid::Uuid::new_v4().to_string().as_bytes(),
                Default::default(),
            )?;
            let guard = match original
                .begin(scope.clone(), key.clone(), fingerprint)
                .await?
            {
                Begin::Proceed(guard) => guard,
                other => return Err(format!("a fresh key must proceed, got {other:?}").into()),
            };
            let duplicate = tokio::spawn({
                let (engine, scope, key) = (duplicate_engine.clone(), scope.clone(), key.clone());
                async move {
                    let answer = engine.begin(scope, key, fingerprint).await;
                    (answer, Instant::now())
                }
            });
            // Spread over the range, trial by trial.
            let span = hold.end().saturating_sub(*hold.start()) + 1;
            let held = Duration::from_millis(hold.start() + (trial as u64 * 37) % span);
            tokio::time::sleep(held).await;
            let completion = guard.complete(response.clone()).await;
            let stored = Instant::now();
            if completion != Completion::Stored {
                return Err(format!("the original was not stored: {completion:?}").into());
            }
            let (answer, answered) = duplicate.await?;
            match answer? {
                Begin::Replay(_) => {}
                other => return Err(format!("the duplicate must replay, got {other:?}").into()),
            }
            row.delays.push(answered.saturating_duration_since(stored));
        }
    }
    Ok(rows)
}

/// The rows as a Markdown table: median, p90 and worst delay per store and instance.
pub fn table(rows: &[Row]) -> String {
    let mut md = String::from(
        "| store | duplicate on | trials | median | p90 | worst |\n| --- | --- | ---: | ---: | ---: | ---: |\n",
    );
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    for row in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            row.store,
            match row.instance {
                Instance::Same => "the same instance",
                Instance::Other => "another instance",
            },
            row.delays.len(),
            ms(row.quantile(0.5)),
            ms(row.quantile(0.9)),
            ms(row.quantile(1.0)),
        ));
    }
    md
}
