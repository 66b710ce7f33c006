//! Probing the environment: the machine, the servers' settings, and fsync time, so every figure
//! has its conditions beside it.

use idempotency::TableMode;
use idempotency_bench::{Servers, Target, connect, err};
use std::path::PathBuf;

/// PostgreSQL's version and the settings that move the figures.
#[derive(Debug)]
pub(crate) struct PgSettings {
    pub(crate) version: String,
    pub(crate) synchronous_commit: String,
    pub(crate) fsync: String,
    pub(crate) wal_level: String,
    pub(crate) shared_buffers: String,
}

/// Redis' version and persistence.
#[derive(Debug)]
pub(crate) struct RedisSettings {
    pub(crate) version: String,
    pub(crate) save: String,
    pub(crate) appendonly: String,
}

/// What the run was measured on.
#[derive(Debug)]
pub(crate) struct Environment {
    pub(crate) date: String,
    pub(crate) machine: String,
    pub(crate) postgres: Option<PgSettings>,
    pub(crate) redis: Option<RedisSettings>,
    /// Where fsync was timed: beside the database's data directory when it is local.
    pub(crate) fsync_dir: PathBuf,
    pub(crate) fsync_before_us: Option<f64>,
}

/// Reads the environment; an unreachable server leaves its part empty.
pub(crate) async fn environment(servers: &Servers) -> Result<Environment, String> {
    let (postgres, data_dir) = match postgres_settings(servers).await {
        Ok((settings, dir)) => (Some(settings), Some(dir)),
        Err(_) => (None, None),
    };
    let fsync_dir = data_dir
        .map(PathBuf::from)
        .and_then(|d| d.parent().map(PathBuf::from))
        .filter(|d| d.exists())
        .unwrap_or_else(std::env::temp_dir);
    let fsync_before_us = fsync_us(&fsync_dir);
    Ok(Environment {
        date: command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        machine: machine(),
        postgres,
        redis: redis_settings(servers).await,
        fsync_dir,
        fsync_before_us,
    })
}

async fn postgres_settings(servers: &Servers) -> Result<(PgSettings, String), String> {
    let c = connect(Target::Postgres(TableMode::Unlogged), servers, 1).await?;
    let pg = c.postgres.clone().ok_or("no Postgres store")?;
    let client = pg.pool().get().await.map_err(err)?;
    let row = client
        .query_one(
            "SELECT version(), current_setting('synchronous_commit'), current_setting('fsync'), \
             current_setting('wal_level'), current_setting('shared_buffers'), \
             current_setting('data_directory')",
            &[],
        )
        .await
        .map_err(err)?;
    drop(client);
    c.cleanup().await;
    Ok((
        PgSettings {
            version: row.get(0),
            synchronous_commit: row.get(1),
            fsync: row.get(2),
            wal_level: row.get(3),
            shared_buffers: row.get(4),
        },
        row.get(5),
    ))
}

async fn redis_settings(servers: &Servers) -> Option<RedisSettings> {
    // The store's own reading of the server (`RedisStore::status`), under a prefix of its
    // own so the probe touches no bench keys.
    let store = idempotency::RedisStore::builder(&servers.redis)
        .key_prefix("idem-bench-probe:")
        .build()
        .await
        .ok()?;
    let info = store.status().await.ok()?;
    Some(RedisSettings {
        version: info.version,
        save: info.save.unwrap_or_else(|| "unknown".to_owned()),
        appendonly: if info.appendonly { "yes" } else { "no" }.to_owned(),
    })
}

/// `pg_test_fsync`'s fdatasync time for one 8 kB write, in microseconds, in `dir`.
pub(crate) fn fsync_us(dir: &std::path::Path) -> Option<f64> {
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin/pg_test_fsync"))
        .find(|p| p.exists())?;
    let file = dir.join(format!("idem-fsync-{}.tmp", std::process::id()));
    let mut child = std::process::Command::new(bin)
        .args(["-s", "1", "-f"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let stdout = child.stdout.take()?;
    let mut found = None;
    use std::io::BufRead;
    for line in std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"fdatasync") && words.len() >= 5 {
            found = words[3].parse().ok();
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&file);
    found
}

fn command_output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().next().map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<f64>()
                    .unwrap_or(0.0)
                    / 1048576.0
            })
        })
        .unwrap_or(0.0);
    format!(
        "{} cores ({cpu}), {memory:.0} GiB memory, Linux {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        command_output("uname", &["-r"])
    )
}
