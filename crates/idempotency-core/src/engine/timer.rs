//! The timer the heartbeat and the lease sleep on: futures-timer's own thread, not the
//! runtime's (see `heartbeat.rs` for why).

use tokio::time::Instant;

/// A future that resolves at `deadline`, woken from futures-timer's own thread: Tokio fires its
/// timers only from a worker parked on its driver, and a worker that wakes holding the driver
/// and then blocks leaves them unattended.
pub(crate) fn sleep_until(deadline: Instant) -> futures_timer::Delay {
    futures_timer::Delay::new(deadline.saturating_duration_since(Instant::now()))
}
