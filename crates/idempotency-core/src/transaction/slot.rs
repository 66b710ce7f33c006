//! The slot a request's transaction lives in: opened on the handler's first use, held by one
//! [`Transaction`] at a time, and taken back by the engine when the request ends.

use super::{StoreTransaction, TransactionError};
use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};

pub(crate) type OpenFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Box<dyn StoreTransaction>, TransactionError>> + Send + 'a>>;

/// Opens the transaction of one claim (made by the engine, which knows the store's type).
pub(crate) trait Opener: Send + Sync {
    fn open(&self) -> OpenFuture<'_>;
}

/// A slot's state, and whether the handler asked for the transaction.
pub(crate) struct Slot {
    state: SlotState,
    used: bool,
}

pub(crate) enum SlotState {
    /// Not opened yet: the handler has not asked for it.
    Unopened(Box<dyn Opener>),
    /// Open: the handler may be writing in it.
    Open(Box<dyn StoreTransaction>),
    /// Completed, rolled back, or refused: it cannot be opened (again).
    Closed,
}

/// The transaction a request may write in, opened on first use. The HTTP layer puts a clone in
/// the extensions of every request it lets proceed on a
/// [`TransactionalStore`](super::TransactionalStore);
/// [`Guard::transaction`](crate::Guard::transaction) gives it to other callers.
#[derive(Clone)]
pub struct TransactionSlot(Arc<Mutex<Slot>>, Arc<Flags>);

/// What the request said of its transaction, outside the lock (a holder may be asking).
#[derive(Default)]
struct Flags {
    /// It was asked for while taken ([`TransactionError::InUse`]).
    misused: AtomicBool,
    /// [`TransactionSlot::discard_writes`]: roll the writes back, store the answer alone.
    discard: AtomicBool,
}

impl fmt::Debug for TransactionSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.0.try_lock().as_deref().map(|slot| &slot.state) {
            Ok(SlotState::Unopened(_)) => "unopened",
            Ok(SlotState::Open(_)) => "open",
            Ok(SlotState::Closed) => "closed",
            Err(_) => "in use",
        };
        f.debug_tuple("TransactionSlot").field(&state).finish()
    }
}

/// What the engine found in the slot when the request finished.
pub(crate) enum Taken {
    /// The handler never opened it.
    Unopened,
    /// The open transaction, now the engine's, and whether the handler asked for it.
    Open {
        tx: Box<dyn StoreTransaction>,
        used: bool,
    },
    /// The handler still holds it (it kept its [`Transaction`] past its response).
    Busy,
    /// It was closed already.
    Closed,
}

impl TransactionSlot {
    pub(crate) fn new(opener: Box<dyn Opener>) -> Self {
        Self::with_state(SlotState::Unopened(opener))
    }

    /// A slot whose transaction is already open (the one-transaction mode).
    pub(crate) fn opened(tx: Box<dyn StoreTransaction>) -> Self {
        Self::with_state(SlotState::Open(tx))
    }

    fn with_state(state: SlotState) -> Self {
        TransactionSlot(
            Arc::new(Mutex::new(Slot { state, used: false })),
            Arc::new(Flags::default()),
        )
    }

    /// The request's transaction as the store's transaction type `T` (for the PostgreSQL store,
    /// `idempotency_postgres::PostgresTransaction`), opening it on first use. Holds it until the
    /// returned [`Transaction`] is dropped; drop it before the handler returns.
    ///
    /// [`TransactionError::InUse`] at once while another [`Transaction`] of this request is
    /// alive: never a wait on a holder that is usually the caller itself.
    pub async fn open<T: StoreTransaction>(&self) -> Result<Transaction<T>, TransactionError> {
        let Ok(mut slot) = Arc::clone(&self.0).try_lock_owned() else {
            self.1.misused.store(true, Ordering::Relaxed);
            tracing::error!(
                "the request's idempotency transaction was asked for while it is already taken \
                 (two Tx extractors, or a helper opening it again): refused"
            );
            return Err(TransactionError::InUse);
        };
        slot.used = true;
        if let SlotState::Unopened(opener) = &slot.state {
            match opener.open().await {
                Ok(tx) => slot.state = SlotState::Open(tx),
                Err(error) => {
                    if matches!(error, TransactionError::LeaseLost) {
                        slot.state = SlotState::Closed;
                    }
                    return Err(error);
                }
            }
        }
        OwnedMutexGuard::try_map(slot, |slot| match &mut slot.state {
            SlotState::Open(tx) => tx.as_any_mut().downcast_mut::<T>(),
            _ => None,
        })
        .map(|tx| Transaction(tx, Arc::clone(&self.1)))
        .map_err(|slot| match &slot.state {
            SlotState::Open(_) => TransactionError::WrongType {
                expected: std::any::type_name::<T>(),
            },
            _ => TransactionError::Closed,
        })
    }

    /// Whether it was asked for while taken ([`TransactionError::InUse`]).
    pub(crate) fn was_misused(&self) -> bool {
        self.1.misused.load(Ordering::Relaxed)
    }

    /// Rolls back every write of the request's transaction when the request ends, and stores
    /// its answer (a response, a job's value) without them. For a permanent refusal decided
    /// after a statement failed: the failed statement aborted the transaction, which can then
    /// never commit, yet the refusal must be recorded so that every retry gets it without
    /// running again. Holds for whatever the request returns afterwards; the answer is still
    /// stored only if the replay policy stores its status (a job's value always is).
    ///
    /// The key stays held until the answer's record lands: a duplicate meanwhile is answered
    /// "in flight", never run (the store writes the record before its transaction lets the key
    /// go, or claims the key right after the rollback and answers with what stands if another
    /// request took it in between). A crash in between leaves the key free (nothing of the
    /// request exists), and its retry runs and refuses again.
    pub fn discard_writes(&self) {
        self.1.discard.store(true, Ordering::Relaxed);
    }

    /// Whether [`TransactionSlot::discard_writes`] was called.
    pub(crate) fn discards_writes(&self) -> bool {
        self.1.discard.load(Ordering::Relaxed)
    }

    /// Takes the transaction out for completion, waiting up to `wait` for the handler to let go
    /// of it; the slot is closed afterwards.
    pub(crate) async fn take(&self, wait: Duration) -> Taken {
        let Ok(mut slot) = tokio::time::timeout(wait, self.0.lock()).await else {
            return Taken::Busy;
        };
        let used = slot.used;
        match std::mem::replace(&mut slot.state, SlotState::Closed) {
            SlotState::Unopened(_) => Taken::Unopened,
            SlotState::Open(tx) => Taken::Open { tx, used },
            SlotState::Closed => Taken::Closed,
        }
    }
}

/// The request's open transaction, as the store's type `T`; it derefs to `T`, which gives the
/// handler its database handle. There is no commit: the engine commits it together with the
/// stored response after the handler returns, or rolls it back.
pub struct Transaction<T: 'static>(OwnedMappedMutexGuard<Slot, T>, Arc<Flags>);

impl<T: 'static> Transaction<T> {
    /// [`TransactionSlot::discard_writes`], from the transaction: every write of the request's
    /// transaction is rolled back when the request ends, and its answer stored alone (a
    /// refusal decided after some writes: the order's third item is out of stock).
    pub fn discard_writes(&self) {
        self.1.discard.store(true, Ordering::Relaxed);
    }
}

impl<T: 'static> Deref for Transaction<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: 'static> DerefMut for Transaction<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T: 'static> fmt::Debug for Transaction<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Transaction")
            .field(&std::any::type_name::<T>())
            .finish()
    }
}
