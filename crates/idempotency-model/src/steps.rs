//! A request's own steps in each claim mode: `begin`, the handler, and the guard's completion
//! or release, each deciding through core's [`protocol`] functions.

use crate::core_terms::{RETENTION, fingerprint, live, made};
use crate::model::{Bug, Mode, Protocol};
use crate::state::{Made, Outcome, Phase, Record, Reply, Request, State, Task, Tx};
use idempotency_core::protocol::{self, Answer, Judged};
use idempotency_core::store::FenceOutcome;
use idempotency_core::{Completion, RollbackCause, StoreError, Superseded};
use std::time::Duration;

/// A store call that timed out or lost its connection: it may have been applied.
fn unreachable_error() -> StoreError {
    StoreError::from_failure("model", true, "the connection dropped")
}

/// What a request answers on a live record it found at `begin`.
fn judged_reply(judged: Judged) -> Reply {
    match judged {
        Judged::Mismatch => Reply::Mismatch,
        Judged::Replay(replayed) => Reply::Final(made(&replayed)),
        Judged::Running(_) => Reply::Retry,
    }
}

/// Whether a claim may take the key: no record, or a claim whose lease ran out.
fn claimable(record: Record) -> bool {
    matches!(record, Record::Free | Record::Claimed { expired: true, .. })
}

impl Protocol {
    fn at(state: &State, id: u8) -> Option<usize> {
        state.requests.iter().position(|r| r.id == id)
    }

    /// The engine's `begin`: a claim (lease modes) or the key's lookup opening the request's
    /// transaction (one-transaction modes). `fault`: the claim's store call fails, having
    /// reached the store (`Some(true)`) or not.
    pub(crate) fn begin(&self, state: &mut State, id: u8, fault: Option<bool>) {
        let Some(at) = Self::at(state, id) else {
            return;
        };
        let request = state.requests[at];
        let record = state.store.record;
        let phase = if self.holds_by_transaction() {
            let busy = state.store.lock.is_some_and(|holder| holder != id);
            let found = live(record);
            if !busy && found.is_none() {
                state.saw_takeover |= record != Record::Free;
                state.store.lock = Some(id);
                state.requests[at].tx = Some(Tx {
                    effect: false,
                    lookup_taken: false,
                    killed: false,
                });
                Phase::Holding
            } else if self.mode == Mode::Speculative {
                // The lookup is on its way with the handler's first statement: the handler
                // runs, and every statement of it is refused.
                state.requests[at].tx = Some(Tx {
                    effect: false,
                    lookup_taken: true,
                    killed: false,
                });
                Phase::Holding
            } else {
                match found {
                    Some(found) if !busy => Phase::Reply(judged_reply(protocol::judge(
                        found,
                        &fingerprint(request.body),
                        RETENTION,
                    ))),
                    _ => Phase::Reply(Reply::Retry),
                }
            }
        } else if let Some(applied) = fault {
            // The engine answers that the store failed, and releases, fenced by the claim's
            // token, the claim it may have made.
            if applied && claimable(record) {
                state.store.record = claimed(id, request.body);
            }
            state.tasks.push(Task::Release {
                token: id,
                instance: request.instance,
            });
            Phase::Reply(Reply::Retry)
        } else if claimable(record) {
            state.saw_takeover |= record != Record::Free;
            state.store.record = claimed(id, request.body);
            Phase::Holding
        } else {
            match live(record) {
                Some(found) => Phase::Reply(judged_reply(protocol::judge(
                    found,
                    &fingerprint(request.body),
                    RETENTION,
                ))),
                None => Phase::Reply(Reply::Retry),
            }
        };
        state.requests[at].phase = phase;
    }

    /// The handler returns `outcome`, having made its side effect if it created: at once
    /// outside a transaction, in the request's transaction otherwise (discarded later if it
    /// refused).
    pub(crate) fn run(&self, state: &mut State, id: u8, outcome: Outcome) {
        let Some(at) = Self::at(state, id) else {
            return;
        };
        let wrote = matches!(outcome, Outcome::Created | Outcome::Refused);
        match self.mode {
            Mode::Lease => {
                if outcome == Outcome::Created {
                    state.store.effects += 1;
                }
            }
            Mode::LeaseInTransaction => {
                state.requests[at].tx = Some(Tx {
                    effect: wrote,
                    lookup_taken: false,
                    killed: false,
                });
            }
            Mode::OneTransaction | Mode::Speculative => {
                if let Some(tx) = &mut state.requests[at].tx {
                    tx.effect = wrote && !tx.lookup_taken;
                }
            }
        }
        state.requests[at].phase = Phase::Ran(outcome);
    }

    /// The guard completes (a stored status) or releases (`500`), and the client's answer is
    /// decided. `fault`: the store call fails, having reached the store (`Some(true)`) or not.
    pub(crate) fn finish(&self, state: &mut State, id: u8, fault: Option<bool>) {
        let Some(at) = Self::at(state, id) else {
            return;
        };
        let request = state.requests[at];
        let Phase::Ran(outcome) = request.phase else {
            return;
        };
        let made = Made {
            outcome,
            body: request.body,
        };
        let (completion, applied) = match self.mode {
            Mode::Lease => (self.finish_lease(state, at, made, fault), false),
            Mode::LeaseInTransaction => self.finish_lease_in_transaction(state, at, made, fault),
            Mode::OneTransaction | Mode::Speculative => {
                let Some(decided) = self.finish_one_transaction(state, at, made, fault) else {
                    return;
                };
                decided
            }
        };
        state.requests[at].tx = None;
        state.requests[at].phase = Phase::Reply(self.reply(completion, made, applied));
    }

    /// The lease mode without a transaction: a fenced store of the response, or a fenced
    /// release; a failed call keeps the claim and is retried in the background.
    fn finish_lease(
        &self,
        state: &mut State,
        at: usize,
        made: Made,
        fault: Option<bool>,
    ) -> Completion {
        let Request { id, instance, .. } = state.requests[at];
        let fenced = matches!(state.store.record, Record::Claimed { token, .. } if token == id);
        // By the process's clock, which the model equates with the store's.
        let within_lease = matches!(
            state.store.record,
            Record::Claimed { token, expired: false, .. } if token == id
        );
        let stores = made.outcome != Outcome::Failed;
        let change = if stores {
            Record::Completed(made)
        } else {
            Record::Free
        };
        let error = unreachable_error();
        let result = match fault {
            None if fenced => {
                state.store.record = change;
                Ok(FenceOutcome::Applied)
            }
            None => Ok(FenceOutcome::Stale),
            Some(applied) => {
                if applied && fenced {
                    state.store.record = change;
                }
                Err(&error)
            }
        };
        if !stores {
            let completion = protocol::after_release(result);
            if completion == Completion::Deferred {
                state.tasks.push(Task::Release {
                    token: id,
                    instance,
                });
            }
            return completion;
        }
        if self.has(Bug::ReleaseAfterFailedCompletion) && result.is_err() {
            if matches!(state.store.record, Record::Claimed { token, .. } if token == id) {
                state.store.record = Record::Free;
            }
            return Completion::Released;
        }
        let completion = protocol::after_store(
            result,
            within_lease || self.has(Bug::LostLeaseAnswersItsOwnResponse),
        );
        if completion == Completion::Deferred {
            state.tasks.push(Task::Store {
                token: id,
                instance,
                made,
            });
        }
        completion
    }

    /// The lease mode with the handler's writes in the request's transaction: the response
    /// stored and the writes committed together, fenced by the claim's token.
    fn finish_lease_in_transaction(
        &self,
        state: &mut State,
        at: usize,
        made: Made,
        fault: Option<bool>,
    ) -> (Completion, bool) {
        let request = state.requests[at];
        let id = request.id;
        let error = unreachable_error();
        if made.outcome == Outcome::Failed {
            // Rolled back, then the claim released (fenced).
            let fenced = matches!(state.store.record, Record::Claimed { token, .. } if token == id);
            let result = match fault {
                None if fenced => {
                    state.store.record = Record::Free;
                    Ok(FenceOutcome::Applied)
                }
                None => Ok(FenceOutcome::Stale),
                Some(applied) => {
                    if applied && fenced {
                        state.store.record = Record::Free;
                    }
                    Err(&error)
                }
            };
            let completion = protocol::after_release(result);
            if completion == Completion::Deferred {
                state.tasks.push(Task::Release {
                    token: id,
                    instance: request.instance,
                });
            }
            return (completion, false);
        }
        let tx = request.tx.unwrap_or(Tx {
            effect: false,
            lookup_taken: false,
            killed: false,
        });
        let fenced = self.has(Bug::TakeoverWithoutFencing)
            || matches!(state.store.record, Record::Claimed { token, .. } if token == id);
        let commits = !tx.killed && fenced;
        let apply = |state: &mut State| {
            state.store.record = Record::Completed(made);
            if made.outcome == Outcome::Created && tx.effect {
                state.store.effects += 1;
            }
        };
        match fault {
            None if tx.killed => {}
            None if commits => {
                apply(state);
                return (Completion::Stored, true);
            }
            None => return (Completion::RolledBack(RollbackCause::LeaseLost), false),
            Some(applied) => {
                if applied && commits {
                    apply(state);
                }
                // The engine releases its claim (fenced: a commit that happened left no claim
                // of its token), and says the outcome is not known.
                state.tasks.push(Task::Release {
                    token: id,
                    instance: request.instance,
                });
                return (protocol::after_failed_commit(&error), applied && commits);
            }
        }
        // The server ended the transaction: its COMMIT meets a closed connection.
        state.tasks.push(Task::Release {
            token: id,
            instance: request.instance,
        });
        (protocol::after_failed_commit(&error), false)
    }

    /// The one-transaction modes: the speculative lookup settled first, then the record
    /// inserted and committed with the writes (or, for a refusal, without them), the key held
    /// by the transaction's lock throughout. `None`: a step that leaves the request to finish
    /// later (the seeded bug's rollback before its insert).
    fn finish_one_transaction(
        &self,
        state: &mut State,
        at: usize,
        made: Made,
        fault: Option<bool>,
    ) -> Option<(Completion, bool)> {
        let request = state.requests[at];
        let id = request.id;
        let error = unreachable_error();
        let Some(tx) = request.tx else {
            // Every request of these modes holds its transaction from `begin` on, but the one
            // the seeded bug rolled back before its insert.
            assert!(
                self.has(Bug::RefusalStoredAfterLockReleased),
                "a one-transaction request without its transaction"
            );
            // The seeded bug's second half: the refusal inserted if the key is still free,
            // its own refusal answered either way.
            if claimable(state.store.record) {
                state.store.record = Record::Completed(made);
            }
            return Some((Completion::Stored, true));
        };
        let release_lock = |state: &mut State| {
            if state.store.lock == Some(id) {
                state.store.lock = None;
            }
        };
        if tx.lookup_taken {
            // Settled: the transaction rolls back (its statements were refused) and the key's
            // record is read.
            if fault.is_some() {
                return Some((Completion::RolledBack(RollbackCause::Store), false));
            }
            let superseded = match live(state.store.record) {
                Some(found) => protocol::superseded(protocol::judge(
                    found,
                    &fingerprint(request.body),
                    RETENTION,
                )),
                None => Superseded::InFlight {
                    retry_after: Duration::from_secs(1),
                },
            };
            return Some((Completion::Superseded(superseded), false));
        }
        if made.outcome == Outcome::Failed {
            release_lock(state);
            return Some((Completion::Released, false));
        }
        if self.has(Bug::RefusalStoredAfterLockReleased) && made.outcome == Outcome::Refused {
            release_lock(state);
            state.requests[at].tx = None;
            return None;
        }
        if tx.killed {
            return Some((protocol::after_failed_commit(&error), false));
        }
        let found = live(state.store.record);
        let commits = found.is_none();
        let apply = |state: &mut State| {
            state.store.record = Record::Completed(made);
            if made.outcome == Outcome::Created && tx.effect {
                state.store.effects += 1;
            }
        };
        let decided = match (fault, found) {
            (None, None) => {
                apply(state);
                (Completion::Stored, true)
            }
            (None, Some(found)) => (
                Completion::Superseded(protocol::superseded(protocol::judge(
                    found,
                    &fingerprint(request.body),
                    RETENTION,
                ))),
                false,
            ),
            (Some(applied), _) => {
                if applied && commits {
                    apply(state);
                }
                (protocol::after_failed_commit(&error), applied && commits)
            }
        };
        release_lock(state);
        Some(decided)
    }

    /// What the client is told for a request that ran: core's [`Completion::answer`].
    /// `applied`: whether the request's own commit happened (the model knows it).
    fn reply(&self, completion: Completion, made: Made, applied: bool) -> Reply {
        let answer = if self.has(Bug::HandlerResponseThroughFailedSettle)
            && completion == Completion::RolledBack(RollbackCause::Store)
            || self.has(Bug::LostLeaseAnswersItsOwnResponse) && completion == Completion::Stale
        {
            Answer::HandlerResponse
        } else {
            completion.answer()
        };
        match answer {
            Answer::HandlerResponse => match made.outcome {
                Outcome::Created | Outcome::Refused => Reply::Final(made),
                Outcome::Failed => Reply::HandlerFailed,
                Outcome::Garbage => Reply::Garbage,
            },
            Answer::Replay(replayed) => Reply::Final(self::made(&replayed)),
            Answer::Mismatch => Reply::Mismatch,
            Answer::NotCommitted => Reply::NotCommitted { applied },
            Answer::OutcomeUnknown => Reply::OutcomeUnknown { applied },
            _ => Reply::Retry,
        }
    }
}

/// A live claim of request `id`.
fn claimed(id: u8, body: u8) -> Record {
    Record::Claimed {
        token: id,
        body,
        expired: false,
    }
}
