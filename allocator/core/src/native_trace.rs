//! heapscope's native trace format: a compact binary form of a [`Trace`], for traces that do not come
//! from PyTorch.
//!
//! ```text
//! magic     8 bytes   "HSTRACE\0"
//! version   1 byte    1
//! name      varint length, then that many bytes of UTF-8 (read with control characters escaped and cut to
//!           about 256 characters: it heads every report, on a terminal)
//! events    varint count (of events and captions), then each:
//!             0x00 varint(size_bytes)   allocate; the allocation takes the next slot (0, 1, 2, ...)
//!             0x01 varint(slot)         free the live allocation in that slot
//!             0x02                      empty the cache (`torch.cuda.empty_cache()`)
//!             0x03 varint(length) UTF-8
//!                                       a caption (a CSV trace's comment line), before the event it is shown
//!                                       from (or after the last)
//! ```
//!
//! Varints are unsigned LEB128 (7 bits a byte, low bits first, at most 10 bytes). Slots are implicit on
//! allocation, so a typical event takes 2 to 5 bytes: the 12,355-event GPT-2 trace is 45 KB against
//! 270 KB of CSV. Nothing may follow the last one. Every error names the file and the byte offset. A
//! trace without captions is written as before captions were kept; builds before them refuse one with captions at the
//! caption's tag.

use std::path::Path;

use crate::trace::{Event, Trace, TraceBuilder};
use crate::{Error, Result};

/// The first bytes of a native trace.
pub const MAGIC: &[u8; 8] = b"HSTRACE\0";
/// The version this build writes and reads.
pub const VERSION: u8 = 1;

const ALLOC: u8 = 0;
const FREE: u8 = 1;
const EMPTY_CACHE: u8 = 2;
const CAPTION: u8 = 3;

fn push_varint(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Reads through a byte slice, failing with the offset.
struct Cursor<'a> {
    file: &'a str,
    bytes: &'a [u8],
    offset: usize,
}

impl Cursor<'_> {
    fn fail(&self, offset: usize, what: impl Into<String>) -> Error {
        Error::Trace { file: self.file.to_owned(), line: 0, what: format!("byte {offset}: {}", what.into()) }
    }

    fn byte(&mut self, what: &str) -> Result<u8> {
        let byte = *self.bytes.get(self.offset).ok_or_else(|| self.fail(self.offset, format!("truncated: expected {what}")))?;
        self.offset += 1;
        Ok(byte)
    }

    fn varint(&mut self, what: &str) -> Result<u64> {
        let start = self.offset;
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = self.byte(what)?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(self.fail(start, format!("{what} does not fit in 64 bits")));
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.fail(start, format!("{what} does not fit in 64 bits")))
    }
}

impl Trace {
    /// Whether `bytes` start like a native trace.
    pub fn is_native(bytes: &[u8]) -> bool {
        bytes.starts_with(MAGIC)
    }

    /// The native binary form.
    pub fn to_native(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.name.len() + self.events().len() * 4);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        push_varint(&mut out, self.name.len() as u64);
        out.extend_from_slice(self.name.as_bytes());
        push_varint(&mut out, (self.events().len() + self.captions().len()) as u64);
        let mut captions = self.captions().iter().peekable();
        let mut caption = |out: &mut Vec<u8>, before: usize| {
            while let Some(shown) = captions.next_if(|caption| caption.event <= before) {
                out.push(CAPTION);
                push_varint(out, shown.text.len() as u64);
                out.extend_from_slice(shown.text.as_bytes());
            }
        };
        for (index, event) in self.events().iter().enumerate() {
            caption(&mut out, index);
            match *event {
                Event::Alloc { size_bytes, .. } => {
                    out.push(ALLOC);
                    push_varint(&mut out, size_bytes);
                }
                Event::Free { slot } => {
                    out.push(FREE);
                    push_varint(&mut out, u64::from(slot));
                }
                Event::EmptyCache => out.push(EMPTY_CACHE),
            }
        }
        caption(&mut out, usize::MAX);
        out
    }

    /// Parses the native binary form; `file` names the input in errors.
    ///
    /// # Errors
    /// [`Error::Trace`] naming the file and the byte offset of what is wrong.
    pub fn parse_native(file: &str, bytes: &[u8]) -> Result<Self> {
        let mut cursor = Cursor { file, bytes, offset: 0 };
        if !Self::is_native(bytes) {
            return Err(cursor.fail(0, "not a heapscope native trace (no HSTRACE magic)"));
        }
        cursor.offset = MAGIC.len();
        let version = cursor.byte("the version")?;
        if version != VERSION {
            return Err(cursor.fail(MAGIC.len(), format!("version {version}; this build reads version {VERSION}")));
        }
        let name_offset = cursor.offset;
        let name_len = cursor.varint("the name length")?;
        let name_end =
            usize::try_from(name_len).ok().and_then(|len| cursor.offset.checked_add(len)).filter(|&end| end <= bytes.len());
        let Some(name_end) = name_end else {
            return Err(cursor.fail(name_offset, format!("truncated: a name of {name_len} bytes")));
        };
        let name = shown_name(
            std::str::from_utf8(&bytes[cursor.offset..name_end])
                .map_err(|_| cursor.fail(cursor.offset, "the name is not UTF-8"))?,
        );
        cursor.offset = name_end;
        let count = cursor.varint("the event count")?;
        let mut builder = TraceBuilder::new(name);
        let mut slots = 0u64;
        for _ in 0..count {
            let offset = cursor.offset;
            match cursor.byte("an event")? {
                CAPTION => {
                    let length = cursor.varint("a caption's length")?;
                    let end = usize::try_from(length)
                        .ok()
                        .and_then(|length| cursor.offset.checked_add(length))
                        .filter(|&end| end <= bytes.len())
                        .ok_or_else(|| cursor.fail(offset, format!("truncated: a caption of {length} bytes")))?;
                    let text = std::str::from_utf8(&bytes[cursor.offset..end])
                        .map_err(|_| cursor.fail(cursor.offset, "a caption is not UTF-8"))?;
                    builder.caption(text);
                    cursor.offset = end;
                }
                ALLOC => {
                    let size_bytes = cursor.varint("an allocation size")?;
                    builder.alloc(slots, size_bytes).map_err(|what| cursor.fail(offset, what.to_string()))?;
                    slots += 1;
                }
                FREE => {
                    let slot = cursor.varint("a slot")?;
                    builder.free(slot).map_err(|what| cursor.fail(offset, what.to_string()))?;
                }
                EMPTY_CACHE => builder.empty_cache(),
                tag => {
                    return Err(cursor.fail(
                        offset,
                        format!(
                            "unknown event tag 0x{tag:02x}: expected 0x00 (alloc), 0x01 (free), 0x02 (empty the cache) or \
                             0x03 (a caption)"
                        ),
                    ));
                }
            }
        }
        if cursor.offset != bytes.len() {
            return Err(cursor.fail(cursor.offset, format!("{} bytes after the last event", bytes.len() - cursor.offset)));
        }
        Ok(builder.finish())
    }

    /// Reads a trace file in the native form or the compact CSV, told apart by the magic.
    ///
    /// # Errors
    /// [`Error::Trace`] naming the file and what is wrong.
    pub fn read(path: &Path) -> Result<Self> {
        let file = crate::path_name(path);
        let bytes = std::fs::read(path).map_err(|error| Error::Trace {
            file: file.clone(),
            line: 0,
            what: format!("cannot read: {error}"),
        })?;
        if Self::is_native(&bytes) {
            return Self::parse_native(&file, &bytes);
        }
        let text = String::from_utf8(bytes).map_err(|error| {
            let at = error.utf8_error().valid_up_to();
            let line = error.as_bytes()[..at].iter().filter(|&&byte| byte == b'\n').count() as u64 + 1;
            Error::Trace {
                file: file.clone(),
                line,
                what: format!("neither a native trace nor a CSV trace: a CSV trace is UTF-8 text, and byte {at} is not"),
            }
        })?;
        Self::parse_csv(&file, &text)
    }

    /// Writes the native form to `path`.
    ///
    /// # Errors
    /// [`Error::Trace`] when the file cannot be written.
    pub fn write_native(&self, path: &Path) -> Result<()> {
        crate::whole_file::write_whole(path, |file| std::io::Write::write_all(file, &self.to_native()))
            .map_err(|error| Error::Trace { file: crate::path_name(path), line: 0, what: format!("cannot write: {error}") })
    }
}

/// The most characters of a name read from a file.
const NAME_CHARS: usize = 256;

/// `name` as a report may print it: control characters, line and paragraph separators and bidirectional overrides
/// escaped (`\n`, `\u{1b}`: a name cannot forge a line of output, move a terminal's cursor or reorder what follows),
/// and a name much longer than [`NAME_CHARS`] cut there with its length said. Stable: a name read this way reads
/// back the same (`convert` of a converted trace changes nothing).
fn shown_name(name: &str) -> String {
    // Room for the `… (N bytes)` a cut adds, so a cut name is not cut again.
    let cut = name.chars().count() > NAME_CHARS + 32;
    let mut shown = String::new();
    for (count, character) in name.chars().enumerate() {
        if cut && count == NAME_CHARS {
            shown.push_str(&format!("… ({} bytes)", name.len()));
            break;
        }
        let reorders = matches!(character, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if character.is_control() || reorders {
            shown.extend(character.escape_default());
        } else {
            shown.push(character);
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte that is not UTF-8 in a CSV trace is named with its line (the file was refused without one).
    #[test]
    fn a_csv_trace_not_utf8_names_its_line() {
        let path = std::env::temp_dir().join(format!("heapscope-not-utf8-{}.csv", std::process::id()));
        std::fs::write(&path, b"a,1,4096\n# caf\xe9\nf,1\n").unwrap();
        let error = Trace::read(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(error.contains(":2:") && error.contains("a CSV trace is UTF-8 text, and byte 14 is not"), "{error}");
    }

    fn sample() -> Trace {
        let mut builder = TraceBuilder::new("sample ✓");
        builder.alloc(10, 4096).unwrap();
        builder.alloc(20, u64::MAX).unwrap();
        builder.free(10).unwrap();
        builder.empty_cache();
        builder.alloc(10, 127).unwrap();
        builder.alloc(30, 128).unwrap();
        builder.free(20).unwrap();
        builder.finish()
    }

    #[test]
    fn varint_table() {
        let cases: [(u64, &[u8]); 5] = [
            (0, &[0]),
            (127, &[0x7f]),
            (128, &[0x80, 1]),
            (300, &[0xac, 2]),
            (u64::MAX, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1]),
        ];
        for (value, bytes) in cases {
            let mut out = Vec::new();
            push_varint(&mut out, value);
            assert_eq!(out, bytes, "{value}");
            let mut cursor = Cursor { file: "t", bytes, offset: 0 };
            assert_eq!(cursor.varint("v").unwrap(), value);
        }
    }

    #[test]
    fn a_name_cannot_forge_output() {
        let long = "n".repeat(300);
        let cases = [
            ("plain.csv", "plain.csv".to_owned()),
            ("\u{1b}[31mRED\u{1b}[0m\nfake: line", "\\u{1b}[31mRED\\u{1b}[0m\\nfake: line".to_owned()),
            ("a\u{202e}b\u{2028}c", "a\\u{202e}b\\u{2028}c".to_owned()),
            (long.as_str(), format!("{}… (300 bytes)", "n".repeat(256))),
            (&long[..280], "n".repeat(280)),
        ];
        for (name, shown) in cases {
            let mut builder = TraceBuilder::new(name);
            builder.alloc(1, 64).unwrap();
            let read = Trace::parse_native("t.hst", &builder.finish().to_native()).unwrap();
            assert_eq!(read.name, shown, "{name:?}");
            // Read back as it was read: converting again changes nothing.
            let again = Trace::parse_native("t.hst", &read.to_native()).unwrap();
            assert_eq!(again.name, read.name, "{name:?}");
        }
    }

    #[test]
    fn round_trip_keeps_name_and_events() {
        let trace = sample();
        let bytes = trace.to_native();
        let again = Trace::parse_native("t.hst", &bytes).unwrap();
        assert_eq!(again, trace);
    }

    /// A CSV trace's captions (comment lines) are kept: before the first event, between two, after the last (convert
    /// dropped them); a trace without captions is written as before.
    #[test]
    fn round_trip_keeps_captions() {
        let csv = "# heapscope trace v1\n# first\na,1,4096\n# second\n# and third\na,2,64\nf,1\n# the end\n";
        let trace = Trace::parse_csv("lesson.csv", csv).unwrap();
        assert_eq!(trace.captions().len(), 4);
        let again = Trace::parse_native("lesson.hst", &trace.to_native()).unwrap();
        assert_eq!((again.captions(), again.events()), (trace.captions(), trace.events()));
        let plain = Trace::parse_csv("plain.csv", "a,1,4096\nf,1\n").unwrap();
        assert_eq!(plain.to_native(), [&MAGIC[..], &[1, 9], b"plain.csv", &[2, ALLOC, 0x80, 0x20, FREE, 0]].concat());
        let bytes = trace.to_native();
        for len in 0..bytes.len() {
            let message = Trace::parse_native("cut.hst", &bytes[..len]).unwrap_err().to_string();
            assert!(message.starts_with("cut.hst: byte "), "{len}: {message}");
        }
    }

    #[test]
    fn every_truncation_is_an_error_naming_the_offset() {
        let bytes = sample().to_native();
        for len in 0..bytes.len() {
            let message = Trace::parse_native("cut.hst", &bytes[..len]).unwrap_err().to_string();
            assert!(message.starts_with("cut.hst: byte "), "{len}: {message}");
        }
    }

    #[test]
    fn bad_content_is_named() {
        let valid = sample().to_native();
        let header = MAGIC.len() + 1 + 1 + "sample ✓".len() + 1;
        let mut extra = valid.clone();
        extra.push(0);
        let mut bad_tag = valid.clone();
        bad_tag[header] = 7;
        let mut bad_version = valid.clone();
        bad_version[MAGIC.len()] = 9;
        let mut double_free = Trace::parse_native("t", &valid).unwrap().to_native();
        double_free.truncate(double_free.len() - 2);
        double_free.extend_from_slice(&[FREE, 0]);
        let cases: [(&[u8], &str); 6] = [
            (b"a,1,10\n", "no HSTRACE magic"),
            (&extra, "1 bytes after the last event"),
            (&bad_tag, "unknown event tag 0x07"),
            (&bad_version, "version 9"),
            (&double_free, "not live"),
            (
                &[b'H', b'S', b'T', b'R', b'A', b'C', b'E', 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
                "64 bits",
            ),
        ];
        for (bytes, needle) in cases {
            let message = Trace::parse_native("bad.hst", bytes).unwrap_err().to_string();
            assert!(message.contains(needle), "{needle}: {message}");
        }
    }

    #[test]
    fn read_tells_the_formats_apart() {
        let dir = std::env::temp_dir().join(format!("heapscope-native-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let native = dir.join("t.hst");
        let csv = dir.join("t.csv");
        let trace = sample();
        trace.write_native(&native).unwrap();
        std::fs::write(&csv, trace.to_csv()).unwrap();
        assert_eq!(Trace::read(&native).unwrap().events(), trace.events());
        assert_eq!(Trace::read(&csv).unwrap().events(), trace.events());
        std::fs::write(&csv, [0xffu8, 0xfe]).unwrap();
        assert!(Trace::read(&csv).unwrap_err().to_string().contains("neither a native trace nor a CSV trace"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
