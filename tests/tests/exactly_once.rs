//! Exactly once across a crash of the service and a fault of the key table, on two apps: the demo
//! (tokio-postgres store) and the sqlx example (`examples/axum_sqlx.rs`, `SqlxPostgresStore`).
//! Every key that was sent is retried to completion, then the side effects (tasks, orders) are
//! counted per key. With transactional completion no key has two; with tasks written outside the
//! key's transaction the same test finds keys with two, so it is known to see them.
#![allow(clippy::unwrap_used)]

mod postgres {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::{Method, Request, StatusCode};
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioExecutor;
    use idempotency_e2e::{DemoProcess, TestDatabase as Database};
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    type HttpClient = Client<HttpConnector, Full<Bytes>>;

    /// Concurrent clients during the crash.
    const CLIENTS: usize = 16;
    /// The lease of the demo in the crash tests: how long the claims of the killed process block
    /// their keys.
    const CRASH_LEASE: &str = "2";

    /// The app under test.
    #[derive(Clone, Copy, Debug)]
    enum App {
        /// The demo's task API on the tokio-postgres store, with extra command-line flags.
        Demo(&'static [&'static str]),
        /// The sqlx example: orders written in the request's `sqlx::Transaction`.
        SqlxOrders,
    }

    impl App {
        /// The route that creates the side effect.
        fn path(self) -> &'static str {
            match self {
                App::Demo(_) => "/tasks",
                App::SqlxOrders => "/orders",
            }
        }

        /// The request body; the side effect carries `key`.
        fn body(self, key: &str) -> String {
            match self {
                App::Demo(_) => format!(r#"{{"title":"{key}"}}"#),
                App::SqlxOrders => format!(r#"{{"item":"{key}"}}"#),
            }
        }

        /// Of `$1` (keys), how many have more than one side effect, and how many have one at all.
        fn per_key_sql(self) -> &'static str {
            match self {
                App::Demo(_) => {
                    "SELECT count(*) FILTER (WHERE n > 1), count(*) \
                     FROM (SELECT title, count(*) AS n FROM tasks \
                           WHERE title = ANY($1) GROUP BY title) per_key"
                }
                App::SqlxOrders => {
                    "SELECT count(*) FILTER (WHERE n > 1), count(*) \
                     FROM (SELECT item, count(*) AS n FROM orders \
                           WHERE item = ANY($1) GROUP BY item) per_key"
                }
            }
        }
    }

    /// Of `keys`, how many have more than one side effect, and how many have one at all.
    async fn effects_per_key(db: &Database, app: App, keys: &[String]) -> (i64, i64) {
        let row = db
            .connect()
            .await
            .query_one(app.per_key_sql(), &[&keys])
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }

    /// Where an app listens.
    #[derive(Clone, Copy)]
    struct Target {
        app: App,
        addr: SocketAddr,
    }

    /// The app as a child process.
    struct Demo {
        process: DemoProcess,
        target: Target,
    }

    impl Demo {
        async fn start(app: App, db_url: &str, lease: &str) -> Demo {
            let process = match app {
                App::Demo(extra) => {
                    let mut args = vec!["--store", db_url, "--lease", lease];
                    args.extend_from_slice(extra);
                    DemoProcess::start(env!("CARGO_BIN_EXE_demo-server"), &args, &[]).await
                }
                App::SqlxOrders => {
                    DemoProcess::start(
                        env!("CARGO_BIN_EXE_sqlx-orders"),
                        &["--lease", lease],
                        &[("DATABASE_URL", db_url)],
                    )
                    .await
                }
            };
            Demo {
                target: Target {
                    app,
                    addr: process.addr(),
                },
                process,
            }
        }

        /// SIGKILL: no shutdown, no completion, no release.
        async fn kill(self) {
            self.process.kill().await;
        }
    }

    async fn post_task(
        client: &HttpClient,
        target: Target,
        user: &str,
        key: &str,
    ) -> Result<StatusCode, String> {
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{}{}", target.addr, target.app.path()))
            .header("authorization", format!("Bearer {user}"))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from(target.app.body(key))))
            .map_err(|e| e.to_string())?;
        let response = tokio::time::timeout(Duration::from_secs(20), client.request(request))
            .await
            .map_err(|_| "timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        let status = response.status();
        response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok(status)
    }

    /// The keys every client sent (each with its user), recorded before the request goes out.
    type Sent = Arc<Mutex<Vec<(String, String)>>>;

    /// Runs `CLIENTS` clients creating tasks, kills the service under them, restarts it, retries
    /// every key to a 201, and returns (keys with two or more tasks, keys sent).
    async fn crash_under_load(db: &Database, app: App) -> (i64, usize) {
        let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
        let demo = Demo::start(app, db.url(), CRASH_LEASE).await;
        let sent: Sent = Arc::default();
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            let (client, sent, target) = (client.clone(), sent.clone(), demo.target);
            clients.push(tokio::spawn(async move {
                let user = uuid::Uuid::new_v4().to_string();
                loop {
                    let key = uuid::Uuid::new_v4().to_string();
                    sent.lock().unwrap().push((user.clone(), key.clone()));
                    match post_task(&client, target, &user, &key).await {
                        Ok(status) if status.is_success() => {}
                        Ok(status) => panic!("before the crash: unexpected {status}"),
                        // The service died under this request.
                        Err(_) => return,
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        demo.kill().await;
        for c in clients {
            c.await.unwrap();
        }
        let demo = Demo::start(app, db.url(), CRASH_LEASE).await;
        let sent = sent.lock().unwrap().clone();
        retry_all(&client, demo.target, &sent).await;
        demo.kill().await;
        (count_doubled(db, app, &sent).await, sent.len())
    }

    /// Sends `key` until it is answered 2xx, like a client that retries 409 and 503 and lost
    /// connections, for up to 30 s.
    async fn until_done(client: &HttpClient, target: Target, user: &str, key: &str) {
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match post_task(client, target, user, key).await {
                Ok(status) if status.is_success() => return,
                Ok(StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE) | Err(_)
                    if tokio::time::Instant::now() < until =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => panic!("sending {key}: {other:?}"),
            }
        }
    }

    /// Retries every sent key to completion, `CLIENTS` at a time.
    async fn retry_all(client: &HttpClient, target: Target, sent: &[(String, String)]) {
        use futures_util::StreamExt as _;
        let retries = sent
            .iter()
            .map(|(user, key)| until_done(client, target, user, key));
        let mut retries = futures_util::stream::iter(retries).buffer_unordered(CLIENTS);
        while retries.next().await.is_some() {}
    }

    /// Keys with two or more side effects; checks that every sent key has one.
    async fn count_doubled(db: &Database, app: App, sent: &[(String, String)]) -> i64 {
        let keys: Vec<String> = sent.iter().map(|(_, key)| key.clone()).collect();
        let (doubled, with_effect) = effects_per_key(db, app, &keys).await;
        assert_eq!(
            with_effect as usize,
            sent.len(),
            "every key sent must end with a side effect"
        );
        doubled
    }

    /// Runs `CLIENTS` clients (each retrying its key until done) while the key table refuses every
    /// write (`INSERT` and `UPDATE`: claims, completions, and the one-transaction mode's insert)
    /// for 3 s, then retries every key and returns (keys with two or more tasks, keys sent).
    async fn key_table_refuses_updates(db: &Database, app: App, lease: &str) -> (i64, usize) {
        let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
        let demo = Demo::start(app, db.url(), lease).await;
        let sent: Sent = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            let (client, sent, stop, target) =
                (client.clone(), sent.clone(), stop.clone(), demo.target);
            clients.push(tokio::spawn(async move {
                let user = uuid::Uuid::new_v4().to_string();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let key = uuid::Uuid::new_v4().to_string();
                    sent.lock().unwrap().push((user.clone(), key.clone()));
                    until_done(&client, target, &user, &key).await;
                }
            }));
        }
        let admin = db.connect().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        admin
            .batch_execute(
                "CREATE FUNCTION refuse_updates() RETURNS trigger LANGUAGE plpgsql AS \
               $$ BEGIN RAISE EXCEPTION 'the key table refuses updates'; END $$; \
             CREATE TRIGGER refuse_updates BEFORE INSERT OR UPDATE ON idempotency_keys \
               FOR EACH ROW EXECUTE FUNCTION refuse_updates();",
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        admin
            .batch_execute(
                "DROP TRIGGER refuse_updates ON idempotency_keys; DROP FUNCTION refuse_updates();",
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for c in clients {
            c.await.unwrap();
        }
        let sent = sent.lock().unwrap().clone();
        retry_all(&client, demo.target, &sent).await;
        demo.kill().await;
        (count_doubled(db, app, &sent).await, sent.len())
    }

    /// SIGKILL under 16 clients, restart, retry every key: with the task written in the key's
    /// transaction (the demo's default on PostgreSQL, the speculative one-transaction mode), no
    /// key gets two tasks, over three crashes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_under_load_never_creates_a_task_twice() {
        three_crashes_without_a_double(App::Demo(&[]), "idem_once").await;
    }

    /// The same three crashes in the one-transaction mode that looks the key up before the
    /// handler runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_under_load_never_creates_a_task_twice_with_the_lookup_first() {
        three_crashes_without_a_double(
            App::Demo(&["--claim-mode", "one-transaction"]),
            "idem_once",
        )
        .await;
    }

    /// The same three crashes in the lease mode (a claim committed first, the task and the
    /// completion in the request's transaction).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_under_load_never_creates_a_task_twice_in_lease_mode() {
        three_crashes_without_a_double(App::Demo(&["--lease-mode"]), "idem_once").await;
    }

    /// Three crashes under load of `app` on a fresh database: no key gets two side effects.
    async fn three_crashes_without_a_double(app: App, database: &str) {
        let db = Database::create(database).await;
        let mut total = 0;
        for run in 1..=3 {
            let (doubled, sent) = crash_under_load(&db, app).await;
            eprintln!("{app:?} run {run}: {sent} keys, {doubled} with two side effects");
            assert_eq!(
                doubled, 0,
                "{app:?} run {run}: {doubled} of {sent} keys got a second side effect"
            );
            total += sent;
        }
        assert!(
            total > 3 * CLIENTS,
            "the load must have been real: {total} keys"
        );
        db.drop().await;
    }

    /// The same crash with tasks written outside the key's transaction: keys whose task was
    /// committed but whose response was not get a second task on retry. This shows the test sees
    /// the duplicates that transactional completion removes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_the_transaction_the_same_crash_creates_duplicates() {
        let db = Database::create("idem_once").await;
        let mut found = 0;
        for run in 1..=10 {
            let (doubled, sent) =
                crash_under_load(&db, App::Demo(&["--tasks-outside-transaction"])).await;
            eprintln!("non-transactional run {run}: {sent} keys, {doubled} with two tasks");
            found += doubled;
            if found > 0 {
                break;
            }
        }
        assert!(
            found > 0,
            "ten crashes without the transaction produced no duplicate"
        );
        db.drop().await;
    }

    /// The key table refuses every write for 3 s under 16 clients: with the task in the key's
    /// one transaction, a refused insert of the key rolls the task back and the retry creates it
    /// once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_table_refusing_writes_never_creates_a_task_twice() {
        let db = Database::create("idem_once").await;
        let (doubled, sent) = key_table_refuses_updates(&db, App::Demo(&[]), "10").await;
        eprintln!("speculative: {sent} keys, {doubled} with two tasks");
        assert_eq!(doubled, 0, "{doubled} of {sent} keys got a second task");
        db.drop().await;
    }

    /// The same fault in the one-transaction mode that looks the key up before the handler.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_table_refusing_writes_never_creates_a_task_twice_with_the_lookup_first() {
        let db = Database::create("idem_once").await;
        let (doubled, sent) =
            key_table_refuses_updates(&db, App::Demo(&["--claim-mode", "one-transaction"]), "10")
                .await;
        eprintln!("one transaction, lookup first: {sent} keys, {doubled} with two tasks");
        assert_eq!(doubled, 0, "{doubled} of {sent} keys got a second task");
        db.drop().await;
    }

    /// The same fault in the lease mode: a refused completion rolls the task back, the key is
    /// released (fenced), and the retry creates the task once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_table_refusing_writes_never_creates_a_task_twice_in_lease_mode() {
        let db = Database::create("idem_once").await;
        let (doubled, sent) =
            key_table_refuses_updates(&db, App::Demo(&["--lease-mode"]), "10").await;
        eprintln!("lease mode: {sent} keys, {doubled} with two tasks");
        assert_eq!(doubled, 0, "{doubled} of {sent} keys got a second task");
        db.drop().await;
    }

    /// The same fault with tasks written outside the key's transaction: the task exists, so the
    /// failed completion keeps the claim and stores the response once the table accepts updates
    /// again, within the lease; no key gets a second task either.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn outside_the_transaction_a_failed_completion_keeps_the_key() {
        let db = Database::create("idem_once").await;
        let (doubled, sent) =
            key_table_refuses_updates(&db, App::Demo(&["--tasks-outside-transaction"]), "10").await;
        eprintln!("non-transactional: {sent} keys, {doubled} with two tasks");
        assert_eq!(doubled, 0, "{doubled} of {sent} keys got a second task");
        db.drop().await;
    }

    /// The crash test on the sqlx example app: SIGKILL under 16 clients, restart, retry every
    /// key; with the order written in the request's `sqlx::Transaction`, no key gets two orders,
    /// over three crashes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_under_load_never_creates_an_order_twice_on_sqlx() {
        three_crashes_without_a_double(App::SqlxOrders, "idem_sqlx_once").await;
    }

    /// The key table refuses every UPDATE for 3 s under 16 clients of the sqlx example: a
    /// refused completion rolls the order back and the retry creates it once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_table_refusing_updates_never_creates_an_order_twice_on_sqlx() {
        let db = Database::create("idem_sqlx_once").await;
        let (doubled, sent) = key_table_refuses_updates(&db, App::SqlxOrders, "10").await;
        eprintln!("sqlx: {sent} keys, {doubled} with two orders");
        assert_eq!(doubled, 0, "{doubled} of {sent} keys got a second order");
        db.drop().await;
    }
}
