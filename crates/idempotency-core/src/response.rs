//! The stored response and its one binary encoding, shared by every store.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::StatusCode;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The name of the header that marks a replayed response.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The name of the header every answer the library makes by itself carries (the HTTP layer's
/// refusals: a duplicate in flight, the store unavailable, a commit not made or not confirmed,
/// a key reused, ...), its value the refusal's slug (`in-flight`, `store-unavailable`, ...). A
/// handler's answer never carries it, first or replayed (it is not stored), so a client tells
/// the library's retryable `409` from a stored business `409` without reading the body: retry
/// with the same key only an answer that carries it and a `Retry-After`.
pub const IDEMPOTENCY_REFUSAL: HeaderName = HeaderName::from_static("idempotency-refusal");

/// The name of the header a replay carries to say when the key was first answered (its
/// response stored), as an HTTP-date: the `Date` the first answer had, about (a replay's own
/// `Date` is the replay's). Added to every replay, never stored.
pub const IDEMPOTENCY_ORIGINAL_DATE: HeaderName =
    HeaderName::from_static("idempotency-original-date");

/// The name of the header a replay carries to say when its key expires, as an HTTP-date: until
/// then a request with the key replays this answer (or is refused as a mismatch); after it the
/// key is free and a request with it runs again, so a client stops retrying before it. Added to
/// every replay, never stored.
pub const IDEMPOTENCY_KEY_EXPIRES: HeaderName = HeaderName::from_static("idempotency-key-expires");

/// A response as stored for replay: status, the headers worth replaying (repeated ones kept, in
/// order) and the body bytes, byte for byte (ADR amendment 4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    body_omitted: bool,
}

/// The stored bytes of a response could not be decoded. Stores report it as
/// [`StoreError::Corrupt`](crate::StoreError::Corrupt); it never becomes "not found".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes do not start with the encoding's magic number.
    #[error("not a stored response (bad magic)")]
    BadMagic,
    /// The encoding version is newer than this library.
    #[error("unsupported stored response version {0}")]
    UnsupportedVersion(u8),
    /// The bytes end before the encoding does.
    #[error("stored response is truncated")]
    Truncated,
    /// Bytes follow the end of the encoding.
    #[error("{0} unexpected bytes after the stored response")]
    TrailingBytes(usize),
    /// The status code is outside 100..=999.
    #[error("invalid status code {0}")]
    InvalidStatus(u16),
    /// A header name or value is not valid HTTP.
    #[error("invalid header in stored response")]
    InvalidHeader,
    /// Unknown flag bits are set.
    #[error("unknown flags {0:#04x}")]
    UnknownFlags(u8),
    /// More header fields than an `http::HeaderMap` can hold (2^15).
    #[error("stored response claims {0} headers, more than a header map holds")]
    TooManyHeaders(usize),
}

const MAGIC: &[u8; 3] = b"IDR";
const CONTENT_MD5: HeaderName = HeaderName::from_static("content-md5");
const VERSION: u8 = 1;
const FLAG_BODY_OMITTED: u8 = 0b0000_0001;

impl StoredResponse {
    /// A response with exactly these headers. Use [`StoredResponse::capture`] to apply the
    /// replay filter to a handler's full header map.
    pub fn new(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        StoredResponse {
            status,
            headers,
            body,
            body_omitted: false,
        }
    }

    /// Captures a handler's response for storage: keeps every header that is safe to replay
    /// (see [`is_replayable_header`]) and the body.
    pub fn capture(status: StatusCode, headers: &HeaderMap, body: Bytes) -> Self {
        StoredResponse::new(status, replayable_headers(headers), body)
    }

    /// Captures only the status and headers of a response whose body was too large to store.
    /// A replay of it answers with the stored status and headers and an empty body, and
    /// [`StoredResponse::body_omitted`] is true, so the handler does not run a second time.
    pub fn capture_without_body(status: StatusCode, headers: &HeaderMap) -> Self {
        let mut headers = replayable_headers(headers);
        // The body is not replayed, so neither are the headers that describe it.
        headers.remove(header::CONTENT_ENCODING);
        headers.remove(header::CONTENT_RANGE);
        headers.remove(CONTENT_MD5);
        StoredResponse {
            status,
            headers,
            body: Bytes::new(),
            body_omitted: true,
        }
    }

    /// The stored status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stored headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The stored body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// True when the body was over the storage cap and was not stored.
    pub fn body_omitted(&self) -> bool {
        self.body_omitted
    }

    /// Splits the response into its parts.
    pub fn into_parts(self) -> (StatusCode, HeaderMap, Bytes) {
        (self.status, self.headers, self.body)
    }

    /// Bytes the encoded form takes (for capacity accounting).
    pub fn encoded_len(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(n, v)| 2 + n.as_str().len() + 4 + v.len())
            .sum();
        MAGIC.len() + 1 + 2 + 1 + 4 + headers + 4 + self.body.len()
    }

    /// Encodes the response in the one format every store keeps:
    ///
    /// ```text
    /// "IDR" version:u8 status:u16 flags:u8 header_count:u32
    ///   (name_len:u16 name value_len:u32 value)*  body_len:u32 body
    /// ```
    /// All integers are big-endian.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.encoded_len());
        out.put_slice(MAGIC);
        out.put_u8(VERSION);
        out.put_u16(self.status.as_u16());
        out.put_u8(if self.body_omitted {
            FLAG_BODY_OMITTED
        } else {
            0
        });
        out.put_u32(self.headers.len() as u32);
        for (name, value) in &self.headers {
            out.put_u16(name.as_str().len() as u16);
            out.put_slice(name.as_str().as_bytes());
            out.put_u32(value.len() as u32);
            out.put_slice(value.as_bytes());
        }
        out.put_u32(self.body.len() as u32);
        out.put_slice(&self.body);
        out.freeze()
    }

    /// Decodes bytes written by [`StoredResponse::encode`]. The body is a zero-copy slice of
    /// `bytes`. Corrupt input is a typed error, never a panic.
    pub fn decode(mut bytes: Bytes) -> Result<Self, DecodeError> {
        fn need(buf: &Bytes, n: usize) -> Result<(), DecodeError> {
            if buf.remaining() < n {
                Err(DecodeError::Truncated)
            } else {
                Ok(())
            }
        }
        need(&bytes, MAGIC.len() + 1)?;
        if &bytes[..3] != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        bytes.advance(3);
        let version = bytes.get_u8();
        if version != VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        need(&bytes, 2 + 1 + 4)?;
        let raw_status = bytes.get_u16();
        let status =
            StatusCode::from_u16(raw_status).map_err(|_| DecodeError::InvalidStatus(raw_status))?;
        let flags = bytes.get_u8();
        if flags & !FLAG_BODY_OMITTED != 0 {
            return Err(DecodeError::UnknownFlags(flags));
        }
        let count = bytes.get_u32() as usize;
        // Each header takes at least 6 bytes: refuse counts the input cannot hold before
        // reserving memory for them.
        if count > bytes.remaining() / 6 {
            return Err(DecodeError::Truncated);
        }
        // A header map holds at most 2^15 fields and panics past that in `with_capacity` and
        // `append`: use the fallible forms (a response captured from a real `HeaderMap` never
        // gets there, so only a damaged or forged record does).
        let mut headers =
            HeaderMap::try_with_capacity(count).map_err(|_| DecodeError::TooManyHeaders(count))?;
        for _ in 0..count {
            need(&bytes, 2)?;
            let name_len = usize::from(bytes.get_u16());
            need(&bytes, name_len)?;
            let name = HeaderName::from_bytes(&bytes[..name_len])
                .map_err(|_| DecodeError::InvalidHeader)?;
            bytes.advance(name_len);
            need(&bytes, 4)?;
            let value_len = bytes.get_u32() as usize;
            need(&bytes, value_len)?;
            let value = HeaderValue::from_maybe_shared(bytes.split_to(value_len))
                .map_err(|_| DecodeError::InvalidHeader)?;
            headers
                .try_append(name, value)
                .map_err(|_| DecodeError::TooManyHeaders(count))?;
        }
        need(&bytes, 4)?;
        let body_len = bytes.get_u32() as usize;
        need(&bytes, body_len)?;
        let body = bytes.split_to(body_len);
        if bytes.has_remaining() {
            return Err(DecodeError::TrailingBytes(bytes.remaining()));
        }
        Ok(StoredResponse {
            status,
            headers,
            body,
            body_omitted: flags & FLAG_BODY_OMITTED != 0,
        })
    }
}

/// Headers that identify one request or one trace, never the operation's result: a replay that
/// carried them would hand a later request the first one's id (and join it to the first one's
/// trace), so they are dropped; the service's own middleware sets fresh ones on the replay.
const PER_REQUEST_HEADERS: [&str; 7] = [
    "x-request-id",
    "request-id",
    "x-correlation-id",
    "traceparent",
    "tracestate",
    "server-timing",
    "x-amzn-requestid",
];

/// Whether a response header is stored and replayed.
///
/// Dropped: hop-by-hop headers (RFC 9110 §7.6.1: `Connection`, `Keep-Alive`,
/// `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`, and the proxy
/// authentication pair), `Date` (the replay gets its own), `Set-Cookie` (a session cookie must
/// never be handed out again), `WWW-Authenticate` (a challenge to the credentials of one
/// request; 401 and 403 are not stored by the standard policy either), per-request ids and
/// trace context (`X-Request-Id`, `Request-Id`, `X-Correlation-Id`, `traceparent`,
/// `tracestate`, `Server-Timing`, `X-Amzn-RequestId`), `Content-Length` (recomputed from the
/// body), and the headers added to every replay: `Idempotent-Replayed`,
/// `Idempotency-Original-Date` and `Idempotency-Key-Expires`. Everything else, including
/// `Location`, `Content-Type`, `ETag`, `Cache-Control` and custom headers, is kept with all its
/// values.
pub fn is_replayable_header(name: &HeaderName) -> bool {
    !matches!(
        *name,
        header::CONNECTION
            | header::TE
            | header::TRAILER
            | header::TRANSFER_ENCODING
            | header::UPGRADE
            | header::PROXY_AUTHENTICATE
            | header::PROXY_AUTHORIZATION
            | header::DATE
            | header::SET_COOKIE
            | header::WWW_AUTHENTICATE
            | header::CONTENT_LENGTH
    ) && name != IDEMPOTENT_REPLAYED
        && name != IDEMPOTENCY_REFUSAL
        && name != IDEMPOTENCY_ORIGINAL_DATE
        && name != IDEMPOTENCY_KEY_EXPIRES
        && name.as_str() != "keep-alive"
        && name.as_str() != "proxy-connection"
        && !PER_REQUEST_HEADERS.contains(&name.as_str())
}

fn replayable_headers(headers: &HeaderMap) -> HeaderMap {
    // Headers named in `Connection` are hop-by-hop too.
    let named_by_connection: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if is_replayable_header(name) && !named_by_connection.contains(name) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests;
