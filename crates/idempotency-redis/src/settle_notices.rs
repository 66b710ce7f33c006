//! The store's session subscribed to settle notices (`<prefix>settled`), which wakes the
//! duplicates this process has waiting when another instance settles their key: opened by
//! core's [`SettleListener`](idempotency_core::store::SettleListener) at the first wait.

use crate::error::{corrupt, redis_error};
use idempotency_core::StoreError;

/// Subscribes to `channel` on the first of `nodes` that answers, and passes each notice's
/// payload to `notices` from a task of its own until `stop` is cancelled or the connection is
/// lost (see [`SettleListener::ensure`]). Returns once `SUBSCRIBE` is confirmed.
pub(crate) async fn subscribe(
    nodes: &[redis::Client],
    channel: &str,
    notices: tokio::sync::mpsc::UnboundedSender<String>,
    stop: tokio_util::sync::CancellationToken,
) -> Result<bool, StoreError> {
    use futures_util::StreamExt;
    let mut failure = None;
    for node in nodes {
        let subscribed = async {
            let mut pubsub = node.get_async_pubsub().await?;
            pubsub.subscribe(channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        match subscribed.await {
            Ok(pubsub) => {
                let (notices, stop) = (notices.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut messages = pubsub.into_on_message();
                    loop {
                        tokio::select! {
                            () = stop.cancelled() => break,
                            message = messages.next() => {
                                let Some(message) = message else { break };
                                let Ok(payload) = message.get_payload::<String>() else {
                                    continue;
                                };
                                if notices.send(payload).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                });
                return Ok(true);
            }
            Err(error) => failure = Some(error),
        }
    }
    Err(match failure {
        Some(error) => redis_error(error),
        None => corrupt("no node to subscribe to"),
    })
}
