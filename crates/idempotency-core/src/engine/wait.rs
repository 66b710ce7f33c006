//! Waiting for a duplicate's answer: the one policy every claim mode's `begin` follows when it
//! finds its key held by another request
//! ([`EngineConfig::in_flight_wait`](crate::EngineConfig#structfield.in_flight_wait)).
//!
//! A mode's `begin` asks the store in its own way (a claim, or a lookup in the request's
//! transaction) and hands what it saw here: [`WaitForKey::running`] says whether to ask again
//! (after a place among this process's waiters was taken, or after a nap that a settle of this
//! process cuts short) or to answer in flight now. Polling stays, as the way to learn of a
//! request settled by another process.

use super::waiters::{Waiters, Waiting};
use crate::key::IdempotencyKey;
use crate::scope::Scope;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;

/// The first nap between two looks at a running key; each nap doubles, up to [`MAX_POLL`].
pub(super) const FIRST_POLL: Duration = Duration::from_millis(10);
/// The longest nap between two looks at a running key.
pub(super) const MAX_POLL: Duration = Duration::from_millis(250);

/// One request's wait for the key another request holds.
pub(super) struct WaitForKey<'a> {
    waiters: &'a Waiters,
    deadline: Instant,
    poll: Duration,
    /// What the last look showed, once one showed the key held: the `Retry-After` of an answer
    /// in flight.
    seen_running: Option<Duration>,
    /// Its place among the duplicates waiting on this process, once it waits. Boxed, like its
    /// wake: every request's `begin` future carries these, few ever wait.
    waiting: Option<Box<Waiting<'a>>>,
}

/// What a request that found its key held does next.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Ask the store again (the wake is armed when [`WaitForKey::arm`] is called first).
    AskAgain,
    /// The request just took its place among this process's waiters: where the running
    /// request's record can be watched for its settle by another process
    /// ([`IdempotencyStore::watch_settle`](crate::IdempotencyStore::watch_settle)), watch it,
    /// then ask the store again.
    Watch,
    /// Stop waiting: answer in flight, with this `Retry-After`.
    InFlight(Duration),
}

impl<'a> WaitForKey<'a> {
    /// A request that began at `started` and may wait `wait` for a running duplicate.
    pub(super) fn new(waiters: &'a Waiters, started: Instant, wait: Duration) -> Self {
        WaitForKey {
            waiters,
            deadline: started + wait,
            poll: FIRST_POLL,
            seen_running: None,
            waiting: None,
        }
    }

    /// The wake of this key, armed before the store is asked: a request of this process that
    /// settles the key after the store's answer then still wakes this one. `None` until the
    /// request has a place among the waiters.
    pub(super) fn arm(&self) -> Option<Pin<Box<OwnedNotified>>> {
        self.waiting.as_deref().map(Waiting::notified)
    }

    /// Once a look showed the key held: the `Retry-After` it gave. A store failure after that
    /// answers in flight rather than an error, so a fail-open caller never runs a request that
    /// another one is running.
    pub(super) fn seen_running(&self) -> Option<Duration> {
        self.seen_running
    }

    /// The last look found `(scope, key)` held by another request: ask again, or answer in flight
    /// with `retry_after`. The first time, the request takes a place among this process's
    /// waiters ([`Next::Watch`]) and asks again at once (with the wake armed, so a settle before
    /// that look is not missed); past the waiters' bounds, or past the wait, it answers now. Later, it naps
    /// until woken, its poll (doubling from [`FIRST_POLL`] to [`MAX_POLL`]), the end of its
    /// wait, or `nap_at_most`, whichever comes first.
    pub(super) async fn running(
        &mut self,
        scope: &Scope,
        key: &IdempotencyKey,
        retry_after: Duration,
        nap_at_most: Duration,
        woken: Option<Pin<Box<OwnedNotified>>>,
    ) -> Next {
        self.seen_running = Some(retry_after);
        let now = Instant::now();
        if now >= self.deadline {
            return Next::InFlight(retry_after);
        }
        let Some(woken) = woken else {
            return match self.waiters.join(scope, key) {
                Some(place) => {
                    self.waiting = Some(Box::new(place));
                    Next::Watch
                }
                None => Next::InFlight(retry_after),
            };
        };
        let nap = self.poll.min(self.deadline - now).min(nap_at_most);
        // Woken by a request of this process, or at the poll: a request of another process
        // settles the key unseen.
        let _ = tokio::time::timeout(nap, woken).await;
        self.poll = (self.poll * 2).min(MAX_POLL);
        Next::AskAgain
    }
}

#[cfg(test)]
#[cfg(not(idempotency_loom))]
mod tests {
    use super::*;

    use crate::test_store::scope_and_key as key;

    #[tokio::test(start_paused = true)]
    async fn without_a_wait_the_first_look_answers_in_flight() {
        let waiters = Waiters::new(4, 16);
        let (s, k) = key("a");
        let mut wait = WaitForKey::new(&waiters, Instant::now(), Duration::ZERO);
        assert_eq!(wait.seen_running(), None);
        let woken = wait.arm();
        let next = wait
            .running(&s, &k, Duration::from_secs(1), Duration::MAX, woken)
            .await;
        assert_eq!(next, Next::InFlight(Duration::from_secs(1)));
        assert_eq!(wait.seen_running(), Some(Duration::from_secs(1)));
        assert_eq!(waiters.waiting(), 0, "no place taken without a wait");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_takes_a_place_then_naps_doubling_until_its_end() {
        let waiters = Waiters::new(4, 16);
        let (s, k) = key("a");
        let started = Instant::now();
        let mut wait = WaitForKey::new(&waiters, started, Duration::from_millis(100));
        let retry = Duration::from_millis(700);
        // The first look: a place, and at once another look.
        let next = wait.running(&s, &k, retry, Duration::MAX, wait.arm()).await;
        assert_eq!(next, Next::Watch);
        assert_eq!(waiters.waiting(), 1);
        assert_eq!(Instant::now(), started, "the second look is not delayed");
        // Then naps of 10, 20, 40 ms, and the rest of the 100 ms wait.
        let mut naps = Vec::new();
        loop {
            let before = Instant::now();
            match wait.running(&s, &k, retry, Duration::MAX, wait.arm()).await {
                Next::AskAgain => naps.push((Instant::now() - before).as_millis()),
                Next::Watch => panic!("a place is taken once"),
                Next::InFlight(after) => {
                    assert_eq!(after, retry);
                    break;
                }
            }
        }
        assert_eq!(naps, [10, 20, 40, 30]);
        drop(wait);
        assert_eq!(waiters.waiting(), 0, "the place is given back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_nap_is_cut_short_by_a_settle_of_this_process_and_by_its_bound() {
        let waiters = Waiters::new(4, 16);
        let (s, k) = key("a");
        let started = Instant::now();
        let mut wait = WaitForKey::new(&waiters, started, Duration::from_secs(10));
        let retry = Duration::from_secs(1);
        assert_eq!(
            wait.running(&s, &k, retry, Duration::MAX, wait.arm()).await,
            Next::Watch
        );
        // Bounded by the caller (a lease that ends sooner than the poll).
        let before = Instant::now();
        let next = wait
            .running(&s, &k, retry, Duration::from_millis(3), wait.arm())
            .await;
        assert_eq!(next, Next::AskAgain);
        assert_eq!(Instant::now() - before, Duration::from_millis(3));
        // Woken: the settle comes before the 20 ms poll.
        let woken = wait.arm();
        let waiters_ref = &waiters;
        let settle = async {
            tokio::time::sleep(Duration::from_millis(2)).await;
            waiters_ref.wake(&s, &k);
        };
        let before = Instant::now();
        let (next, ()) = tokio::join!(wait.running(&s, &k, retry, Duration::MAX, woken), settle);
        assert_eq!(next, Next::AskAgain);
        assert_eq!(Instant::now() - before, Duration::from_millis(2));
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_waiters_bound_it_answers_at_once() {
        let waiters = Waiters::new(1, 16);
        let (s, k) = key("a");
        let now = Instant::now();
        let mut first = WaitForKey::new(&waiters, now, Duration::from_secs(10));
        let mut second = WaitForKey::new(&waiters, now, Duration::from_secs(10));
        let retry = Duration::from_secs(1);
        assert_eq!(
            first.running(&s, &k, retry, Duration::MAX, None).await,
            Next::Watch
        );
        assert_eq!(
            second.running(&s, &k, retry, Duration::MAX, None).await,
            Next::InFlight(retry)
        );
    }
}
