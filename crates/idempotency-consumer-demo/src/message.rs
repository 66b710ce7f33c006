//! What a "create task" message carries, and how a delivery is read into one.

use idempotency::{IdempotencyKey, KeyFormat, Scope};
use lapin::message::Delivery;
use serde::{Deserialize, Serialize};

/// The body of a "create task" message (JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTask {
    /// The user the task belongs to: the message's scope, so one user's keys never meet
    /// another's.
    pub user: String,
    /// The task's title: 1 to 200 characters.
    pub title: String,
}

/// The stored result of a message: the task's id, or why it was refused. A refusal is a
/// result, not an error: it is stored and every duplicate gets it back.
pub type TaskResult = Result<i64, String>;

impl CreateTask {
    /// The longest title accepted.
    pub const MAX_TITLE: usize = 200;

    /// Whether the task can be created; `Err` says why not (a permanent refusal).
    pub fn check(&self) -> Result<(), String> {
        let length = self.title.chars().count();
        if length == 0 || length > Self::MAX_TITLE {
            return Err(format!(
                "a title has 1 to {} characters, this one has {length}",
                Self::MAX_TITLE
            ));
        }
        Ok(())
    }
}

/// A delivery read into what [`Engine::once`](idempotency::Engine::once) needs.
#[derive(Debug)]
pub struct Message {
    /// The key: the message's `message_id` property.
    pub key: IdempotencyKey,
    /// The scope: the task's user.
    pub scope: Scope,
    /// The task.
    pub task: CreateTask,
}

impl Message {
    /// Reads `delivery`; `Err` says why it cannot be processed at all (a poison message: no
    /// `message_id`, a body that is not a task, a user that is not a valid scope).
    pub fn read(delivery: &Delivery) -> Result<Message, String> {
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .ok_or("the message has no message_id property, which is its idempotency key")?;
        let key = IdempotencyKey::parse(id.as_str().as_bytes(), KeyFormat::opaque())
            .map_err(|e| format!("the message_id is not a valid key: {e}"))?;
        let task: CreateTask = serde_json::from_slice(&delivery.data)
            .map_err(|e| format!("the body is not a create-task message: {e}"))?;
        let scope = Scope::new(task.user.as_str())
            .map_err(|e| format!("the user is not a valid scope: {e}"))?;
        Ok(Message { key, scope, task })
    }
}
