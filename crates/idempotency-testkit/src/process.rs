use std::io;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

/// A TCP port on 127.0.0.1 that was free a moment ago, below the ephemeral range (32768 and
/// up): a readiness probe to a port in that range that nothing listens on yet can connect to
/// itself and then keep the server from binding; and a Redis Cluster node's bus port (its port
/// + 10000) must stay below 65536.
pub fn free_port() -> io::Result<u16> {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Spread over 20000..32000, starting somewhere different in each test process.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = (std::process::id() % 12_000) as u16;
    for _ in 0..12_000 {
        let offset = NEXT.fetch_add(7, Ordering::Relaxed);
        let port = 20_000 + (start.wrapping_add(offset) % 12_000);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(io::Error::other("no free port between 20000 and 32000"))
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

pub(crate) fn user_ids(user: &str) -> io::Result<(u32, u32)> {
    let id = |flag: &str| -> io::Result<u32> {
        let out = Command::new("id").args([flag, user]).output()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| io::Error::other(format!("no user {user:?} on this machine")))
    };
    Ok((id("-u")?, id("-g")?))
}

/// Runs a command, as `user` when running as root, and fails with its output when it fails.
pub(crate) fn run_as(user: Option<&str>, program: &Path, args: &[&str]) -> io::Result<Output> {
    let mut command = match user {
        Some(user) => {
            let mut c = Command::new("setpriv");
            c.args([
                &format!("--reuid={user}"),
                &format!("--regid={user}"),
                "--init-groups",
                "--",
            ])
            .arg(program);
            c
        }
        None => Command::new(program),
    };
    let output = command.args(args).output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("could not run {}: {e}", program.display()),
        )
    })?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(io::Error::other(format!(
            "{} {} failed ({}):\n{}{}",
            program.display(),
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}
