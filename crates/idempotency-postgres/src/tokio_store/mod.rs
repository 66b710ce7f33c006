//! The tokio-postgres flavour of the store (feature `tokio-postgres`, on by default): its own
//! deadpool pool, statements prepared once per connection (or sent unnamed behind a transaction
//! pooler), `BEGIN` and `COMMIT` pipelined with the store's statements, and TLS on rustls.
//!
//! `builder.rs` (URL or pool, pool settings, the writer check), `store.rs` (the driver the
//! shared primitives run on, the store's accessors), `statement.rs` (how a statement is sent),
//! `transaction.rs` (the request's transaction), `session.rs` (setup statements), `error.rs`,
//! `tls.rs` (`sslmode`, the connector).

mod builder;
mod error;
mod session;
mod statement;
mod store;
mod tls;
mod transaction;

pub use builder::PostgresStoreBuilder;
pub(crate) use error::{pool_error, query_error};
pub use store::PostgresStore;
pub use tls::SslMode;
#[cfg(feature = "raw-connection")]
pub use tls::connect_raw;
pub use transaction::PgTransaction;
