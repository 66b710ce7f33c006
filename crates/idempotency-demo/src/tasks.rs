//! Where tasks live: in memory, or in an ordinary (LOGGED) `tasks` table in PostgreSQL.
//!
//! Every write takes the request's idempotency transaction when there is one (`tx`): then the
//! task and the stored response commit together. Without one, a write goes to the task store on
//! its own.

use idempotency::PostgresTransaction;
use idempotency::postgres::deadpool_postgres::Pool;
use idempotency::postgres::tokio_postgres::{self, Client, Row};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use uuid::Uuid;

/// A task, as the API returns it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Task {
    /// The task's id.
    pub id: Uuid,
    /// Its title.
    pub title: String,
    /// Whether it is done.
    pub done: bool,
    /// When it was created (RFC 3339, UTC).
    pub created_at: String,
}

/// At most this many tasks per user in memory: a flood of creates from one user fills its own
/// list, not the process's memory.
pub const MAX_MEMORY_TASKS_PER_USER: usize = 1_000;
/// At most this many tasks in memory over all users (with titles of at most 200 characters,
/// some tens of MB).
pub const MAX_MEMORY_TASKS: usize = 100_000;

/// A task store failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskStoreError {
    /// The in-memory task list is full (for this user, or for everyone).
    #[error("the in-memory task list holds at most {limit} tasks {whose}")]
    Full {
        /// The limit reached.
        limit: usize,
        /// `per user` or `in all`.
        whose: &'static str,
    },
    /// PostgreSQL failed.
    #[error("task storage failed")]
    Postgres {
        /// The driver's or the pool's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        /// Whether the database could not be reached (down, restarting, out of connections):
        /// a retry later may succeed.
        unavailable: bool,
    },
}

impl TaskStoreError {
    /// Whether the database could not be reached, so a retry later may succeed.
    pub fn is_unavailable(&self) -> bool {
        match self {
            TaskStoreError::Postgres { unavailable, .. } => *unavailable,
            TaskStoreError::Full { .. } => false,
        }
    }

    /// Whether the request's transaction refused the statement because it was already aborted
    /// (SQLSTATE 25P02): in the speculative one-transaction mode, what a request whose key
    /// turned out taken gets; the layer answers it with the key's stored response.
    pub fn is_transaction_aborted(&self) -> bool {
        match self {
            TaskStoreError::Postgres { source, .. } => source
                .downcast_ref::<tokio_postgres::Error>()
                .and_then(tokio_postgres::Error::code)
                .is_some_and(|code| {
                    *code == tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION
                }),
            TaskStoreError::Full { .. } => false,
        }
    }
}

/// A statement failed: unavailable when the connection is gone or the server cannot serve now.
fn pg(e: tokio_postgres::Error) -> TaskStoreError {
    let class = e.code().map(|c| &c.code()[..2]);
    let unavailable = e.is_closed() || matches!(class, None | Some("08" | "53" | "57"));
    TaskStoreError::Postgres {
        source: Box::new(e),
        unavailable,
    }
}

/// No connection could be had: the database is unavailable.
fn pool<E: std::error::Error + Send + Sync + 'static>(e: E) -> TaskStoreError {
    TaskStoreError::Postgres {
        source: Box::new(e),
        unavailable: true,
    }
}

/// Tasks per user.
#[derive(Clone, Debug)]
pub enum TaskStore {
    /// In this process only, bounded ([`MAX_MEMORY_TASKS_PER_USER`], [`MAX_MEMORY_TASKS`]).
    Memory(Arc<Mutex<MemoryTasks>>),
    /// In the `tasks` table, shared by every process on the database.
    Postgres(Pool),
}

/// The tasks kept in memory, per user, and how many there are in all.
#[derive(Debug, Default)]
pub struct MemoryTasks {
    by_user: HashMap<Uuid, Vec<Task>>,
    count: usize,
}

const COLUMNS: &str =
    "id, title, done, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')";

fn task_from_row(row: &Row) -> Task {
    Task {
        id: row.get(0),
        title: row.get(1),
        done: row.get(2),
        created_at: row.get(3),
    }
}

impl TaskStore {
    /// Tasks in this process.
    pub fn memory() -> Self {
        TaskStore::Memory(Arc::default())
    }

    /// Tasks in PostgreSQL on `pool` (the idempotency store's, so TLS and pooler settings are
    /// the same); creates the table if missing.
    pub async fn postgres(pool: Pool) -> Result<Self, TaskStoreError> {
        let client = pool.get().await.map_err(self::pool)?;
        client
            .batch_execute(
                "BEGIN;
                 SELECT pg_advisory_xact_lock(hashtext('idempotency-demo tasks'));
                 CREATE TABLE IF NOT EXISTS tasks (
                     id uuid PRIMARY KEY,
                     user_id uuid NOT NULL,
                     title text NOT NULL,
                     done boolean NOT NULL DEFAULT false,
                     created_at timestamptz NOT NULL DEFAULT now());
                 CREATE INDEX IF NOT EXISTS tasks_user_id_idx ON tasks (user_id, created_at);
                 COMMIT;",
            )
            .await
            .map_err(pg)?;
        drop(client);
        Ok(TaskStore::Postgres(pool))
    }

    fn locked(map: &Mutex<MemoryTasks>) -> std::sync::MutexGuard<'_, MemoryTasks> {
        map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a task for `user`, in `tx` when given.
    pub async fn create(
        &self,
        tx: Option<&PostgresTransaction>,
        user: Uuid,
        title: String,
    ) -> Result<Task, TaskStoreError> {
        let id = Uuid::new_v4();
        match (tx, self) {
            (Some(tx), _) => sql::create(tx, id, user, &title).await,
            (None, TaskStore::Postgres(pool)) => {
                sql::create(&*pool.get().await.map_err(self::pool)?, id, user, &title).await
            }
            (None, TaskStore::Memory(map)) => {
                let task = Task {
                    id,
                    title,
                    done: false,
                    created_at: humantime::format_rfc3339_micros(std::time::SystemTime::now())
                        .to_string(),
                };
                let mut map = Self::locked(map);
                if map.count >= MAX_MEMORY_TASKS {
                    return Err(TaskStoreError::Full {
                        limit: MAX_MEMORY_TASKS,
                        whose: "in all",
                    });
                }
                let tasks = map.by_user.entry(user).or_default();
                if tasks.len() >= MAX_MEMORY_TASKS_PER_USER {
                    return Err(TaskStoreError::Full {
                        limit: MAX_MEMORY_TASKS_PER_USER,
                        whose: "per user",
                    });
                }
                tasks.push(task.clone());
                map.count += 1;
                Ok(task)
            }
        }
    }

    /// The user's tasks, oldest first.
    pub async fn list(&self, user: Uuid) -> Result<Vec<Task>, TaskStoreError> {
        match self {
            TaskStore::Memory(map) => Ok(Self::locked(map)
                .by_user
                .get(&user)
                .cloned()
                .unwrap_or_default()),
            TaskStore::Postgres(pool) => {
                sql::list(&*pool.get().await.map_err(self::pool)?, user).await
            }
        }
    }

    /// One of the user's tasks.
    pub async fn get(&self, user: Uuid, id: Uuid) -> Result<Option<Task>, TaskStoreError> {
        match self {
            TaskStore::Memory(map) => Ok(Self::locked(map)
                .by_user
                .get(&user)
                .and_then(|tasks| tasks.iter().find(|t| t.id == id).cloned())),
            TaskStore::Postgres(pool) => {
                sql::get(&*pool.get().await.map_err(self::pool)?, user, id).await
            }
        }
    }

    /// Changes the title and/or done flag of one of the user's tasks, in `tx` when given.
    pub async fn update(
        &self,
        tx: Option<&PostgresTransaction>,
        user: Uuid,
        id: Uuid,
        title: Option<String>,
        done: Option<bool>,
    ) -> Result<Option<Task>, TaskStoreError> {
        match (tx, self) {
            (Some(tx), _) => sql::update(tx, user, id, title, done).await,
            (None, TaskStore::Postgres(pool)) => {
                let client = pool.get().await.map_err(self::pool)?;
                sql::update(&client, user, id, title, done).await
            }
            (None, TaskStore::Memory(map)) => {
                let mut map = Self::locked(map);
                let Some(task) = map
                    .by_user
                    .get_mut(&user)
                    .and_then(|t| t.iter_mut().find(|t| t.id == id))
                else {
                    return Ok(None);
                };
                if let Some(title) = title {
                    task.title = title;
                }
                if let Some(done) = done {
                    task.done = done;
                }
                Ok(Some(task.clone()))
            }
        }
    }

    /// Deletes one of the user's tasks, in `tx` when given; false when there was none.
    pub async fn delete(
        &self,
        tx: Option<&PostgresTransaction>,
        user: Uuid,
        id: Uuid,
    ) -> Result<bool, TaskStoreError> {
        match (tx, self) {
            (Some(tx), _) => sql::delete(tx, user, id).await,
            (None, TaskStore::Postgres(pool)) => {
                sql::delete(&*pool.get().await.map_err(self::pool)?, user, id).await
            }
            (None, TaskStore::Memory(map)) => {
                let mut map = Self::locked(map);
                let Some(tasks) = map.by_user.get_mut(&user) else {
                    return Ok(false);
                };
                let before = tasks.len();
                tasks.retain(|t| t.id != id);
                let deleted = tasks.len() < before;
                if tasks.is_empty() {
                    map.by_user.remove(&user);
                }
                if deleted {
                    map.count -= 1;
                }
                Ok(deleted)
            }
        }
    }
}

/// The statements, on any connection: a pooled one, or the request's transaction. Each is sent
/// unnamed with its parameter types (`query_typed`), so it works behind a connection pooler in
/// transaction mode too.
mod sql {
    use super::{COLUMNS, Client, Task, TaskStoreError, pg, task_from_row};
    use idempotency::postgres::tokio_postgres::types::Type;
    use uuid::Uuid;

    pub(super) async fn create(
        client: &Client,
        id: Uuid,
        user: Uuid,
        title: &str,
    ) -> Result<Task, TaskStoreError> {
        let row = client
            .query_typed_one(
                &format!(
                    "INSERT INTO tasks (id, user_id, title) VALUES ($1, $2, $3) RETURNING {COLUMNS}"
                ),
                &[(&id, Type::UUID), (&user, Type::UUID), (&title, Type::TEXT)],
            )
            .await
            .map_err(pg)?;
        Ok(task_from_row(&row))
    }

    pub(super) async fn list(client: &Client, user: Uuid) -> Result<Vec<Task>, TaskStoreError> {
        let rows = client
            .query_typed(
                &format!("SELECT {COLUMNS} FROM tasks WHERE user_id = $1 ORDER BY created_at, id"),
                &[(&user, Type::UUID)],
            )
            .await
            .map_err(pg)?;
        Ok(rows.iter().map(task_from_row).collect())
    }

    pub(super) async fn get(
        client: &Client,
        user: Uuid,
        id: Uuid,
    ) -> Result<Option<Task>, TaskStoreError> {
        let row = client
            .query_typed_opt(
                &format!("SELECT {COLUMNS} FROM tasks WHERE user_id = $1 AND id = $2"),
                &[(&user, Type::UUID), (&id, Type::UUID)],
            )
            .await
            .map_err(pg)?;
        Ok(row.as_ref().map(task_from_row))
    }

    pub(super) async fn update(
        client: &Client,
        user: Uuid,
        id: Uuid,
        title: Option<String>,
        done: Option<bool>,
    ) -> Result<Option<Task>, TaskStoreError> {
        let row = client
            .query_typed_opt(
                &format!(
                    "UPDATE tasks SET title = coalesce($3, title), done = coalesce($4, done) \
                     WHERE user_id = $1 AND id = $2 RETURNING {COLUMNS}"
                ),
                &[
                    (&user, Type::UUID),
                    (&id, Type::UUID),
                    (&title, Type::TEXT),
                    (&done, Type::BOOL),
                ],
            )
            .await
            .map_err(pg)?;
        Ok(row.as_ref().map(task_from_row))
    }

    pub(super) async fn delete(
        client: &Client,
        user: Uuid,
        id: Uuid,
    ) -> Result<bool, TaskStoreError> {
        let n = client
            .execute_typed(
                "DELETE FROM tasks WHERE user_id = $1 AND id = $2",
                &[(&user, Type::UUID), (&id, Type::UUID)],
            )
            .await
            .map_err(pg)?;
        Ok(n == 1)
    }
}
