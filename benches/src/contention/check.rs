//! The check of a contended run: every key's answers against the database (one order per `201`
//! and none otherwise, stock conserved, every later answer byte-identical to the first, none
//! left without a final answer), and what the run measured.

use super::client::{Answer, KeyLog};
use super::{INITIAL_STOCK, Outcome, Settings, connect};
use crate::err;
use hdrhistogram::Histogram;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

fn quantiles(values: impl Iterator<Item = Duration>) -> (usize, Duration, Duration) {
    let mut histogram = match Histogram::<u64>::new(3) {
        Ok(h) => h,
        Err(_) => return (0, Duration::ZERO, Duration::ZERO),
    };
    for value in values {
        let _ = histogram.record(u64::try_from(value.as_micros()).unwrap_or(u64::MAX).max(1));
    }
    let at = |q| Duration::from_micros(histogram.value_at_quantile(q));
    (histogram.len() as usize, at(0.5), at(0.99))
}

/// Checks the keys' answers against the database and measures the run.
pub(super) async fn check(
    settings: &Settings,
    logs: &[KeyLog],
    window: Duration,
) -> Result<Outcome, String> {
    let schema = &settings.shop.schema;
    let client = connect(&settings.shop.url).await?;
    let mut orders: HashMap<String, Vec<i64>> = HashMap::new();
    for row in client
        .query(
            &format!("SELECT reference, id FROM \"{schema}\".orders"),
            &[],
        )
        .await
        .map_err(err)?
    {
        orders.entry(row.get(0)).or_default().push(row.get(1));
    }
    let mut violations = Vec::new();
    let mut retried: BTreeMap<String, usize> = BTreeMap::new();
    let (mut created, mut refused) = (0, 0);
    for log in logs {
        for attempt in &log.attempts {
            let who = match &attempt.answer {
                Answer::Retry {
                    refusal: Some(slug),
                    ..
                } => slug.clone(),
                Answer::Retry { refusal: None, .. } => "handler-503".to_owned(),
                Answer::Cut => "cut".to_owned(),
                Answer::Unexpected { status, body } => {
                    violations.push(format!(
                        "key {}: unexpected {status} {}",
                        log.key,
                        String::from_utf8_lossy(body)
                    ));
                    continue;
                }
                Answer::Final { .. } => continue,
            };
            *retried.entry(who).or_default() += 1;
        }
        let stored = orders.get(&log.key).map_or(&[][..], Vec::as_slice);
        let Some((status, body)) = log.first_final() else {
            violations.push(format!(
                "key {}: no final answer within {:?} after the load ({} attempts)",
                log.key,
                settings.settle,
                log.attempts.len()
            ));
            continue;
        };
        if let Some((other, other_body)) = log.finals().find(|f| *f != (status, body)) {
            violations.push(format!(
                "key {}: answered {status} {} and later {other} {}",
                log.key,
                String::from_utf8_lossy(body),
                String::from_utf8_lossy(other_body)
            ));
        }
        match status {
            201 => {
                created += 1;
                let id = serde_json::from_slice::<serde_json::Value>(body)
                    .ok()
                    .and_then(|v| v["id"].as_i64());
                if stored.len() != 1 || id != stored.first().copied() {
                    violations.push(format!(
                        "key {}: answered 201 (order {id:?}), orders in the database: {stored:?}",
                        log.key
                    ));
                }
            }
            _ => {
                refused += 1;
                if !stored.is_empty() {
                    violations.push(format!(
                        "key {}: answered {status}, orders in the database: {stored:?}",
                        log.key
                    ));
                }
            }
        }
    }
    for (reference, ids) in &orders {
        if !logs.iter().any(|log| &log.key == reference) {
            violations.push(format!(
                "orders {ids:?} of a key no client sent: {reference}"
            ));
        }
    }
    let conservation = format!(
        "SELECT s.item, s.qty, {INITIAL_STOCK} \
           + coalesce((SELECT sum(qty) FROM \"{schema}\".restocks r WHERE r.item = s.item), 0) \
           - coalesce((SELECT sum(q) FROM \"{schema}\".orders o, unnest(o.items, o.qtys) AS l(i, q) \
                       WHERE l.i = s.item), 0) \
         FROM \"{schema}\".stock s ORDER BY s.item"
    );
    for row in client.query(&conservation, &[]).await.map_err(err)? {
        let (item, qty, expected): (i32, i32, i64) = (row.get(0), row.get(1), row.get(2));
        if i64::from(qty) != expected {
            violations.push(format!(
                "item {item}: {qty} in stock, {expected} by the orders and restocks"
            ));
        }
    }
    let window_end = logs_start(logs) + window;
    let answered_in_window = logs
        .iter()
        .filter_map(KeyLog::answered_at)
        .filter(|at| *at <= window_end)
        .count();
    let (_, order_p50, order_p99) = quantiles(logs.iter().filter_map(|log| {
        let first = log.attempts.first()?;
        Some(log.answered_at()?.duration_since(first.sent))
    }));
    let (replays, replay_p50, replay_p99) = quantiles(
        logs.iter()
            .flat_map(|log| &log.attempts)
            .filter(|a| matches!(a.answer, Answer::Final { replayed: true, .. }))
            .map(|a| a.took),
    );
    Ok(Outcome {
        mode: settings.shop.mode,
        pool: settings.shop.pool,
        admission: settings.shop.admission,
        keys: logs.len(),
        created,
        refused,
        throughput: answered_in_window as f64 / window.as_secs_f64(),
        order_p50,
        order_p99,
        replays,
        replay_p50,
        replay_p99,
        attempts: logs.iter().map(|l| l.attempts.len()).sum(),
        retried,
        violations,
    })
}

/// When the first attempt of the run was sent.
pub(super) fn logs_start(logs: &[KeyLog]) -> Instant {
    logs.iter()
        .filter_map(|l| l.attempts.first().map(|a| a.sent))
        .min()
        .unwrap_or_else(Instant::now)
}
