//! The idempotency protocol as a state machine, checked exhaustively with
//! [stateright](https://docs.rs/stateright): one key, two clients that retry it, two
//! instances of the service, and the store, under each claim mode, with faults as steps of
//! their own (a store call that fails before or after it reached the store, an answer lost
//! on its way, an instance killed, an instance frozen past its lease and thawed, a lease run
//! out, a transaction ended by the server).
//!
//! The model takes its decisions through core's own functions
//! ([`idempotency_core::protocol`]: what a found record means, what a store's answer to a
//! completion or a release makes of the outcome, what the client is told), so the model and
//! the engine cannot drift at those points. The properties ([`properties`]) are the ones
//! `docs/architecture.md` lists beside the invariants; each seeded [`Bug`] class makes the
//! checker fail (the crate's tests).
//!
//! ```
//! use idempotency_model::{Mode, Protocol, properties};
//! use stateright::{Checker, Model};
//!
//! let mut protocol = Protocol::new(Mode::OneTransaction);
//! protocol.faults.crashes = 0;
//! protocol.faults.freezes = 0;
//! let checker = protocol.checker().spawn_bfs().join();
//! checker.assert_no_discovery(properties::ONE_ANSWER);
//! checker.assert_no_discovery(properties::AT_MOST_ONE_EFFECT);
//! ```

mod core_terms;
mod model;
pub mod properties;
mod state;
mod steps;

pub use model::{Action, Bug, Mode, Protocol};
pub use state::{
    Budget, Client, Instance, Made, Outcome, Phase, Record, Reply, Request, State, Store, Task,
    Told, Tx,
};
