//! What fingerprinting a JSON body costs by its shape: `cargo bench -p idempotency-bench --bench
//! fingerprint`. A 1 MiB body flat and in key order, flat and reversed, and nested 127 levels
//! deep with every level out of order (the shape that made the streaming canonicaliser re-copy
//! the body once per level, issue 28 item 5).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use idempotency::BodyCanonicalization;
use idempotency::store::Fingerprint;
use std::hint::black_box;

const SIZE: usize = 1 << 20;

fn flat(reversed: bool) -> Vec<u8> {
    let members: Vec<String> = (0..SIZE / 32)
        .map(|i| format!("\"k{i:08}\":\"{}\"", "v".repeat(16)))
        .collect();
    let members: Vec<&String> = match reversed {
        true => members.iter().rev().collect(),
        false => members.iter().collect(),
    };
    let joined: Vec<&str> = members.iter().map(|m| m.as_str()).collect();
    format!("{{{}}}", joined.join(",")).into_bytes()
}

fn nested() -> Vec<u8> {
    let mut body = format!("{{\"z\":\"{}\",\"a\":1}}", "x".repeat(SIZE));
    for _ in 0..126 {
        body = format!("{{\"z\":{body},\"a\":1}}");
    }
    body.into_bytes()
}

fn fingerprint(c: &mut Criterion) {
    let mut group = c.benchmark_group("fingerprint_1mib");
    group.sample_size(20);
    for (name, body) in [
        ("flat_in_order", flat(false)),
        ("flat_reversed", flat(true)),
        ("nested_127_out_of_order", nested()),
    ] {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                black_box(Fingerprint::of_request(
                    "POST",
                    "/tasks",
                    black_box(&body),
                    BodyCanonicalization::Json,
                ))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, fingerprint);
criterion_main!(benches);
