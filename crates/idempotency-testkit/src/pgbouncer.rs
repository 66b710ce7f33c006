//! A throwaway PgBouncer in front of a PostgreSQL server.

use crate::process::{free_port, is_root, user_ids};
use std::io;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A throwaway PgBouncer (Debian's `pgbouncer` package) on a free loopback port, in front of the
/// PostgreSQL server on `127.0.0.1:<upstream port>`, trusting every user. Killed and its folder
/// removed on drop.
#[derive(Debug)]
pub struct TempPgBouncer {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

/// How PgBouncer lends server connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per transaction: sessions move between server connections, so
    /// nothing may outlive a transaction (named prepared statements, session settings).
    Transaction,
    /// A server connection per client session.
    Session,
}

impl TempPgBouncer {
    /// Starts PgBouncer in `mode` in front of `127.0.0.1:<upstream_port>`.
    pub fn start(upstream_port: u16, mode: PoolMode) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("idem-pgbouncer-")
            .tempdir()?;
        let port = free_port()?;
        let mode = match mode {
            PoolMode::Transaction => "transaction",
            PoolMode::Session => "session",
        };
        let path = dir.path().to_string_lossy().into_owned();
        std::fs::write(dir.path().join("users.txt"), "\"postgres\" \"\"\n")?;
        std::fs::write(
            dir.path().join("pgbouncer.ini"),
            format!(
                "[databases]\n\
                 * = host=127.0.0.1 port={upstream_port}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {path}/users.txt\n\
                 pool_mode = {mode}\n\
                 max_client_conn = 500\n\
                 default_pool_size = 20\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 logfile = {path}/pgbouncer.log\n\
                 pidfile = {path}/pgbouncer.pid\n"
            ),
        )?;
        // PgBouncer refuses to run as root: run it as the postgres user, in place (setpriv
        // execs, so signals reach PgBouncer itself).
        let mut command = if is_root() {
            let (uid, gid) = user_ids("postgres")?;
            for entry in std::fs::read_dir(dir.path())? {
                std::os::unix::fs::chown(entry?.path(), Some(uid), Some(gid))?;
            }
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
            let mut c = Command::new("setpriv");
            c.args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
                "pgbouncer",
            ]);
            c
        } else {
            Command::new("pgbouncer")
        };
        let child = command
            .arg(dir.path().join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("could not run pgbouncer (install the pgbouncer package): {e}"),
                )
            })?;
        let mut bouncer = TempPgBouncer {
            dir,
            port,
            child: Some(child),
        };
        // The port is below the ephemeral range, so this probe cannot connect to itself.
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = bouncer
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(io::Error::other(format!(
                    "pgbouncer exited ({status}):\n{}",
                    bouncer.log()
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "pgbouncer did not listen on {port}:\n{}",
                    bouncer.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(bouncer)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for `database` as `postgres`, through PgBouncer.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for TempPgBouncer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
