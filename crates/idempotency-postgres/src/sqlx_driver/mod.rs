//! The sqlx driver (feature `sqlx`): the store's statements on an application's
//! [`sqlx::PgPool`] (`driver.rs`), and setup statements over sqlx (`session.rs`).

mod driver;
mod session;

pub use driver::Sqlx;
pub(crate) use session::SqlxSession;
