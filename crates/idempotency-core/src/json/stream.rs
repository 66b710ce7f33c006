//! The canonical form written straight from the input, without building a tree.
//!
//! The fingerprint of every JSON request goes through here, so it allocates nothing once its
//! buffers have grown: strings and numbers are copied (strings re-escaped) into the output as
//! they are read, and an object whose members arrive out of key order has its members' bytes
//! moved into order when it closes (inner objects first, so an outer object moves finished
//! bytes). The output is byte for byte what [`Json::canonical`](super::Json::canonical) writes
//! for the parsed tree; a property test holds the two together. The tree is still what a
//! [`Projection`](super::Projection) works on.
//!
//! Moving an object's members re-copies the objects inside it, so a body nested many levels
//! deep with every level out of order would be copied once per level (a 1 MiB body nested 127
//! deep took 11 ms against 3 ms flat). Once the bytes moved pass twice the input (plus a few
//! KiB), the writer stops and the tree writes the form instead, each byte once: the cost stays
//! linear in the input whatever its shape.

use super::MAX_DEPTH;
use super::lex::{Cursor, Piece, Unescaped, write_char};
use std::cmp::Ordering;

/// Buffers reused across calls: the output, the members of the objects being read, and the
/// bytes of an object being put in key order.
#[derive(Debug, Default)]
pub(crate) struct Buffers {
    out: Vec<u8>,
    members: Vec<Member>,
    moved: Vec<u8>,
    /// How many inputs were handed to the tree because reordering them cost too much.
    pub(crate) handed_to_the_tree: u64,
}

/// Bytes the writer may move beyond twice the input before it hands the input to the tree.
const MOVE_SLACK: usize = 4096;

/// Larger buffers are dropped after use, so one large body does not pin memory for the life of
/// the thread.
const KEPT_CAPACITY: usize = 64 * 1024;

impl Buffers {
    /// The canonical form of `input`, or `None` when it is not JSON that can be canonicalised
    /// without changing its meaning (the same inputs [`parse`](super::parse) refuses).
    pub(crate) fn canonicalize(&mut self, input: &[u8]) -> Option<&[u8]> {
        self.out.clear();
        self.members.clear();
        let mut writer = Writer {
            cursor: Cursor::new(input),
            out: &mut self.out,
            members: &mut self.members,
            moved: &mut self.moved,
            may_move: input.len().saturating_mul(2).saturating_add(MOVE_SLACK),
            too_costly: false,
        };
        writer.cursor.skip_ws();
        let whole = writer.value(0).is_some() && {
            writer.cursor.skip_ws();
            writer.cursor.at_end()
        };
        if writer.too_costly {
            self.handed_to_the_tree += 1;
            self.members.clear();
            let tree = super::parse(input)?;
            self.out.clear();
            tree.write(&mut self.out);
            return Some(self.out.as_slice());
        }
        whole.then_some(self.out.as_slice())
    }

    /// Gives back the memory of buffers grown past what is worth keeping.
    pub(crate) fn trim(&mut self) {
        for buffer in [&mut self.out, &mut self.moved] {
            if buffer.capacity() > KEPT_CAPACITY {
                *buffer = Vec::new();
            }
        }
        if self.members.capacity() * std::mem::size_of::<Member>() > KEPT_CAPACITY {
            self.members = Vec::new();
        }
    }
}

/// One member of an object being read, as offsets into the output: its key (with its quotes)
/// starts at `start` and ends at `key_end`, its value ends at `end`.
#[derive(Clone, Copy, Debug)]
struct Member {
    start: usize,
    key_end: usize,
    end: usize,
    /// The key's canonical form holds an escape, so it sorts by its unescaped bytes, not its
    /// written ones.
    escaped: bool,
}

struct Writer<'a> {
    cursor: Cursor<'a>,
    out: &'a mut Vec<u8>,
    members: &'a mut Vec<Member>,
    moved: &'a mut Vec<u8>,
    /// Bytes the writer may still move to put members in order.
    may_move: usize,
    /// It stopped because moving cost too much: the tree takes over.
    too_costly: bool,
}

impl Writer<'_> {
    fn value(&mut self, depth: usize) -> Option<()> {
        match self.cursor.peek()? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string().map(|_| ()),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => {
                // Kept exactly as written.
                let number = self.cursor.number()?;
                self.out.extend_from_slice(number.as_bytes());
                Some(())
            }
            _ => None,
        }
    }

    fn literal(&mut self, word: &'static [u8]) -> Option<()> {
        self.cursor.literal(word)?;
        self.out.extend_from_slice(word);
        Some(())
    }

    fn object(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.cursor.eat(b'{')?;
        self.out.push(b'{');
        let first = self.members.len();
        self.cursor.skip_ws();
        if self.cursor.eat(b'}').is_none() {
            loop {
                self.cursor.skip_ws();
                let start = self.out.len();
                let escaped = self.string()?;
                let key_end = self.out.len();
                self.cursor.skip_ws();
                self.cursor.eat(b':')?;
                self.out.push(b':');
                self.cursor.skip_ws();
                self.value(depth)?;
                self.members.push(Member {
                    start,
                    key_end,
                    end: self.out.len(),
                    escaped,
                });
                self.cursor.skip_ws();
                if self.cursor.eat(b'}').is_some() {
                    break;
                }
                self.cursor.eat(b',')?;
                self.out.push(b',');
            }
        }
        self.order_members(first)?;
        self.members.truncate(first);
        self.out.push(b'}');
        Some(())
    }

    /// Puts the members from `first` on in key order; `None` on a duplicate key (parsers
    /// disagree on which one wins, so the meaning is not fixed).
    fn order_members(&mut self, first: usize) -> Option<()> {
        let out = &*self.out;
        let members = &mut self.members[first..];
        let mut sorted = true;
        for pair in members.windows(2) {
            match compare_keys(out, &pair[0], &pair[1]) {
                Ordering::Less => {}
                Ordering::Equal => return None,
                Ordering::Greater => sorted = false,
            }
        }
        if sorted {
            return Some(());
        }
        // Members were written in input order: the first starts the region to rewrite.
        let region = members.first()?.start;
        members.sort_unstable_by(|a, b| compare_keys(out, a, b));
        if members
            .windows(2)
            .any(|pair| compare_keys(out, &pair[0], &pair[1]) == Ordering::Equal)
        {
            return None;
        }
        // Rewrite the members' bytes in order, from a copy, unless that has cost too much.
        let moving = self.out.len() - region;
        match self.may_move.checked_sub(moving) {
            Some(left) => self.may_move = left,
            None => {
                self.too_costly = true;
                return None;
            }
        }
        self.moved.clear();
        self.moved.extend_from_slice(&self.out[region..]);
        self.out.truncate(region);
        for (i, member) in members.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.out
                .extend_from_slice(&self.moved[member.start - region..member.end - region]);
        }
        Some(())
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.cursor.eat(b'[')?;
        self.out.push(b'[');
        self.cursor.skip_ws();
        if self.cursor.eat(b']').is_none() {
            loop {
                self.cursor.skip_ws();
                self.value(depth)?;
                self.cursor.skip_ws();
                if self.cursor.eat(b']').is_some() {
                    break;
                }
                self.cursor.eat(b',')?;
                self.out.push(b',');
            }
        }
        self.out.push(b']');
        Some(())
    }

    /// Copies a string in its canonical form; whether that form holds an escape.
    fn string(&mut self) -> Option<bool> {
        self.cursor.eat(b'"')?;
        self.out.push(b'"');
        let mut escaped = false;
        loop {
            match self.cursor.piece()? {
                Piece::Run(run) => self.out.extend_from_slice(run.as_bytes()),
                Piece::Char(c) => escaped |= write_char(c, self.out),
                Piece::End => {
                    self.out.push(b'"');
                    return Some(escaped);
                }
            }
        }
    }
}

/// Orders two members by their keys' unescaped UTF-8 bytes, as the tree sorts them.
fn compare_keys(out: &[u8], a: &Member, b: &Member) -> Ordering {
    // Inside the quotes.
    let key = |m: &Member| &out[m.start + 1..m.key_end - 1];
    if !a.escaped && !b.escaped {
        return key(a).cmp(key(b));
    }
    Unescaped(key(a)).cmp(Unescaped(key(b)))
}
