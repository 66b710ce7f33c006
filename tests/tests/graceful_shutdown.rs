//! A deploy: SIGTERM reaches the demo (PostgreSQL store, tasks in the key's transaction) while
//! requests run, some of whose clients have already hung up. Every running request finishes and
//! stores its response before the process exits, so after a restart each retry replays: no 409
//! from a key left claimed, no second task.
#![allow(clippy::unwrap_used)]

mod postgres {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::{Method, Request, StatusCode};
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioExecutor;
    use idempotency_e2e::{DemoProcess, TestDatabase};
    use std::net::SocketAddr;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    type HttpClient = Client<HttpConnector, Full<Bytes>>;

    /// Requests whose clients wait for their answer.
    const WAITING: usize = 6;
    /// Requests whose clients hang up while their handler runs.
    const LEAVING: usize = 6;
    /// Long enough that a key left claimed by the first process is still claimed when it is
    /// retried after the restart.
    const LEASE: &str = "120";

    fn body(key: &str) -> String {
        format!(r#"{{"title":"{key}"}}"#)
    }

    /// POST /tasks and wait for the answer: (status, replayed).
    async fn post_task(
        client: &HttpClient,
        addr: SocketAddr,
        user: &str,
        key: &str,
    ) -> (StatusCode, bool) {
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{addr}/tasks"))
            .header("authorization", format!("Bearer {user}"))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from(body(key))))
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(30), client.request(request))
            .await
            .expect("answered within 30 s")
            .expect("answered, not cut off");
        let status = response.status();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        response.into_body().collect().await.unwrap();
        (status, replayed)
    }

    /// POST /tasks over a raw connection that is closed without reading the answer, once the
    /// handler is running (the caller checks that).
    async fn post_task_and_hang_up(
        addr: SocketAddr,
        user: &str,
        key: &str,
    ) -> tokio::net::TcpStream {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let body = body(key);
        let request = format!(
            "POST /tasks HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {user}\r\n\
             content-type: application/json\r\nidempotency-key: {key}\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        stream
    }

    /// How many task inserts are sleeping in the trigger right now.
    async fn inserts_running(db: &TestDatabase) -> i64 {
        db.connect()
            .await
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND query LIKE 'INSERT INTO tasks%'",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sigterm_lets_running_requests_finish_and_their_retries_replay() {
        let db = TestDatabase::create("idem_drain").await;
        let binary = env!("CARGO_BIN_EXE_demo-server");
        let demo = DemoProcess::start(binary, &["--store", db.url(), "--lease", LEASE], &[]).await;
        let addr = demo.addr();
        // The demo made its `tasks` table; make every insert take 2 s, so the requests are
        // still running when SIGTERM arrives.
        db.connect()
            .await
            .batch_execute(
                "CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS \
                   $$ BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$; \
                 CREATE TRIGGER slow_insert BEFORE INSERT ON tasks \
                   FOR EACH ROW EXECUTE FUNCTION slow_insert();",
            )
            .await
            .unwrap();

        let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
        let user = uuid::Uuid::new_v4().to_string();
        let keys: Vec<String> = (0..WAITING + LEAVING)
            .map(|_| uuid::Uuid::new_v4().to_string())
            .collect();
        let mut waiting = Vec::new();
        for key in &keys[..WAITING] {
            let (client, user, key) = (client.clone(), user.clone(), key.clone());
            waiting.push(tokio::spawn(async move {
                post_task(&client, addr, &user, &key).await
            }));
        }
        let mut leaving = Vec::new();
        for key in &keys[WAITING..] {
            leaving.push(post_task_and_hang_up(addr, &user, key).await);
        }
        // Every handler is inside its insert.
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while inserts_running(&db).await < keys.len() as i64 {
            assert!(
                tokio::time::Instant::now() < until,
                "the requests did not all start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Those clients hang up: their handlers go on in their own tasks.
        drop(leaving);
        tokio::time::sleep(Duration::from_millis(100)).await;

        let status = demo.terminate(Duration::from_secs(30)).await;
        assert!(status.success(), "the demo exited with {status}");
        for answer in waiting {
            assert_eq!(
                answer.await.unwrap(),
                (StatusCode::CREATED, false),
                "a request running at SIGTERM is answered"
            );
        }
        assert_eq!(
            inserts_running(&db).await,
            0,
            "nothing of the first process still runs"
        );

        // After the restart, every retry gets the stored response back: none runs again, and
        // none meets a key the first process left claimed.
        let demo = DemoProcess::start(binary, &["--store", db.url(), "--lease", LEASE], &[]).await;
        for key in &keys {
            assert_eq!(
                post_task(&client, demo.addr(), &user, key).await,
                (StatusCode::CREATED, true),
                "the retry of {key} after the restart"
            );
        }
        demo.kill().await;
        let row = db
            .connect()
            .await
            .query_one(
                "SELECT count(*), count(DISTINCT title) FROM tasks WHERE title = ANY($1)",
                &[&keys],
            )
            .await
            .unwrap();
        let (tasks, distinct): (i64, i64) = (row.get(0), row.get(1));
        assert_eq!(
            (tasks, distinct),
            (keys.len() as i64, keys.len() as i64),
            "one task per key"
        );
        db.drop().await;
    }
}
