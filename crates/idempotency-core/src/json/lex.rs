//! What both JSON readers share: the tokens of RFC 8259 (white space, literals, numbers, the
//! pieces of a string), and the one way a canonical string escapes a character. The tree
//! parser (`mod.rs`) and the streaming writer (`stream.rs`) differ only in what they build.

/// A position in the input.
pub(super) struct Cursor<'a> {
    input: &'a [u8],
    pos: usize,
}

/// A piece of a string's contents.
pub(super) enum Piece<'a> {
    /// A run of characters that need no escape, as written.
    Run(&'a str),
    /// The character an escape stands for.
    Char(char),
    /// The closing quote.
    End,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(input: &'a [u8]) -> Self {
        Cursor { input, pos: 0 }
    }

    /// The whole input was read.
    pub(super) fn at_end(&self) -> bool {
        self.pos == self.input.len()
    }

    pub(super) fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    pub(super) fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    pub(super) fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.pos += 1)
    }

    /// Reads `word` (`true`, `false`, `null`).
    pub(super) fn literal(&mut self, word: &'static [u8]) -> Option<()> {
        let end = self.pos.checked_add(word.len())?;
        (self.input.get(self.pos..end)? == word).then(|| self.pos = end)
    }

    /// Reads a number; its literal exactly as written.
    pub(super) fn number(&mut self) -> Option<&'a str> {
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
        std::str::from_utf8(&self.input[start..self.pos]).ok()
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

    /// The next piece of a string whose opening quote was read; `None` when it is not JSON (a
    /// raw control character, a bad escape, a lone surrogate, invalid UTF-8, no closing quote).
    pub(super) fn piece(&mut self) -> Option<Piece<'a>> {
        match self.peek()? {
            b'"' => {
                self.pos += 1;
                Some(Piece::End)
            }
            b'\\' => {
                self.pos += 1;
                self.escape().map(Piece::Char)
            }
            // A raw control character inside a string is not JSON.
            b if b < 0x20 => None,
            _ => {
                // The longest run of plain characters. `"`, `\` and control characters are
                // ASCII, so a run never ends inside a UTF-8 sequence.
                let start = self.pos;
                while let Some(b) = self.peek() {
                    if b == b'"' || b == b'\\' || b < 0x20 {
                        break;
                    }
                    self.pos += 1;
                }
                std::str::from_utf8(&self.input[start..self.pos])
                    .ok()
                    .map(Piece::Run)
            }
        }
    }

    /// The character an escape (after its `\`) stands for.
    fn escape(&mut self) -> Option<char> {
        let escaped = self.peek()?;
        self.pos += 1;
        Some(match escaped {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
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
                        0x10000 + ((u32::from(first) - 0xD800) << 10) + (u32::from(second) - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return None,
                    other => u32::from(other),
                };
                char::from_u32(code)?
            }
            _ => return None,
        })
    }
}

/// Writes `c` as a canonical string writes it: `"`, `\` and control characters escaped (the
/// short form where JSON has one, else `\u00xx`), everything else as itself. Whether that took
/// an escape.
pub(super) fn write_char(c: char, out: &mut Vec<u8>) -> bool {
    let escape: &[u8] = match c {
        '"' => b"\\\"",
        '\\' => b"\\\\",
        '\n' => b"\\n",
        '\r' => b"\\r",
        '\t' => b"\\t",
        '\u{8}' => b"\\b",
        '\u{c}' => b"\\f",
        c if (c as u32) < 0x20 => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            let code = c as usize;
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[code >> 4], HEX[code & 0xf]]);
            return true;
        }
        c => {
            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
            return false;
        }
    };
    out.extend_from_slice(escape);
    true
}

/// The bytes a canonical string's contents stand for: what [`write_char`] wrote, its escapes
/// undone. Every escape stands for one ASCII byte (the canonical form escapes only `"`, `\`
/// and control characters).
#[derive(Clone)]
pub(super) struct Unescaped<'a>(pub(super) &'a [u8]);

impl Iterator for Unescaped<'_> {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        let (&first, rest) = self.0.split_first()?;
        if first != b'\\' {
            self.0 = rest;
            return Some(first);
        }
        let (&kind, rest) = rest.split_first()?;
        let (byte, rest) = match kind {
            b'n' => (b'\n', rest),
            b'r' => (b'\r', rest),
            b't' => (b'\t', rest),
            b'b' => (0x08, rest),
            b'f' => (0x0c, rest),
            // `\u00XX`: two hex digits after `00`.
            b'u' => {
                let digits = rest.get(2..4)?;
                let value = std::str::from_utf8(digits)
                    .ok()
                    .and_then(|d| u8::from_str_radix(d, 16).ok())?;
                (value, rest.get(4..)?)
            }
            // `\"` and `\\`.
            other => (other, rest),
        };
        self.0 = rest;
        Some(byte)
    }
}
