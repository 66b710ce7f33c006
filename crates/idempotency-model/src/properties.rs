//! What must hold in every state the checker reaches, what must hold at the end of every run,
//! and what must be possible (so that the checks are not vacuous).

use crate::model::{Mode, Protocol};
use crate::state::{Record, State};
use stateright::Property;

/// At most one side effect per key (beyond the effects a process made outside any
/// transaction and then died with, which no record can make once).
pub const AT_MOST_ONE_EFFECT: &str = "at most one side effect per key";
/// Every final answer to every client equals the first.
pub const ONE_ANSWER: &str = "every final answer equals the first";
/// No final answer contradicts what exists: no `201` without its side effect, no refusal
/// beside a side effect.
pub const ANSWERS_AGREE: &str = "no answer contradicts what committed";
/// No client gets a response made for another request body.
pub const OWN_BODY_ONLY: &str = "no client gets another request's response";
/// No client gets a response its handler built from statements the database refused.
pub const NO_REFUSED_STATEMENTS: &str = "no response built from refused statements";
/// No client is told "not committed" about a commit that happened.
pub const UNKNOWN_NEVER_KNOWN: &str = "an unknown outcome is never reported as known";
/// Every run ends with nothing held: no request, no task, no lock, no live claim.
pub const KEY_SETTLES: &str = "every run ends with the key settled";

/// Reached when the store may lose its state: it lost a record that mattered (a claim, or an
/// answer), so a check with a state loss is not vacuous.
pub const RECORD_LOST: &str = "the store loses a record that mattered";

/// Every property the model checks.
pub(crate) fn all() -> Vec<Property<Protocol>> {
    vec![
        Property::always(AT_MOST_ONE_EFFECT, |_, s: &State| {
            s.store.effects <= 1 + s.excused
        }),
        Property::always(ONE_ANSWER, |_, s: &State| {
            !s.told.two_answers || s.excused > 0
        }),
        Property::always(ANSWERS_AGREE, |_, s: &State| {
            s.excused > 0
                || !(s.told.created_without_effect || s.told.refused && s.store.effects > 0)
        }),
        Property::always(OWN_BODY_ONLY, |_, s: &State| !s.told.other_body),
        Property::always(NO_REFUSED_STATEMENTS, |_, s: &State| !s.told.garbage),
        Property::always(UNKNOWN_NEVER_KNOWN, |_, s: &State| !s.told.unknown_as_known),
        Property::eventually(KEY_SETTLES, |_, s: &State| settled(s)),
        Property::sometimes(
            "a duplicate is answered with the first answer",
            |_, s: &State| s.told.first.is_some() && s.clients.iter().all(|c| c.finished),
        ),
        Property::sometimes(
            "a claim whose lease ran out is taken over",
            |m: &Protocol, s: &State| {
                matches!(m.mode, Mode::OneTransaction | Mode::Speculative) || s.saw_takeover
            },
        ),
        Property::sometimes(RECORD_LOST, |m: &Protocol, s: &State| {
            m.faults.state_losses == 0 || s.saw_record_lost
        }),
        Property::sometimes(
            "a client is told the outcome is unknown",
            |m: &Protocol, s: &State| m.mode == Mode::Lease || s.saw_unknown,
        ),
    ]
}

/// Nothing is left running or held, and every client stopped.
fn settled(s: &State) -> bool {
    s.requests.is_empty()
        && s.tasks.is_empty()
        && s.store.lock.is_none()
        && !matches!(s.store.record, Record::Claimed { expired: false, .. })
}
