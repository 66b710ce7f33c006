//! Which driver a plain `PostgresStore` (no type argument) runs on: tokio-postgres with the
//! feature `tokio-postgres` (the default), else sqlx.

#[cfg(feature = "tokio-postgres")]
pub(crate) type DefaultDriver = crate::tokio_driver::TokioPostgres;
#[cfg(all(feature = "sqlx", not(feature = "tokio-postgres")))]
pub(crate) type DefaultDriver = crate::sqlx_driver::Sqlx;
