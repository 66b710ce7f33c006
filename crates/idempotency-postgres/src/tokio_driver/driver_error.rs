//! A tokio-postgres error as the driver's [`DriverError`]: its SQLSTATE kept for the store's
//! decisions, the error kept as the cause (`driver.rs`, `queued.rs` and the listening session
//! in `listen.rs` all send statements).

use crate::driver::DriverError;
use crate::error::query_error;

/// `e` with its SQLSTATE, if the server sent one.
pub(super) fn driver_error(e: tokio_postgres::Error) -> DriverError {
    DriverError {
        sqlstate: e.code().map(|code| code.code().to_owned()),
        error: query_error(e),
    }
}
