#![doc = include_str!("../README.md")]

mod core_terms;
mod delivery;
mod model;
pub mod properties;
mod state;
mod steps;

pub use model::{Action, Bug, Mode, Protocol};
pub use state::{
    Budget, Client, Instance, Made, Outcome, Phase, Record, Reply, Request, State, Store, Task,
    Told, Tx,
};
