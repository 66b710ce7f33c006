//! What waiting for a Redis replica costs: claim+complete on a throwaway master with one
//! replica, through a store that does not wait and one that waits for the replica after each
//! claim and completion (`wait_for_replicas(1, ..)`), interleaved at one client.

use super::measure::claim_complete;
use fmt::Write as _;
use idempotency::RedisStore;
use idempotency_bench::{bench_fingerprint, bench_response, bench_scope, err, median};
use idempotency_testkit::TempRedis;
use std::fmt;
use std::time::{Duration, Instant};

/// The result of the comparison.
#[derive(Debug)]
pub(crate) struct ReplicaWaitCost {
    /// Median over rounds of the round's median claim+complete, µs, without waiting.
    pub(crate) plain_us: f64,
    /// The same, waiting for one replica.
    pub(crate) waiting_us: f64,
    /// Median over rounds of waiting / plain.
    pub(crate) ratio: f64,
}

/// Starts a master and a replica, waits for the link, and measures.
pub(crate) async fn measure(rounds: usize, ops: usize) -> Result<ReplicaWaitCost, String> {
    let master = TempRedis::start(&[]).map_err(err)?;
    let port = master.port().to_string();
    let _replica = TempRedis::start(&["--replicaof", "127.0.0.1", &port]).map_err(err)?;
    let build = |wait: bool| {
        let url = master.url();
        async move {
            let builder = RedisStore::builder(url).key_prefix("idem-bench-replica:");
            let builder = if wait {
                builder.wait_for_replicas(1, Duration::from_secs(1))
            } else {
                builder
            };
            builder.build().await
        }
    };
    let plain = build(false).await.map_err(err)?;
    // The replica needs a moment to connect; the waiting store refuses to build before.
    let deadline = Instant::now() + Duration::from_secs(20);
    let waiting = loop {
        match build(true).await {
            Ok(store) => break store,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(format!("the replica never connected: {}", err(e))),
        }
    };
    let (scope, fp, response) = (bench_scope(), bench_fingerprint(), bench_response());
    let (mut plain_medians, mut waiting_medians, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut per_side = [0.0f64; 2];
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let store = if side == 0 { &plain } else { &waiting };
            let mut times = Vec::with_capacity(ops);
            for _ in 0..ops {
                let t = Instant::now();
                claim_complete(store, &scope, &fp, &response).await?;
                times.push(t.elapsed().as_secs_f64() * 1e6);
            }
            per_side[side] = median(&mut times);
        }
        plain_medians.push(per_side[0]);
        waiting_medians.push(per_side[1]);
        ratios.push(per_side[1] / per_side[0]);
    }
    Ok(ReplicaWaitCost {
        plain_us: median(&mut plain_medians),
        waiting_us: median(&mut waiting_medians),
        ratio: median(&mut ratios),
    })
}

/// The section's Markdown.
pub(crate) fn section(
    w: &mut String,
    cost: &ReplicaWaitCost,
    rounds: usize,
    ops: usize,
) -> fmt::Result {
    writeln!(
        w,
        "\n## Redis: waiting for replicas\n\nA throwaway master with one replica on this machine (loopback). Claim+complete of fresh \
         keys at one client, {rounds} interleaved rounds of {ops} operations per side: a store that does not wait, and one \
         built with `wait_for_replicas(1, 1s)`, which sends `WAIT 1` after each claim and completion, so a failover cannot \
         forget a claim a handler runs on or a response a client got.\n"
    )?;
    writeln!(w, "| store | µs | ratio |")?;
    writeln!(w, "| --- | ---: | ---: |")?;
    writeln!(w, "| no wait | {:.0} | 1.00 |", cost.plain_us)?;
    writeln!(
        w,
        "| `wait_for_replicas(1, 1s)` | {:.0} | {:.2} |",
        cost.waiting_us, cost.ratio
    )
}
