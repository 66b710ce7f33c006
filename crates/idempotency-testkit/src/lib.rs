//! Test scaffolding, written once for every test crate and the benches:
//!
//! - [`env`](mod@env): where the shared servers are (`IDEMPOTENCY_TEST_POSTGRES_URL`,
//!   `IDEMPOTENCY_TEST_REDIS_URL`), and the failure that says how to start a missing one;
//! - [`TestSchema`]: a schema of its own on the shared PostgreSQL, dropped at the end;
//! - throwaway servers for tests that must crash, restart or reconfigure a server. They listen
//!   on free loopback ports, keep their files in a fresh temporary folder, and are stopped and
//!   removed when dropped. The shared servers on the default ports are never touched.
//!
//! PostgreSQL refuses to run as root, so when the tests run as root the server runs as the
//! `postgres` user (`setpriv`, which execs in place so signals reach the server).

pub mod env;
mod pgbouncer;
mod postgres;
mod process;
mod redis;
mod schema;
mod tls;

pub use pgbouncer::{PoolMode, TempPgBouncer};
pub use postgres::{TempPostgres, require_library};
pub use process::free_port;
pub use redis::{TempRedis, TempRedisCluster};
pub use schema::{TestSchema, drop_test_schema};
pub use tls::{ServerCert, TestCa};
