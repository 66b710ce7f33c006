//! Waking duplicates across instances: the store's listening session, opened at the first
//! waiting duplicate and kept, which hands each notice of a waited-for key's settle to the
//! store's [`SettledKeys`] (so to every engine over the store). Migration 0004 and the
//! statements (`schema.rs`: `watch`, and the notice in `complete`, `release` and the
//! completion in the request's transaction) are the other half; `docs/postgres.md` says how it
//! works and what a lost notice costs (a poll).

use crate::driver::Driver;
use idempotency_core::StoreError;
use idempotency_core::store::{SettledKeys, parse_wake_id};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio_util::sync::CancellationToken;

/// The store's listening session, and what it hears.
pub(crate) struct SettleListener {
    pub(crate) settled: Arc<SettledKeys>,
    /// A session listens now: a notice committed from now on is heard.
    listening: Arc<AtomicBool>,
    /// The driver cannot open a session (an application's deadpool pool): never asked again.
    unavailable: AtomicBool,
    /// One opening at a time.
    opening: tokio::sync::Mutex<()>,
    /// Ends the session when the store (its last clone) is dropped.
    stop: CancellationToken,
}

impl Default for SettleListener {
    fn default() -> Self {
        SettleListener {
            settled: Arc::new(SettledKeys::new()),
            listening: Arc::new(AtomicBool::new(false)),
            unavailable: AtomicBool::new(false),
            opening: tokio::sync::Mutex::new(()),
            stop: CancellationToken::new(),
        }
    }
}

impl Drop for SettleListener {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl SettleListener {
    /// Makes sure a session listens on `channel`: `Ok(true)` once one does (at once when one
    /// already did), `Ok(false)` when the driver cannot open one.
    pub(crate) async fn ensure<D: Driver>(
        &self,
        driver: &D,
        channel: &str,
    ) -> Result<bool, StoreError> {
        if self.listening.load(Ordering::Acquire) {
            return Ok(true);
        }
        if self.unavailable.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let _opening = self.opening.lock().await;
        if self.listening.load(Ordering::Acquire) {
            return Ok(true);
        }
        let (notices, mut heard) = tokio::sync::mpsc::unbounded_channel::<String>();
        if !driver
            .listen(channel, notices, self.stop.child_token())
            .await?
        {
            self.unavailable.store(true, Ordering::Relaxed);
            tracing::info!(
                "the store cannot open a listening session (it was built on an application's \
                 deadpool pool): duplicates waiting on another instance poll for its answer"
            );
            return Ok(false);
        }
        self.listening.store(true, Ordering::Release);
        let (listening, settled) = (Arc::clone(&self.listening), Arc::clone(&self.settled));
        tokio::spawn(async move {
            while let Some(payload) = heard.recv().await {
                if let Some(id) = parse_wake_id(&payload) {
                    settled.settled(id);
                }
            }
            // The session ended (the store dropped, or its connection lost): the next waiting
            // duplicate opens another; until then, duplicates poll.
            listening.store(false, Ordering::Release);
            tracing::debug!("the store's listening session ended");
        });
        Ok(true)
    }
}
