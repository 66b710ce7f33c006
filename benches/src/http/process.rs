//! A server variant as a child process of the bench, on a free loopback port.

use super::Variant;
use std::net::SocketAddr;
use std::time::Duration;

/// A server child process.
#[derive(Debug)]
pub struct ServerProcess {
    child: tokio::process::Child,
    addr: SocketAddr,
}

impl ServerProcess {
    /// Starts `binary serve-tasks [--layer]` and waits until it listens.
    pub async fn start(binary: &std::path::Path, variant: Variant) -> Result<Self, String> {
        let mut args = vec!["serve-tasks", "--listen", "127.0.0.1:0"];
        if let Variant::Layer(store) = variant {
            args.extend(["--layer", store.name()]);
        }
        Self::spawn(binary, &args).await
    }

    /// Starts `binary args..`, a server that prints `listening on <addr>` once bound, and
    /// waits until it listens.
    pub async fn spawn(binary: &std::path::Path, args: &[&str]) -> Result<Self, String> {
        Self::spawn_with_env(binary, args, &[]).await
    }

    /// [`ServerProcess::spawn`] with environment variables set for the child (for what must
    /// not show in the process list, a database URL with its password).
    pub async fn spawn_with_env(
        binary: &std::path::Path,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Result<Self, String> {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut command = tokio::process::Command::new(binary);
        command.args(args).envs(envs.iter().copied());
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("could not start {}: {e}", binary.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .map_err(|_| "the server did not start within 10 s".to_owned())?
            .map_err(|e| e.to_string())?
            .ok_or("the server exited before listening")?;
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("unexpected first line: {line}"))?;
        Ok(ServerProcess { child, addr })
    }

    /// SIGKILLs the process (no shutdown of any kind) and reaps it.
    pub async fn kill(&mut self) {
        // Already gone is fine: it is gone either way.
        let _ = self.child.kill().await;
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// CPU time the process has used so far (user + system), from `/proc`.
    pub fn cpu_time(&self) -> Option<Duration> {
        let pid = self.child.id()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name (which may hold spaces) in parentheses.
        let rest = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // USER_HZ is 100 on Linux.
        Some(Duration::from_millis(ticks * 10))
    }
}
