//! Throwaway servers for tests that must crash, restart or reconfigure a server. They listen on
//! free loopback ports, keep their files in a fresh temporary folder, and are stopped and removed
//! when dropped. The shared servers on the default ports are never touched.
//!
//! PostgreSQL refuses to run as root, so when the tests run as root the server runs as the
//! `postgres` user (`setpriv`, which execs in place so signals reach the server).

mod postgres;
mod process;
mod redis;

pub use postgres::TempPostgres;
pub use process::free_port;
pub use redis::{TempRedis, TempRedisCluster};
