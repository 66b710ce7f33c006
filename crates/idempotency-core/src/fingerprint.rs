//! Request fingerprints: what makes two requests "the same request".

use sha2::{Digest, Sha256};
use std::fmt;

/// How the request body enters the fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodyCanonicalization {
    /// The body bytes as received.
    #[default]
    Raw,
    /// JSON bodies are canonicalised first (object keys sorted, insignificant white space
    /// dropped, string escapes normalised, number literals kept exactly), so a client that
    /// re-serialises the same document on retry is not refused with a false mismatch. A body that
    /// is not JSON, or whose meaning is ambiguous (duplicate keys), is fingerprinted raw.
    Json,
}

/// Which algorithm produced a fingerprint. Stored with the digest so the algorithm can evolve:
/// fingerprints made by different algorithms never compare equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum FingerprintAlgorithm {
    /// SHA-256 over method, path and query, and the raw body.
    Sha256Raw = 1,
    /// SHA-256 over method, path and query, and the canonical JSON form of the body.
    Sha256CanonicalJson = 2,
}

impl FingerprintAlgorithm {
    fn from_id(id: u8) -> Option<Self> {
        match id {
            1 => Some(Self::Sha256Raw),
            2 => Some(Self::Sha256CanonicalJson),
            _ => None,
        }
    }
}

/// A fingerprint's stored bytes could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid fingerprint bytes: {reason}")]
pub struct FingerprintError {
    reason: &'static str,
}

/// The fingerprint of a request: an algorithm id and a SHA-256 digest over the method, the path
/// and query, and the body (ADR amendment 3). A retry whose fingerprint differs from the stored
/// one is refused (422) and never served the other request's response.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    algorithm: FingerprintAlgorithm,
    digest: [u8; 32],
}

/// Length of [`Fingerprint::to_bytes`].
pub const FINGERPRINT_LEN: usize = 33;

impl Fingerprint {
    /// Fingerprints a request. `path_and_query` is the request target as received (for example
    /// `/tasks?draft=true`); `method` is the method's name (`POST`).
    pub fn of_request(
        method: &str,
        path_and_query: &str,
        body: &[u8],
        canonicalization: BodyCanonicalization,
    ) -> Self {
        let canonical = match canonicalization {
            BodyCanonicalization::Raw => None,
            BodyCanonicalization::Json => crate::canonical_json::canonicalize(body),
        };
        let (algorithm, body) = match &canonical {
            Some(c) => (FingerprintAlgorithm::Sha256CanonicalJson, c.as_slice()),
            None => (FingerprintAlgorithm::Sha256Raw, body),
        };
        let mut hasher = Sha256::new();
        hasher.update(b"idempotency-fingerprint-v1");
        hasher.update([algorithm as u8]);
        // Length-prefix every part so that ("PO", "ST/x") and ("POST", "/x") differ.
        for part in [method.as_bytes(), path_and_query.as_bytes(), body] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Fingerprint {
            algorithm,
            digest: hasher.finalize().into(),
        }
    }

    /// The algorithm that produced this fingerprint.
    pub fn algorithm(&self) -> FingerprintAlgorithm {
        self.algorithm
    }

    /// The SHA-256 digest.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    /// The stored form: one algorithm byte followed by the 32-byte digest.
    pub fn to_bytes(&self) -> [u8; FINGERPRINT_LEN] {
        let mut out = [0u8; FINGERPRINT_LEN];
        out[0] = self.algorithm as u8;
        out[1..].copy_from_slice(&self.digest);
        out
    }

    /// Reads the stored form written by [`Fingerprint::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, FingerprintError> {
        let (&id, digest) = bytes
            .split_first()
            .ok_or(FingerprintError { reason: "empty" })?;
        let algorithm = FingerprintAlgorithm::from_id(id).ok_or(FingerprintError {
            reason: "unknown algorithm id",
        })?;
        let digest: [u8; 32] = digest.try_into().map_err(|_| FingerprintError {
            reason: "the digest is not 32 bytes",
        })?;
        Ok(Fingerprint { algorithm, digest })
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({:?}, ", self.algorithm)?;
        for b in &self.digest[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use BodyCanonicalization::{Json, Raw};

    #[test]
    fn every_part_counts() {
        let base = Fingerprint::of_request("POST", "/tasks", b"{}", Raw);
        assert_ne!(base, Fingerprint::of_request("PATCH", "/tasks", b"{}", Raw));
        assert_ne!(
            base,
            Fingerprint::of_request("POST", "/tasks?x=1", b"{}", Raw)
        );
        assert_ne!(base, Fingerprint::of_request("POST", "/tasks", b"{ }", Raw));
        assert_eq!(base, Fingerprint::of_request("POST", "/tasks", b"{}", Raw));
        assert_ne!(
            Fingerprint::of_request("PO", "ST/x", b"", Raw),
            Fingerprint::of_request("POST", "/x", b"", Raw)
        );
    }

    #[test]
    fn json_mode_ignores_key_order_and_white_space_only() {
        let a = Fingerprint::of_request("POST", "/t", br#"{"a":1,"b":[1,2]}"#, Json);
        let b = Fingerprint::of_request("POST", "/t", b"{ \"b\": [1, 2],\n \"a\": 1 }", Json);
        let c = Fingerprint::of_request("POST", "/t", br#"{"a":1,"b":[2,1]}"#, Json);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.algorithm(), FingerprintAlgorithm::Sha256CanonicalJson);
        let not_json = Fingerprint::of_request("POST", "/t", b"a=1", Json);
        assert_eq!(not_json.algorithm(), FingerprintAlgorithm::Sha256Raw);
        assert_eq!(not_json, Fingerprint::of_request("POST", "/t", b"a=1", Raw));
    }

    #[test]
    fn stored_form_round_trips_and_rejects_garbage() {
        let fp = Fingerprint::of_request("POST", "/t", b"x", Json);
        assert_eq!(Fingerprint::from_bytes(&fp.to_bytes()), Ok(fp));
        assert!(Fingerprint::from_bytes(&[]).is_err());
        assert!(Fingerprint::from_bytes(&[9; 33]).is_err());
        assert!(Fingerprint::from_bytes(&[1; 32]).is_err());
    }
}
