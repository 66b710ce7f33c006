use crate::process::{free_port, is_root, run_as, user_ids};
use std::io;
use std::path::{Path, PathBuf};

/// A throwaway PostgreSQL cluster: `initdb` into a temporary folder and a server on a free
/// loopback port. Stopped (immediately) and removed on drop.
#[derive(Debug)]
pub struct TempPostgres {
    root: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    settings: Vec<String>,
    user: Option<&'static str>,
}

fn pg_bin_dir() -> io::Result<PathBuf> {
    if let Ok(dir) = std::env::var("IDEMPOTENCY_TEST_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut candidates: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                "no PostgreSQL server binaries under /usr/lib/postgresql: install the \
                 `postgresql` package (scripts/services.sh does) or set IDEMPOTENCY_TEST_PG_BIN",
            )
        })?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    candidates.sort();
    candidates
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| io::Error::other("no initdb found under /usr/lib/postgresql/*/bin"))
}

/// The major version of the newest PostgreSQL server installed (`15`), if any.
pub(crate) fn installed_version() -> Option<String> {
    let bin = pg_bin_dir().ok()?;
    let version = bin.parent()?.file_name()?.to_str()?;
    Some(version.to_owned())
}

/// Fails, naming the Debian package to install, when the server binaries have no `library`
/// (e.g. `pg_cron`) to preload: a test that needs it then says what is missing rather than
/// "the server did not start".
pub fn require_library(library: &str, debian_package: &str) -> io::Result<()> {
    let bin = pg_bin_dir()?;
    let lib = bin
        .parent()
        .map_or_else(|| PathBuf::from("lib"), |v| v.join("lib"))
        .join(format!("{library}.so"));
    if lib.exists() {
        return Ok(());
    }
    let version = installed_version().unwrap_or_else(|| "<version>".to_owned());
    let package = debian_package.replace("{version}", &version);
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "{library} is not installed ({} is missing): install it with `apt-get install \
             {package}` (`scripts/services.sh --install` does)",
            lib.display()
        ),
    ))
}

impl TempPostgres {
    /// Creates and starts a cluster. `settings` are extra `-c name=value` server settings,
    /// given as `name=value`.
    pub fn start(settings: &[&str]) -> io::Result<Self> {
        let cluster = Self::create(settings)?;
        cluster.start_server()?;
        Ok(cluster)
    }

    /// Creates and starts a cluster that accepts TLS connections only: `pg_hba.conf` has
    /// `hostssl` lines and no `host` line, and the server presents `cert` (see
    /// [`TestCa`](crate::TestCa)).
    pub fn start_tls_only(cert: &crate::ServerCert, settings: &[&str]) -> io::Result<Self> {
        let mut all: Vec<&str> = settings.to_vec();
        all.extend([
            "ssl=on",
            "ssl_cert_file=server.crt",
            "ssl_key_file=server.key",
        ]);
        let cluster = Self::create(&all)?;
        let data = cluster.data_dir();
        cert.write_into(&data)?;
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n",
        )?;
        if let Some(user) = cluster.user {
            let (uid, gid) = user_ids(user)?;
            for file in ["server.crt", "server.key", "pg_hba.conf"] {
                std::os::unix::fs::chown(data.join(file), Some(uid), Some(gid))?;
            }
        }
        cluster.start_server()?;
        Ok(cluster)
    }

    /// Runs `initdb` into a new temporary folder; the server is not started.
    fn create(settings: &[&str]) -> io::Result<Self> {
        let bin = pg_bin_dir()?;
        let root = tempfile::Builder::new().prefix("idem-pg-").tempdir()?;
        let user = is_root().then_some("postgres");
        if let Some(user) = user {
            let (uid, gid) = user_ids(user)?;
            std::os::unix::fs::chown(root.path(), Some(uid), Some(gid))?;
        }
        let cluster = TempPostgres {
            port: free_port()?,
            root,
            bin,
            settings: settings.iter().map(|s| s.to_string()).collect(),
            user,
        };
        let data = cluster.data_dir();
        cluster.pg(
            "initdb",
            &[
                "-D",
                path_str(&data)?,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        )?;
        Ok(cluster)
    }

    /// Makes a streaming standby of this cluster with `pg_basebackup -R` and starts it.
    pub fn start_standby(&self) -> io::Result<TempPostgres> {
        let root = tempfile::Builder::new().prefix("idem-pg-").tempdir()?;
        if let Some(user) = self.user {
            let (uid, gid) = user_ids(user)?;
            std::os::unix::fs::chown(root.path(), Some(uid), Some(gid))?;
        }
        let standby = TempPostgres {
            port: free_port()?,
            root,
            bin: self.bin.clone(),
            settings: self.settings.clone(),
            user: self.user,
        };
        let port = self.port.to_string();
        standby.pg(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                path_str(&standby.data_dir())?,
                "-R",
                "-X",
                "stream",
            ],
        )?;
        standby.start_server()?;
        Ok(standby)
    }

    fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    fn pg(&self, tool: &str, args: &[&str]) -> io::Result<std::process::Output> {
        run_as(self.user, &self.bin.join(tool), args)
    }

    /// Starts the server (again, after [`TempPostgres::crash`] or [`TempPostgres::stop`]).
    pub fn start_server(&self) -> io::Result<()> {
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off",
            self.port,
            path_str(self.root.path())?
        );
        for setting in &self.settings {
            options.push_str(" -c ");
            options.push_str(setting);
        }
        let log = self.root.path().join("server.log");
        self.pg(
            "pg_ctl",
            &[
                "-D",
                path_str(&self.data_dir())?,
                "-l",
                path_str(&log)?,
                "-o",
                &options,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )?;
        Ok(())
    }

    /// Promotes this standby to a primary (`pg_ctl promote -w`): it leaves recovery and accepts
    /// writes; its UNLOGGED tables start empty.
    pub fn promote(&self) -> io::Result<()> {
        self.pg(
            "pg_ctl",
            &[
                "-D",
                path_str(&self.data_dir())?,
                "-w",
                "-t",
                "60",
                "promote",
            ],
        )?;
        Ok(())
    }

    /// Kills the server without a clean shutdown (`pg_ctl stop -m immediate`): the next start
    /// runs crash recovery, which empties UNLOGGED tables.
    pub fn crash(&self) -> io::Result<()> {
        self.stop_mode("immediate")
    }

    /// Freezes the server (`SIGSTOP` to the postmaster and every process it started), as a
    /// paused VM or a stop-the-world would: connections stay open and nothing answers. Undo with
    /// [`TempPostgres::thaw`] before the cluster is dropped.
    pub fn freeze(&self) -> io::Result<()> {
        self.signal_all("STOP")
    }

    /// Resumes a server [frozen](TempPostgres::freeze).
    pub fn thaw(&self) -> io::Result<()> {
        self.signal_all("CONT")
    }

    /// Sends `signal` to the postmaster, then to its children.
    fn signal_all(&self, signal: &str) -> io::Result<()> {
        let pid_file = std::fs::read_to_string(self.data_dir().join("postmaster.pid"))?;
        let pid = pid_file
            .lines()
            .next()
            .map(str::trim)
            .filter(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| io::Error::other("postmaster.pid names no process"))?;
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), pid])
            .status()?;
        if !sent.success() {
            return Err(io::Error::other(format!("kill -{signal} {pid} failed")));
        }
        // pkill exits 1 when no child matched: not an error.
        std::process::Command::new("pkill")
            .args([&format!("-{signal}"), "-P", pid])
            .status()?;
        Ok(())
    }

    /// Stops the server cleanly (`pg_ctl stop -m fast`).
    pub fn stop(&self) -> io::Result<()> {
        self.stop_mode("fast")
    }

    fn stop_mode(&self, mode: &str) -> io::Result<()> {
        self.pg(
            "pg_ctl",
            &["-D", path_str(&self.data_dir())?, "-m", mode, "-w", "stop"],
        )?;
        Ok(())
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for `database` as the `postgres` superuser.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        // A frozen server would not stop. The folder goes with `root` after this.
        let _ = self.thaw();
        let _ = self.stop_mode("immediate");
    }
}

fn path_str(path: &Path) -> io::Result<&str> {
    path.to_str()
        .ok_or_else(|| io::Error::other(format!("non-UTF-8 path {}", path.display())))
}
