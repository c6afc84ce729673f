//! The trace model: a stream of allocations and frees, and heapscope's compact CSV form of it.
//!
//! ```text
//! # heapscope trace v1: one event a line; '#' starts a comment
//! a,<id>,<size_bytes>      allocate size_bytes under the caller's id (size_bytes may carry a unit: 150MiB)
//! f,<id>                   free the allocation with that id
//! e                        empty the cache: `torch.cuda.empty_cache()`, cached memory no allocation uses goes back
//! # a comment on a line of its own is a caption: a lesson shows it from the next event on
//! ```
//!
//! Ids are the recorder's (an address, a counter); an id may be reused after its free. The parser maps them
//! to dense slots so a replay can keep its handles in a vector.

use crate::hash::FastMap;
use std::fmt;
use std::path::Path;

use crate::{Error, Result};

/// One step of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Event {
    /// Allocate `size_bytes`; the allocation is known as `slot` until freed.
    Alloc {
        /// Dense index of the allocation in the trace.
        slot: u32,
        /// Bytes requested.
        size_bytes: u64,
    },
    /// Free the allocation in `slot`.
    Free {
        /// Dense index of the allocation in the trace.
        slot: u32,
    },
    /// Give cached memory that no allocation uses back to the device (`torch.cuda.empty_cache()`): PyTorch's
    /// allocator releases its free segments, a heap its empty blocks, a paged heap its cached pages.
    EmptyCache,
}

/// A named stream of events in which every free follows its allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Trace {
    /// Where it came from.
    pub name: String,
    events: Vec<Event>,
    slots: u32,
    captions: Vec<Caption>,
}

/// A line of text a trace shows from one of its events on: a lesson's caption (a `#` comment on a line of its own in
/// the CSV form, before the event it introduces).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Caption {
    /// The index of the first event it is shown with (the number of events before it).
    pub event: usize,
    /// Its text.
    pub text: String,
}

/// An event that contradicts the trace so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadEvent {
    /// An allocation of 0 bytes.
    #[error("allocation {id} has size 0")]
    ZeroSize {
        /// The caller's id.
        id: u64,
    },
    /// An id allocated again before its free.
    #[error("allocation {id} is already live (allocated twice without a free)")]
    AlreadyLive {
        /// The caller's id.
        id: u64,
    },
    /// A free of an id that is not live.
    #[error("free of allocation {id}, which is not live")]
    NotLive {
        /// The caller's id.
        id: u64,
    },
    /// More allocations than slots.
    #[error("more than 2^32 allocations")]
    TooManyAllocations,
}

/// Builds a [`Trace`], checking that frees match live allocations.
#[derive(Debug, Default)]
pub struct TraceBuilder {
    trace: Trace,
    live: FastMap<u64, u32>,
}

impl TraceBuilder {
    /// An empty trace called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self { trace: Trace { name: name.into(), ..Trace::default() }, live: FastMap::default() }
    }

    /// Appends an allocation of `size_bytes` under `id`.
    ///
    /// # Errors
    /// [`BadEvent`] when `id` is already live or the size is 0; the builder is unchanged then.
    pub fn alloc(&mut self, id: u64, size_bytes: u64) -> Result<(), BadEvent> {
        if size_bytes == 0 {
            return Err(BadEvent::ZeroSize { id });
        }
        let slot = self.trace.slots;
        // One lookup: the entry is either the live allocation (refused) or where this one goes.
        match self.live.entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => return Err(BadEvent::AlreadyLive { id }),
            std::collections::hash_map::Entry::Vacant(vacant) => {
                self.trace.slots = slot.checked_add(1).ok_or(BadEvent::TooManyAllocations)?;
                vacant.insert(slot);
            }
        }
        self.trace.events.push(Event::Alloc { slot, size_bytes });
        Ok(())
    }

    /// Appends the free of the live allocation `id`.
    ///
    /// # Errors
    /// [`BadEvent::NotLive`] when `id` is not live.
    pub fn free(&mut self, id: u64) -> Result<(), BadEvent> {
        let slot = self.live.remove(&id).ok_or(BadEvent::NotLive { id })?;
        self.trace.events.push(Event::Free { slot });
        Ok(())
    }

    /// Whether allocation `id` is live (allocated and not freed since).
    pub fn is_live(&self, id: u64) -> bool {
        self.live.contains_key(&id)
    }

    /// The ids of the live allocations (allocated and not freed since), in no order.
    pub fn live_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.live.keys().copied()
    }

    /// Appends an `empty_cache()` call.
    pub fn empty_cache(&mut self) {
        self.trace.events.push(Event::EmptyCache);
    }

    /// Shows `text` from the next event on (a caption).
    pub fn caption(&mut self, text: impl Into<String>) {
        self.trace.captions.push(Caption { event: self.trace.events.len(), text: text.into() });
    }

    /// Shows `text` from event `event` on (a caption written once what it says is known), after the captions already
    /// at that event.
    pub fn caption_at(&mut self, event: usize, text: impl Into<String>) {
        let captions = &mut self.trace.captions;
        let index = captions.partition_point(|caption| caption.event <= event);
        captions.insert(index, Caption { event, text: text.into() });
    }

    /// The trace.
    pub fn finish(self) -> Trace {
        self.trace
    }
}

/// Text from the input as an error shows it: quoted, its first 60 characters at most, with its length when cut.
struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN_CHARS: usize = 60;
        match self.0.char_indices().nth(SHOWN_CHARS) {
            None => write!(f, "{:?}", self.0),
            Some((cut, _)) => write!(f, "{:?}… ({} bytes)", &self.0[..cut], self.0.len()),
        }
    }
}

impl Trace {
    /// The events in order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Number of allocations (slots) in the trace.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Its captions, in order of their events.
    pub fn captions(&self) -> &[Caption] {
        &self.captions
    }

    /// The caption shown with event `event`: the last one at or before it.
    pub fn caption_at(&self, event: usize) -> Option<&Caption> {
        let index = self.captions.partition_point(|caption| caption.event <= event);
        index.checked_sub(1).map(|index| &self.captions[index])
    }

    /// Parses the compact CSV form; `name` names the input in errors (a long field or line is cut there: a 20 MB
    /// line is not repeated on stderr).
    ///
    /// # Errors
    /// [`Error::Trace`] naming the line and what is wrong with it.
    pub fn parse_csv(name: &str, text: &str) -> Result<Self> {
        let mut builder = TraceBuilder::new(name);
        // A byte-order mark (Notepad and Excel write one) is no part of the first line.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (index, raw) in text.lines().enumerate() {
            let line = index as u64 + 1;
            let fail = |what: String| Error::Trace { file: name.to_owned(), line, what };
            let content = raw.split('#').next().unwrap_or_default().trim();
            if content.is_empty() {
                // A comment on a line of its own (not the format's header) is a caption.
                if let Some(text) = raw.trim().strip_prefix('#').map(str::trim)
                    && !text.is_empty()
                    && !text.starts_with("heapscope trace v1")
                {
                    builder.caption(text);
                }
                continue;
            }
            let fields: Vec<&str> = content.split(',').map(str::trim).collect();
            let shown = Shown(content);
            // Lines ended by a lone carriage return (old Mac files) read as one line: said with its error.
            let endings = if content.contains('\r') {
                " (it holds a carriage return: lines end in LF or CRLF here, not CR alone)"
            } else {
                ""
            };
            let number = |position: usize, what: &str| -> Result<u64> {
                let field = fields.get(position).ok_or_else(|| fail(format!("missing {what} in {shown}")))?;
                field.parse().map_err(|_| {
                    let why = if !field.is_empty() && field.bytes().all(|byte| byte.is_ascii_digit()) {
                        "is larger than 2^64 - 1"
                    } else {
                        "is not a non-negative integer"
                    };
                    fail(format!("{what} {} {why}", Shown(field)))
                })
            };
            // A size in bytes, or with a unit as the command line takes it (`150MiB`, `1.5 GiB`, `64k`).
            let size = |position: usize| -> Result<u64> {
                let field = fields.get(position).ok_or_else(|| fail(format!("missing size_bytes in {shown}")))?;
                crate::units::parse_size(field).map_err(|bad| fail(format!("size_bytes {}: {}", Shown(field), bad.what)))
            };
            match (fields[0], fields.len()) {
                ("a", 3) => builder.alloc(number(1, "id")?, size(2)?).map_err(|error| fail(error.to_string()))?,
                ("f", 2) => builder.free(number(1, "id")?).map_err(|error| fail(error.to_string()))?,
                ("e", 1) => builder.empty_cache(),
                ("a" | "f" | "e", count) => {
                    return Err(fail(format!("{count} fields in {shown}: expected a,<id>,<size_bytes>, f,<id> or e{endings}")));
                }
                (other, _) => {
                    return Err(fail(format!(
                        "unknown event {}: expected 'a' (alloc), 'f' (free) or 'e' (empty the cache){endings}",
                        Shown(other)
                    )));
                }
            }
        }
        Ok(builder.finish())
    }

    /// Reads a compact CSV trace file.
    ///
    /// # Errors
    /// [`Error::Trace`] naming the file (and the line, for bad content).
    pub fn read_csv(path: &Path) -> Result<Self> {
        let name = crate::path_name(path);
        let text = std::fs::read_to_string(path).map_err(|error| Error::Trace {
            file: name.clone(),
            line: 0,
            what: format!("cannot read: {error}"),
        })?;
        Self::parse_csv(&name, &text)
    }

    /// The compact CSV form (slots as ids).
    pub fn to_csv(&self) -> String {
        let mut text = format!("# heapscope trace v1: {}\n", self.name);
        let mut captions = self.captions.iter().peekable();
        for (index, event) in self.events.iter().enumerate() {
            while let Some(caption) = captions.next_if(|caption| caption.event <= index) {
                text.push_str(&format!("# {}\n", caption.text));
            }
            match event {
                Event::Alloc { slot, size_bytes } => text.push_str(&format!("a,{slot},{size_bytes}\n")),
                Event::Free { slot } => text.push_str(&format!("f,{slot}\n")),
                Event::EmptyCache => text.push_str("e\n"),
            }
        }
        for caption in captions {
            text.push_str(&format!("# {}\n", caption.text));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_round_trip() {
        let text = "# comment\na,100,4096\na,7,1 # trailing comment\n\nf,100\na,100,512\nf,7\na,8,1.5 KiB\na,9,2MiB\ne\n";
        let trace = Trace::parse_csv("t.csv", text).unwrap();
        assert_eq!(
            trace.events(),
            [
                Event::Alloc { slot: 0, size_bytes: 4096 },
                Event::Alloc { slot: 1, size_bytes: 1 },
                Event::Free { slot: 0 },
                Event::Alloc { slot: 2, size_bytes: 512 },
                Event::Free { slot: 1 },
                Event::Alloc { slot: 3, size_bytes: 1536 },
                Event::Alloc { slot: 4, size_bytes: 2 << 20 },
                Event::EmptyCache,
            ]
        );
        assert_eq!(trace.slots(), 5);
        let again = Trace::parse_csv("t.csv", &trace.to_csv()).unwrap();
        assert_eq!(again.events(), trace.events());
    }

    /// A byte-order mark before the first line, as Notepad and Excel write one, is skipped (it read as an unknown
    /// event `\u{feff}a`).
    #[test]
    fn a_byte_order_mark_is_skipped() {
        for text in ["\u{feff}a,1,4096\nf,1\n", "\u{feff}# heapscope trace v1\na,1,4096\nf,1\n"] {
            let trace = Trace::parse_csv("bom.csv", text).unwrap();
            assert_eq!(trace.events(), [Event::Alloc { slot: 0, size_bytes: 4096 }, Event::Free { slot: 0 }], "{text:?}");
        }
    }

    /// Comment lines are captions from the next event on; the header and trailing comments are not; they round-trip.
    #[test]
    fn comment_lines_are_captions() {
        let text = "# heapscope trace v1: lesson\n# Twenty blocks of 150 MiB\na,1,150MiB\na,2,150MiB # not a caption\n\
                    #\n# Now free every other one\nf,1\n# The end\n";
        let trace = Trace::parse_csv("lesson.csv", text).unwrap();
        let captions: Vec<(usize, &str)> = trace.captions().iter().map(|c| (c.event, c.text.as_str())).collect();
        assert_eq!(captions, [(0, "Twenty blocks of 150 MiB"), (2, "Now free every other one"), (3, "The end")]);
        let at = |event| trace.caption_at(event).map(|caption| caption.text.as_str());
        assert_eq!(
            (at(0), at(1), at(2), at(9)),
            (
                Some("Twenty blocks of 150 MiB"),
                Some("Twenty blocks of 150 MiB"),
                Some("Now free every other one"),
                Some("The end")
            )
        );
        let again = Trace::parse_csv("lesson.csv", &trace.to_csv()).unwrap();
        assert_eq!((again.captions(), again.events()), (trace.captions(), trace.events()));
        assert_eq!(Trace::parse_csv("t.csv", "a,1,1\n").unwrap().caption_at(0), None);
    }

    #[test]
    fn errors_name_file_line_and_problem() {
        let cases = [
            ("a,1,10\nx,2\n", 2, "unknown event \"x\""),
            ("e,1\n", 1, "2 fields in \"e,1\": expected a,<id>,<size_bytes>, f,<id> or e"),
            ("a,1\n", 1, "2 fields"),
            ("a,1,ten\n", 1, "size_bytes \"ten\": no number: it starts with 't'"),
            ("a,1,3 parsecs\n", 1, "size_bytes \"3 parsecs\": unknown unit"),
            ("a,1,0\n", 1, "size 0"),
            ("a,1,10\na,1,10\n", 2, "already live"),
            ("f,9\n", 1, "not live"),
            ("a,-1,10\n", 1, "id \"-1\""),
            ("a,18446744073709551616,10\n", 1, "id \"18446744073709551616\" is larger than 2^64 - 1"),
            ("a,1,-5\n", 1, "size_bytes \"-5\": a negative size"),
            ("a,1,4096\rf,1\n", 1, "lines end in LF or CRLF here, not CR alone"),
            ("e\rf,1\n", 1, "lines end in LF or CRLF here, not CR alone"),
        ];
        for (text, line, needle) in cases {
            let error = Trace::parse_csv("bad.csv", text).unwrap_err();
            let message = error.to_string();
            assert!(message.starts_with(&format!("bad.csv:{line}: ")) && message.contains(needle), "{text:?}: {message}");
        }
        // Issue 17: a 20 MB line is not repeated on stderr: the field is cut, its length said.
        let long = format!("a,1,{}\n", "9".repeat(20_000_000));
        let message = Trace::parse_csv("long.csv", &long).unwrap_err().to_string();
        assert!(message.len() < 200 && message.contains("… (20000000 bytes): larger than 2^64 bytes"), "{message}");
        let long_id = format!("a,{},10\n", "9".repeat(20_000_000));
        let message = Trace::parse_csv("long.csv", &long_id).unwrap_err().to_string();
        assert!(message.len() < 200 && message.contains("… (20000000 bytes) is larger than 2^64 - 1"), "{message}");
        let missing = Trace::read_csv(Path::new("/nonexistent/trace.csv")).unwrap_err().to_string();
        assert!(missing.contains("/nonexistent/trace.csv") && missing.contains("cannot read"), "{missing}");
    }

    #[test]
    fn a_refused_event_leaves_the_builder_unchanged() {
        let mut builder = TraceBuilder::new("t");
        builder.alloc(1, 10).unwrap();
        assert!(builder.alloc(1, 20).is_err());
        assert!(builder.alloc(2, 0).is_err());
        assert!(builder.free(7).is_err());
        builder.free(1).unwrap();
        let trace = builder.finish();
        assert_eq!(trace.events(), [Event::Alloc { slot: 0, size_bytes: 10 }, Event::Free { slot: 0 }]);
        assert_eq!(trace.slots(), 1);
    }
}
