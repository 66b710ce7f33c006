//! What the client's tests share: a server that answers from a script and records what it was
//! sent, and the client under test.
#![allow(clippy::unwrap_used, dead_code)]

use axum::Router;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::any;
use idempotency_client::IdempotentRetry;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One scripted answer: a status and its headers.
pub(crate) type Answer = (u16, Vec<(&'static str, &'static str)>);

#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) keys: Vec<Option<String>>,
    pub(crate) bodies: Vec<String>,
}

/// A server that answers each request with the next answer of `script` (the last one once the
/// script runs out), and what it was sent.
pub(crate) async fn scripted(script: Vec<Answer>) -> (String, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let script = Arc::new(Mutex::new(script));
    let app = Router::new().route(
        "/orders",
        any({
            let seen = seen.clone();
            move |headers: HeaderMap, body: String| {
                let (seen, script) = (seen.clone(), script.clone());
                async move {
                    let mut seen = seen.lock().unwrap();
                    seen.keys.push(
                        headers
                            .get("idempotency-key")
                            .map(|v| v.to_str().unwrap().to_owned()),
                    );
                    seen.bodies.push(body);
                    let mut script = script.lock().unwrap();
                    let (status, pairs) = if script.len() > 1 {
                        script.remove(0)
                    } else {
                        script[0].clone()
                    };
                    let mut response =
                        (StatusCode::from_u16(status).unwrap(), "answer").into_response();
                    for (name, value) in pairs {
                        response.headers_mut().insert(
                            HeaderName::from_static(name),
                            HeaderValue::from_static(value),
                        );
                    }
                    response
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/orders", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

pub(crate) fn client(retry: IdempotentRetry) -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(retry)
        .build()
}

pub(crate) fn fast() -> IdempotentRetry {
    IdempotentRetry::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .build()
}
