//! The connection a request's transaction holds: rolled back in the background if it is dropped
//! before the transaction ended, or closed.

use deadpool_postgres::{ClientWrapper, Object};
use std::ops::Deref;
use std::sync::Arc;

/// A connection inside a transaction the store opened. Dropped before the transaction ended
/// (a panic, a cancelled request, a duplicate's answer), it is rolled back in the background
/// before it returns to the pool, or closed. Shared (an `Arc`) with the task that reads a
/// queued statement's answer (`DriverOps::begin_queued`); the connection returns to the pool
/// when the last holder lets go.
pub struct TokioTx(pub(super) Option<Arc<Object>>);

impl std::fmt::Debug for TokioTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokioTx")
            .field("open", &self.0.is_some())
            .finish()
    }
}

impl Deref for TokioTx {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        match &self.0 {
            Some(client) => client,
            None => unreachable!("the connection is only taken when the transaction ends"),
        }
    }
}

impl TokioTx {
    pub(super) fn new(client: Object) -> Self {
        TokioTx(Some(Arc::new(client)))
    }

    /// The connection, which goes back to the pool when dropped.
    pub(super) fn end(mut self) -> Option<Arc<Object>> {
        self.0.take()
    }
}

/// Closes `client` instead of pooling it (its session is in an unknown state), unless a task
/// still reads from it: that task's error ends it the same way.
pub(super) fn close(client: Arc<Object>) {
    if let Ok(client) = Arc::try_unwrap(client) {
        drop(Object::take(client));
    }
}

impl Drop for TokioTx {
    fn drop(&mut self) {
        let Some(client) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if client.batch_execute("ROLLBACK").await.is_err() {
                        close(client);
                    }
                });
            }
            Err(_) => close(client),
        }
    }
}
