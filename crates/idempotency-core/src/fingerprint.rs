//! Request fingerprints: what makes two requests "the same request".

use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::fmt;

thread_local! {
    /// The canonical JSON form's buffers, one set per thread.
    static BUFFERS: RefCell<crate::json::Buffers> = RefCell::default();
}

/// Runs `f` with this thread's canonicalisation buffers (fresh ones if they are in use or
/// gone, as during thread teardown), then trims them.
fn with_buffers<R>(mut f: impl FnMut(&mut crate::json::Buffers) -> R) -> R {
    let kept = BUFFERS.try_with(|cell| {
        let mut buffers = cell.try_borrow_mut().ok()?;
        let result = f(&mut buffers);
        buffers.trim();
        Some(result)
    });
    match kept {
        Ok(Some(result)) => result,
        _ => f(&mut crate::json::Buffers::default()),
    }
}

/// Whether a request with `headers` may carry JSON: its `Content-Type` is a JSON media type
/// (`application/json`, `application/<anything>+json`, with any parameters) or absent.
fn may_be_json(headers: &http::HeaderMap) -> bool {
    let Some(value) = headers.get(http::header::CONTENT_TYPE) else {
        return true;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case("json")
            || subtype.len() > 5
                && subtype.is_char_boundary(subtype.len() - 5)
                && subtype[subtype.len() - 5..].eq_ignore_ascii_case("+json"))
}

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
        let spec = FingerprintSpec::new().body(canonicalization);
        Self::with_spec(&spec, method, path_and_query, &http::HeaderMap::new(), body)
    }

    /// Fingerprints a request as [`FingerprintSpec`] `spec` says.
    fn with_spec(
        spec: &FingerprintSpec,
        method: &str,
        path_and_query: &str,
        headers: &http::HeaderMap,
        body: &[u8],
    ) -> Self {
        // A body whose request says it is not JSON is not read as JSON: the same bytes sent as
        // `text/plain` are another request than the JSON one (their algorithms differ, so their
        // fingerprints never match).
        let canonicalization = match spec.canonicalization {
            BodyCanonicalization::Json if !may_be_json(headers) => BodyCanonicalization::Raw,
            other => other,
        };
        match (canonicalization, &spec.projection) {
            (BodyCanonicalization::Raw, _) => {
                Self::hash_parts(spec, method, path_and_query, headers, body, false)
            }
            // The common case, on every request: written straight from the body into buffers
            // the thread keeps, so it allocates nothing.
            (BodyCanonicalization::Json, crate::json::Projection::Whole) => {
                with_buffers(|buffers| {
                    let (canonical, body) = match buffers.canonicalize(body) {
                        Some(canonical) => (true, canonical),
                        None => (false, body),
                    };
                    Self::hash_parts(spec, method, path_and_query, headers, body, canonical)
                })
            }
            (BodyCanonicalization::Json, projection) => {
                match crate::json::parse(body).map(|json| projection.apply(json).canonical()) {
                    Some(canonical) => {
                        Self::hash_parts(spec, method, path_and_query, headers, &canonical, true)
                    }
                    None => Self::hash_parts(spec, method, path_and_query, headers, body, false),
                }
            }
        }
    }

    /// The fingerprint of a request whose body (canonical JSON when `canonical`) is `body`.
    fn hash_parts(
        spec: &FingerprintSpec,
        method: &str,
        path_and_query: &str,
        headers: &http::HeaderMap,
        body: &[u8],
        canonical: bool,
    ) -> Self {
        let algorithm = match canonical {
            true => FingerprintAlgorithm::Sha256CanonicalJson,
            false => FingerprintAlgorithm::Sha256Raw,
        };
        let mut hasher = Sha256::new();
        hasher.update(b"idempotency-fingerprint-v1");
        hasher.update([algorithm as u8]);
        // Length-prefix every part so that ("PO", "ST/x") and ("POST", "/x") differ.
        let mut part = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_be_bytes());
            hasher.update(bytes);
        };
        part(method.as_bytes());
        part(path_and_query.as_bytes());
        part(body);
        // What the spec adds is hashed after the default parts, each tagged, so a spec that adds
        // nothing gives the default fingerprint, and specs that differ give different ones.
        for name in &spec.headers {
            part(b"header");
            part(name.as_str().as_bytes());
            // The count first: without it, values could pass for a header's tag and name and
            // move between headers without changing the digest.
            let values = headers.get_all(name);
            part(&(values.iter().count() as u64).to_be_bytes());
            for value in values {
                part(value.as_bytes());
            }
        }
        if canonical {
            match &spec.projection {
                crate::json::Projection::Whole => {}
                crate::json::Projection::Ignore(pointers) => {
                    part(b"ignore");
                    pointers.iter().for_each(|p| part(p.as_str().as_bytes()));
                }
                crate::json::Projection::Keep(pointers) => {
                    part(b"keep");
                    pointers.iter().for_each(|p| part(p.as_str().as_bytes()));
                }
            }
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
mod tests;

/// Which parts of a request make its fingerprint, so "the same request" means what your API
/// means. The default is method, path and query, and the body with JSON canonicalised
/// ([`Fingerprint::of_request`] with [`BodyCanonicalization::Json`]). Add headers that change
/// the meaning (an API version), ignore body fields a client may change on retry (a timestamp),
/// or count only some fields:
///
/// ```
/// use idempotency_core::FingerprintSpec;
/// use http::{HeaderMap, HeaderName};
///
/// let spec = FingerprintSpec::new()
///     .header(HeaderName::from_static("api-version"))
///     .ignore_json("/sent_at")?;
/// let headers = HeaderMap::new();
/// let a = spec.fingerprint("POST", "/orders", &headers, br#"{"item":"tea","sent_at":1}"#);
/// let b = spec.fingerprint("POST", "/orders", &headers, br#"{"sent_at":2,"item":"tea"}"#);
/// assert_eq!(a, b);
/// # Ok::<(), idempotency_core::JsonPointerError>(())
/// ```
///
/// Changing the spec of a running service changes fingerprints: retries of requests made before
/// the change are refused as different requests (422) until their records expire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FingerprintSpec {
    canonicalization: BodyCanonicalization,
    headers: Vec<http::HeaderName>,
    projection: crate::json::Projection,
}

impl Default for FingerprintSpec {
    fn default() -> Self {
        Self::new()
    }
}

impl FingerprintSpec {
    /// Method, path and query, and the body with JSON canonicalised.
    pub fn new() -> Self {
        FingerprintSpec {
            canonicalization: BodyCanonicalization::Json,
            headers: Vec::new(),
            projection: crate::json::Projection::Whole,
        }
    }

    /// How the body enters (default [`BodyCanonicalization::Json`]). Projections of JSON bodies
    /// apply with `Json` only.
    pub fn body(mut self, canonicalization: BodyCanonicalization) -> Self {
        self.canonicalization = canonicalization;
        self
    }

    /// Counts the values of header `name`, in order (absent and empty differ).
    pub fn header(mut self, name: http::HeaderName) -> Self {
        if !self.headers.contains(&name) {
            self.headers.push(name);
        }
        self
    }

    /// Ignores the part of a JSON body at `pointer` (RFC 6901, e.g. `/meta/sent_at`): object
    /// members are dropped, array elements count as `null`. Repeatable. Bodies that are not JSON
    /// count whole.
    pub fn ignore_json(mut self, pointer: &str) -> Result<Self, crate::json::JsonPointerError> {
        let pointer = crate::json::JsonPointer::parse(pointer)?;
        match &mut self.projection {
            crate::json::Projection::Ignore(pointers) => pointers.push(pointer),
            other => *other = crate::json::Projection::Ignore(vec![pointer]),
        }
        Ok(self)
    }

    /// Counts only the parts of a JSON body at the pointers given this way, with the objects
    /// around them (a pointer that reaches an array counts it whole). Repeatable; replaces
    /// [`FingerprintSpec::ignore_json`].
    pub fn keep_json(mut self, pointer: &str) -> Result<Self, crate::json::JsonPointerError> {
        let pointer = crate::json::JsonPointer::parse(pointer)?;
        match &mut self.projection {
            crate::json::Projection::Keep(pointers) => pointers.push(pointer),
            other => *other = crate::json::Projection::Keep(vec![pointer]),
        }
        Ok(self)
    }

    /// The fingerprint of a request: `path_and_query` is the request target (`/tasks?draft=1`).
    pub fn fingerprint(
        &self,
        method: &str,
        path_and_query: &str,
        headers: &http::HeaderMap,
        body: &[u8],
    ) -> Fingerprint {
        Fingerprint::with_spec(self, method, path_and_query, headers, body)
    }
}
