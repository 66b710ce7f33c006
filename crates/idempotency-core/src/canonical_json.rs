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

use std::fmt::Write as _;

/// Deepest nesting of arrays and objects accepted.
pub(crate) const MAX_DEPTH: usize = 128;

/// Returns the canonical form of `input`, or `None` when it is not JSON that can be
/// canonicalised without changing its meaning.
pub(crate) fn canonicalize(input: &[u8]) -> Option<Vec<u8>> {
    let mut parser = Parser { input, pos: 0 };
    let mut out = String::with_capacity(input.len());
    parser.skip_ws();
    parser.value(&mut out, 0)?;
    parser.skip_ws();
    (parser.pos == input.len()).then(|| out.into_bytes())
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

    fn literal(&mut self, word: &'static str, out: &mut String) -> Option<()> {
        let end = self.pos.checked_add(word.len())?;
        (self.input.get(self.pos..end)? == word.as_bytes()).then(|| {
            self.pos = end;
            out.push_str(word);
        })
    }

    fn value(&mut self, out: &mut String, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(out, depth + 1),
            b'[' => self.array(out, depth + 1),
            b'"' => {
                let s = self.string()?;
                write_string(&s, out);
                Some(())
            }
            b't' => self.literal("true", out),
            b'f' => self.literal("false", out),
            b'n' => self.literal("null", out),
            b'-' | b'0'..=b'9' => self.number(out),
            _ => None,
        }
    }

    fn object(&mut self, out: &mut String, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        let mut members: Vec<(String, String)> = Vec::new();
        self.skip_ws();
        if self.eat(b'}').is_none() {
            loop {
                self.skip_ws();
                let key = self.string()?;
                self.skip_ws();
                self.eat(b':')?;
                self.skip_ws();
                let mut value = String::new();
                self.value(&mut value, depth)?;
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
        out.push('{');
        for (i, (key, value)) in members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            write_string(key, out);
            out.push(':');
            out.push_str(value);
        }
        out.push('}');
        Some(())
    }

    fn array(&mut self, out: &mut String, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(b'[')?;
        out.push('[');
        self.skip_ws();
        if self.eat(b']').is_none() {
            let mut first = true;
            loop {
                if !first {
                    out.push(',');
                }
                first = false;
                self.skip_ws();
                self.value(out, depth)?;
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
        out.push(']');
        Some(())
    }

    fn number(&mut self, out: &mut String) -> Option<()> {
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
        out.push_str(std::str::from_utf8(&self.input[start..self.pos]).ok()?);
        Some(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> Option<String> {
        canonicalize(s.as_bytes()).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn sorts_keys_and_drops_white_space() {
        assert_eq!(
            canon(" { \"b\" : [1, 2 ,{\"z\":null,\"a\":true}], \"a\": \"x\" } ").as_deref(),
            Some(r#"{"a":"x","b":[1,2,{"a":true,"z":null}]}"#)
        );
    }

    #[test]
    fn keeps_number_literals_exactly() {
        assert_eq!(
            canon("[12345678901234567890123, 12345678901234567890124, 1.0, 1, -0, 1e3]").as_deref(),
            Some("[12345678901234567890123,12345678901234567890124,1.0,1,-0,1e3]")
        );
    }

    #[test]
    fn normalises_string_escapes() {
        assert_eq!(
            canon(r#""\u0041\/\n\u00e9""#).as_deref(),
            Some("\"A/\\né\"")
        );
        assert_eq!(canon(r#""\ud83d\ude00""#).as_deref(), Some("\"😀\""));
    }

    #[test]
    fn refuses_what_it_cannot_canonicalise_safely() {
        for bad in [
            r#"{"a":1,"a":2}"#,
            r#""\ud83d""#,
            r#""\ude00""#,
            "[1,]",
            "{\"a\" 1}",
            "01",
            "1.",
            "-",
            "\"a\u{1}b\"",
            "tru",
            "[1] [2]",
            "",
        ] {
            assert_eq!(canon(bad), None, "{bad:?} must not canonicalise");
        }
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(canon(&deep), None);
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert_eq!(canon(&ok), Some(ok));
    }

    #[test]
    fn agrees_with_serde_json_on_meaning() {
        let doc = r#"{"title":"Buy milk","tags":["a","b"],"n":{"x":1.5,"y":[true,false,null]}}"#;
        let ours = canon(doc).unwrap();
        let a: serde_json::Value = serde_json::from_str(doc).unwrap();
        let b: serde_json::Value = serde_json::from_str(&ours).unwrap();
        assert_eq!(a, b);
    }

    /// Nested JSON documents: objects, arrays, strings with escapes and non-ASCII text, integers,
    /// decimals, booleans and nulls, up to four levels deep.
    fn nested_document() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            (-1e6f64..1e6).prop_map(serde_json::Value::from),
            "[a-z\u{e9}\u{1f600}\"\\\n\t/]{0,8}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                proptest::collection::btree_map("[a-z\u{e9}\"]{0,5}", inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// `value` written with every object's members in reverse order and with white space, as
    /// another client might serialise it.
    fn reversed_and_spaced(value: &serde_json::Value) -> String {
        match value {
            serde_json::Value::Object(map) => {
                let members: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(k, v)| {
                        format!(
                            " {} : {} ",
                            serde_json::to_string(k).unwrap(),
                            reversed_and_spaced(v)
                        )
                    })
                    .collect();
                format!("{{\n{}\n}}", members.join(",\n"))
            }
            serde_json::Value::Array(items) => {
                let items: Vec<String> = items.iter().map(reversed_and_spaced).collect();
                format!("[ {} ]", items.join(" , "))
            }
            other => serde_json::to_string(other).unwrap(),
        }
    }

    proptest::proptest! {
        #[test]
        fn agrees_with_serde_json_on_nested_documents(value in nested_document()) {
            let compact = serde_json::to_vec(&value).unwrap();
            let pretty = serde_json::to_vec_pretty(&value).unwrap();
            let reversed = reversed_and_spaced(&value);
            let canonical = canonicalize(&compact);
            proptest::prop_assert!(canonical.is_some(), "serde_json's output must canonicalise");
            let canonical = canonical.unwrap();
            // Same meaning: the canonical form parses to what the document parses to (both read
            // by serde_json, whose float parsing is not exact without `float_roundtrip`).
            let back: serde_json::Value = serde_json::from_slice(&canonical).unwrap();
            let read: serde_json::Value = serde_json::from_slice(&compact).unwrap();
            proptest::prop_assert_eq!(&back, &read);
            // One form whatever the layout and key order.
            proptest::prop_assert_eq!(canonicalize(&pretty), Some(canonical.clone()));
            proptest::prop_assert_eq!(canonicalize(reversed.as_bytes()), Some(canonical.clone()));
            // Canonical is a fixed point.
            proptest::prop_assert_eq!(canonicalize(&canonical), Some(canonical.clone()));
        }

        #[test]
        fn never_panics_on_arbitrary_bytes(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = canonicalize(&raw);
        }

        #[test]
        fn reserialised_json_has_the_same_canonical_form(
            entries in proptest::collection::btree_map("[a-z\u{e9}\"\\\\]{0,6}", proptest::num::i64::ANY, 0..8)
        ) {
            // serde_json writes keys in one order; writing them reversed and pretty must not matter.
            let value = serde_json::Value::Object(entries.iter().map(|(k, v)| (k.clone(), (*v).into())).collect());
            let compact = serde_json::to_vec(&value).unwrap();
            let mut reversed = String::from("{\n");
            for (i, (k, v)) in entries.iter().rev().enumerate() {
                if i > 0 { reversed.push_str(",\n"); }
                reversed.push_str(&format!("  {} :  {}", serde_json::to_string(k).unwrap(), v));
            }
            reversed.push_str("\n}");
            proptest::prop_assert_eq!(canonicalize(&compact), canonicalize(reversed.as_bytes()));
            proptest::prop_assert!(canonicalize(&compact).is_some());
        }
    }
}
