//! The verdict's lines on what a service sees through HTTP.

use idempotency::TableMode;
use idempotency_bench::http::{HttpCompare, Workload};
use idempotency_bench::http_pg::PgRow;
use std::fmt::{self, Write as _};

/// The verdict's first lines: what a service sees through HTTP, in each claim mode and table
/// mode on PostgreSQL (at the most clients measured) and on the memory store.
pub(super) fn http_verdict(w: &mut String, http: &[HttpCompare], http_pg: &[PgRow]) -> fmt::Result {
    use idempotency::ClaimMode;
    use idempotency_bench::http_pg::PgVariant;
    if let Some(clients) = http_pg.iter().map(|r| r.clients).max() {
        let ratio = |variant: PgVariant| {
            http_pg
                .iter()
                .find(|r| r.clients == clients && r.variant == variant)
                .map(|r| r.ratio)
        };
        let layer = |mode, table| ratio(PgVariant::Layer { mode, table });
        let show = |r: Option<f64>| r.map_or("n/a".to_owned(), |r| format!("{r:.2}x"));
        writeln!(
            w,
            "- **Through HTTP, what a service sees** ({clients} clients; the create-task handler behind the layer, its \
             requests/s as a share of the same handler bare in its own transaction): lease mode {} with an UNLOGGED key \
             table, {} LOGGED, {} LOGGED with asynchronous claims; one-transaction mode {} UNLOGGED, {} LOGGED; speculative \
             one-transaction mode {} UNLOGGED, {} LOGGED (its SQL written by hand without the library: {}).",
            show(layer(ClaimMode::Lease, TableMode::Unlogged)),
            show(layer(ClaimMode::Lease, TableMode::Logged)),
            show(layer(ClaimMode::Lease, TableMode::LoggedAsyncCommit)),
            show(layer(ClaimMode::OneTransaction, TableMode::Unlogged)),
            show(layer(ClaimMode::OneTransaction, TableMode::Logged)),
            show(layer(
                ClaimMode::OneTransactionSpeculative,
                TableMode::Unlogged
            )),
            show(layer(
                ClaimMode::OneTransactionSpeculative,
                TableMode::Logged
            )),
            show(ratio(PgVariant::HandWrittenSpeculative)),
        )?;
        for (mode, name) in [
            (
                ClaimMode::OneTransactionSpeculative,
                "the speculative mode (the demo's)",
            ),
            (ClaimMode::Lease, "the lease mode"),
        ] {
            if let (Some(logged), Some(unlogged)) = (
                layer(mode, TableMode::Logged),
                layer(mode, TableMode::Unlogged),
            ) {
                let relative = logged / unlogged;
                let reading = if (relative - 1.0).abs() <= 0.05 {
                    "within 5%: through HTTP the table mode is decided by what survives a crash (LOGGED keeps every key; \
                     UNLOGGED comes back empty and is absent on standbys), not by speed"
                } else if relative < 1.0 {
                    "LOGGED is slower by more than 5% here"
                } else {
                    "LOGGED is faster here, which is this run's noise"
                };
                writeln!(
                    w,
                    "- The table mode through HTTP, in {name}: LOGGED at {relative:.2}x of UNLOGGED's requests/s, {reading}."
                )?;
            }
        }
    }
    let memory = |workload: Workload| {
        http.iter()
            .find(|c| c.workload == workload)
            .map(|c| c.throughput_ratio)
    };
    if let (Some(fresh), Some(replay)) = (memory(Workload::FreshKeys), memory(Workload::Replay)) {
        writeln!(
            w,
            "- The memory store through HTTP: fresh keys at {fresh:.2}x of the bare handler's requests/s, replays at {replay:.2}x."
        )?;
    }
    Ok(())
}
