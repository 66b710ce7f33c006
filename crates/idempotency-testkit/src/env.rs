//! Where tests and benches find the shared servers, and how a test fails when one is missing.
//!
//! Addresses are read at run time. An unreachable server fails the test with a message that
//! says how to start it: store tests never skip, so a CI run without its servers is red.

/// The PostgreSQL URL for store tests: `IDEMPOTENCY_TEST_POSTGRES_URL`, else
/// `postgres://postgres@127.0.0.1:5432/postgres`.
pub fn postgres_url() -> String {
    std::env::var("IDEMPOTENCY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// The Redis URL for store tests: `IDEMPOTENCY_TEST_REDIS_URL`, else `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("IDEMPOTENCY_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// The RabbitMQ URL for broker tests: `IDEMPOTENCY_TEST_AMQP_URL`, else
/// `amqp://guest:guest@127.0.0.1:5672/%2f`.
pub fn amqp_url() -> String {
    std::env::var("IDEMPOTENCY_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// Fails the test because `server` at `url` could not be used, saying how to start it.
pub fn server_unreachable(server: &str, url: &str, error: &dyn std::error::Error) -> ! {
    let mut cause = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        cause.push_str(": ");
        cause.push_str(&s.to_string());
        source = s.source();
    }
    let how = match server {
        "PostgreSQL" => {
            let version =
                crate::postgres::installed_version().unwrap_or_else(|| "<version>".to_owned());
            format!(
                "start it with `pg_ctlcluster {version} main start` (Debian), or point \
                 IDEMPOTENCY_TEST_POSTGRES_URL at a server"
            )
        }
        "Redis" => "start it with `redis-server --daemonize yes --bind 127.0.0.1 --port 6379 \
                    --save '' --appendonly no`, or point IDEMPOTENCY_TEST_REDIS_URL at a server"
            .to_owned(),
        "RabbitMQ" => "start it with `rabbitmq-server -detached` (Debian package rabbitmq-server; \
                       guest/guest on 127.0.0.1:5672), or point IDEMPOTENCY_TEST_AMQP_URL at a \
                       broker"
            .to_owned(),
        _ => "start it".to_owned(),
    };
    let url = idempotency_core::redact_credentials(url);
    panic!(
        "{server} is not usable at {url}: {cause}\n\
         Store tests run against the real server and never skip: {how}. \
         `scripts/services.sh` installs and starts PostgreSQL, Redis and RabbitMQ."
    )
}
