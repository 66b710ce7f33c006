//! The tokio-postgres driver (feature `tokio-postgres`, on by default): its own deadpool pool
//! (`options.rs`, `pool.rs`), statements prepared once per connection or sent unnamed behind a
//! transaction pooler (`statement.rs`), `BEGIN` and `COMMIT` pipelined with the store's
//! statements (`driver.rs`, its errors in `driver_error.rs`), the speculative begin
//! (`queued.rs`), the connection a request's transaction holds (`transaction.rs`), the session
//! that listens for answers (`listen.rs`), setup statements (`session.rs`), and TLS on rustls
//! (`tls.rs`).

mod driver;
mod driver_error;
mod listen;
mod options;
mod pool;
mod queued;
mod session;
mod statement;
mod tls;
mod transaction;

pub use driver::TokioPostgres;
pub(crate) use options::{Source, TokioOptions};
pub(crate) use pool::connect;
pub(crate) use session::TokioSession;
pub use tls::SslMode;
#[cfg(feature = "raw-connection")]
pub use tls::connect_raw;
