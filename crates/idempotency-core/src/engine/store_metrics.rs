//! The store-call metrics of one engine, with their keys built once.
//!
//! `metrics::histogram!` with label values that are not literals builds its key on every call:
//! a vector of labels (one allocation) and a hash. The engine's labels (`backend`, `op`) are
//! fixed for its life, so the keys are built when the engine is, and each call only asks the
//! recorder installed at that moment for the metric (nothing is cached but the key: a recorder
//! installed later, or a thread-local one in a test, still gets every value).

use crate::store::StoreOp;
use metrics::{Key, Label, Level, Metadata};

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The name of the store-latency histogram, as the engine records it.
pub const STORE_DURATION_METRIC: &str = "idempotency_store_duration_seconds";

const DURATION: &str = STORE_DURATION_METRIC;
const ERRORS: &str = "idempotency_store_errors_total";

/// The keys of `idempotency_store_duration_seconds` and `idempotency_store_errors_total` for
/// each store step of one backend.
pub(crate) struct StoreMetrics {
    duration: [Key; StoreOp::ALL.len()],
    errors: [Key; StoreOp::ALL.len()],
}

impl StoreMetrics {
    /// The keys for a store named `backend`.
    pub(crate) fn new(backend: &'static str) -> Self {
        let key = |name: &'static str, op: StoreOp| {
            Key::from_parts(
                name,
                vec![Label::new("backend", backend), Label::new("op", op.name())],
            )
        };
        StoreMetrics {
            duration: StoreOp::ALL.map(|op| key(DURATION, op)),
            errors: StoreOp::ALL.map(|op| key(ERRORS, op)),
        }
    }

    /// Exports every op's error counter at zero, so a dashboard, a ratio and `increase()` see
    /// the series before its first error.
    pub(crate) fn announce(&self) {
        metrics::with_recorder(|recorder| {
            for key in &self.errors {
                recorder.register_counter(key, &METADATA).increment(0);
            }
        });
    }

    /// Records how long a call of `op` took.
    pub(crate) fn duration(&self, op: StoreOp, seconds: f64) {
        metrics::with_recorder(|recorder| {
            recorder
                .register_histogram(&self.duration[op as usize], &METADATA)
                .record(seconds)
        });
    }

    /// Counts a failed call of `op`.
    pub(crate) fn error(&self, op: StoreOp) {
        metrics::with_recorder(|recorder| {
            recorder
                .register_counter(&self.errors[op as usize], &METADATA)
                .increment(1)
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[test]
    fn every_op_has_its_own_keys_with_backend_and_op_labels() {
        let metrics = StoreMetrics::new("memory");
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            for op in StoreOp::ALL {
                metrics.duration(op, 0.5);
            }
            metrics.error(StoreOp::Complete);
        });
        let seen: Vec<String> = crate::test_store::metrics_by_series(&snapshotter)
            .into_iter()
            .map(|(series, value)| {
                let count = match value {
                    DebugValue::Counter(n) => n as usize,
                    DebugValue::Histogram(values) => values.len(),
                    DebugValue::Gauge(_) => 0,
                };
                format!("{series} {count}")
            })
            .collect();
        let mut expected: Vec<String> = StoreOp::ALL
            .iter()
            .map(|op| format!("{DURATION}{{backend=memory,op={}}} 1", op.name()))
            .collect();
        expected.push(format!("{ERRORS}{{backend=memory,op=complete}} 1"));
        expected.sort();
        assert_eq!(seen, expected);
    }
}
