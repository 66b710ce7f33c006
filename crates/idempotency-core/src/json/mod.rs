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
//! Files: `mod.rs` (the parser and the tree), `stream.rs` (the canonical form written straight
//! from the input, without a tree: what a fingerprint without a projection uses), `pointer.rs`
//! (JSON pointers, and the projections a [`FingerprintSpec`](crate::FingerprintSpec) applies to
//! the tree before the canonical form is written).

mod pointer;
mod stream;
#[cfg(test)]
mod tests;

pub(crate) use pointer::Projection;
pub use pointer::{JsonPointer, JsonPointerError};
pub(crate) use stream::Buffers;

use std::fmt::Write as _;

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
    let mut parser = Parser { input, pos: 0 };
    parser.skip_ws();
    let value = parser.value(0)?;
    parser.skip_ws();
    (parser.pos == input.len()).then_some(value)
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
        let mut out = String::new();
        self.write(&mut out);
        out.into_bytes()
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(true) => out.push_str("true"),
            Json::Bool(false) => out.push_str("false"),
            Json::Number(literal) => out.push_str(literal),
            Json::String(s) => write_string(s, out),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            Json::Object(members) => {
                out.push('{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(key, out);
                    out.push(':');
                    value.write(out);
                }
                out.push('}');
            }
        }
    }
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.pos += 1)
    }

    fn literal(&mut self, word: &'static str, value: Json) -> Option<Json> {
        let end = self.pos.checked_add(word.len())?;
        (self.input.get(self.pos..end)? == word.as_bytes()).then(|| {
            self.pos = end;
            value
        })
    }

    fn value(&mut self, depth: usize) -> Option<Json> {
        match self.peek()? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string().map(Json::String),
            b't' => self.literal("true", Json::Bool(true)),
            b'f' => self.literal("false", Json::Bool(false)),
            b'n' => self.literal("null", Json::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn object(&mut self, depth: usize) -> Option<Json> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        let mut members: Vec<(String, Json)> = Vec::new();
        self.skip_ws();
        if self.eat(b'}').is_none() {
            loop {
                self.skip_ws();
                let key = self.string()?;
                self.skip_ws();
                self.eat(b':')?;
                self.skip_ws();
                let value = self.value(depth)?;
                members.push((key, value));
                self.skip_ws();
                match self.peek()? {
                    b',' => self.pos += 1,
                    b'}' => {
                        self.pos += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        members.sort_by(|a, b| a.0.cmp(&b.0));
        if members.windows(2).any(|w| w[0].0 == w[1].0) {
            // Duplicate keys: parsers disagree on which one wins, so the meaning is not fixed.
            return None;
        }
        Some(Json::Object(members))
    }

    fn array(&mut self, depth: usize) -> Option<Json> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(b'[')?;
        let mut items = Vec::new();
        self.skip_ws();
        if self.eat(b']').is_none() {
            loop {
                self.skip_ws();
                items.push(self.value(depth)?);
                self.skip_ws();
                match self.peek()? {
                    b',' => self.pos += 1,
                    b']' => {
                        self.pos += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        Some(Json::Array(items))
    }

    fn number(&mut self) -> Option<Json> {
        let start = self.pos;
        let _ = self.eat(b'-');
        match self.peek()? {
            b'0' => self.pos += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.').is_some() {
            self.digits_required()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.digits_required()?;
        }
        // The grammar above only admits ASCII, so this is valid UTF-8.
        let literal = std::str::from_utf8(&self.input[start..self.pos]).ok()?;
        Some(Json::Number(literal.to_owned()))
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    fn digits_required(&mut self) -> Option<()> {
        let start = self.pos;
        self.digits();
        (self.pos > start).then_some(())
    }

    fn hex4(&mut self) -> Option<u16> {
        let end = self.pos.checked_add(4)?;
        let text = std::str::from_utf8(self.input.get(self.pos..end)?).ok()?;
        if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.pos = end;
        u16::from_str_radix(text, 16).ok()
    }

    fn string(&mut self) -> Option<String> {
        self.eat(b'"')?;
        let mut out = String::new();
        loop {
            // Copy the longest run of plain characters at once.
            let run_start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(std::str::from_utf8(&self.input[run_start..self.pos]).ok()?);
            match self.peek()? {
                b'"' => {
                    self.pos += 1;
                    return Some(out);
                }
                b'\\' => {
                    self.pos += 1;
                    let escaped = self.peek()?;
                    self.pos += 1;
                    match escaped {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let first = self.hex4()?;
                            let code = match first {
                                0xD800..=0xDBFF => {
                                    self.eat(b'\\')?;
                                    self.eat(b'u')?;
                                    let second = self.hex4()?;
                                    if !(0xDC00..=0xDFFF).contains(&second) {
                                        return None;
                                    }
                                    0x10000
                                        + ((u32::from(first) - 0xD800) << 10)
                                        + (u32::from(second) - 0xDC00)
                                }
                                0xDC00..=0xDFFF => return None,
                                other => u32::from(other),
                            };
                            out.push(char::from_u32(code)?);
                        }
                        _ => return None,
                    }
                }
                // A raw control character inside a string is not JSON.
                _ => return None,
            }
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
