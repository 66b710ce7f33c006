//! A throwaway Redis Cluster: three masters (and a replica each), joined, failed over.

use super::TempRedis;
use crate::process::free_port;
use std::io;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The `redis-server` arguments of a cluster node whose bus listens on `bus`.
fn cluster_args(bus: &str) -> [&str; 8] {
    [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "5000",
        "--cluster-port",
        bus,
    ]
}

/// Runs `redis-cli` with `args`; an error with its output when it fails.
fn run_cli(args: &[&str]) -> io::Result<()> {
    let out = Command::new("redis-cli")
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "redis-cli {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// A throwaway Redis Cluster of three masters (and, with
/// [`start_with_replicas`](Self::start_with_replicas), one replica each), joined with
/// `redis-cli --cluster create`.
#[derive(Debug)]
pub struct TempRedisCluster {
    nodes: Vec<TempRedis>,
}

impl TempRedisCluster {
    /// Starts three cluster-enabled servers, joins them, and waits for `cluster_state:ok`.
    pub fn start() -> io::Result<Self> {
        Self::start_nodes(3, 0)
    }

    /// Three masters with one replica each (six servers), returned once every replica is in
    /// sync with its master, as both sides see it: the replica's link is up and its master
    /// lists it `online`. The master's word can come up to a second later (it waits for the
    /// replica's next acknowledgement), and it is the one a store's `wait_for_replicas` check
    /// reads: a cluster returned on the replicas' word alone made the report's chaos run
    /// refuse it once ("has 0 replicas in sync").
    pub fn start_with_replicas() -> io::Result<Self> {
        let cluster = Self::start_nodes(6, 1)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (mut in_sync, mut online) = (0, 0);
            for node in &cluster.nodes {
                let info = node.cli(&["info", "replication"])?;
                if info.contains("role:slave") && info.contains("master_link_status:up") {
                    in_sync += 1;
                }
                if info.contains("role:master")
                    && info
                        .lines()
                        .any(|line| line.starts_with("slave") && line.contains("state=online"))
                {
                    online += 1;
                }
            }
            if in_sync == 3 && online == 3 {
                return Ok(cluster);
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "{in_sync} of 3 replicas in sync, {online} of 3 listed online by their \
                     masters, after 30 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn start_nodes(count: usize, replicas: usize) -> io::Result<Self> {
        let mut nodes = Vec::new();
        for _ in 0..count {
            nodes.push(Self::start_node()?);
        }
        Self::join(nodes, replicas)
    }

    /// A cluster-enabled server, not yet in a cluster.
    fn start_node() -> io::Result<TempRedis> {
        let bus = free_port()?.to_string();
        TempRedis::start(&cluster_args(&bus))
    }

    /// Adds a master to the cluster and moves `slots` hash slots to it from the others (their
    /// keys with them, `redis-cli --cluster reshard`); returns its index. Waits until every
    /// node sees `cluster_state:ok` again.
    pub fn add_master(&mut self, slots: usize) -> io::Result<usize> {
        let node = Self::start_node()?;
        let first = format!("127.0.0.1:{}", self.node(0)?.port());
        let added = format!("127.0.0.1:{}", node.port());
        let id = node.cli(&["cluster", "myid"])?.trim().to_owned();
        run_cli(&["--cluster", "add-node", &added, &first])?;
        self.nodes.push(node);
        // The reshard needs every node to know the new one.
        let count = self.nodes.len();
        self.wait_until(|info| info.contains(&format!("cluster_known_nodes:{count}")))?;
        // Knowing the new node is not enough: `reshard` refuses while the nodes' views of the
        // slots differ ("Nodes don't agree about configuration!"), which gossip settles a
        // moment later (a CI run on a busy machine hit it). Wait for `--cluster check`.
        self.wait_until_consistent(&first)?;
        run_cli(&[
            "--cluster",
            "reshard",
            &first,
            "--cluster-from",
            "all",
            "--cluster-to",
            &id,
            "--cluster-slots",
            &slots.to_string(),
            "--cluster-yes",
        ])?;
        self.wait_until(|info| info.contains("cluster_state:ok"))?;
        self.wait_until_consistent(&first)?;
        Ok(count - 1)
    }

    /// Waits up to 30 s until `redis-cli --cluster check` through `entry` finds every node
    /// agreeing on the configuration, with no open slot; the last check's output if never.
    fn wait_until_consistent(&self, entry: &str) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new("redis-cli")
                .args(["--cluster", "check", entry])
                .stdin(Stdio::null())
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            if out.status.success() && !text.contains("[ERR]") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "the cluster never agreed on its configuration: {text}{}",
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits up to 30 s until `CLUSTER INFO` satisfies `ok` on every node.
    fn wait_until(&self, ok: impl Fn(&str) -> bool) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &self.nodes {
            while !ok(&node.cli(&["cluster", "info"])?) {
                if Instant::now() > deadline {
                    return Err(io::Error::other(format!(
                        "node {} never reached the expected CLUSTER INFO",
                        node.port()
                    )));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// Three cluster-enabled servers that speak TLS only, their bus too (`--tls-cluster yes`),
    /// presenting `cert`.
    pub fn start_tls_only(cert: &crate::ServerCert, ca_root: &Path) -> io::Result<Self> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let bus = free_port()?.to_string();
            nodes.push(TempRedis::start_tls_with(
                cert,
                ca_root,
                &[&cluster_args(&bus)[..], &["--tls-cluster", "yes"]].concat(),
            )?);
        }
        Self::join(nodes, 0)
    }

    fn join(nodes: Vec<TempRedis>, replicas: usize) -> io::Result<Self> {
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut create = Command::new("redis-cli");
        if let Some(ca) = nodes.first().and_then(|n| n.tls_ca.clone()) {
            create.arg("--tls").arg("--cacert").arg(ca);
        }
        let out = create
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
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
            while !node.cli(&["cluster", "info"])?.contains("cluster_state:ok") {
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

    /// Freezes node `index` (SIGSTOP); see [`TempRedis::pause`].
    pub fn pause(&self, index: usize) -> io::Result<()> {
        self.node(index)?.pause()
    }

    /// Thaws node `index` (SIGCONT).
    pub fn resume(&self, index: usize) -> io::Result<()> {
        self.node(index)?.resume()
    }

    fn node(&self, index: usize) -> io::Result<&TempRedis> {
        self.nodes
            .get(index)
            .ok_or_else(|| io::Error::other(format!("no node {index}")))
    }

    /// Fails one master over to its replica, as an operator or the cluster itself would, and
    /// returns the ports (old master, new master). `crash`: the master is killed (SIGKILL),
    /// its replica takes its slots at once (`CLUSTER FAILOVER TAKEOVER`), and the old master is
    /// started again, empty (the nodes keep no data on disk), and rejoins as the new master's
    /// replica. Otherwise a coordinated failover (`CLUSTER FAILOVER` on the replica: the master
    /// stops taking writes until the replica has them all, then they swap). Returns once the
    /// cluster is whole again: every node sees `cluster_state:ok` and the new master's replica
    /// is in sync, so the next failover has a replica to go to.
    pub fn fail_over(&mut self, crash: bool) -> io::Result<(u16, u16)> {
        let (master, replica) = self.master_with_replica()?;
        if crash {
            self.nodes[master].kill()?;
            self.nodes[replica].cli(&["cluster", "failover", "takeover"])?;
        } else {
            self.nodes[replica].cli(&["cluster", "failover"])?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.nodes[replica].cli(&["role"])?.starts_with("master") {
            if Instant::now() > deadline {
                return Err(io::Error::other("the replica was never promoted"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if crash {
            self.nodes[master].start_server()?;
        }
        // The old master follows the new one, and has its data.
        while !self.nodes[master]
            .cli(&["info", "replication"])?
            .contains("master_link_status:up")
        {
            if Instant::now() > deadline {
                return Err(io::Error::other(
                    "the old master never became the new one's replica",
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.wait_until(|info| info.contains("cluster_state:ok"))?;
        Ok((self.nodes[master].port(), self.nodes[replica].port()))
    }

    /// The index of a master whose replica is connected and in sync, and of that replica.
    fn master_with_replica(&self) -> io::Result<(usize, usize)> {
        for (replica, node) in self.nodes.iter().enumerate() {
            let info = node.cli(&["info", "replication"])?;
            if !info.contains("role:slave") || !info.contains("master_link_status:up") {
                continue;
            }
            let port = info
                .lines()
                .find_map(|line| line.strip_prefix("master_port:"))
                .and_then(|port| port.trim().parse::<u16>().ok());
            if let Some(master) = self.nodes.iter().position(|n| Some(n.port()) == port) {
                return Ok((master, replica));
            }
        }
        Err(io::Error::other("no master has a replica in sync"))
    }

    /// `CLUSTER NODES` as one node sees it.
    pub fn cluster_nodes(&self) -> io::Result<String> {
        self.node(0)?.cli(&["cluster", "nodes"])
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
                n.cli(&["dbsize"])?
                    .trim()
                    .parse()
                    .map_err(|_| io::Error::other("DBSIZE did not answer a number"))
            })
            .collect()
    }
}
