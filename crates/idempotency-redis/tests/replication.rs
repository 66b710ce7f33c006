//! Losing data on one Redis node, and asynchronous replication: on a throwaway cluster every
//! master's loss is noticed (each holds a sentinel); on a throwaway master and replica, a
//! failover to a replica that had not received a claim loses it, unless the store waits for the
//! replica's acknowledgement (`wait_for_replicas`).

mod redis_store {
    use idempotency_core::http::{HeaderMap, StatusCode};
    use idempotency_core::store::{ClaimOutcome, FenceOutcome};
    use idempotency_core::{
        BodyCanonicalization, Fingerprint, IdempotencyKey, IdempotencyStore, KeyFormat, LeaseToken,
        Scope, StoredResponse,
    };
    use idempotency_redis::RedisStore;
    use idempotency_testkit::{TempRedis, TempRedisCluster};
    use std::time::Duration;

    const HOUR: Duration = Duration::from_secs(3600);

    /// How long a store waits for a healthy replica's acknowledgement where the test needs it to
    /// come: on a busy CI machine an acknowledgement took over 300 ms, which failed a claim the
    /// test expected to be replicated. A wait that must time out (the replica cut off) takes
    /// all of it.
    const ACK_WAIT: Duration = Duration::from_secs(2);

    /// The response timeout of a store waiting [`ACK_WAIT`] (it must be longer than the wait).
    const ACK_RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

    fn key(i: usize) -> IdempotencyKey {
        IdempotencyKey::parse(format!("key-{i}").as_bytes(), KeyFormat::opaque())
            .expect("valid key")
    }

    fn fp() -> Fingerprint {
        Fingerprint::of_request("POST", "/tasks", b"{}", BodyCanonicalization::Raw)
    }

    fn response() -> StoredResponse {
        StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), "done".into())
    }

    /// Runs one command on one node, outside the cluster protocol.
    async fn on_node(url: &str, command: &[&str]) -> redis::Value {
        let client = redis::Client::open(url).expect("a node URL");
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the node");
        let mut cmd = redis::cmd(command[0]);
        for arg in &command[1..] {
            cmd.arg(*arg);
        }
        cmd.query_async(&mut connection).await.expect("the command")
    }

    /// Each master of a three-master cluster loses its data in turn (`FLUSHALL` on that node
    /// only, as a restart without persistence would): each loss is noticed and counted once.
    /// With one sentinel for the whole cluster, two of the three went unnoticed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_loss_on_any_master_of_a_cluster_is_noticed() {
        let cluster = TempRedisCluster::start()
            .unwrap_or_else(|e| panic!("could not start a throwaway Redis Cluster: {e}"));
        let store = RedisStore::cluster_builder(cluster.urls())
            .key_prefix("idem-repl:")
            .build()
            .await
            .expect("build on the cluster");
        assert!(!store.check_state().await.expect("check"));
        for (i, node) in cluster.urls().iter().enumerate() {
            on_node(node, &["FLUSHALL"]).await;
            assert!(
                store.check_state().await.expect("check"),
                "the loss on master {node} went unnoticed"
            );
            assert_eq!(store.state_losses(), i as u64 + 1, "counted once");
            assert!(!store.check_state().await.expect("check again"));
        }
    }

    /// A master added to the cluster after the store was built (slots moved to it from the
    /// others) gets a sentinel at the store's next check, so its loss is noticed too. Before
    /// issue 26 item 9 the sentinels were chosen once at build: records written to the new
    /// master were lost with it unnoticed, and their retries ran again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_loss_on_a_master_added_later_is_noticed() {
        let mut cluster = TempRedisCluster::start()
            .unwrap_or_else(|e| panic!("could not start a throwaway Redis Cluster: {e}"));
        let store = RedisStore::cluster_builder(cluster.urls())
            .key_prefix("idem-added:")
            .watch_interval(None)
            .build()
            .await
            .expect("build on the cluster");
        let added = cluster
            .add_master(2000)
            .unwrap_or_else(|e| panic!("could not add a master: {e}"));
        let new_master = cluster.urls()[added].clone();
        assert_eq!(
            cluster.keys_per_node().expect("DBSIZE")[added],
            0,
            "no sentinel of the first three masters moved to the new one (else its loss would \
             be noticed without the fix)"
        );
        assert!(
            !store.check_state().await.expect("check"),
            "a new master is not a loss"
        );
        assert_eq!(
            cluster.keys_per_node().expect("DBSIZE")[added],
            1,
            "the new master holds its sentinel"
        );
        on_node(&new_master, &["FLUSHALL"]).await;
        assert!(
            store.check_state().await.expect("check"),
            "the loss on the master added later went unnoticed"
        );
        assert_eq!(store.state_losses(), 1, "counted once");
        assert!(!store.check_state().await.expect("check again"));
    }

    /// `INFO replication` of one node.
    async fn replication_info(url: &str) -> String {
        let value = on_node(url, &["INFO", "replication"]).await;
        redis::from_redis_value::<String>(value).expect("INFO text")
    }

    /// A master and its replica, replicating.
    async fn master_and_replica() -> (TempRedis, TempRedis) {
        master_and_replica_with(&[]).await
    }

    /// A master started with `master_args` and its replica, replicating.
    async fn master_and_replica_with(master_args: &[&str]) -> (TempRedis, TempRedis) {
        let master = TempRedis::start(master_args)
            .unwrap_or_else(|e| panic!("could not start a throwaway Redis: {e}"));
        let port = master.port().to_string();
        let replica = TempRedis::start(&["--replicaof", "127.0.0.1", &port])
            .unwrap_or_else(|e| panic!("could not start a throwaway replica: {e}"));
        // In sync when both sides say so: the replica's link is up, and the master lists it as
        // online (it does after the replica's first acknowledgement, a moment later).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let on_replica = replication_info(&replica.url()).await;
            let on_master = replication_info(&master.url()).await;
            if on_replica.contains("master_link_status:up") && on_master.contains("state=online") {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the replica never synced:\n{on_replica}\n{on_master}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (master, replica)
    }

    /// A store on `master` that waits [`ACK_WAIT`] for one replica, without a watch.
    async fn waiting_store(master: &TempRedis, prefix: &str) -> RedisStore {
        RedisStore::builder(master.url())
            .key_prefix(prefix)
            .response_timeout(ACK_RESPONSE_TIMEOUT)
            .wait_for_replicas(1, ACK_WAIT)
            .watch_interval(None)
            .build()
            .await
            .expect("build waiting for one replica")
    }

    async fn claim_and_complete(store: &RedisStore, scope: &Scope, key: &IdempotencyKey) {
        let token = LeaseToken::new();
        let claimed = store.claim(scope, key, &fp(), token, HOUR).await;
        assert_eq!(claimed.expect("claim"), ClaimOutcome::Claimed);
        let completed = store.complete(scope, key, token, &response(), HOUR).await;
        assert_eq!(completed.expect("complete"), FenceOutcome::Applied);
    }

    /// The replica loses its replication link, the master dies, the replica is promoted
    /// (`REPLICAOF NO ONE`): without waiting, a claim the master accepted is gone after the
    /// failover, and nothing notices (the sentinel was replicated long before), so a retry would
    /// run the request again while the first still runs. With `wait_for_replicas(1, ..)`, that
    /// claim is refused with a retryable error and released instead of running unreplicated, and
    /// every completion acknowledged before is on the promoted replica.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failover_loses_unreplicated_claims_unless_the_store_waits() {
        let (mut master, replica) = master_and_replica().await;
        let plain = RedisStore::builder(master.url())
            .key_prefix("idem-plain:")
            .build()
            .await
            .expect("build without waiting");
        let waiting = RedisStore::builder(master.url())
            .key_prefix("idem-wait:")
            .response_timeout(ACK_RESPONSE_TIMEOUT)
            .wait_for_replicas(1, ACK_WAIT)
            .build()
            .await
            .expect("build waiting for one replica");
        let scope = Scope::new("user-1").expect("scope");
        // Acknowledged by the replica.
        claim_and_complete(&waiting, &scope, &key(0)).await;

        // The replica loses its link to the master (pointed at a port nothing listens on, it
        // keeps its data and waits): what the master takes now, the replica never gets.
        on_node(&replica.url(), &["REPLICAOF", "127.0.0.1", "1"]).await;
        // The master takes the claim and answers at once; the replica never gets it.
        let claimed = plain
            .claim(&scope, &key(1), &fp(), LeaseToken::new(), HOUR)
            .await;
        assert_eq!(claimed.expect("claim"), ClaimOutcome::Claimed);
        // Waiting: refused (retryable) after the timeout, and released on the master.
        match waiting
            .claim(&scope, &key(1), &fp(), LeaseToken::new(), HOUR)
            .await
        {
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                let message = idempotency_core::ErrorChain(&e).to_string();
                assert!(message.contains("0 of 1 replicas"), "{message}");
            }
            Ok(outcome) => panic!("an unreplicated claim must be refused, got {outcome:?}"),
        }
        assert_eq!(waiting.get(&scope, &key(1)).await.expect("get"), None);

        master.kill().expect("kill the master");
        on_node(&replica.url(), &["REPLICAOF", "NO", "ONE"]).await;

        let plain_after = RedisStore::builder(replica.url())
            .key_prefix("idem-plain:")
            .build()
            .await
            .expect("build on the promoted replica");
        assert_eq!(
            plain_after.get(&scope, &key(1)).await.expect("get"),
            None,
            "without waiting, the claim the master took is gone after the failover"
        );
        assert!(
            !plain_after.check_state().await.expect("check"),
            "and the sentinel cannot tell: it was replicated long before"
        );
        let waiting_after = RedisStore::builder(replica.url())
            .key_prefix("idem-wait:")
            .build()
            .await
            .expect("build on the promoted replica");
        match waiting_after.get(&scope, &key(0)).await.expect("get") {
            Some(record) => assert!(
                matches!(
                    record.state,
                    idempotency_core::store::RecordState::Completed { .. }
                ),
                "{:?}",
                record.state
            ),
            None => panic!("an acknowledged completion was lost in the failover"),
        }
    }

    /// The replica is cut off after a request's claim was acknowledged and before its
    /// completion: the handler has run once, and the completion is kept on the master and
    /// reported stored (the layer answers the handler's response), not turned into an error that
    /// the engine would retry into a "lost lease". A retry replays it: the handler runs once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_completion_the_replica_missed_is_kept_and_the_request_runs_once() {
        use idempotency_core::{Begin, Completion, Engine, EngineConfig};
        let (master, replica) = master_and_replica().await;
        let store = waiting_store(&master, "idem-wait-complete:").await;
        // Room for the completion's wait (see `ACK_WAIT`), which times out, on a busy machine.
        let config = EngineConfig::default().store_timeout(Duration::from_secs(10));
        let engine = Engine::new(store, config).expect("valid engine settings");
        let scope = Scope::new("user-1").expect("scope");
        let Begin::Proceed(guard) = engine
            .begin(scope.clone(), key(0), fp())
            .await
            .expect("begin")
        else {
            panic!("a new key proceeds");
        };
        // The handler runs here (once); then the replica is cut off.
        on_node(&replica.url(), &["REPLICAOF", "127.0.0.1", "1"]).await;
        assert_eq!(
            guard.complete(response()).await,
            Completion::Stored,
            "the completion is on the master; the client gets the response"
        );
        // The retry replays: the handler does not run a second time.
        match engine.begin(scope, key(0), fp()).await.expect("retry") {
            Begin::Replay(stored) => assert_eq!(stored, response()),
            other => panic!("the retry must replay, not run again; got {other:?}"),
        }
    }

    /// A write waiting for a replica that does not answer holds only a connection of its own:
    /// the WAIT (which blocks the connection it is sent on until its timeout) went, before issue
    /// 26 item 9, on the connection every call of the store shares, so a replay of another key
    /// waited behind it for the whole timeout. Now the other call answers meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_waiting_for_replicas_does_not_hold_up_other_calls() {
        const WAIT: Duration = Duration::from_millis(1500);
        let (master, replica) = master_and_replica().await;
        let store = RedisStore::builder(master.url())
            .key_prefix("idem-wait-block:")
            .wait_for_replicas(1, WAIT)
            .watch_interval(None)
            .build()
            .await
            .expect("build waiting for one replica");
        let scope = Scope::new("user-1").expect("scope");
        claim_and_complete(&store, &scope, &key(0)).await;
        // The replica stops answering: every write now waits the whole timeout.
        replica.pause().expect("pause the replica");
        let waiting = tokio::spawn({
            let (store, scope) = (store.clone(), scope.clone());
            async move {
                store
                    .claim(&scope, &key(1), &fp(), LeaseToken::new(), HOUR)
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = tokio::time::Instant::now();
        let replay = store.get(&scope, &key(0)).await.expect("get");
        let took = started.elapsed();
        // The claim is refused once its WAIT times out (the replica is still frozen).
        let claimed = waiting.await.expect("the claim's task");
        replica.resume().expect("resume the replica");
        assert!(replay.is_some(), "the completed record is there");
        assert!(
            took < WAIT / 2,
            "a read waited {took:?} behind another call's WAIT of {WAIT:?}"
        );
        match claimed {
            Err(e) => assert!(e.is_retryable(), "{e}"),
            Ok(outcome) => panic!("an unreplicated claim must be refused, got {outcome:?}"),
        }
    }

    /// How many times `url` answered `NOSCRIPT` (`INFO errorstats`).
    async fn noscript_answers(url: &str) -> u64 {
        let value = on_node(url, &["INFO", "errorstats"]).await;
        let info = redis::from_redis_value::<String>(value).expect("INFO text");
        info.lines()
            .find_map(|line| line.strip_prefix("errorstat_NOSCRIPT:count="))
            .map_or(0, |n| n.trim().parse().expect("a count"))
    }

    /// A write that waits for replicas goes as `EVALSHA` with its `WAIT` in one pipeline; a
    /// server without the script answers `NOSCRIPT` only after the `WAIT` ran, and the resent
    /// pipeline waits again: with the replicas behind, twice the timeout (a 3 s wait measured
    /// 6.1 s before this was fixed). So the store loads its scripts on every node when it is
    /// built and when a check finds the data (and with it the cache) lost, and on a `NOSCRIPT`
    /// it loads all of them, not only the one refused. Counted by the master's `NOSCRIPT`
    /// answers: none for the first writes (before the fix, one per script), none after a loss
    /// the check found, and one, not one per script, after a cache flush nothing noticed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_write_finds_its_script_loaded() {
        let (master, _replica) = master_and_replica().await;
        let store = waiting_store(&master, "idem-scripts:").await;
        let scope = Scope::new("user-1").expect("scope");
        claim_and_complete(&store, &scope, &key(0)).await;
        assert_eq!(
            noscript_answers(&master.url()).await,
            0,
            "the first claim and completion found their scripts loaded at build"
        );

        // A restart without persistence: the data and the script cache are gone.
        on_node(&master.url(), &["FLUSHALL"]).await;
        on_node(&master.url(), &["SCRIPT", "FLUSH"]).await;
        assert!(
            store.check_state().await.expect("check"),
            "the loss is found"
        );
        claim_and_complete(&store, &scope, &key(1)).await;
        assert_eq!(
            noscript_answers(&master.url()).await,
            0,
            "the check that found the loss loaded the scripts again"
        );

        // Only the cache is flushed, and nothing tells the store: the first write is refused
        // once and loads every script, so the completion after it is not refused again.
        on_node(&master.url(), &["SCRIPT", "FLUSH"]).await;
        claim_and_complete(&store, &scope, &key(2)).await;
        assert_eq!(noscript_answers(&master.url()).await, 1);
    }

    /// A master restarts and keeps its data (append-only file) but not its script cache: the
    /// store sees its connection fail, and before its next call checks the state (nothing
    /// lost) and loads its scripts again, so the first write after the restart is not answered
    /// `NOSCRIPT` after its `WAIT` (which would make it wait twice). Counted by the restarted
    /// master's `NOSCRIPT` answers: 0 (1 if the store only loaded scripts after a loss).
    ///
    /// The master syncs its append-only file on every write (`appendfsync always`): that is what
    /// keeps an acknowledged write across a kill. With the default `everysec` a kill may take
    /// the last second of writes with it (the record written just before, and the state
    /// sentinel), and the replica, which had them, resyncs from the restarted master and drops
    /// them too: a `WAIT` only says the replicas received a write, not that anything will keep
    /// it across a master restart (docs/redis.md). This failed once under load with `everysec`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_restart_the_scripts_are_loaded_before_the_next_write() {
        let (mut master, _replica) =
            master_and_replica_with(&["--appendonly", "yes", "--appendfsync", "always"]).await;
        let store = waiting_store(&master, "idem-restart-scripts:").await;
        let scope = Scope::new("user-1").expect("scope");
        claim_and_complete(&store, &scope, &key(0)).await;

        master.kill().expect("kill the master");
        master.start_server().expect("start the master again");
        // While the store reconnects and the replica syncs again, claims fail, retryably.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let token = loop {
            let token = LeaseToken::new();
            match store.claim(&scope, &key(1), &fp(), token, HOUR).await {
                Ok(ClaimOutcome::Claimed) => break token,
                Ok(other) => panic!("a new key is claimed, got {other:?}"),
                Err(e) => {
                    assert!(e.is_retryable(), "{e}");
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "no claim within 30 s of the restart: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let completed = store
            .complete(&scope, &key(1), token, &response(), HOUR)
            .await;
        assert_eq!(completed.expect("complete"), FenceOutcome::Applied);
        assert_eq!(
            store.state_losses(),
            0,
            "the append-only file kept the data: the scripts were loaded for the connection \
             failure, not for a loss"
        );
        assert!(
            store.get(&scope, &key(0)).await.expect("get").is_some(),
            "the record from before the restart is kept"
        );
        assert_eq!(
            noscript_answers(&master.url()).await,
            0,
            "the first writes after the restart found their scripts loaded"
        );
    }

    /// Waiting for more replicas than a master has, or with a timeout the response timeout
    /// would cut, is refused when the store is built.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_impossible_wait_is_refused_at_build() {
        let url = idempotency_testkit::env::redis_url();
        for (replicas, timeout) in [(8, Duration::from_millis(100)), (1, Duration::from_secs(5))] {
            match RedisStore::builder(&url)
                .key_prefix("idem-wait-check:")
                .wait_for_replicas(replicas, timeout)
                .build()
                .await
            {
                Err(e @ idempotency_redis::RedisStoreError::ReplicaWait(_)) => {
                    eprintln!("{e}")
                }
                other => panic!("{replicas} replicas within {timeout:?}: got {other:?}"),
            }
        }
    }

    /// The whole conformance suite on a master whose store waits for its replica after every
    /// claim and completion.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_suite_passes_waiting_for_a_replica() {
        let (master, _replica) = master_and_replica().await;
        let url = master.url();
        idempotency_conformance::run_conformance!(async {
            RedisStore::builder(&url)
                .key_prefix(format!("idem-wait:{}:", uuid::Uuid::new_v4().simple()))
                .response_timeout(ACK_RESPONSE_TIMEOUT)
                .wait_for_replicas(1, ACK_WAIT)
                .build()
                .await
                .unwrap_or_else(|e| panic!("could not build the waiting store: {e}"))
        });
    }

    /// One line of `CLUSTER NODES`: port, node id, master id (`-` for masters), slot ranges.
    struct NodeLine {
        port: u16,
        id: String,
        master: String,
        ranges: Vec<(u16, u16)>,
    }

    fn parse_nodes(text: &str) -> Vec<NodeLine> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let port = fields[1]
                    .split(['@', ','])
                    .next()
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| p.parse().ok())
                    .expect("a node address");
                let ranges = fields[8..]
                    .iter()
                    .filter(|f| !f.starts_with('['))
                    .map(|f| match f.split_once('-') {
                        Some((a, b)) => (a.parse().expect("slot"), b.parse().expect("slot")),
                        None => {
                            let slot = f.parse().expect("slot");
                            (slot, slot)
                        }
                    })
                    .collect();
                NodeLine {
                    port,
                    id: fields[0].to_owned(),
                    master: fields[3].to_owned(),
                    ranges,
                }
            })
            .collect()
    }

    /// On a cluster of three masters with a replica each, `WAIT` goes to the record's own
    /// master: with one replica frozen, exactly the claims in its master's slots are refused,
    /// and the others go on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_cluster_the_wait_goes_to_the_record_s_master() {
        let cluster = TempRedisCluster::start_with_replicas()
            .unwrap_or_else(|e| panic!("could not start a throwaway Redis Cluster: {e}"));
        // Replicas sync after the cluster forms: build once they are in sync.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let store = loop {
            match RedisStore::cluster_builder(cluster.urls())
                .key_prefix("idem-cluster-wait:")
                // Under the cluster client's default response timeout (2 s), with room for a
                // write that waits twice (a script cache flushed unnoticed); long enough for the
                // healthy replicas to answer on a busy machine.
                .wait_for_replicas(1, Duration::from_millis(900))
                .build()
                .await
            {
                Ok(store) => break store,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    eprintln!("not yet: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("the replicas never synced: {e}"),
            }
        };
        let nodes = parse_nodes(&cluster.cluster_nodes().expect("CLUSTER NODES"));
        let replica = nodes.iter().find(|n| n.master != "-").expect("a replica");
        let master = nodes
            .iter()
            .find(|n| n.id == replica.master)
            .expect("the replica's master");
        let replica_index = cluster
            .urls()
            .iter()
            .position(|u| u.ends_with(&format!(":{}", replica.port)))
            .expect("the replica's node");
        let scope = Scope::new("user-1").expect("scope");
        cluster.pause(replica_index).expect("freeze the replica");
        let (mut refused, mut taken, mut timeouts) = (0, 0, 0);
        for i in 0..24 {
            let name = store.record_key(&scope, &key(i));
            let slot = match on_node(&cluster.urls()[0], &["CLUSTER", "KEYSLOT", &name]).await {
                redis::Value::Int(slot) => slot as u16,
                other => panic!("CLUSTER KEYSLOT answered {other:?}"),
            };
            let on_frozen = master.ranges.iter().any(|&(a, b)| (a..=b).contains(&slot));
            let claimed = store
                .claim(&scope, &key(i), &fp(), LeaseToken::new(), HOUR)
                .await;
            match (on_frozen, claimed) {
                (true, Err(e)) => {
                    assert!(e.is_retryable(), "{e}");
                    refused += 1;
                }
                (false, Ok(ClaimOutcome::Claimed)) => taken += 1,
                // The cluster client may refresh its slot map from the frozen node and wait on
                // it until the response timeout: a transient error, not an acceptance.
                (false, Err(e))
                    if e.is_retryable()
                        && idempotency_core::ErrorChain(&e)
                            .to_string()
                            .contains("timed out") =>
                {
                    eprintln!("key {i}: {e} (the client waited on the frozen node)");
                    timeouts += 1;
                }
                (on_frozen, other) => {
                    panic!("key {i} (slot {slot}, frozen master: {on_frozen}): {other:?}")
                }
            }
        }
        cluster.resume(replica_index).expect("thaw the replica");
        assert!(
            refused > 0 && taken > 0 && timeouts <= 3,
            "{refused} refused, {taken} taken, {timeouts} timed out"
        );
    }
}
