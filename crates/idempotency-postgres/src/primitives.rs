//! The store's six primitives, written once over a [`Driver`]: what every clone of a store
//! shares ([`StoreCore`]) and each operation as one of the table's statements.

use crate::driver::{Driver, DriverRow, Param, Undo, record_from_row};
use crate::error::BACKEND;
use crate::schema::Sql;
use crate::table::Table;
use idempotency_core::store::{ClaimOutcome, FenceOutcome, Footprint, Record, SettleListener};
use idempotency_core::{
    Fingerprint, IdempotencyKey, LeaseToken, Scope, StoreError, StoredResponse,
};
use std::sync::Arc;
use std::time::Duration;

/// What every clone of a store shares, whatever its driver.
pub(crate) struct StoreCore<D> {
    pub(crate) table: Table,
    pub(crate) driver: D,
    /// Whether the store offers the request's transaction.
    pub(crate) transactions: bool,
    /// The session that hears of other instances' settles of waited-for keys.
    pub(crate) listener: SettleListener,
}

impl<D: Driver> StoreCore<D> {
    /// Runs one fenced statement (complete, extend, release): applied when it changed the row.
    async fn fenced(&self, sql: &Sql, params: &[Param<'_>]) -> Result<FenceOutcome, StoreError> {
        let changed = self.driver.execute(sql, params).await?;
        Ok(FenceOutcome::from_count(changed))
    }

    /// See [`IdempotencyStore::claim`](idempotency_core::IdempotencyStore::claim).
    pub(crate) async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let hash = fingerprint.to_bytes();
        let params = [
            Param::Text(scope.as_str()),
            Param::Text(key.as_str()),
            Param::Bytes(&hash[..]),
            Param::Uuid(token.as_uuid()),
            Param::Float8(lease.as_secs_f64()),
        ];
        // If the engine stops waiting (its timeout), the claim may still land: its release
        // follows it on its own connection, so it runs after the claim, never before.
        // The release's parameters: scope, key, token.
        let release_params = [params[0], params[1], params[3]];
        let undo = Undo {
            sql: &self.table.statements.release,
            params: &release_params,
        };
        // A row inserted by a transaction that committed after this statement's snapshot was
        // taken conflicts with our insert but is invisible to the read half, so the statement
        // returns nothing; the next attempt sees it. Bounded, and rare outside of races.
        for _ in 0..8 {
            let rows = self
                .driver
                .query_or_undo(&self.table.statements.claim, &params, undo)
                .await?;
            if let Some(row) = rows.first() {
                return if row.bool(0)? {
                    Ok(ClaimOutcome::Claimed)
                } else {
                    record_from_row(row, 1).map(ClaimOutcome::Existing)
                };
            }
        }
        Err(StoreError::Unavailable {
            backend: BACKEND,
            source: "the claim kept racing with concurrent claims of the same key".into(),
        })
    }

    /// See [`IdempotencyStore::complete`](idempotency_core::IdempotencyStore::complete).
    pub(crate) async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let encoded = response.encode();
        self.fenced(
            &self.table.statements.complete,
            &[
                Param::Text(scope.as_str()),
                Param::Text(key.as_str()),
                Param::Uuid(token.as_uuid()),
                Param::Int4(i32::from(response.status().as_u16())),
                Param::Bytes(&encoded[..]),
                Param::Float8(retention.as_secs_f64()),
            ],
        )
        .await
    }

    /// See [`IdempotencyStore::extend`](idempotency_core::IdempotencyStore::extend).
    pub(crate) async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        self.fenced(
            &self.table.statements.extend,
            &[
                Param::Text(scope.as_str()),
                Param::Text(key.as_str()),
                Param::Uuid(token.as_uuid()),
                Param::Float8(lease.as_secs_f64()),
            ],
        )
        .await
    }

    /// See [`IdempotencyStore::release`](idempotency_core::IdempotencyStore::release).
    pub(crate) async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        self.fenced(
            &self.table.statements.release,
            &[
                Param::Text(scope.as_str()),
                Param::Text(key.as_str()),
                Param::Uuid(token.as_uuid()),
            ],
        )
        .await
    }

    /// Makes sure the store's listening session is open (see
    /// [`SettleListener::ensure`]): `Ok(false)` when the store cannot open one.
    async fn listen(&self) -> Result<bool, StoreError> {
        let channel = &self.table.statements.channel;
        self.listener
            .ensure(|notices, stop| async move {
                let opened = self.driver.listen(channel, notices, stop).await?;
                if !opened {
                    tracing::info!(
                        "the store cannot open a listening session (it was built on an \
                         application's deadpool pool, or a transaction-mode pooler is in \
                         front): duplicates waiting on another instance poll for its answer"
                    );
                }
                Ok(opened)
            })
            .await
    }

    /// See [`IdempotencyStore::watch_settle`](idempotency_core::IdempotencyStore::watch_settle):
    /// listening first, so that a settle after the mark is heard.
    pub(crate) async fn watch_settle(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<(), StoreError> {
        if !self.listen().await? {
            return Ok(());
        }
        let params = [Param::Text(scope.as_str()), Param::Text(key.as_str())];
        self.driver
            .execute(&self.table.statements.watch, &params)
            .await?;
        Ok(())
    }

    /// See [`TransactionalStore::watch_transaction`](idempotency_core::store::TransactionalStore::watch_transaction):
    /// listening first, so that the commit the watch asks for is heard.
    pub(crate) async fn watch_transaction(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<(), StoreError> {
        if !self.transactions || !self.listen().await? {
            return Ok(());
        }
        let params = [Param::Text(scope.as_str()), Param::Text(key.as_str())];
        self.driver
            .execute(&self.table.statements.watch_transaction, &params)
            .await?;
        Ok(())
    }

    /// See [`TransactionalStore::listen_for_watches`](idempotency_core::store::TransactionalStore::listen_for_watches):
    /// the listening session opened in a task of its own, at most one try a second.
    pub(crate) fn listen_for_watches(self: &Arc<Self>) {
        if !self.transactions || !self.listener.open_in_background() {
            return;
        }
        let core = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(error) = core.listen().await {
                tracing::debug!(
                    error = %idempotency_core::ErrorChain(&error),
                    "could not open the listening session that hears waiting duplicates; \
                     they poll"
                );
            }
        });
    }

    /// See [`IdempotencyStore::get`](idempotency_core::IdempotencyStore::get).
    pub(crate) async fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<Record>, StoreError> {
        let params = [Param::Text(scope.as_str()), Param::Text(key.as_str())];
        let rows = self
            .driver
            .query(&self.table.statements.get, &params)
            .await?;
        rows.first().map(|row| record_from_row(row, 0)).transpose()
    }

    /// See [`IdempotencyStore::purge_expired`](idempotency_core::IdempotencyStore::purge_expired).
    pub(crate) async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let purged = self
            .driver
            .execute(&self.table.statements.purge, &[Param::Int8(limit)])
            .await?;
        Ok(purged)
    }

    /// See [`IdempotencyStore::footprint`](idempotency_core::IdempotencyStore::footprint): the
    /// catalog's figures, one round trip that reads no row of the table.
    pub(crate) async fn footprint(&self) -> Result<Option<Footprint>, StoreError> {
        let rows = self
            .driver
            .query(&self.table.statements.footprint, &[])
            .await?;
        let Some(row) = rows.first() else {
            return Err(StoreError::Backend {
                backend: BACKEND,
                source: "the key table's row in pg_class did not come back".into(),
            });
        };
        let records = u64::try_from(row.int8(0)?).ok();
        let bytes = u64::try_from(row.int8(1)?).ok();
        Ok(Some(Footprint::new(records, bytes)))
    }
}
