//! A request's answer reaching its client: what each client was told, judged against what
//! the store holds (the properties read `State::told`).

use crate::model::DETACHED;
use crate::state::{Outcome, Phase, Reply, State};

/// A request's answer reaches its client, and what it was told is judged.
pub(crate) fn deliver(state: &mut State, id: u8) {
    let Some(at) = state.requests.iter().position(|r| r.id == id) else {
        return;
    };
    let request = state.requests.remove(at);
    let Phase::Reply(reply) = request.phase else {
        return;
    };
    if request.client == DETACHED {
        return;
    }
    let client = &mut state.clients[usize::from(request.client)];
    client.waiting = false;
    let told = &mut state.told;
    match reply {
        Reply::Final(made) => {
            client.finished = true;
            if made.body != client.body {
                told.other_body = true;
            }
            match told.first {
                None => told.first = Some(made),
                Some(first) if first != made => told.two_answers = true,
                Some(_) => {}
            }
            match made.outcome {
                Outcome::Created if state.store.effects == 0 => told.created_without_effect = true,
                Outcome::Refused => told.refused = true,
                _ => {}
            }
        }
        Reply::Garbage => {
            client.finished = true;
            told.garbage = true;
        }
        Reply::Mismatch => client.finished = true,
        Reply::NotCommitted { applied } => told.unknown_as_known |= applied,
        Reply::OutcomeUnknown { .. } => state.saw_unknown = true,
        Reply::Retry | Reply::HandlerFailed => {}
    }
}
