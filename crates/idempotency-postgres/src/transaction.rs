//! Transactional completion: the handler writes in a transaction on the store's pool, and the
//! stored response commits in the same transaction.

use crate::error::{BACKEND, pool_error, query_error};
use crate::store::{Inner, PostgresStore, record_from_row};
use async_trait::async_trait;
use deadpool_postgres::{ClientWrapper, Object};
use idempotency_core::{
    CommitOutcome, CorruptRecord, Fingerprint, IdempotencyKey, KeyedBegin, LeaseToken, Scope,
    StoreError, StoreTransaction, StoredResponse, TransactionalStore,
};
use std::any::Any;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::error::SqlState;

/// A request's transaction on the PostgreSQL store's pool: the handler's writes and its stored
/// response commit together, or not at all.
///
/// It derefs to the pooled connection ([`ClientWrapper`], which derefs to
/// [`tokio_postgres::Client`]), so a handler runs `query`, `execute`, `prepare_cached` and the
/// rest on it, inside the transaction. It offers no way to commit: the layer commits after the
/// handler returns, storing the response in the same transaction, after checking under the
/// record's row lock that this request still holds its key. Do not run `COMMIT` or `ROLLBACK`
/// yourself: the completion notices, stores nothing, and answers 500.
///
/// In an axum handler, take it as `idempotency::Tx<PgTransaction>` (feature `axum`); elsewhere,
/// open it from the request's `TransactionSlot` extension:
///
/// ```no_run
/// # async fn handler(request: idempotency_core::http::Request<()>) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_core::TransactionSlot;
/// use idempotency_postgres::PgTransaction;
///
/// let slot = request.extensions().get::<TransactionSlot>().ok_or("no idempotency transaction")?;
/// let tx = slot.open::<PgTransaction>().await?;
/// tx.execute("INSERT INTO tasks (title) VALUES ($1)", &[&"Buy milk"]).await?;
/// drop(tx); // before returning the response
/// # Ok(()) }
/// ```
///
/// The transaction runs at PostgreSQL's default isolation, READ COMMITTED (the store's check is
/// its first statement, so it cannot be changed afterwards).
pub struct PgTransaction {
    /// The connection, inside the transaction; taken when the transaction ends.
    client: Option<Object>,
    store: Arc<Inner>,
    scope: Scope,
    key: IdempotencyKey,
    token: LeaseToken,
    /// In the one-transaction mode, what the completion inserts. `None` in the lease mode,
    /// where a claim record is completed.
    keyed: Option<Keyed>,
}

/// What a one-transaction-mode transaction inserts at commit time.
#[derive(Clone, Copy)]
struct Keyed {
    /// The request's fingerprint.
    fingerprint: Fingerprint,
    /// The lookup saw an expired row of the key: the insert takes it over.
    takeover: bool,
    /// The transaction's start (`now()` in it), read at `BEGIN`: the insert checks that it
    /// still runs in that transaction.
    began: std::time::SystemTime,
}

impl fmt::Debug for PgTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTransaction")
            .field("table", &self.store.table.name.qualified())
            .field("open", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

impl Deref for PgTransaction {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        match &self.client {
            Some(client) => client,
            None => unreachable!("the connection is only taken when the transaction is consumed"),
        }
    }
}

impl PgTransaction {
    fn client(&self) -> &ClientWrapper {
        self
    }

    /// Ends the transaction's use of its connection; it goes back to the pool.
    fn finish(&mut self) {
        self.client = None;
    }

    /// Rolls back, then returns the connection to the pool; a connection that cannot roll
    /// back is closed instead (which ends the transaction on the server).
    async fn roll_back(&mut self) -> Result<(), StoreError> {
        let Some(client) = self.client.take() else {
            return Ok(());
        };
        match client.batch_execute("ROLLBACK").await {
            Ok(()) => Ok(()),
            Err(error) => {
                drop(Object::take(client));
                Err(query_error(error))
            }
        }
    }

    /// After a refused completion: whether the token still holds a live claim (then the
    /// handler ended the store's transaction) or not (the lease was lost).
    async fn refusal_cause(&self) -> Result<CommitOutcome, StoreError> {
        let rows = self
            .store
            .table
            .statements
            .tx_diagnose
            .query(
                self.client(),
                &[
                    &self.scope.as_str(),
                    &self.key.as_str(),
                    &self.token.as_uuid(),
                ],
                self.store.prepared,
            )
            .await
            .map_err(query_error)?;
        let still_ours = rows.first().and_then(|row| row.get::<_, Option<bool>>(0)) == Some(true);
        Ok(if still_ours {
            CommitOutcome::EndedByHandler
        } else {
            CommitOutcome::LeaseLost
        })
    }

    /// One-transaction mode: inserts the completed record and commits, pipelined.
    async fn insert_and_commit(
        &mut self,
        keyed: Keyed,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<CommitOutcome, StoreError> {
        let client = self.client();
        let statements = &self.store.table.statements;
        let sql = if keyed.takeover {
            &statements.keyed_takeover
        } else {
            &statements.keyed_insert
        };
        let insert = sql
            .ready(client, self.store.prepared)
            .await
            .map_err(query_error)?;
        let encoded = response.encode();
        let hash = keyed.fingerprint.to_bytes();
        let status = i32::from(response.status().as_u16());
        let retention = retention.as_secs_f64();
        let (scope, key) = (self.scope.as_str(), self.key.as_str());
        let (hash, body) = (&hash[..], &encoded[..]);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
            &scope,
            &key,
            &hash,
            &keyed.began,
            &status,
            &body,
            &retention,
        ];
        let (inserted, committed) = tokio::join!(
            insert.query(client, &params),
            client.batch_execute("COMMIT")
        );
        let refused = |error: &tokio_postgres::Error| {
            [SqlState::DIVISION_BY_ZERO, SqlState::UNIQUE_VIOLATION]
                .iter()
                .find(|&code| error.code() == Some(code))
                .cloned()
        };
        match inserted {
            Ok(rows) if rows.len() == 1 => {
                let committed = committed.map_err(query_error);
                self.finish();
                committed.map(|()| CommitOutcome::Committed)
            }
            Ok(_) => {
                self.finish();
                Err(StoreError::corrupt(
                    BACKEND,
                    CorruptRecord::Field("the completion returned no row or several"),
                ))
            }
            Err(error) if let Some(code) = refused(&error) => {
                // Rolled back by the COMMIT behind it. Whose record stands, if any?
                let record = statements
                    .get
                    .query(client, &[&scope, &key], self.store.prepared)
                    .await
                    .map_err(query_error);
                self.finish();
                match record?.first() {
                    Some(row) => record_from_row(row, 0).map(CommitOutcome::Superseded),
                    // The unique index refused a row that is no longer live (it expired in
                    // between): nothing was written, the retry takes it over.
                    None if code == SqlState::UNIQUE_VIOLATION => Err(StoreError::Unavailable {
                        backend: BACKEND,
                        source: Box::new(error),
                    }),
                    // Nothing stands: the mark was gone, the handler ended the transaction.
                    None => Ok(CommitOutcome::EndedByHandler),
                }
            }
            Err(error) => {
                self.finish();
                Err(query_error(error))
            }
        }
    }
}

impl Drop for PgTransaction {
    /// A transaction dropped before it ended (a panic, a cancelled request) must not go back to
    /// the pool open: it is rolled back in the background, or its connection is closed.
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if client.batch_execute("ROLLBACK").await.is_err() {
                        drop(Object::take(client));
                    }
                });
            }
            Err(_) => drop(Object::take(client)),
        }
    }
}

#[async_trait]
impl StoreTransaction for PgTransaction {
    async fn complete_and_commit(
        mut self: Box<Self>,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<CommitOutcome, StoreError> {
        if let Some(keyed) = self.keyed {
            return self.insert_and_commit(keyed, response, retention).await;
        }
        let client = self.client();
        // Ready (prepared) before the pipeline: the completion must go out before the COMMIT.
        let complete = self
            .store
            .table
            .statements
            .tx_complete
            .ready(client, self.store.prepared)
            .await
            .map_err(query_error)?;
        let encoded = response.encode();
        let status = i32::from(response.status().as_u16());
        let retention = retention.as_secs_f64();
        let (scope, key, token) = (self.scope.as_str(), self.key.as_str(), self.token.as_uuid());
        let body = &encoded[..];
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
            [&scope, &key, &token, &status, &body, &retention];
        // One round trip: the completion and the COMMIT are pipelined. A refused completion
        // aborts the transaction, so the COMMIT behind it rolls back.
        let (completed, committed) = tokio::join!(
            complete.query(client, &params),
            client.batch_execute("COMMIT")
        );
        match completed {
            Ok(rows) if rows.len() == 1 => {
                let committed = committed.map_err(query_error);
                self.finish();
                committed.map(|()| CommitOutcome::Committed)
            }
            Ok(rows) => {
                self.finish();
                Err(StoreError::corrupt(
                    BACKEND,
                    idempotency_core::CorruptRecord::Field(if rows.is_empty() {
                        "the completion returned no row"
                    } else {
                        "the completion returned several rows"
                    }),
                ))
            }
            Err(error) if error.code() == Some(&SqlState::DIVISION_BY_ZERO) => {
                let cause = self.refusal_cause().await;
                self.finish();
                cause
            }
            Err(error) => {
                self.finish();
                Err(query_error(error))
            }
        }
    }

    async fn rollback(mut self: Box<Self>) -> Result<(), StoreError> {
        self.roll_back().await
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

#[async_trait]
impl TransactionalStore for PostgresStore {
    async fn begin_transaction(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: LeaseToken,
    ) -> Result<Option<Box<dyn StoreTransaction>>, StoreError> {
        let client = self.inner.pool.get().await.map_err(pool_error)?;
        // Ready (prepared) before the pipeline, which must send BEGIN first.
        let check = self
            .inner
            .table
            .statements
            .tx_check
            .ready(&client, self.inner.prepared)
            .await
            .map_err(query_error)?;
        // From here on, dropping `tx` (an error below, or this future cancelled by a timeout)
        // rolls the connection back before it returns to the pool.
        let mut tx = PgTransaction {
            client: Some(client),
            store: Arc::clone(&self.inner),
            scope: scope.clone(),
            key: key.clone(),
            token,
            keyed: None,
        };
        let client = tx.client();
        let (scope_str, key_str, token_uuid) = (scope.as_str(), key.as_str(), token.as_uuid());
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&scope_str, &key_str, &token_uuid];
        // One round trip: BEGIN and the check are pipelined.
        let (begun, checked) =
            tokio::join!(client.batch_execute("BEGIN"), check.query(client, &params));
        begun.map_err(query_error)?;
        if !checked.map_err(query_error)?.is_empty() {
            return Ok(Some(Box::new(tx)));
        }
        tracing::debug!(
            backend = BACKEND,
            "the claim was lost before its transaction opened"
        );
        tx.roll_back().await?;
        Ok(None)
    }

    fn supports_one_transaction(&self) -> bool {
        self.inner.transactions
    }

    async fn begin_keyed(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        token: LeaseToken,
    ) -> Result<KeyedBegin, StoreError> {
        let client = self.inner.pool.get().await.map_err(pool_error)?;
        // Ready (prepared) before the pipeline, which must send BEGIN first.
        let read = self
            .inner
            .table
            .statements
            .keyed_begin
            .ready(&client, self.inner.prepared)
            .await
            .map_err(query_error)?;
        // From here on, dropping `tx` (an error below, a duplicate's answer, or this future
        // cancelled) rolls the connection back in the background before it returns to the pool:
        // a replay does not wait for that round trip.
        let mut tx = PgTransaction {
            client: Some(client),
            store: Arc::clone(&self.inner),
            scope: scope.clone(),
            key: key.clone(),
            token,
            keyed: None,
        };
        let client = tx.client();
        let (scope_str, key_str) = (scope.as_str(), key.as_str());
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&scope_str, &key_str];
        // One round trip: BEGIN and the read are pipelined.
        let (begun, read) =
            tokio::join!(client.batch_execute("BEGIN"), read.query(client, &params));
        begun.map_err(query_error)?;
        let rows = read.map_err(query_error)?;
        let Some(row) = rows.first() else {
            return Err(StoreError::corrupt(
                BACKEND,
                CorruptRecord::Field("the key's lookup returned no row"),
            ));
        };
        let locked: bool = row
            .try_get(0)
            .map_err(|_| crate::table::corrupt_field("locked"))?;
        let began: std::time::SystemTime = row
            .try_get(1)
            .map_err(|_| crate::table::corrupt_field("now()"))?;
        let live: Option<bool> = row
            .try_get(2)
            .map_err(|_| crate::table::corrupt_field("expires_at"))?;
        if live == Some(true) {
            return record_from_row(row, 3).map(KeyedBegin::Existing);
        }
        if !locked {
            return Ok(KeyedBegin::Busy);
        }
        tx.keyed = Some(Keyed {
            fingerprint: *fingerprint,
            takeover: live == Some(false),
            began,
        });
        Ok(KeyedBegin::Absent(Box::new(tx)))
    }
}
