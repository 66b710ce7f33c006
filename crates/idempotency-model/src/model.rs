//! The protocol as a [`stateright::Model`]: which steps can happen next, and the faults.

use crate::delivery::deliver;
use crate::state::{
    Budget, Client, Instance, Outcome, Phase, Record, Request, State, Store, Task, Told,
};
use stateright::{Model, Property};

/// How the engine holds a key ([`idempotency_core::ClaimMode`]), and where the handler's side
/// effect lives.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Mode {
    /// A claim record with a lease; the side effect outside any transaction (the memory and
    /// Redis stores). A process that dies between its effect and its response's record cannot
    /// be made once: the properties allow exactly those effects ([`State::excused`]).
    Lease,
    /// A claim record with a lease; the handler's writes in the request's transaction,
    /// committed with the response, fenced by the claim's token (the PostgreSQL store).
    LeaseInTransaction,
    /// No claim record: the request's transaction holds the key from its lookup to its commit.
    OneTransaction,
    /// As [`Mode::OneTransaction`], the key's lookup queued with the handler's first statement
    /// and settled before the commit.
    Speculative,
}

/// A bug seeded into the model's engine, to show that the checker finds its class.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Bug {
    /// The lease mode releases the key when storing the response failed, instead of keeping
    /// the claim and storing it in the background.
    ReleaseAfterFailedCompletion,
    /// A refusal stored with `discard_writes` rolls back first (the key's lock goes with the
    /// transaction), then inserts its record if the key is still free, and answers its own
    /// refusal either way.
    RefusalStoredAfterLockReleased,
    /// A completion commits without checking the claim's fencing token.
    TakeoverWithoutFencing,
    /// A speculative request whose lookup could not be settled passes the handler's response on.
    HandlerResponseThroughFailedSettle,
    /// A request that lost its lease passes its handler's response on (the stale store's answer,
    /// or a failed store past the lease deferred to the background).
    LostLeaseAnswersItsOwnResponse,
}

/// The protocol under a mode, with clients, faults and maybe a seeded bug.
#[derive(Clone, Debug)]
pub struct Protocol {
    /// The claim mode.
    pub mode: Mode,
    /// Each client's request body: equal bodies are retries and duplicates of one request, a
    /// different body is another request with the same key.
    pub bodies: Vec<u8>,
    /// Attempts each client makes at most.
    pub attempts: u8,
    /// What the handler may answer (each run picks one: stock comes and goes).
    pub outcomes: Vec<Outcome>,
    /// The faults to inject.
    pub faults: Budget,
    /// A seeded bug, or none.
    pub bug: Option<Bug>,
}

impl Protocol {
    /// Two clients sending the same request, two attempts each, every handler outcome, and one
    /// of each fault.
    pub fn new(mode: Mode) -> Self {
        Protocol {
            mode,
            bodies: vec![0, 0],
            attempts: 2,
            outcomes: vec![Outcome::Created, Outcome::Refused, Outcome::Failed],
            faults: Budget {
                store_errors: 1,
                lost_answers: 1,
                crashes: 1,
                freezes: 1,
                state_losses: 0,
            },
            bug: None,
        }
    }

    /// With `bug` seeded.
    pub fn with_bug(mut self, bug: Bug) -> Self {
        self.bug = Some(bug);
        self
    }

    pub(crate) fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    pub(crate) fn holds_by_transaction(&self) -> bool {
        matches!(self.mode, Mode::OneTransaction | Mode::Speculative)
    }
}

/// One step of the system.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// A client sends its next attempt.
    Send(u8),
    /// The engine's `begin` for request `id`.
    Begin(u8),
    /// A store call of request `id`'s `begin` fails; `applied`: it reached the store first.
    BeginFails(u8, bool),
    /// Request `id`'s handler returns.
    Run(u8, Outcome),
    /// Request `id`'s guard completes or releases.
    Finish(u8),
    /// Request `id`'s completion's store call fails; `applied`: it reached the store first.
    FinishFails(u8, bool),
    /// Request `id`'s answer reaches its client.
    Deliver(u8),
    /// Request `id`'s client stops waiting for it (a timeout, a lost answer) and may retry
    /// while it runs on.
    Lose(u8),
    /// A background task runs.
    RunTask(u8),
    /// An instance is killed.
    Crash(u8),
    /// An instance freezes.
    Freeze(u8),
    /// A frozen instance thaws.
    Thaw(u8),
    /// The claim's lease runs out (its holder is not heartbeating).
    Expire,
    /// The server ends request `id`'s transaction, idle past its bound (its process frozen).
    KillIdle(u8),
    /// The store loses what it holds ([`Budget::state_losses`]).
    LoseState,
}

/// A client's id when it stopped waiting for a request.
pub(crate) const DETACHED: u8 = u8::MAX;

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            store: Store {
                record: Record::Free,
                lock: None,
                effects: 0,
            },
            instances: [Instance {
                crashed: false,
                frozen: false,
            }; 2],
            requests: Vec::new(),
            tasks: Vec::new(),
            clients: self
                .bodies
                .iter()
                .map(|&body| Client {
                    body,
                    attempts: 0,
                    waiting: false,
                    finished: false,
                })
                .collect(),
            told: Told::default(),
            sent: 0,
            budget: self.faults,
            excused: 0,
            saw_unknown: false,
            saw_takeover: false,
            saw_record_lost: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (c, client) in state.clients.iter().enumerate() {
            if !client.waiting
                && !client.finished
                && client.attempts < self.attempts
                && state.instances.iter().any(|i| !i.crashed)
            {
                actions.push(Action::Send(c as u8));
            }
        }
        for request in &state.requests {
            let instance = state.instances[usize::from(request.instance)];
            if instance.frozen {
                if request.tx.is_some_and(|tx| !tx.killed) {
                    actions.push(Action::KillIdle(request.id));
                }
                continue;
            }
            let id = request.id;
            match request.phase {
                Phase::Begin => {
                    actions.push(Action::Begin(id));
                    if state.budget.store_errors > 0 && !self.holds_by_transaction() {
                        actions.push(Action::BeginFails(id, true));
                        actions.push(Action::BeginFails(id, false));
                    }
                }
                Phase::Holding => {
                    if request.tx.is_some_and(|tx| tx.lookup_taken) {
                        actions.push(Action::Run(id, Outcome::Garbage));
                    } else {
                        for &outcome in &self.outcomes {
                            actions.push(Action::Run(id, outcome));
                        }
                    }
                }
                Phase::Ran(_) => {
                    actions.push(Action::Finish(id));
                    if state.budget.store_errors > 0 {
                        actions.push(Action::FinishFails(id, true));
                        actions.push(Action::FinishFails(id, false));
                    }
                }
                Phase::Reply(_) => actions.push(Action::Deliver(id)),
            }
            if request.client != DETACHED && state.budget.lost_answers > 0 {
                actions.push(Action::Lose(id));
            }
        }
        for (t, task) in state.tasks.iter().enumerate() {
            if !state.instances[usize::from(task.instance())].frozen {
                actions.push(Action::RunTask(t as u8));
            }
        }
        for (i, instance) in state.instances.iter().enumerate() {
            if instance.crashed {
                continue;
            }
            if state.budget.crashes > 0 {
                actions.push(Action::Crash(i as u8));
            }
            if instance.frozen {
                actions.push(Action::Thaw(i as u8));
            } else if state.budget.freezes > 0 {
                actions.push(Action::Freeze(i as u8));
            }
        }
        if let Record::Claimed {
            token,
            expired: false,
            ..
        } = state.store.record
            && !heartbeating(state, token)
        {
            actions.push(Action::Expire);
        }
        if state.budget.state_losses > 0 {
            actions.push(Action::LoseState);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Send(c) => self.send(&mut state, c),
            Action::Begin(id) => self.begin(&mut state, id, None),
            Action::BeginFails(id, applied) => {
                state.budget.store_errors -= 1;
                self.begin(&mut state, id, Some(applied));
            }
            Action::Run(id, outcome) => self.run(&mut state, id, outcome),
            Action::Finish(id) => self.finish(&mut state, id, None),
            Action::FinishFails(id, applied) => {
                state.budget.store_errors -= 1;
                self.finish(&mut state, id, Some(applied));
            }
            Action::Deliver(id) => deliver(&mut state, id),
            Action::Lose(id) => {
                state.budget.lost_answers -= 1;
                let request = state.requests.iter_mut().find(|r| r.id == id)?;
                let client = std::mem::replace(&mut request.client, DETACHED);
                state.clients[usize::from(client)].waiting = false;
            }
            Action::RunTask(t) => run_task(&mut state, t),
            Action::Crash(i) => self.crash(&mut state, i),
            Action::Freeze(i) => {
                state.budget.freezes -= 1;
                state.instances[usize::from(i)].frozen = true;
            }
            Action::Thaw(i) => state.instances[usize::from(i)].frozen = false,
            Action::Expire => self.expire(&mut state),
            Action::LoseState => self.lose_state(&mut state),
            Action::KillIdle(id) => {
                let request = state.requests.iter_mut().find(|r| r.id == id)?;
                if let Some(tx) = &mut request.tx {
                    tx.killed = true;
                }
                if state.store.lock == Some(id) {
                    state.store.lock = None;
                }
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        crate::properties::all()
    }
}

/// Whether the holder of `token`'s claim keeps its lease alive: it runs (not frozen, not gone)
/// and has not finished, or its engine still stores or releases it in the background. (A
/// background store retries until the lease ends; the model's store is never out for a whole
/// lease, so a task whose process lives lands before its lease ends.)
fn heartbeating(state: &State, token: u8) -> bool {
    let running = |instance: u8| !state.instances[usize::from(instance)].frozen;
    state.requests.iter().any(|r| {
        r.id == token && matches!(r.phase, Phase::Holding | Phase::Ran(_)) && running(r.instance)
    }) || state.tasks.iter().any(|task| {
        matches!(*task, Task::Store { token: t, .. } | Task::Release { token: t, .. } if t == token)
            && running(task.instance())
    })
}

/// Whether `token`'s outcome is not recorded while something of it stands outside the store:
/// its side effect, made outside a transaction (or about to be made by a holder that runs
/// on), or an answer its client already has while its store is retried in the background.
/// Lost with its lease, the key may be run again: the lease mode on a store without
/// transactions cannot make that once.
fn outcome_unrecorded(state: &State, token: u8) -> bool {
    state
        .requests
        .iter()
        .any(|r| r.id == token && matches!(r.phase, Phase::Holding | Phase::Ran(Outcome::Created)))
        || state
            .tasks
            .iter()
            .any(|task| matches!(*task, Task::Store { token: t, .. } if t == token))
}

impl Protocol {
    fn send(&self, state: &mut State, c: u8) {
        let client = &mut state.clients[usize::from(c)];
        // Each retry lands on the other instance, unless it is down.
        let mut instance = (c + client.attempts) % 2;
        if state.instances[usize::from(instance)].crashed {
            instance = 1 - instance;
        }
        client.attempts += 1;
        client.waiting = true;
        state.requests.push(Request {
            id: state.sent,
            client: c,
            instance,
            body: client.body,
            phase: Phase::Begin,
            tx: None,
        });
        state.sent += 1;
    }

    fn crash(&self, state: &mut State, i: u8) {
        state.budget.crashes -= 1;
        state.instances[usize::from(i)].crashed = true;
        state.instances[usize::from(i)].frozen = false;
        let (gone, kept): (Vec<Request>, Vec<Request>) =
            state.requests.iter().partition(|r| r.instance == i);
        for request in gone {
            // Its connections close: its transaction rolls back, its lock goes.
            if state.store.lock == Some(request.id) {
                state.store.lock = None;
            }
            if self.mode == Mode::Lease && request.phase == Phase::Ran(Outcome::Created) {
                state.excused += 1;
            }
            if request.client != DETACHED {
                state.clients[usize::from(request.client)].waiting = false;
            }
        }
        state.requests = kept;
        if self.mode == Mode::Lease {
            // A response whose store was still retried: its client has it, the key does not.
            state.excused += state
                .tasks
                .iter()
                .filter(|task| matches!(task, Task::Store { instance, .. } if *instance == i))
                .count() as u8;
        }
        state.tasks.retain(|task| task.instance() != i);
    }

    /// The store loses its records. A completed record's key runs again on its next request:
    /// the accepted risk of such a store, excused. A lost claim is judged like a lapsed lease:
    /// in the lease mode its holder's unrecorded outcome is excused; the transactional modes
    /// must make do without any excuse (on a database the loss is a crash, which ended every
    /// open transaction: none of their writes commit, and the lock a one-transaction request
    /// held is gone).
    fn lose_state(&self, state: &mut State) {
        state.budget.state_losses -= 1;
        state.saw_record_lost |= state.store.record != Record::Free;
        match state.store.record {
            Record::Completed(_) => state.excused += 1,
            Record::Claimed { token, .. }
                if self.mode == Mode::Lease && outcome_unrecorded(state, token) =>
            {
                state.excused += 1;
            }
            Record::Claimed { .. } | Record::Free => {}
        }
        state.store.record = Record::Free;
        if self.mode != Mode::Lease {
            for request in &mut state.requests {
                if let Some(tx) = &mut request.tx {
                    tx.killed = true;
                }
            }
            state.store.lock = None;
        }
    }

    fn expire(&self, state: &mut State) {
        let Record::Claimed { token, body, .. } = state.store.record else {
            return;
        };
        state.store.record = Record::Claimed {
            token,
            body,
            expired: true,
        };
        // A frozen holder that thaws runs its handler, or has run it: outside a transaction,
        // that effect is not made once by the record it lost.
        if self.mode == Mode::Lease && outcome_unrecorded(state, token) {
            state.excused += 1;
        }
    }
}

/// A background task of an engine runs once (fenced by its claim's token).
fn run_task(state: &mut State, t: u8) {
    let task = state.tasks.remove(usize::from(t));
    match (task, state.store.record) {
        (Task::Store { token, made, .. }, Record::Claimed { token: held, .. }) if held == token => {
            state.store.record = Record::Completed(made);
        }
        (Task::Release { token, .. }, Record::Claimed { token: held, .. }) if held == token => {
            state.store.record = Record::Free;
        }
        // Stale: the claim is another's, or the key completed.
        _ => {}
    }
}
