//! The model's state: one key in one scope, the store that holds it, the instances and the
//! requests they run, and the clients that send them.

/// What a handler's run came to.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// It made its side effect and answers `201` (stored).
    Created,
    /// It refused (out of stock) and answers a business `409` (stored); in a transaction its
    /// writes are discarded (`TransactionSlot::discard_writes`).
    Refused,
    /// It failed and answers `500` (not stored): nothing happened, the key is released.
    Failed,
    /// Speculative mode, its key's lookup found the key taken: the database refused its
    /// statements, and whatever it answers is built on them. Never a client's answer.
    Garbage,
}

/// A response the key can stand for: what a handler made, for which request body.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Made {
    /// `Created` or `Refused`: the stored outcomes.
    pub outcome: Outcome,
    /// The request body (fingerprint) it was made for.
    pub body: u8,
}

/// The key's record in the store.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Record {
    /// No live record.
    Free,
    /// A lease-mode claim, fenced by the claiming request's token.
    Claimed {
        /// The claiming request's id, which stands for its fencing token.
        token: u8,
        /// The claiming request's body.
        body: u8,
        /// Its lease ran out (its holder stopped heartbeating): a claim may take it over.
        expired: bool,
    },
    /// A stored response.
    Completed(Made),
}

/// The store: the key's record, the lock a one-transaction request's transaction holds on it,
/// and the side effects that committed.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Store {
    /// The key's record.
    pub record: Record,
    /// The request whose open transaction holds the key (the one-transaction modes).
    pub lock: Option<u8>,
    /// Side effects that exist: made by a handler outside a transaction, or committed.
    pub effects: u8,
}

/// A request's transaction (the transactional modes).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Tx {
    /// The handler wrote its side effect in it (uncommitted).
    pub effect: bool,
    /// Speculative mode: the key's lookup, queued at `BEGIN`, found the key taken; the
    /// transaction is aborted and every statement after it refused.
    pub lookup_taken: bool,
    /// The server ended it (idle past its bound while its process was frozen): it can no
    /// longer commit, and the key's lock is gone.
    pub killed: bool,
}

/// Where a request stands.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Phase {
    /// Sent; the engine's `begin` comes next.
    Begin,
    /// It holds the key (or, speculative, may): the handler runs next.
    Holding,
    /// The handler returned this; the guard completes or releases next.
    Ran(Outcome),
    /// The answer is on its way to the client.
    Reply(Reply),
}

/// What a client is told.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Reply {
    /// A response the key stands for (the handler's own, or a replay).
    Final(Made),
    /// The handler's own response that is not stored (`500`): nothing happened.
    HandlerFailed,
    /// The handler's response built from statements the database refused.
    Garbage,
    /// `409` in flight, `503` store unavailable, `500` transaction misused: retried.
    Retry,
    /// `422`: the key is another request's.
    Mismatch,
    /// `503 outcome-unknown`; `applied`: what the model knows and the engine does not, whether
    /// the request's commit happened.
    OutcomeUnknown {
        /// Whether the commit in doubt did happen.
        applied: bool,
    },
    /// `503 not-committed`; `applied` as above (it must be false).
    NotCommitted {
        /// Whether the request's commit did happen after all.
        applied: bool,
    },
}

/// A request: one attempt of a client, on one instance.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Request {
    /// Its id, which is also its fencing token.
    pub id: u8,
    /// The client that sent it.
    pub client: u8,
    /// The instance that runs it.
    pub instance: u8,
    /// Its body (its client's).
    pub body: u8,
    /// Where it stands.
    pub phase: Phase,
    /// Its transaction, in the transactional modes, once open.
    pub tx: Option<Tx>,
}

/// Work an engine left to run in the background.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Task {
    /// Store this response under the claim of `token` (fenced), retried until its lease ends.
    Store {
        /// The claim's token.
        token: u8,
        /// The instance it runs on.
        instance: u8,
        /// The response.
        made: Made,
    },
    /// Release the claim of `token` (fenced).
    Release {
        /// The claim's token.
        token: u8,
        /// The instance it runs on.
        instance: u8,
    },
}

impl Task {
    /// The instance it runs on.
    pub fn instance(&self) -> u8 {
        match self {
            Task::Store { instance, .. } | Task::Release { instance, .. } => *instance,
        }
    }
}

/// A client: it sends one logical request, with one key, until it gets a final answer.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Client {
    /// Its request body (two clients with different bodies share the key: a mismatch).
    pub body: u8,
    /// Attempts sent.
    pub attempts: u8,
    /// An attempt is on its way.
    pub waiting: bool,
    /// It has its final answer (or was told the key is another's).
    pub finished: bool,
}

/// An instance of the service.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Instance {
    /// It crashed (SIGKILL): its requests, tasks and connections are gone.
    pub crashed: bool,
    /// It is frozen (a stop-the-world pause): nothing of it runs, heartbeats neither.
    pub frozen: bool,
}

/// What the clients were told, in the terms the properties judge.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Told {
    /// The first final answer a client got.
    pub first: Option<Made>,
    /// A later final answer differed from the first.
    pub two_answers: bool,
    /// A client got a response made for another request body.
    pub other_body: bool,
    /// A client got `201` while no side effect existed.
    pub created_without_effect: bool,
    /// A client got a refusal (judged against the side effects, which may come later).
    pub refused: bool,
    /// A client got a response built from refused statements.
    pub garbage: bool,
    /// A client was told "not committed" for a commit that happened.
    pub unknown_as_known: bool,
}

/// The whole model's state.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    /// The store.
    pub store: Store,
    /// The instances (two).
    pub instances: [Instance; 2],
    /// The requests being run.
    pub requests: Vec<Request>,
    /// The background tasks.
    pub tasks: Vec<Task>,
    /// The clients.
    pub clients: Vec<Client>,
    /// What the clients were told.
    pub told: Told,
    /// Requests sent so far (the next one's id).
    pub sent: u8,
    /// Faults left to inject: store failures, lost answers, crashes, freezes.
    pub budget: Budget,
    /// Outcomes a process left unrecorded when it died or froze past its lease (the lease mode
    /// on a store without transactions): a side effect made outside any transaction, or an
    /// answer its client already had while its store was retried in the background. No record
    /// can make those once, and the properties allow exactly these. Also each completed record
    /// the store lost (the accepted risk of a store that can lose its records: a retry of that
    /// key runs again), and in the lease mode a claim it lost while its outcome was unrecorded.
    pub excused: u8,
    /// A commit's answer was lost (some run had an outcome nobody knew).
    pub saw_unknown: bool,
    /// A lease was taken over.
    pub saw_takeover: bool,
    /// The store lost a record (a claim, or an answer).
    pub saw_record_lost: bool,
}

/// Faults still to inject on a run.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Budget {
    /// Store calls that fail.
    pub store_errors: u8,
    /// Answers lost on their way to the client.
    pub lost_answers: u8,
    /// Instance crashes.
    pub crashes: u8,
    /// Instance freezes (each thaws later).
    pub freezes: u8,
    /// The store losing what it holds (an UNLOGGED table emptied by crash recovery, Redis
    /// restarted without persistence): the key's record is gone, and on a database the crash
    /// ended every open transaction with it.
    pub state_losses: u8,
}
