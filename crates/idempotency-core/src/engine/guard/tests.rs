//! Tests of `guard`.

use super::{Completion, RollbackCause, Superseded};
use metrics_util::debugging::DebuggingRecorder;

#[test]
fn each_completion_is_counted_under_its_label() {
    let all = [
        Completion::Stored,
        Completion::Released,
        Completion::Stale,
        Completion::Deferred,
        Completion::RolledBack(RollbackCause::Store),
        Completion::TransactionMisused,
        Completion::Superseded(Superseded::Mismatch),
    ];
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || all.iter().for_each(|c| c.count()));
    let mut counted: Vec<String> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, ..)| {
            let key = key.key();
            assert_eq!(key.name(), "idempotency_completions_total");
            key.labels().map(|l| l.value().to_owned()).collect()
        })
        .collect();
    counted.sort();
    let mut labels: Vec<String> = all.iter().map(|c| c.label().to_owned()).collect();
    labels.sort();
    assert_eq!(counted, labels);
}
