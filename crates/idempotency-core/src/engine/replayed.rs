//! A stored answer, as a duplicate gets it: the response and when its key was first answered
//! and expires.

use crate::StoredResponse;
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
    /// `retention - expires_in` ago. A record stored under a longer retention than today's
    /// reads as answered just now (the difference saturates at zero).
    pub fn new(response: StoredResponse, expires_in: Duration, retention: Duration) -> Self {
        Replayed {
            response,
            expires_in,
            answered_ago: retention.saturating_sub(expires_in),
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

    /// When the first request was answered, by this process's clock.
    pub fn answered_at(&self) -> SystemTime {
        SystemTime::now()
            .checked_sub(self.answered_ago)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }

    /// When the key expires, by this process's clock.
    pub fn expires_at(&self) -> SystemTime {
        SystemTime::now()
            .checked_add(self.expires_in)
            .unwrap_or(SystemTime::now())
    }
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
        let answered = replayed.answered_at();
        // Read after `now`, by up to a minute of a slow machine.
        assert!(answered >= now - Duration::from_secs(600));
        assert!(answered < now - Duration::from_secs(540));
        let expires = replayed.expires_at();
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
