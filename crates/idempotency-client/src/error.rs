//! What the middleware fails with, beside the transport's own errors.

use std::time::Duration;

/// Why a request sent through [`IdempotentRetry`](crate::IdempotentRetry) has no answer. It
/// reaches the caller as `reqwest_middleware::Error::Middleware`; `downcast_ref::<ClientError>()`
/// on it gives this.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The request's body is a stream, which cannot be sent a second time: nothing was sent.
    /// Give the body as bytes (or a string, or JSON) to have the request retried with its key.
    #[error(
        "the request's body is a stream and cannot be sent again, so it cannot be retried with its \
         idempotency key; nothing was sent: give the body as bytes"
    )]
    BodyNotReplayable,
    /// Every attempt failed before an answer came (the connection refused, reset or timed out),
    /// up to the attempt budget. Whether the last ones reached the server is unknown: send the
    /// request again with the same `key` later, never with a new one.
    #[error("no answer for idempotency key {key} after {attempts} attempts")]
    GaveUp {
        /// The key every attempt carried.
        key: String,
        /// How many attempts were sent.
        attempts: u32,
        /// The last attempt's error.
        #[source]
        source: reqwest::Error,
    },
    /// The overall deadline passed before an answer came. The request may have run: send it
    /// again with the same `key`, never with a new one.
    #[error("no answer for idempotency key {key} within {deadline:?} ({attempts} attempts)")]
    DeadlineExceeded {
        /// The key every attempt carried.
        key: String,
        /// How many attempts were sent.
        attempts: u32,
        /// The deadline that passed.
        deadline: Duration,
    },
}
