//! Where the admission's limit goes: it climbs the committed transactions per second, window
//! by window (`admission.rs` holds the places it limits).

use super::MIN_LIMIT;
use std::time::{Duration, Instant};

/// A window ends after this many transactions ended, and at least [`MIN_WINDOW`]...
const WINDOW_TRANSACTIONS: u32 = 48;
const MIN_WINDOW: Duration = Duration::from_millis(200);
/// ... or after this long, whatever ended (none: the window starts again, no decision).
const MAX_WINDOW: Duration = Duration::from_secs(1);

/// A limit up is kept only when it commits more than this many times the limit before: on
/// hot rows a tie kept by noise walked the limit back up from 1-2 to 9 within seconds (two
/// instances, each probing); below the pool, transactions that do not wait on each other
/// commit clearly more with each one more at once, and the process started at the pool.
const KEEP_UP: f64 = 1.03;

/// ... and only when each transaction admitted commits at least this share of what each one
/// committed before (the rate per place). A process that admits more takes a larger share of
/// what hot rows let through, whatever the total does: with another instance at one place,
/// going from one to two gave this one a third more of a total that fell (its share went from a
/// half to two thirds), so a probe judged by its own rate alone was kept, the other instance's
/// rate fell, and both climbed (the contention bench: limits wandering between 1 and 5, 0.35-0.5x
/// of the best fixed pool). Transactions that do not wait on each other commit about as much
/// each at one place more; this bites only where a step is large beside the limit (1 to 2 needs
/// 1.5x, 2 to 3 1.125x), where the share effect is largest.
const KEEP_UP_PER_PLACE: f64 = 0.75;
/// A limit down is kept only when it commits more than this many times the limit before, in
/// two windows in a row: hot rows give far more (the bench: 2-4x for half the limit), and a
/// window's noise on a shared machine reaches 10-15%, and 20% when a slow moment made the
/// limit's own last window and a quick one the probe's, which must not take a server without
/// contention down. One window was not enough: on the HTTP bench here (2 cores, 32 clients on a
/// pool of 32, no hot rows) a probe kept by such a pair took the limit to 14 and the next probe
/// from it further down, and most of the time most requests read their key first.
const KEEP_DOWN: f64 = 1.2;

/// ... and in one window when it commits more than this many times: no machine's noise does
/// that, and hot rows are left as fast as before.
const KEEP_DOWN_AT_ONCE: f64 = 2.0;

/// A probe down that commits at least this share of the limit before it (but not
/// [`KEEP_DOWN`] times more) found a plateau: the next limit down is tried too before going
/// back. Hot rows far past their collapse commit next to nothing whatever the limit, so halving
/// it showed no gain and the limit went back to the pool (the contention bench: the first 5-10
/// seconds between 7 and 14); transactions that do not wait on each other commit about half as
/// much at half the limit, so they never look for more.
const FLAT: f64 = 0.9;

/// The most windows spent at a limit between two probes, once probing keeps finding nothing
/// better.
const MAX_REST: u32 = 16;

/// Two resting windows in a row that commit less than this share of the window before them end
/// the rest: the load changed (hot rows came), so a probe down starts at once. One such window
/// does not: another instance's probe up takes this one's rate down for a window, and answering
/// it with a probe of its own made the instances chase each other up.
const CHANGED: f64 = 0.7;

/// What the current window is measuring.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// The current limit, for `rest` more windows (the last one's rate is the next probe's
    /// base), unless two windows in a row commit less than [`CHANGED`] of the one before them
    /// (`last`, none yet: 0; `low`: the window before this one did).
    Rest { rest: u32, last: f64, low: bool },
    /// A limit `step` above `from`, whose rate was `base`; `confirming`: one window at it
    /// passed already, this one must pass too.
    Up {
        from: usize,
        base: f64,
        step: usize,
        confirming: bool,
    },
    /// A limit `step` below `from`, whose rate was `base`; `confirming`: one window at it
    /// passed [`KEEP_DOWN`] already, this one must pass too.
    Down {
        from: usize,
        base: f64,
        step: usize,
        confirming: bool,
    },
}

/// The limit's state: the current window and what it is measuring.
#[derive(Debug)]
pub(super) struct Climb {
    pub(super) limit: usize,
    pub(super) max: usize,
    phase: Phase,
    /// Windows to rest after a probe cycle that moved nothing (doubles up to [`MAX_REST`]).
    rest_after_cycle: u32,
    /// Draws each rest's length from a little range (xorshift state, never 0): instances that
    /// settled together would otherwise probe together for ever, and two probes up at once
    /// each see the other's cost and neither sees its own.
    jitter: u64,
    window_start: Option<Instant>,
    ended: u32,
    committed: u32,
}

impl Climb {
    pub(super) fn new(max: usize) -> Self {
        // Any seed will do, as long as two instances' differ.
        Self::seeded(max, uuid::Uuid::new_v4().as_u64_pair().0)
    }

    fn seeded(max: usize, seed: u64) -> Self {
        Climb {
            jitter: seed | 1,
            limit: max,
            max,
            // The first window only measures: it starts before the load has settled (on hot
            // rows the first transactions commit before the lock queues form), and a probe
            // judged against it was turned back at once (the contention bench: 3-4 s more at
            // the pool before the limit came down).
            phase: Phase::Rest {
                rest: 1,
                last: 0.0,
                low: false,
            },
            // A process rests long from its first cycle on, unless a probe is kept: a probe
            // on a server without contention costs what fewer places commit less (a tenth at
            // half the pool, a fifth at a quarter, on the HTTP bench here), and starting the
            // rests at one window spent about half of a process's first 3 s probing (2 cores,
            // 32 clients on a pool of 32: 0.64x of the bare transaction where a limit held at
            // the pool gave 0.69x). Hot rows are found as fast as before: the first probe comes
            // after two windows, and each one kept starts the rests at one window again.
            rest_after_cycle: MAX_REST,
            window_start: None,
            ended: 0,
            committed: 0,
        }
    }

    /// The limit the climb stands on: the current one, or during a probe the one it goes back
    /// to unless the probe is kept. A probe down from the pool is how a server without
    /// contention checks that fewer would not commit more; it is not contention.
    pub(super) fn kept(&self) -> usize {
        match self.phase {
            Phase::Up { from, .. } | Phase::Down { from, .. } => from,
            Phase::Rest { .. } => self.limit,
        }
    }

    /// The step of a probe up from `from`: a fifth of it, at least one.
    fn first_step_up(from: usize) -> usize {
        (from / 5).max(1)
    }

    /// The first step of a probe down from `from`: half of it; each probe down kept doubles
    /// the next one. Hot rows collapse a large
    /// limit's rate (the bench: a few orders/s at 14, hundreds at 1-2), and a window at a
    /// large limit is long (few transactions end), so the way down is taken in big steps;
    /// on a server without contention a window at half the limit costs little and is
    /// reverted.
    fn first_step_down(from: usize) -> usize {
        (from / 2).max(1)
    }

    /// A transaction ended at `now` (`committed`: it got its work done). Once per window,
    /// moves the limit; the new limit when it moved.
    pub(super) fn ended(&mut self, now: Instant, committed: bool) -> Option<usize> {
        let start = *self.window_start.get_or_insert(now);
        self.ended += 1;
        self.committed += u32::from(committed);
        let elapsed = now.saturating_duration_since(start);
        if !((self.ended >= WINDOW_TRANSACTIONS && elapsed >= MIN_WINDOW) || elapsed >= MAX_WINDOW)
        {
            return None;
        }
        let rate = f64::from(self.committed) / elapsed.as_secs_f64().max(1e-6);
        let nothing = self.committed == 0;
        self.window_start = Some(now);
        self.ended = 0;
        self.committed = 0;
        if nothing {
            // Nothing committed (a table lock, a database that stopped): no measure of anything.
            return None;
        }
        let before = self.limit;
        self.phase = match self.phase {
            Phase::Rest { rest, last, low } if rate < last * CHANGED => {
                if low {
                    // Down twice in a row: the load changed.
                    let from = self.limit;
                    self.probe_down(from, rate, Self::first_step_down(from))
                } else {
                    Phase::Rest {
                        rest,
                        last,
                        low: true,
                    }
                }
            }
            Phase::Rest { rest, .. } if rest > 0 => Phase::Rest {
                rest: rest - 1,
                last: rate,
                low: false,
            },
            Phase::Rest { last, .. } => {
                // The probe is judged against the better of the limit's last two windows: one
                // window caught in a slow moment made an ordinary one at the probe look like a
                // gain.
                let from = self.limit;
                self.probe_up(from, rate.max(last), Self::first_step_up(from))
            }
            Phase::Up {
                from,
                base,
                step,
                confirming: false,
            } if rate > base * keep_up(from, step) => {
                // Once more at this limit: another instance's probe down (or its rest after
                // one) raises this one's rate for a window, which must not walk it up.
                Phase::Up {
                    from,
                    base,
                    step,
                    confirming: true,
                }
            }
            Phase::Up {
                from, base, step, ..
            } => {
                if rate > base * keep_up(from, step) {
                    // Kept: on up, from here, by as much (up in steps, down in leaps: a
                    // noisy rate that lets a probe up through is not taken far).
                    self.rest_after_cycle = 1;
                    self.probe_up(self.limit, rate, step)
                } else {
                    self.limit = from;
                    self.probe_down(from, base, Self::first_step_down(from))
                }
            }
            Phase::Down {
                from,
                base,
                step,
                confirming,
            } => {
                if rate > base * KEEP_DOWN_AT_ONCE || (confirming && rate > base * KEEP_DOWN) {
                    self.rest_after_cycle = 1;
                    self.probe_down(self.limit, rate, step * 2)
                } else if rate > base * KEEP_DOWN {
                    // Once more at this limit: one window's gain may be the machine's noise.
                    Phase::Down {
                        from,
                        base,
                        step,
                        confirming: true,
                    }
                } else if rate >= base * FLAT && self.limit > MIN_LIMIT {
                    // As much with fewer: a plateau (hot rows past their collapse commit next
                    // to nothing at 14 and at 7 alike; a busy server as much at 16 as at 8).
                    // Looks at half this limit, still judged against `from`, which it goes
                    // back to if nothing below does better: on a busy server the search stops
                    // at the first limit that commits clearly less, one window there.
                    self.limit = (self.limit / 2).max(MIN_LIMIT);
                    Phase::Down {
                        from,
                        base,
                        step,
                        confirming: false,
                    }
                } else {
                    self.limit = from;
                    self.settle(base)
                }
            }
        };
        (self.limit != before).then_some(self.limit)
    }

    /// Tries the limit `step` above `from` (whose rate was `base`), or down from the top.
    fn probe_up(&mut self, from: usize, base: f64, step: usize) -> Phase {
        if from >= self.max {
            return self.probe_down(from, base, Self::first_step_down(from));
        }
        self.limit = (from + step).min(self.max);
        Phase::Up {
            from,
            base,
            step,
            confirming: false,
        }
    }

    /// Tries the limit `step` below `from` (whose rate was `base`), or rests at the bottom.
    fn probe_down(&mut self, from: usize, base: f64, step: usize) -> Phase {
        if from <= MIN_LIMIT {
            return self.settle(base);
        }
        self.limit = from.saturating_sub(step).max(MIN_LIMIT);
        Phase::Down {
            from,
            base,
            step,
            confirming: false,
        }
    }

    /// Neither way did better: rest at the limit (whose rate was `base`), longer each time.
    fn settle(&mut self, base: f64) -> Phase {
        let rest = self.rest_after_cycle;
        self.rest_after_cycle = (rest * 2).min(MAX_REST);
        // A rest of `rest` windows and up to half as many more.
        let mut x = self.jitter;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter = x;
        let rest = rest + (x % u64::from(rest / 2 + 1)) as u32;
        Phase::Rest {
            rest,
            last: base,
            low: false,
        }
    }
}

/// How many times the rate at `from` a probe `step` up must commit to be kept: [`KEEP_UP`], and
/// [`KEEP_UP_PER_PLACE`] of the rate per place.
fn keep_up(from: usize, step: usize) -> f64 {
    let places = (from + step) as f64 / from.max(1) as f64;
    KEEP_UP.max(KEEP_UP_PER_PLACE * places)
}

#[cfg(test)]
mod tests;
