//! The store: its shared state, its accessors, and the six primitives.

use crate::error::{BACKEND, pool_error, query_error, setup_error};
use crate::schema::{Sql, TableMode};
use crate::session::TokioSession;
use crate::table::{RecordColumns, Table, corrupt_field};
use async_trait::async_trait;
use deadpool_postgres::Pool;
use idempotency_core::{
    ClaimOutcome, FenceOutcome, Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Record,
    Scope, StoreError, StoredResponse, TransactionalStore,
};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::Row;

/// What every clone of a store shares.
pub(crate) struct Inner {
    pub(crate) table: Table,
    pub(crate) pool: Pool,
    pub(crate) transactions: bool,
    /// Statements prepared once per connection; off, sent unnamed (for transaction poolers).
    pub(crate) prepared: bool,
}

/// The PostgreSQL store. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.inner.table.name.qualified())
            .field("mode", &self.inner.table.mode)
            .finish_non_exhaustive()
    }
}

/// The SQL text of each store step; parameters are documented on each field.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct StatementsSql<'a> {
    /// `$1` scope, `$2` key, `$3` fingerprint bytes, `$4` token (uuid), `$5` lease seconds
    /// (float8).
    pub claim: &'a str,
    /// `$1` scope, `$2` key, `$3` token, `$4` status (int4), `$5` response bytes, `$6` retention
    /// seconds (float8).
    pub complete: &'a str,
    /// `$1` scope, `$2` key, `$3` token, `$4` lease seconds (float8).
    pub extend: &'a str,
    /// `$1` scope, `$2` key, `$3` token.
    pub release: &'a str,
    /// `$1` scope, `$2` key.
    pub get: &'a str,
    /// `$1` batch size (int8).
    pub purge: &'a str,
}

impl PostgresStore {
    /// The pool the store uses.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The table mode.
    pub fn table_mode(&self) -> TableMode {
        self.inner.table.mode
    }

    /// The SQL of each store step, as rendered for this table (for `EXPLAIN`, for DBAs, and for
    /// the benchmark that runs the same statements without the library).
    pub fn statements(&self) -> StatementsSql<'_> {
        self.inner.table.statements.sql()
    }

    /// Checks that the table still holds what it held: returns `true` (and logs an error and
    /// counts it in `idempotency_store_state_lost_total`) when the table was emptied since the
    /// last check, by crash recovery of an UNLOGGED table, a failover or a `TRUNCATE`. Pools built
    /// by the store run this on every new connection; call it periodically on a pool you passed
    /// in with [`PostgresStore::builder_from_pool`].
    pub async fn check_state(&self) -> Result<bool, StoreError> {
        let client = self.client().await?;
        self.inner
            .table
            .watch
            .check(&mut TokioSession(&**client))
            .await
            .map_err(setup_error)
    }

    /// How many times this store found its table emptied (see [`PostgresStore::check_state`]).
    pub fn state_losses(&self) -> u64 {
        self.inner.table.watch.losses.count()
    }

    /// The schema of the table.
    pub fn schema(&self) -> &str {
        &self.inner.table.name.schema
    }

    /// The quoted, schema-qualified table name.
    pub fn table_name(&self) -> String {
        self.inner.table.name.qualified()
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.inner.pool.get().await.map_err(pool_error)
    }

    /// Runs one fenced statement (complete, extend, release): applied when it changed the row.
    async fn fenced(
        &self,
        sql: &Sql,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<FenceOutcome, StoreError> {
        let client = self.client().await?;
        let rows = sql
            .execute(&client, params, self.inner.prepared)
            .await
            .map_err(query_error)?;
        Ok(FenceOutcome::from_count(rows))
    }
}

pub(crate) fn record_from_row(row: &Row, offset: usize) -> Result<Record, StoreError> {
    RecordColumns {
        request_hash: row
            .try_get(offset)
            .map_err(|_| corrupt_field("request_hash"))?,
        in_flight: row
            .try_get(offset + 1)
            .map_err(|_| corrupt_field("lease_token"))?,
        remaining_ms: row
            .try_get(offset + 2)
            .map_err(|_| corrupt_field("locked_until"))?,
        response: row
            .try_get(offset + 3)
            .map_err(|_| corrupt_field("response"))?,
    }
    .into_record()
}

#[async_trait]
impl IdempotencyStore for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let client = self.client().await?;
        let hash = fingerprint.to_bytes();
        let lease_secs = lease.as_secs_f64();
        // A row inserted by a transaction that committed after this statement's snapshot was
        // taken conflicts with our insert but is invisible to the read half, so the statement
        // returns nothing; the next attempt sees it. Bounded, and rare outside of races.
        for _ in 0..8 {
            let rows = self
                .inner
                .table
                .statements
                .claim
                .query(
                    &client,
                    &[
                        &scope.as_str(),
                        &key.as_str(),
                        &&hash[..],
                        &token.as_uuid(),
                        &lease_secs,
                    ],
                    self.inner.prepared,
                )
                .await
                .map_err(query_error)?;
            if let Some(row) = rows.first() {
                let claimed: bool = row.get(0);
                return if claimed {
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

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let encoded = response.encode();
        let status = i32::from(response.status().as_u16());
        let statement = &self.inner.table.statements.complete;
        self.fenced(
            statement,
            &[
                &scope.as_str(),
                &key.as_str(),
                &token.as_uuid(),
                &status,
                &&encoded[..],
                &retention.as_secs_f64(),
            ],
        )
        .await
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
        lease: Duration,
    ) -> Result<FenceOutcome, StoreError> {
        let statement = &self.inner.table.statements.extend;
        self.fenced(
            statement,
            &[
                &scope.as_str(),
                &key.as_str(),
                &token.as_uuid(),
                &lease.as_secs_f64(),
            ],
        )
        .await
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<FenceOutcome, StoreError> {
        let statement = &self.inner.table.statements.release;
        self.fenced(
            statement,
            &[&scope.as_str(), &key.as_str(), &token.as_uuid()],
        )
        .await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let client = self.client().await?;
        let rows = self
            .inner
            .table
            .statements
            .get
            .query(
                &client,
                &[&scope.as_str(), &key.as_str()],
                self.inner.prepared,
            )
            .await
            .map_err(query_error)?;
        rows.first().map(|row| record_from_row(row, 0)).transpose()
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.inner
            .table
            .statements
            .purge
            .execute(&client, &[&limit], self.inner.prepared)
            .await
            .map_err(query_error)
    }

    /// Unless turned off with [`PostgresStoreBuilder::transactions`](crate::PostgresStoreBuilder::transactions): a handler's writes and
    /// its stored response can commit in one transaction on the store's pool (see
    /// [`PgTransaction`](crate::PgTransaction)).
    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        if self.inner.transactions {
            Some(self)
        } else {
            None
        }
    }
}
