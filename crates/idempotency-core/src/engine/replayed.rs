//! A stored answer, as a duplicate gets it: the response and when its key was first answered
//! and expires.

use crate::response::StoredResponse;
use std::ops::Deref;
use std::time::{Duration, SystemTime};

/// A completed request's stored response, as the engine hands it to a duplicate
/// ([`Begin::Replay`](crate::Begin::Replay), [`Superseded::Replay`](crate::Superseded::Replay)),
/// with when the key was first answered and when it expires, so a client knows when to stop
/// retrying. Dereferences to the [`StoredResponse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replayed {
    response: StoredResponse,
    expires_in: Duration,
    answered_ago: Duration,
}

impl Replayed {
    /// A stored `response` whose record expires in `expires_in` (by the store's clock, as read)
    /// and was kept for `retention` when it was stored: it was first answered
    /// `retention - expires_in` ago; a record stored under a longer retention than today's reads as
    /// answered just now.
    pub fn new(response: StoredResponse, expires_in: Duration, retention: Duration) -> Self {
        Replayed {
            response,
            expires_in,
            answered_ago: answered_ago(retention, expires_in),
        }
    }

    /// The stored response.
    pub fn response(&self) -> &StoredResponse {
        &self.response
    }

    /// The stored response, taken out.
    pub fn into_response(self) -> StoredResponse {
        self.response
    }

    /// How long the key still replays this response, from when its record was read. After
    /// that the key is free and a request with it runs again.
    pub fn expires_in(&self) -> Duration {
        self.expires_in
    }

    /// How long ago the first request was answered (its response stored), from when the record
    /// was read: the engine's retention less [`expires_in`](Self::expires_in).
    pub fn answered_ago(&self) -> Duration {
        self.answered_ago
    }

    /// When the first request was answered and when the key expires, by this process's clock
    /// (read once for both).
    pub fn dates(&self) -> (SystemTime, SystemTime) {
        dates(self.answered_ago, self.expires_in)
    }
}

/// How long ago a record that expires in `expires_in` was stored, under `retention`. A record
/// stored under a longer retention than today's reads as answered just now (the difference
/// saturates at zero). The one rule for a replay's and a status's first answer.
pub(crate) fn answered_ago(retention: Duration, expires_in: Duration) -> Duration {
    retention.saturating_sub(expires_in)
}

/// `answered_ago` before now and `expires_in` after it, by one reading of this process's clock.
pub(crate) fn dates(answered_ago: Duration, expires_in: Duration) -> (SystemTime, SystemTime) {
    let now = SystemTime::now();
    (
        now.checked_sub(answered_ago)
            .unwrap_or(SystemTime::UNIX_EPOCH),
        now.checked_add(expires_in).unwrap_or(now),
    )
}

impl Deref for Replayed {
    type Target = StoredResponse;

    fn deref(&self) -> &StoredResponse {
        &self.response
    }
}

impl PartialEq<StoredResponse> for Replayed {
    fn eq(&self, other: &StoredResponse) -> bool {
        self.response == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, StatusCode};

    #[test]
    fn the_first_answer_is_the_retention_before_the_expiry() {
        let response = StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), "ok".into());
        let replayed = Replayed::new(
            response.clone(),
            Duration::from_secs(3_000),
            Duration::from_secs(3_600),
        );
        assert_eq!(replayed.answered_ago(), Duration::from_secs(600));
        assert_eq!(replayed.expires_in(), Duration::from_secs(3_000));
        assert_eq!(replayed, response);
        assert_eq!(replayed.status(), StatusCode::CREATED);
        let now = SystemTime::now();
        let (answered, expires) = replayed.dates();
        // Read after `now`, by up to a minute of a slow machine.
        assert!(answered >= now - Duration::from_secs(600));
        assert!(answered < now - Duration::from_secs(540));
        assert!(expires >= now + Duration::from_secs(3_000));
        assert!(expires < now + Duration::from_secs(3_060));
    }

    #[test]
    fn a_record_kept_longer_than_todays_retention_reads_as_answered_now() {
        let response = StoredResponse::new(StatusCode::OK, HeaderMap::new(), "".into());
        let replayed = Replayed::new(response, Duration::from_secs(90), Duration::from_secs(60));
        assert_eq!(replayed.answered_ago(), Duration::ZERO);
    }
}
