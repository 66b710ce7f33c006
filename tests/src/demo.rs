//! The demo service as a child process, and what a client checks over real HTTP.

use axum::http::{Method, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use std::time::Duration;

/// The demo service as a child process, listening on a free loopback port.
#[derive(Debug)]
pub struct DemoProcess {
    child: tokio::process::Child,
    addr: std::net::SocketAddr,
}

impl DemoProcess {
    /// Starts `binary` (the test crate's `demo-server`, from `env!("CARGO_BIN_EXE_demo-server")`)
    /// with `--listen 127.0.0.1:0` and `args`, and `envs` in its environment; waits until it
    /// says where it listens.
    pub async fn start(binary: &str, args: &[&str], envs: &[(&str, &str)]) -> DemoProcess {
        use std::process::Stdio;
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut child = tokio::process::Command::new(binary)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .envs(envs.iter().copied())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some((_, rest)) = line.split_once("listening on http://") {
                    let addr = rest.split_whitespace().next().unwrap();
                    return addr.parse::<std::net::SocketAddr>().unwrap();
                }
            }
            panic!("the demo exited before listening");
        })
        .await
        .expect("the demo did not start listening within 30 s");
        // Keep draining its output so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        DemoProcess { child, addr }
    }

    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the process: `STOP` freezes it as a paused VM
    /// or a long stop-the-world would, its connections open and silent.
    pub fn signal(&self, signal: &str) {
        let pid = self
            .child
            .id()
            .expect("the demo is still running")
            .to_string();
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal} {pid} failed");
    }

    /// SIGKILL: no shutdown, no completion, no release.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM, then waits up to `within` for the process to exit on its own; its exit status.
    pub async fn terminate(mut self, within: Duration) -> std::process::ExitStatus {
        self.signal("TERM");
        tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the demo did not exit within {within:?} of SIGTERM"))
            .unwrap()
    }
}

/// Over real HTTP to the demo at `addr`: creates a task with a fresh key, sends it again, and lists the user's tasks: 201, a replayed
/// 201 with the same body, and one task.
pub async fn create_replay_list(addr: std::net::SocketAddr) {
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let user = uuid::Uuid::new_v4().to_string();
    let key = uuid::Uuid::new_v4().to_string();
    let send = |method: Method, path: &str, key: Option<&str>| {
        let mut builder = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .header("authorization", format!("Bearer {user}"))
            .header("content-type", "application/json");
        if let Some(key) = key {
            builder = builder.header("idempotency-key", key);
        }
        let request = builder
            .body(Full::new(Bytes::from_static(br#"{"title":"over TLS"}"#)))
            .unwrap();
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let (parts, body) = response.into_parts();
            (parts, body.collect().await.unwrap().to_bytes())
        }
    };
    let (first, first_body) = send(Method::POST, "/tasks", Some(&key)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first_body:?}");
    let (replay, replay_body) = send(Method::POST, "/tasks", Some(&key)).await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.headers.get("idempotent-replayed").unwrap(), "true");
    assert_eq!(replay_body, first_body);
    let (list, body) = send(Method::GET, "/tasks", None).await;
    assert_eq!(list.status, StatusCode::OK);
    let tasks: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
    assert_eq!(tasks.len(), 1);
}
