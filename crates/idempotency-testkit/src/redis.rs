use crate::process::free_port;
use std::io;
use std::path::Path;

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
    /// The CA file to check the server with, when it speaks TLS only.
    tls_ca: Option<std::path::PathBuf>,
}

fn ping(port: u16, tls_ca: Option<&Path>) -> bool {
    let mut command = Command::new("redis-cli");
    command.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(ca) = tls_ca {
        command.arg("--tls").arg("--cacert").arg(ca);
    }
    command
        .arg("ping")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
        .unwrap_or(false)
}

impl TempRedis {
    /// Runs `redis-cli` against this server (over TLS when it speaks TLS only).
    fn cli(&self, args: &[&str]) -> io::Result<String> {
        let mut command = Command::new("redis-cli");
        command.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(ca) = &self.tls_ca {
            command.arg("--tls").arg("--cacert").arg(ca);
        }
        let out = command.args(args).output()?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
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
            tls_ca: None,
        };
        server.start_server()?;
        Ok(server)
    }

    /// Starts a server that speaks TLS only (`--port 0 --tls-port`), presenting `cert`;
    /// `ca_root` is the CA file its readiness check trusts. Clients need no certificate.
    pub fn start_tls_only(cert: &crate::ServerCert, ca_root: &Path) -> io::Result<Self> {
        Self::start_tls_with(cert, ca_root, &[])
    }

    fn start_tls_with(
        cert: &crate::ServerCert,
        ca_root: &Path,
        extra: &[&str],
    ) -> io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("idem-redis-").tempdir()?;
        let (cert_file, key_file) = cert.write_into(dir.path())?;
        let port = free_port()?;
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let mut server = TempRedis {
            extra: vec![
                "--tls-port".into(),
                port.to_string(),
                "--tls-cert-file".into(),
                path(&cert_file),
                "--tls-key-file".into(),
                path(&key_file),
                "--tls-ca-cert-file".into(),
                path(ca_root),
                "--tls-auth-clients".into(),
                "no".into(),
            ]
            .into_iter()
            .chain(extra.iter().map(|s| s.to_string()))
            .collect(),
            dir,
            port,
            child: None,
            tls_ca: Some(ca_root.to_owned()),
        };
        server.start_server()?;
        Ok(server)
    }

    /// Starts the server again on the same port (after [`TempRedis::kill`]).
    pub fn start_server(&mut self) -> io::Result<()> {
        // A TLS-only server listens on its TLS port only.
        let plain_port = if self.tls_ca.is_some() { 0 } else { self.port };
        let child = Command::new("redis-server")
            .args(["--port", &plain_port.to_string(), "--bind", "127.0.0.1"])
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
        while !ping(self.port, self.tls_ca.as_deref()) {
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

    /// `redis://127.0.0.1:<port>`, or `rediss://localhost:<port>` for a TLS-only server (the
    /// certificate names `localhost`).
    pub fn url(&self) -> String {
        match self.tls_ca {
            Some(_) => format!("rediss://localhost:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }
}

impl Drop for TempRedis {
    fn drop(&mut self) {
        // The folder goes with `dir` after this.
        let _ = self.kill();
    }
}

mod cluster;

pub use cluster::TempRedisCluster;
