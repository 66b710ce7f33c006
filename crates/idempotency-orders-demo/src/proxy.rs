//! A TCP proxy that loses requests and answers, as a flaky network or a load balancer that
//! times out does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// What a [`LossyProxy`] did to the connections it took, so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Losses {
    /// Connections taken.
    pub connections: usize,
    /// Requests read and never forwarded: the server never saw them.
    pub requests_dropped: usize,
    /// Requests forwarded whose answer was cut off as it started: the server ran them and the
    /// caller never heard.
    pub answers_dropped: usize,
}

#[derive(Debug, Default)]
struct Counts {
    connections: AtomicUsize,
    requests_dropped: AtomicUsize,
    answers_dropped: AtomicUsize,
}

/// A proxy on a loopback port to `upstream` that, connection by connection in turn, passes
/// the connection, drops its request (reads it and closes), or drops its answer (forwards the
/// request, waits for the answer to start, closes both ends). A caller that opens one
/// connection per attempt (`pool_max_idle_per_host(0)`) thus has one attempt in three pass.
/// An upstream that is down closes the caller's connection unanswered. It runs until the
/// runtime ends.
#[derive(Debug)]
pub struct LossyProxy {
    address: SocketAddr,
    counts: Arc<Counts>,
}

impl LossyProxy {
    /// Starts the proxy to `upstream` on a free loopback port.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<LossyProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let shared = counts.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let turn = shared.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(relay(client, upstream, turn % 3, shared.clone()));
            }
        });
        Ok(LossyProxy { address, counts })
    }

    /// Where callers connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// What the proxy did so far.
    pub fn losses(&self) -> Losses {
        Losses {
            connections: self.counts.connections.load(Ordering::SeqCst),
            requests_dropped: self.counts.requests_dropped.load(Ordering::SeqCst),
            answers_dropped: self.counts.answers_dropped.load(Ordering::SeqCst),
        }
    }
}

/// One connection's fate: `0` passes it, `1` drops the request, `2` drops the answer.
async fn relay(mut client: TcpStream, upstream: SocketAddr, fate: usize, counts: Arc<Counts>) {
    match fate {
        1 => {
            let mut buffer = vec![0u8; 64 * 1024];
            let _ = client.read(&mut buffer).await;
            counts.requests_dropped.fetch_add(1, Ordering::SeqCst);
        }
        2 => {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let (mut server_read, mut server_write) = server.into_split();
            let (mut client_read, _client_write) = client.into_split();
            let forward = tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
            });
            // The answer starts: the request ran. Both ends close unanswered.
            let mut first = [0u8; 1];
            if matches!(server_read.read(&mut first).await, Ok(1)) {
                counts.answers_dropped.fetch_add(1, Ordering::SeqCst);
            }
            forward.abort();
        }
        _ => {
            let Ok(mut server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        }
    }
}
