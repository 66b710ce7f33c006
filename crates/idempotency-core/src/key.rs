//! Client-supplied idempotency keys: parsing and validation.

use std::fmt;

/// The longest key any format accepts, in bytes (Stripe's documented limit).
pub const MAX_KEY_LEN: usize = 255;

/// Which keys a service accepts.
///
/// The default is [`KeyFormat::opaque`]: any visible-ASCII string of 1 to 255 bytes, bare or as a
/// structured-field string. That is what the IETF draft specifies (the key is a String; UUIDs
/// are only recommended) and what Stripe accepts, and what real clients send: stripe-python's
/// keys are UUID-shaped with a random version digit, and Stainless-generated SDKs (OpenAI,
/// Anthropic, Increase, ...) send `stainless-python-retry-<uuid>` on retries; a UUID-v4-only
/// rule refused 15 of 16 of the former and all of the latter. [`KeyFormat::UuidV4`] is the
/// strict opt-in for services whose clients are known to send UUID v4s (the ADR's request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyFormat {
    /// A UUID version 4 (RFC 9562), the strict opt-in. Accepted in any form the `uuid` crate
    /// parses (hyphenated, simple, braced, URN; any letter case) and normalised to lower-case
    /// hyphenated, so a client that changes the spelling of the same UUID still addresses the
    /// same record.
    UuidV4,
    /// Any string of visible ASCII characters (`!` to `~`), 1 to `max_len` bytes long, compared
    /// byte for byte.
    Opaque {
        /// The longest accepted key, at most [`MAX_KEY_LEN`].
        max_len: usize,
    },
}

impl Default for KeyFormat {
    /// [`KeyFormat::opaque`]: what real clients send (see the type's documentation).
    fn default() -> Self {
        KeyFormat::opaque()
    }
}

impl KeyFormat {
    /// Any visible-ASCII key of 1 to [`MAX_KEY_LEN`] bytes, compared byte for byte (the
    /// default).
    pub const fn opaque() -> Self {
        KeyFormat::Opaque {
            max_len: MAX_KEY_LEN,
        }
    }

    /// Any visible-ASCII key of 1 to `max_len` bytes; `max_len` is clamped to 1..=[`MAX_KEY_LEN`].
    pub const fn opaque_with_max_len(max_len: usize) -> Self {
        let max_len = if max_len == 0 {
            1
        } else if max_len > MAX_KEY_LEN {
            MAX_KEY_LEN
        } else {
            max_len
        };
        KeyFormat::Opaque { max_len }
    }

    fn max_len(self) -> usize {
        match self {
            KeyFormat::UuidV4 => MAX_KEY_LEN,
            KeyFormat::Opaque { max_len } => max_len.clamp(1, MAX_KEY_LEN),
        }
    }
}

/// Why a key was refused. Every variant maps to `400 Bad Request` at the HTTP layer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key (after removing the quotes of the structured-field form) is empty.
    #[error("the idempotency key is empty")]
    Empty,
    /// The key is longer than the format allows.
    #[error("the idempotency key is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Length of the key received, in bytes.
        len: usize,
        /// Longest key the format accepts.
        max: usize,
    },
    /// The key contains a byte outside ASCII.
    #[error("the idempotency key contains a non-ASCII byte at position {position}")]
    NonAscii {
        /// Byte offset of the first offending byte.
        position: usize,
    },
    /// The key contains a control character, a space or DEL.
    #[error("the idempotency key contains a control or space character at position {position}")]
    NotVisible {
        /// Byte offset of the first offending byte.
        position: usize,
    },
    /// A structured-field string (`"..."`) is not terminated or has a bad escape.
    #[error("the idempotency key is a malformed structured-field string: {reason}")]
    MalformedQuotedString {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The format requires a UUID and the key is not one.
    #[error("the idempotency key must be a UUID v4")]
    NotUuid,
    /// The key is a UUID, but not version 4.
    #[error("the idempotency key must be a UUID v4, got a version {version} UUID")]
    WrongUuidVersion {
        /// The version found in the key.
        version: usize,
    },
}

/// A validated client key (the ADR's `key` column).
///
/// Build one with [`IdempotencyKey::parse`], which accepts the bare form Stripe clients send
/// (`Idempotency-Key: 8e03978e-...`) and the quoted structured-field string of the IETF draft
/// (`Idempotency-Key: "8e03978e-..."`).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(Box<str>);

impl IdempotencyKey {
    /// Parses a header value in either the bare or the quoted form, then validates it against
    /// `format`. Leading and trailing spaces and tabs (HTTP optional white space) are ignored.
    pub fn parse(raw: &[u8], format: KeyFormat) -> Result<Self, KeyError> {
        let raw = trim_ows(raw);
        let unquoted;
        let bytes: &[u8] = if raw.first() == Some(&b'"') {
            unquoted = unquote_sf_string(raw)?;
            &unquoted
        } else {
            raw
        };
        if bytes.is_empty() {
            return Err(KeyError::Empty);
        }
        if let Some(position) = bytes.iter().position(|b| !b.is_ascii()) {
            return Err(KeyError::NonAscii { position });
        }
        if let Some(position) = bytes.iter().position(|b| !b.is_ascii_graphic()) {
            return Err(KeyError::NotVisible { position });
        }
        let max = format.max_len();
        if bytes.len() > max {
            return Err(KeyError::TooLong {
                len: bytes.len(),
                max,
            });
        }
        match format {
            KeyFormat::UuidV4 => {
                let uuid = uuid::Uuid::try_parse_ascii(bytes).map_err(|_| KeyError::NotUuid)?;
                if uuid.get_version_num() != 4 {
                    return Err(KeyError::WrongUuidVersion {
                        version: uuid.get_version_num(),
                    });
                }
                let mut buf = uuid::Uuid::encode_buffer();
                let text = uuid.hyphenated().encode_lower(&mut buf);
                Ok(IdempotencyKey(Box::from(&*text)))
            }
            KeyFormat::Opaque { .. } => {
                // Every byte was checked to be visible ASCII above, so this cannot fail.
                let text =
                    std::str::from_utf8(bytes).map_err(|_| KeyError::NonAscii { position: 0 })?;
                Ok(IdempotencyKey(Box::from(text)))
            }
        }
    }

    /// The key as stored: the unquoted, validated (for UUIDs: normalised) text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&&*self.0).finish()
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

fn trim_ows(mut raw: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = raw {
        raw = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = raw {
        raw = rest;
    }
    raw
}

/// Decodes an RFC 9651 sf-string: `"` chars `"`, where chars are printable ASCII and `\` escapes
/// only `"` and `\`.
fn unquote_sf_string(raw: &[u8]) -> Result<Vec<u8>, KeyError> {
    let malformed = |reason| KeyError::MalformedQuotedString { reason };
    let inner = raw
        .strip_prefix(b"\"")
        .ok_or(malformed("it does not start with a quote"))?;
    let mut out = Vec::with_capacity(inner.len());
    let mut iter = inner.iter().enumerate();
    while let Some((i, &b)) = iter.next() {
        match b {
            b'\\' => match iter.next() {
                Some((_, &c @ (b'"' | b'\\'))) => out.push(c),
                Some(_) => return Err(malformed("only \\\" and \\\\ may be escaped")),
                None => return Err(malformed("it ends inside an escape")),
            },
            b'"' => {
                if i + 1 != inner.len() {
                    return Err(malformed("characters follow the closing quote"));
                }
                return Ok(out);
            }
            other => out.push(other),
        }
    }
    Err(malformed("the closing quote is missing"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

    #[test]
    fn bare_and_quoted_uuid_are_the_same_key() {
        let bare = IdempotencyKey::parse(V4.as_bytes(), KeyFormat::UuidV4).unwrap();
        let quoted =
            IdempotencyKey::parse(format!("\"{V4}\"").as_bytes(), KeyFormat::UuidV4).unwrap();
        let upper = IdempotencyKey::parse(V4.to_uppercase().as_bytes(), KeyFormat::UuidV4).unwrap();
        assert_eq!(bare, quoted);
        assert_eq!(bare, upper);
        assert_eq!(bare.as_str(), V4);
    }

    #[test]
    fn uuid_format_rejects_other_versions_and_garbage() {
        let v1 = "c232ab00-9414-11ec-b3c8-9f68deced846";
        assert_eq!(
            IdempotencyKey::parse(v1.as_bytes(), KeyFormat::UuidV4),
            Err(KeyError::WrongUuidVersion { version: 1 })
        );
        assert_eq!(
            IdempotencyKey::parse(b"not-a-uuid", KeyFormat::UuidV4),
            Err(KeyError::NotUuid)
        );
    }

    #[test]
    fn empty_too_long_control_and_non_ascii_are_typed_errors() {
        let f = KeyFormat::opaque();
        assert_eq!(IdempotencyKey::parse(b"", f), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"  ", f), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"\"\"", f), Err(KeyError::Empty));
        assert_eq!(
            IdempotencyKey::parse(&[b'a'; 256], f),
            Err(KeyError::TooLong { len: 256, max: 255 })
        );
        assert!(IdempotencyKey::parse(&[b'a'; 255], f).is_ok());
        assert_eq!(
            IdempotencyKey::parse(b"ab\r\ncd", f),
            Err(KeyError::NotVisible { position: 2 })
        );
        assert_eq!(
            IdempotencyKey::parse(b"a b", f),
            Err(KeyError::NotVisible { position: 1 })
        );
        assert_eq!(
            IdempotencyKey::parse("clé".as_bytes(), f),
            Err(KeyError::NonAscii { position: 2 })
        );
        assert_eq!(
            IdempotencyKey::parse(b"abc", KeyFormat::opaque_with_max_len(2)),
            Err(KeyError::TooLong { len: 3, max: 2 })
        );
    }

    #[test]
    fn quoted_form_is_decoded_strictly() {
        let f = KeyFormat::opaque();
        assert_eq!(
            IdempotencyKey::parse(br#""a\"b\\c""#, f).unwrap().as_str(),
            r#"a"b\c"#
        );
        assert!(matches!(
            IdempotencyKey::parse(br#""abc"#, f),
            Err(KeyError::MalformedQuotedString { .. })
        ));
        assert!(matches!(
            IdempotencyKey::parse(br#""a\nb""#, f),
            Err(KeyError::MalformedQuotedString { .. })
        ));
        assert!(matches!(
            IdempotencyKey::parse(br#""ab"c"#, f),
            Err(KeyError::MalformedQuotedString { .. })
        ));
        // A bare key may contain quotes anywhere but at the start.
        assert_eq!(
            IdempotencyKey::parse(br#"a"b"#, f).unwrap().as_str(),
            r#"a"b"#
        );
    }

    proptest::proptest! {
        #[test]
        fn any_visible_ascii_key_round_trips_bare_and_quoted(key in "[!-~]{1,255}") {
            let f = KeyFormat::opaque();
            if !key.starts_with('"') {
                let bare = IdempotencyKey::parse(key.as_bytes(), f).unwrap();
                proptest::prop_assert_eq!(bare.as_str(), key.as_str());
            }
            let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
            let parsed = IdempotencyKey::parse(quoted.as_bytes(), f).unwrap();
            proptest::prop_assert_eq!(parsed.as_str(), key.as_str());
        }

        #[test]
        fn parse_never_panics_and_accepts_only_visible_ascii(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            for f in [KeyFormat::opaque(), KeyFormat::UuidV4] {
                if let Ok(key) = IdempotencyKey::parse(&raw, f) {
                    proptest::prop_assert!(!key.as_str().is_empty());
                    proptest::prop_assert!(key.as_str().len() <= MAX_KEY_LEN);
                    proptest::prop_assert!(key.as_str().bytes().all(|b| b.is_ascii_graphic()));
                }
            }
        }
    }
}
