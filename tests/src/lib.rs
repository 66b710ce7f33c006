//! End-to-end scenarios: HTTP requests through the real layer into real handlers that count
//! their side effects, on each store against its real server. `tests/e2e.rs` runs every scenario
//! per store.
#![allow(clippy::unwrap_used)]

mod app;
pub mod chaos;
mod client;
mod database;
mod demo;
mod namespace;

pub use app::*;
pub use client::*;
pub use database::*;
pub use demo::*;
pub use namespace::*;
