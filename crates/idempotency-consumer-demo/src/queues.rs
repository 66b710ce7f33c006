//! The queue topology the publisher and the consumer both declare: a durable quorum queue
//! that counts each message's deliveries, and its dead-letter queue.

use lapin::Channel;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};

/// The broker's own bound on deliveries of one message (`x-delivery-limit` of the quorum
/// queue), behind the consumer's: it dead-letters a message that no consumer ever settles
/// (one that crashes every consumer that takes it). The same for every consumer and publisher,
/// since a queue's arguments are fixed when it is declared.
const BROKER_DELIVERY_LIMIT: i64 = 1_000;

/// Declares `queue` (a durable quorum queue, which counts each message's deliveries) with its
/// dead-letter queue `<queue>.dead`. The publisher and the consumer both declare it, with the
/// same arguments. (A classic queue of the same name, left by an earlier version of this demo,
/// is refused by the broker with `PRECONDITION_FAILED`: delete it first.)
pub async fn declare_queues(channel: &Channel, queue: &str) -> Result<(), lapin::Error> {
    let dead = format!("{queue}.dead");
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(dead.as_str().into(), durable, FieldTable::default())
        .await?;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dead.as_str().into()),
    );
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    arguments.insert(
        "x-delivery-limit".into(),
        AMQPValue::LongLongInt(BROKER_DELIVERY_LIMIT),
    );
    channel
        .queue_declare(queue.into(), durable, arguments)
        .await?;
    Ok(())
}
