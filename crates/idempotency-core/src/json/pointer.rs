//! JSON pointers (RFC 6901), and the projections of a body that a fingerprint can count.

use super::Json;
use std::fmt;

/// A JSON pointer (RFC 6901) such as `/meta/request_id`: which part of a JSON body a
/// [`FingerprintSpec`](crate::FingerprintSpec) ignores or keeps.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct JsonPointer {
    text: String,
    segments: Vec<String>,
}

/// A JSON pointer could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid JSON pointer {pointer:?}: {reason}")]
pub struct JsonPointerError {
    pointer: String,
    reason: &'static str,
}

impl JsonPointer {
    /// Parses `/a/b~1c/0` (`~1` is `/`, `~0` is `~`). It must name a part of the document: the
    /// empty pointer (the whole document) is refused.
    pub fn parse(pointer: &str) -> Result<Self, JsonPointerError> {
        let error = |reason| JsonPointerError {
            pointer: pointer.to_owned(),
            reason,
        };
        let Some(rest) = pointer.strip_prefix('/') else {
            return Err(error("it must start with '/'"));
        };
        let mut segments = Vec::new();
        for raw in rest.split('/') {
            let mut segment = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                match c {
                    '~' => match chars.next() {
                        Some('0') => segment.push('~'),
                        Some('1') => segment.push('/'),
                        _ => return Err(error("'~' must be followed by 0 or 1")),
                    },
                    c => segment.push(c),
                }
            }
            segments.push(segment);
        }
        Ok(JsonPointer {
            text: pointer.to_owned(),
            segments,
        })
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Debug for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JsonPointer({:?})", self.text)
    }
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Which part of a JSON body counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Projection {
    /// All of it.
    #[default]
    Whole,
    /// All but these parts: object members are removed, array elements become `null` (so the
    /// positions of the others do not move).
    Ignore(Vec<JsonPointer>),
    /// Only these parts, with the objects around them; a pointer that reaches an array or a
    /// scalar keeps that value whole.
    Keep(Vec<JsonPointer>),
}

impl Projection {
    /// `json` as this projection sees it.
    pub(crate) fn apply(&self, json: Json) -> Json {
        match self {
            Projection::Whole => json,
            Projection::Ignore(pointers) => {
                let mut json = json;
                for pointer in pointers {
                    remove(&mut json, &pointer.segments);
                }
                json
            }
            Projection::Keep(pointers) => {
                let mut kept = Json::Object(Vec::new());
                for pointer in pointers {
                    copy(&json, &pointer.segments, &mut kept);
                }
                kept
            }
        }
    }
}

fn remove(json: &mut Json, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    match json {
        Json::Object(members) => {
            if let Ok(i) = members.binary_search_by(|(k, _)| k.as_str().cmp(first)) {
                if rest.is_empty() {
                    members.remove(i);
                } else {
                    remove(&mut members[i].1, rest);
                }
            }
        }
        Json::Array(items) => {
            if let Some(item) = first.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                if rest.is_empty() {
                    *item = Json::Null;
                } else {
                    remove(item, rest);
                }
            }
        }
        _ => {}
    }
}

/// Copies the value at `path` in `from` into `into` (an object), creating the objects on the
/// way; stops at the first array or scalar, which is copied whole.
fn copy(from: &Json, path: &[String], into: &mut Json) {
    let (Some((first, rest)), Json::Object(members)) = (path.split_first(), from) else {
        *into = from.clone();
        return;
    };
    let Ok(i) = members.binary_search_by(|(k, _)| k.as_str().cmp(first)) else {
        return;
    };
    let Json::Object(out) = into else {
        // An earlier pointer kept this value whole already.
        return;
    };
    let slot = match out.binary_search_by(|(k, _)| k.as_str().cmp(first)) {
        Ok(j) => j,
        Err(j) => {
            out.insert(j, (first.clone(), Json::Object(Vec::new())));
            j
        }
    };
    let value = &members[i].1;
    if rest.is_empty() {
        out[slot].1 = value.clone();
    } else {
        copy(value, rest, &mut out[slot].1);
    }
}
