//! Runs a future inline, and hands it to the runtime if its caller stops waiting.

use futures_util::FutureExt as _;
use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

type Caught<T> = Result<T, Box<dyn Any + Send>>;

/// Polls `future` in the caller's task (no spawn, no cross-thread hand-off on the common path).
/// If the caller drops this before `future` finishes (the client disconnected), `future` is
/// spawned and runs to its end in the background. A panic inside `future` is caught and returned
/// as `Err`, after its locals were dropped by unwinding.
pub(crate) struct DetachOnDrop<F: Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    future: Option<Pin<Box<AssertUnwindSafe<F>>>>,
}

impl<F: Future + Send + 'static> DetachOnDrop<F>
where
    F::Output: Send + 'static,
{
    pub(crate) fn new(future: F) -> Self {
        DetachOnDrop {
            future: Some(Box::pin(AssertUnwindSafe(future))),
        }
    }
}

impl<F: Future + Send + 'static> Future for DetachOnDrop<F>
where
    F::Output: Send + 'static,
{
    type Output = Caught<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(future) = self.future.as_mut() else {
            return Poll::Pending;
        };
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| future.poll_unpin(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                self.future = None;
                Poll::Ready(Ok(output))
            }
            Err(panic) => {
                // Dropping the future drops whatever it still held (the claim's guard releases).
                self.future = None;
                Poll::Ready(Err(panic))
            }
        }
    }
}

impl<F: Future + Send + 'static> Drop for DetachOnDrop<F>
where
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(future) = self.future.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(future.catch_unwind());
                }
                Err(_) => tracing::warn!(
                    "request dropped outside a Tokio runtime: its handler cannot finish in the background"
                ),
            }
        }
    }
}
