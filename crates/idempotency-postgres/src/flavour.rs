//! What a plain `PostgresStore`, `PostgresStoreBuilder` or `PostgresTransaction` (no type
//! argument) names: `TokioPostgres`, and only in a build that has it (feature
//! `tokio-postgres`). In an sqlx-only build these types take their driver explicitly
//! (`SqlxPostgresStore` = `PostgresStore<Sqlx>`), so turning `tokio-postgres` on anywhere in the
//! dependency graph only adds names: no code that compiled before changes meaning (features
//! are additive, as Cargo unifies them across crates).

/// Declares a driver-generic struct twice: with `D` defaulting to `TokioPostgres` when the
/// crate has it, without a default otherwise.
macro_rules! defaults_to_tokio_postgres {
    ($(#[$meta:meta])* $vis:vis struct $name:ident<D: Driver> { $($fields:tt)* }) => {
        #[cfg(feature = "tokio-postgres")]
        $(#[$meta])*
        $vis struct $name<D: Driver = crate::tokio_driver::TokioPostgres> { $($fields)* }
        #[cfg(not(feature = "tokio-postgres"))]
        $(#[$meta])*
        $vis struct $name<D: Driver> { $($fields)* }
    };
    ($(#[$meta:meta])* $vis:vis struct $name:ident<D: Driver>($($fields:tt)*);) => {
        #[cfg(feature = "tokio-postgres")]
        $(#[$meta])*
        $vis struct $name<D: Driver = crate::tokio_driver::TokioPostgres>($($fields)*);
        #[cfg(not(feature = "tokio-postgres"))]
        $(#[$meta])*
        $vis struct $name<D: Driver>($($fields)*);
    };
}

pub(crate) use defaults_to_tokio_postgres;
