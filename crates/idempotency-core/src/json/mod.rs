//! A small, strict JSON canonicaliser for fingerprints.
//!
//! It parses RFC 8259 JSON and writes it back with object members sorted by key, no insignificant
//! white space and strings re-escaped one way. Number literals are kept exactly as written (no
//! float round trip, so two different large numbers can never collapse into one fingerprint).
//! Input it cannot canonicalise safely (not JSON, a duplicate object key, a lone surrogate,
//! nesting deeper than [`MAX_DEPTH`]) is reported as `None`, and the caller falls back to the raw
//! bytes.
//!
//! # Why not RFC 8785 (JCS)
//! This is **not** JCS, on purpose. JCS writes every number the way an IEEE-754 double prints,
//! so `12345678901234567890` and `12345678901234567891` (two different order amounts to an API
//! that reads them as integers or decimals) get one canonical form, and so one fingerprint: a
//! changed request would replay the other's response. A fingerprint must never merge requests
//! whose meaning may differ, while it may keep apart two that mean the same (`1.0` and `1`: the
//! client sent different bytes; the worst case is a 422, never a wrong replay). So number
//! literals stay verbatim, and keys are sorted by their unescaped UTF-8 bytes (JCS sorts by UTF-16
//! code units). The output is not meant to interoperate with other canonicalisers: the same
//! library computes and compares it, and the fingerprint stores its algorithm id so the form can
//! evolve. A differential property test checks it against `serde_json` on nested documents: the
//! canonical form parses to the same value, and documents `serde_json` writes in different key
//! orders and layouts share one canonical form.

//!
//! Files: `mod.rs` (the parser and the tree), `lex.rs` (the tokens and the canonical escaping
//! both readers share), `stream.rs` (the canonical form written straight
//! from the input, without a tree: what a fingerprint without a projection uses), `pointer.rs`
//! (JSON pointers, and the projections a [`FingerprintSpec`](crate::FingerprintSpec) applies to
//! the tree before the canonical form is written).

mod lex;
mod pointer;
mod stream;
#[cfg(test)]
mod tests;

pub(crate) use pointer::Projection;
pub use pointer::{JsonPointer, JsonPointerError};
pub(crate) use stream::Buffers;

use lex::{Cursor, Piece, write_char};

/// Deepest nesting of arrays and objects accepted.
pub(crate) const MAX_DEPTH: usize = 128;

/// A parsed JSON document: numbers keep their literal, objects their members sorted by key
/// (with no duplicate keys).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// Parses `input`, or `None` when it is not JSON that can be canonicalised without changing its
/// meaning.
pub(crate) fn parse(input: &[u8]) -> Option<Json> {
    let mut cursor = Cursor::new(input);
    cursor.skip_ws();
    let value = value(&mut cursor, 0)?;
    cursor.skip_ws();
    cursor.at_end().then_some(value)
}

/// Returns the canonical form of `input`, or `None` when it is not JSON that can be
/// canonicalised without changing its meaning: written straight from the input, as
/// fingerprints write it.
#[cfg(test)]
pub(crate) fn canonicalize(input: &[u8]) -> Option<Vec<u8>> {
    Buffers::default().canonicalize(input).map(<[u8]>::to_vec)
}

/// The same through the tree, as projections write it.
#[cfg(test)]
pub(crate) fn canonicalize_tree(input: &[u8]) -> Option<Vec<u8>> {
    parse(input).map(|json| json.canonical())
}

impl Json {
    /// The canonical form: members in key order, no white space, strings escaped one way.
    pub(crate) fn canonical(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Json::Null => out.extend_from_slice(b"null"),
            Json::Bool(true) => out.extend_from_slice(b"true"),
            Json::Bool(false) => out.extend_from_slice(b"false"),
            Json::Number(literal) => out.extend_from_slice(literal.as_bytes()),
            Json::String(s) => write_string(s, out),
            Json::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Json::Object(members) => {
                out.push(b'{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_string(key, out);
                    out.push(b':');
                    value.write(out);
                }
                out.push(b'}');
            }
        }
    }
}

fn value(cursor: &mut Cursor<'_>, depth: usize) -> Option<Json> {
    match cursor.peek()? {
        b'{' => object(cursor, depth + 1),
        b'[' => array(cursor, depth + 1),
        b'"' => string(cursor).map(Json::String),
        b't' => cursor.literal(b"true").map(|()| Json::Bool(true)),
        b'f' => cursor.literal(b"false").map(|()| Json::Bool(false)),
        b'n' => cursor.literal(b"null").map(|()| Json::Null),
        b'-' | b'0'..=b'9' => cursor.number().map(|n| Json::Number(n.to_owned())),
        _ => None,
    }
}

fn object(cursor: &mut Cursor<'_>, depth: usize) -> Option<Json> {
    if depth > MAX_DEPTH {
        return None;
    }
    cursor.eat(b'{')?;
    let mut members: Vec<(String, Json)> = Vec::new();
    cursor.skip_ws();
    if cursor.eat(b'}').is_none() {
        loop {
            cursor.skip_ws();
            let key = string(cursor)?;
            cursor.skip_ws();
            cursor.eat(b':')?;
            cursor.skip_ws();
            members.push((key, value(cursor, depth)?));
            cursor.skip_ws();
            if cursor.eat(b'}').is_some() {
                break;
            }
            cursor.eat(b',')?;
        }
    }
    members.sort_by(|a, b| a.0.cmp(&b.0));
    if members.windows(2).any(|w| w[0].0 == w[1].0) {
        // Duplicate keys: parsers disagree on which one wins, so the meaning is not fixed.
        return None;
    }
    Some(Json::Object(members))
}

fn array(cursor: &mut Cursor<'_>, depth: usize) -> Option<Json> {
    if depth > MAX_DEPTH {
        return None;
    }
    cursor.eat(b'[')?;
    let mut items = Vec::new();
    cursor.skip_ws();
    if cursor.eat(b']').is_none() {
        loop {
            cursor.skip_ws();
            items.push(value(cursor, depth)?);
            cursor.skip_ws();
            if cursor.eat(b']').is_some() {
                break;
            }
            cursor.eat(b',')?;
        }
    }
    Some(Json::Array(items))
}

/// A string, unescaped.
fn string(cursor: &mut Cursor<'_>) -> Option<String> {
    cursor.eat(b'"')?;
    let mut out = String::new();
    loop {
        match cursor.piece()? {
            Piece::Run(run) => out.push_str(run),
            Piece::Char(c) => out.push(c),
            Piece::End => return Some(out),
        }
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        write_char(c, out);
    }
    out.push(b'"');
}
