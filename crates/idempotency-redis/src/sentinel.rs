//! State sentinels: keys without a TTL whose absence means Redis lost its data. One on a single
//! server; on a cluster, one per master, each named so that its hash slot is one that master
//! serves, so a master that restarts empty or fails over to a replica that never got the data is
//! noticed whichever master it is. The masters are read again at every check, so a master added
//! to the cluster later gets its sentinel then.

use crate::connection::Connection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisError, Value};

/// Redis Cluster's hash slots.
const SLOTS: u16 = 16384;

/// CRC16/XMODEM, the checksum Redis Cluster maps keys to slots with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash slot of `key`, with Redis' hash-tag rule: the part between the first `{` and the
/// next `}`, when not empty, instead of the whole key.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// The sentinel of a single server (the name stores have always used).
pub(crate) fn single(prefix: &str) -> Vec<String> {
    vec![format!("{prefix}state-sentinel")]
}

/// One sentinel per master: for each master (its slot ranges), the first name
/// `<prefix>state-sentinel:<n>` whose slot it serves.
pub(crate) fn per_master(prefix: &str, masters: &[Vec<(u16, u16)>]) -> Vec<String> {
    masters
        .iter()
        .filter_map(|ranges| {
            (0u32..1_000_000).find_map(|n| {
                let name = format!("{prefix}state-sentinel:{n}");
                let slot = key_slot(name.as_bytes());
                ranges
                    .iter()
                    .any(|&(start, end)| (start..=end).contains(&slot))
                    .then_some(name)
            })
        })
        .collect()
}

/// The slot ranges of each master, from `CLUSTER SLOTS`.
pub(crate) async fn cluster_masters(
    connection: &Connection,
) -> Result<Vec<Vec<(u16, u16)>>, RedisError> {
    let Connection::Cluster(cluster) = connection else {
        return Ok(Vec::new());
    };
    let mut command = redis::cmd("CLUSTER");
    command.arg("SLOTS");
    let reply = cluster
        .clone()
        .route_command(
            command,
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    let unexpected = || {
        RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "CLUSTER SLOTS answered with an unexpected value",
        ))
    };
    let Value::Array(ranges) = reply else {
        return Err(unexpected());
    };
    // Grouped by the master's node id (or address, where no id is given).
    let mut masters: Vec<(String, Vec<(u16, u16)>)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(unexpected());
        };
        let slot = |value: Option<&Value>| match value {
            Some(Value::Int(n)) => u16::try_from(*n).map_err(|_| unexpected()),
            _ => Err(unexpected()),
        };
        let (start, end) = (slot(fields.first())?, slot(fields.get(1))?);
        let master = match fields.get(2) {
            Some(Value::Array(node)) => node
                .iter()
                .map(|v| match v {
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    Value::SimpleString(s) => s.clone(),
                    Value::Int(n) => n.to_string(),
                    _ => String::new(),
                })
                .collect::<Vec<_>>()
                .join(" "),
            _ => return Err(unexpected()),
        };
        match masters.iter_mut().find(|(id, _)| *id == master) {
            Some((_, list)) => list.push((start, end)),
            None => masters.push((master, vec![(start, end)])),
        }
    }
    Ok(masters.into_iter().map(|(_, ranges)| ranges).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
    }

    #[test]
    fn every_master_gets_a_sentinel_in_its_own_slots() {
        let masters = vec![vec![(0, 5460)], vec![(5461, 10922)], vec![(10923, 16383)]];
        let names = per_master("app:idem:", &masters);
        assert_eq!(names.len(), 3);
        for (name, ranges) in names.iter().zip(&masters) {
            let slot = key_slot(name.as_bytes());
            assert!(
                ranges.iter().any(|&(a, b)| (a..=b).contains(&slot)),
                "{name}"
            );
        }
    }
}
