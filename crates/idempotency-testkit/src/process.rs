use std::io;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
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
