//! The store's connection to Redis: to one server, through a connection manager that reconnects,
//! or to a cluster, through a client that routes each key to its node.

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

/// A connection of the store (the shared one, or one of those writes that wait for replicas go
/// on). Cheap to clone: clones share the connection.
#[derive(Clone)]
pub(crate) enum Connection {
    /// One server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}
