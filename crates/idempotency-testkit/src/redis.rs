use crate::process::free_port;
use std::io;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A throwaway `redis-server` on a free loopback port, persistence off. Killed and its folder
/// removed on drop.
#[derive(Debug)]
pub struct TempRedis {
    dir: tempfile::TempDir,
    port: u16,
    extra: Vec<String>,
    child: Option<Child>,
}

fn ping(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "ping"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
        .unwrap_or(false)
}

fn cli(port: u16, args: &[&str]) -> io::Result<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl TempRedis {
    /// Starts a server; `extra` are more `redis-server` arguments (`--cluster-enabled`, `yes`).
    pub fn start(extra: &[&str]) -> io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("idem-redis-").tempdir()?;
        let mut server = TempRedis {
            dir,
            port: free_port()?,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        server.start_server()?;
        Ok(server)
    }

    /// Starts the server again on the same port (after [`TempRedis::kill`]).
    pub fn start_server(&mut self) -> io::Result<()> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--logfile", "redis.log"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("could not run redis-server (install the redis-server package): {e}"),
                )
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ping(self.port) {
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "redis-server on port {} did not answer PING",
                    self.port
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) -> io::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing is answered, like a
    /// hung or partitioned server.
    pub fn pause(&self) -> io::Result<()> {
        self.signal("-STOP")
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) -> io::Result<()> {
        self.signal("-CONT")
    }

    fn signal(&self, signal: &str) -> io::Result<()> {
        let pid = self
            .child
            .as_ref()
            .ok_or_else(|| io::Error::other("the server is not running"))?
            .id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("kill {signal} {pid} failed")))
        }
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for TempRedis {
    fn drop(&mut self) {
        // The folder goes with `dir` after this.
        let _ = self.kill();
    }
}

/// A throwaway Redis Cluster of three masters and no replicas, joined with
/// `redis-cli --cluster create`.
#[derive(Debug)]
pub struct TempRedisCluster {
    nodes: Vec<TempRedis>,
}

impl TempRedisCluster {
    /// Starts three cluster-enabled servers, joins them, and waits for `cluster_state:ok`.
    pub fn start() -> io::Result<Self> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(TempRedis::start(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "5000",
            ])?);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &nodes {
            while !cli(node.port(), &["cluster", "info"])?.contains("cluster_state:ok") {
                if Instant::now() > deadline {
                    return Err(io::Error::other(
                        "the cluster never reached cluster_state:ok",
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(TempRedisCluster { nodes })
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(TempRedis::url).collect()
    }

    /// The number of keys each node holds (`DBSIZE`), to show keys spread over the slots.
    pub fn keys_per_node(&self) -> io::Result<Vec<u64>> {
        self.nodes
            .iter()
            .map(|n| {
                cli(n.port(), &["dbsize"])?
                    .trim()
                    .parse()
                    .map_err(|_| io::Error::other("DBSIZE did not answer a number"))
            })
            .collect()
    }
}
