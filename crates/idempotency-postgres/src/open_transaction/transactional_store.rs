//! The PostgreSQL store as a [`TransactionalStore`]: each claim mode's begin, and the key's
//! transaction looked up without taking it.

use super::PostgresTransaction;
use super::one_transaction::Begun;
use crate::driver::{Driver, DriverRow, Param};
use crate::error::BACKEND;
use crate::store::PostgresStore;
use idempotency_core::store::{
    CorruptRecord, OneTransactionBegin, StoreTransaction, TransactionalStore,
};
use idempotency_core::{Fingerprint, IdempotencyKey, LeaseToken, Scope, StoreError};
use std::time::Duration;

#[async_trait::async_trait]
impl<D: Driver> TransactionalStore for PostgresStore<D> {
    async fn begin_transaction(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        hold: Duration,
    ) -> Result<Option<Box<dyn StoreTransaction>>, StoreError> {
        let open = self
            .inner
            .begin_transaction(scope, key, token, hold)
            .await?;
        Ok(open.map(|tx| Box::new(PostgresTransaction(tx)) as Box<dyn StoreTransaction>))
    }

    fn supports_one_transaction(&self) -> bool {
        self.inner.transactions
    }

    async fn held_by_transaction(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<bool, StoreError> {
        if !self.inner.transactions {
            return Ok(false);
        }
        let statements = &self.inner.table.statements;
        let id = statements.lock_id(scope.as_str(), key.as_str());
        let rows = self
            .inner
            .driver
            .query(&statements.held_by_transaction, &[Param::Int8(id)])
            .await?;
        match rows.first() {
            Some(row) => row.bool(0),
            None => Err(StoreError::corrupt(
                BACKEND,
                CorruptRecord::Field("the look at the key's lock returned no row"),
            )),
        }
    }

    async fn watch_transaction(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<(), StoreError> {
        self.inner.watch_transaction(scope, key).await
    }

    fn listen_for_watches(&self) {
        self.inner.listen_for_watches();
    }

    fn supports_speculative(&self) -> bool {
        self.inner.transactions && self.inner.driver.queues_statements()
    }

    async fn begin_one_transaction(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        hold: Duration,
    ) -> Result<OneTransactionBegin, StoreError> {
        self.inner
            .begin_one_transaction(scope, key, fingerprint, token, hold)
            .await
            .map(Begun::into_one_transaction_begin)
    }

    async fn begin_one_transaction_speculative(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        hold: Duration,
    ) -> Result<OneTransactionBegin, StoreError> {
        self.inner
            .begin_one_transaction_speculative(scope, key, fingerprint, token, hold)
            .await
            .map(Begun::into_one_transaction_begin)
    }
}
