//! The sqlx flavour of the store (feature `sqlx`): the same table, the same SQL text, the same
//! migrations, writer check and lost-state sentinel as `PostgresStore`,
//! on the application's own [`sqlx::PgPool`], and a handler's writes committed with its stored
//! response in one [`sqlx::Transaction`] ([`SqlxTransaction`]).
//!
//! `builder.rs` (settings, the writer check), `store.rs` (the six primitives), `transaction.rs`
//! (the request's transaction), `session.rs` (setup statements and errors over sqlx).

mod builder;
mod session;
mod store;
mod transaction;

pub use builder::SqlxPostgresStoreBuilder;
pub(crate) use session::sqlx_error;
pub use store::SqlxPostgresStore;
pub use transaction::SqlxTransaction;
