//! How the demo's task routes answer what went wrong: one RFC 9457 problem response per
//! [`ApiError`] (the idempotency layer's own refusals are the layer's, not these).

use crate::tasks::TaskStoreError;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// An RFC 9457 problem response.
pub(crate) fn problem(
    status: StatusCode,
    slug: &str,
    title: &str,
    detail: impl Into<String>,
) -> Response {
    let body = serde_json::json!({
        "type": format!("urn:idempotency-demo:problem:{slug}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail.into(),
    });
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        )],
        body.to_string(),
    )
        .into_response()
}

/// Why a task request failed; each variant is one problem response.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// The body is not JSON (400).
    MalformedJson(String),
    /// The JSON is not a valid task or change (422).
    InvalidTask(String),
    /// No such task for this user (404).
    NotFound,
    /// The task storage failed: 503 with `Retry-After` when its database is unreachable, 500
    /// otherwise.
    Storage(TaskStoreError),
}

impl From<TaskStoreError> for ApiError {
    fn from(e: TaskStoreError) -> Self {
        ApiError::Storage(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::MalformedJson(detail) => problem(
                StatusCode::BAD_REQUEST,
                "invalid-json",
                "Malformed JSON",
                detail,
            ),
            ApiError::InvalidTask(detail) => problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-task",
                "Invalid task",
                detail,
            ),
            ApiError::NotFound => problem(
                StatusCode::NOT_FOUND,
                "not-found",
                "No such task",
                "You have no task with this id.",
            ),
            ApiError::Storage(TaskStoreError::Full { limit, whose }) => problem(
                StatusCode::INSUFFICIENT_STORAGE,
                "task-list-full",
                "Task list full",
                format!(
                    "The demo keeps at most {limit} tasks {whose} in memory; delete some, or \
                     run it on PostgreSQL (--store postgres://...)."
                ),
            ),
            ApiError::Storage(error) if error.is_unavailable() => {
                tracing::warn!(error = %idempotency::ErrorChain(&error), "task storage unavailable");
                let mut response = problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage-unavailable",
                    "Task storage unavailable",
                    "The task database cannot be reached; retry later.",
                );
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                response
            }
            ApiError::Storage(error) => {
                if error.is_transaction_aborted() {
                    // Expected: the layer drops this answer for the key's own.
                    tracing::debug!(
                        "the request's transaction was aborted before the task: its key is taken"
                    );
                } else {
                    tracing::error!(error = %idempotency::ErrorChain(&error), "task storage failed");
                }
                problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "storage-failed",
                    "Task storage failed",
                    "The task could not be read or written.",
                )
            }
        }
    }
}
