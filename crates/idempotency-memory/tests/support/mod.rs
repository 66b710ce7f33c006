//! Helpers of the resident-memory tests (`memory_bound.rs`, `tier_memory_bound.rs`), each in
//! its own binary so that the process's memory is that test's alone.

use bytes::Bytes;
use idempotency_core::StoredResponse;
use idempotency_core::http::{HeaderMap, HeaderValue, StatusCode, header};

/// The process's resident memory, in bytes.
pub(crate) fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

/// A typical small API response: 201, two headers, a 120-byte JSON body.
pub(crate) fn response(i: u64) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let location = HeaderValue::from_str(&format!("/tasks/{i:020}")).expect("a header value");
    headers.insert(header::LOCATION, location);
    let body = format!("{{\"id\":\"{i:020}\",\"title\":\"{}\"}}", "t".repeat(80));
    StoredResponse::new(StatusCode::CREATED, headers, Bytes::from(body))
}
