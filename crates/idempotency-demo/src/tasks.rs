//! Where tasks live: in memory, or in an ordinary (LOGGED) `tasks` table in PostgreSQL.

use idempotency::postgres::deadpool_postgres::{
    Manager, ManagerConfig, Pool, RecyclingMethod, Runtime,
};
use idempotency::postgres::tokio_postgres::{self, NoTls, Row};
use serde::Serialize;
use std::collections::HashMap;
use std::str::FromStr;
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

/// A task store failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskStoreError {
    /// PostgreSQL failed.
    #[error("task storage failed")]
    Postgres(#[source] Box<dyn std::error::Error + Send + Sync>),
}

fn pg<E: std::error::Error + Send + Sync + 'static>(e: E) -> TaskStoreError {
    TaskStoreError::Postgres(Box::new(e))
}

/// Tasks per user.
#[derive(Clone, Debug)]
pub enum TaskStore {
    /// In this process only.
    Memory(Arc<Mutex<HashMap<Uuid, Vec<Task>>>>),
    /// In the `tasks` table, shared by every process on the database.
    Postgres(Pool),
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

    /// Tasks in PostgreSQL at `url`; creates the table if missing.
    pub async fn postgres(url: &str) -> Result<Self, TaskStoreError> {
        let config = tokio_postgres::Config::from_str(url).map_err(pg)?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(16)
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(pg)?;
        let client = pool.get().await.map_err(pg)?;
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

    fn locked(
        map: &Mutex<HashMap<Uuid, Vec<Task>>>,
    ) -> std::sync::MutexGuard<'_, HashMap<Uuid, Vec<Task>>> {
        map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a task for `user`.
    pub async fn create(&self, user: Uuid, title: String) -> Result<Task, TaskStoreError> {
        let id = Uuid::new_v4();
        match self {
            TaskStore::Memory(map) => {
                let task = Task {
                    id,
                    title,
                    done: false,
                    created_at: humantime::format_rfc3339_micros(std::time::SystemTime::now())
                        .to_string(),
                };
                Self::locked(map)
                    .entry(user)
                    .or_default()
                    .push(task.clone());
                Ok(task)
            }
            TaskStore::Postgres(pool) => {
                let client = pool.get().await.map_err(pg)?;
                let row = client
                    .query_one(
                        &format!("INSERT INTO tasks (id, user_id, title) VALUES ($1, $2, $3) RETURNING {COLUMNS}"),
                        &[&id, &user, &title],
                    )
                    .await
                    .map_err(pg)?;
                Ok(task_from_row(&row))
            }
        }
    }

    /// The user's tasks, oldest first.
    pub async fn list(&self, user: Uuid) -> Result<Vec<Task>, TaskStoreError> {
        match self {
            TaskStore::Memory(map) => Ok(Self::locked(map).get(&user).cloned().unwrap_or_default()),
            TaskStore::Postgres(pool) => {
                let client = pool.get().await.map_err(pg)?;
                let rows = client
                    .query(
                        &format!(
                            "SELECT {COLUMNS} FROM tasks WHERE user_id = $1 ORDER BY created_at, id"
                        ),
                        &[&user],
                    )
                    .await
                    .map_err(pg)?;
                Ok(rows.iter().map(task_from_row).collect())
            }
        }
    }

    /// One of the user's tasks.
    pub async fn get(&self, user: Uuid, id: Uuid) -> Result<Option<Task>, TaskStoreError> {
        match self {
            TaskStore::Memory(map) => Ok(Self::locked(map)
                .get(&user)
                .and_then(|tasks| tasks.iter().find(|t| t.id == id).cloned())),
            TaskStore::Postgres(pool) => {
                let client = pool.get().await.map_err(pg)?;
                let row = client
                    .query_opt(
                        &format!("SELECT {COLUMNS} FROM tasks WHERE user_id = $1 AND id = $2"),
                        &[&user, &id],
                    )
                    .await
                    .map_err(pg)?;
                Ok(row.as_ref().map(task_from_row))
            }
        }
    }

    /// Changes the title and/or done flag of one of the user's tasks.
    pub async fn update(
        &self,
        user: Uuid,
        id: Uuid,
        title: Option<String>,
        done: Option<bool>,
    ) -> Result<Option<Task>, TaskStoreError> {
        match self {
            TaskStore::Memory(map) => {
                let mut map = Self::locked(map);
                let Some(task) = map
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
            TaskStore::Postgres(pool) => {
                let client = pool.get().await.map_err(pg)?;
                let row = client
                    .query_opt(
                        &format!(
                            "UPDATE tasks SET title = coalesce($3, title), done = coalesce($4, done) \
                             WHERE user_id = $1 AND id = $2 RETURNING {COLUMNS}"
                        ),
                        &[&user, &id, &title, &done],
                    )
                    .await
                    .map_err(pg)?;
                Ok(row.as_ref().map(task_from_row))
            }
        }
    }

    /// Deletes one of the user's tasks; false when there was none.
    pub async fn delete(&self, user: Uuid, id: Uuid) -> Result<bool, TaskStoreError> {
        match self {
            TaskStore::Memory(map) => {
                let mut map = Self::locked(map);
                let Some(tasks) = map.get_mut(&user) else {
                    return Ok(false);
                };
                let before = tasks.len();
                tasks.retain(|t| t.id != id);
                Ok(tasks.len() < before)
            }
            TaskStore::Postgres(pool) => {
                let client = pool.get().await.map_err(pg)?;
                let n = client
                    .execute(
                        "DELETE FROM tasks WHERE user_id = $1 AND id = $2",
                        &[&user, &id],
                    )
                    .await
                    .map_err(pg)?;
                Ok(n == 1)
            }
        }
    }
}
