//! A purpose-built, streaming reader for the pickles that hold PyTorch memory snapshots.
//!
//! # Why not a general pickle crate
//!
//! A snapshot is plain builtin data (dicts, lists, tuples, str, int, float, bool, None) but large: a
//! 400 000-event trace is ~35 MB of pickle, and python's own `pickle.loads` needs 0.8 s for it. A generic
//! value tree of that file costs ~450 bytes a trace entry (an `Rc` dict of eight key/value pairs), several
//! times the file. This reader runs the pickle machine over a small [`Value`] type, and lets a [`Sink`]
//! take the items appended to lists it recognises (a device's trace list) as they arrive, so memory stays
//! near the typed model's size (a `TraceEntry` is 48 bytes). Everything else (segments, settings) stays
//! generic and is converted at the end.
//!
//! # The fast path for trace entries and segments
//!
//! Building each event's generic dict and converting it was most of the time (SETITEMS, memo gets and
//! malloc/free of `Rc`s and `String`s). So when a dict is about to become an item of a list the sink reads
//! directly ([`Sink::reads_items`]: a device's trace, the root's `segments`), the machine first offers the
//! sink a [`Scan`] over the buffered input ([`Sink::read_item`]): a schema-directed reader of plain [`Token`]s
//! that decodes the dict straight into a `TraceEntry` (or a `Segment` with its blocks), with no `Value`, no
//! `Rc` and no allocation per event:
//!
//! - keys and names (actions, pools, block states) are matched as small integers: [`Sink::atom`] maps a str
//!   to an id once, when it is memo'd, and the machine keeps the ids beside the memo, so a key that is a memo
//!   get (every key after the first event) costs an array load and an integer compare;
//! - a new str that is memo'd (a per-event `compile_context` such as `"N/A"`) is kept inline in its memo
//!   slot ([`Value::Short`], up to 14 bytes), decoded to an `Rc<str>` only if read back generically; one equal
//!   to the latest such str reuses its UTF-8 check and atom;
//! - an entry's dict slot is written once, as [`Value::Consumed`]; a frame list's becomes [`Value::Stack`], a
//!   frame dict's [`Value::Frame`], a segment's, its blocks list's and its blocks' [`Value::Converted`], as the
//!   generic path leaves them.
//!
//! The fast path never reports an error: on anything unexpected (a malformed or truncated opcode, a
//! wrong type, a missing key, a key met twice in a segment, an int beyond 64 bits, a nested value, an item
//! longer than the 64 KiB window) it gives up, the machine rewinds the input and the memo, and the generic
//! path builds and converts that dict, with its error messages and byte offsets. An item so taken stands in
//! the list as [`Value::Taken`] until its `APPENDS`.
//!
//! # Sharing
//!
//! Memo'd objects are `Rc`s, so an object the pickle refers to many times (a key string, a frame list
//! shared through the memo) exists once. A sink may replace a memo entry with an already converted form
//! ([`Value::Stack`], [`Value::Frame`]) so a frame list shared by every event is decoded and interned once,
//! with [`Value::Consumed`] once it has taken the object (so the memo does not keep every event alive), or
//! with [`Value::Converted`] and the sink's mark for an object the schema never shares (a segment, its
//! blocks): its generic values go at once, and a second reference is refused naming the first place.
//!
//! # Measured
//!
//! `cargo bench -p heapscope-lab --bench snapshot_import` (BENCHMARKS.md, "Reading and replaying PyTorch
//! snapshots", has every number and the commands): on the layout PyTorch >= 2.5 writes, the import takes about a
//! fifth of python3's `pickle.load` of the same file, and its peak is about the file's size (a 48-byte
//! `TraceEntry` and two memo slots of five bytes an entry, [`Memo`], against ~75 bytes of pickle). Where the time
//! goes (perf): the fast path's token decoding and memo pushes, the machine's dispatch, page faults. The input is
//! read in 1 MiB chunks, never whole (a large file from a second thread that reads and gunzips it: the import's
//! `read_ahead.rs`); `read_snapshot` reserves the trace from the file's (or the gzip trailer's) size so it is
//! never copied while it grows.
//!
//! # Where a container sits
//!
//! The pickler pushes an empty container, then its items, then `SETITEMS`/`APPENDS` (or the one-item
//! `SETITEM`/`APPEND`). So when a container is created its parent is known from the stack: the container
//! just below the latest mark (with the key on top, for a dict), or, without an open mark, the list on top
//! of the stack (`APPEND` form) or the dict below the key (`SETITEM` form). The sink tags containers from
//! their parent's tag and the key or index; tags only decide what is taken early, the final conversion
//! checks the whole schema either way.
//!
//! Opcodes: protocols 2 to 5 as Python 3.8 to 3.14 write plain builtin data (PROTO, FRAME, MEMOIZE,
//! BINPUT/LONG_BINPUT, BINGET/LONG_BINGET, EMPTY_DICT/LIST/TUPLE, MARK, SETITEM(S), APPEND(S), TUPLE/1/2/3,
//! LIST, DICT, POP, POP_MARK, DUP, BININT/1/2, LONG1/LONG4 (of any width: `pickle_int.rs`), BINUNICODE/SHORT_BINUNICODE/
//! BINUNICODE8, BINFLOAT, NEWTRUE/NEWFALSE, NONE, STOP). Values of builtin types no snapshot key holds are read past
//! and kept as their type ([`Value::Opaque`]): bytes, bytearrays and sets by their own opcodes (protocols 3 to 5) or as
//! python's reductions of them before those (`GLOBAL`/`STACK_GLOBAL` of `_codecs.encode`, `builtins.set`,
//! `frozenset`, `bytearray`, `bytes`, then `REDUCE`), so a file's protocol does not decide whether it reads. Anything
//! else (another class, protocol 0 text opcodes) is an error naming the opcode (the class) and its byte offset.

use std::cell::RefCell;
use std::fmt;
use std::io::{self, Read};
use std::rc::Rc;

use crate::pickle_int::{Int, LongInt};

/// A decoded pickle value.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An int that fits `i64`.
    Int(i64),
    /// An int wider than `i64` (of any width).
    Long(Box<LongInt>),
    /// A float.
    Float(f64),
    /// A str.
    Str(Rc<String>),
    /// A list.
    List(Rc<RefCell<List>>),
    /// A dict, as its items in insertion order (a later duplicate key wins).
    Dict(Rc<RefCell<Dict>>),
    /// A tuple.
    Tuple(Rc<Vec<Value>>),
    /// A frame list already interned by the sink (a `StackId`).
    Stack(u32),
    /// A frame dict already converted by the sink (an index into its frame table).
    Frame(u32),
    /// An object the sink has taken (its memo entry, if referenced again).
    Consumed,
    /// A trace entry the sink read directly from the input (see [`Sink::read_item`]); stands in the list
    /// being built until `APPENDS` counts it.
    Taken,
    /// A list or dict the sink converted as it arrived and let go of (a segment, its blocks): what its memo slot
    /// holds then, with the sink's mark, so that a second reference is refused naming the first place.
    Converted(u32),
    /// A short memo'd str kept inline (see [`Scan`]); becomes a `Str` when the machine reads it back.
    Short(ShortStr),
    /// A memo slot never written.
    Hole,
    /// A value of a type no snapshot key holds (bytes, a set), read past and kept as its type alone: under a key the
    /// importer ignores it costs nothing, under one it reads it is named in the error.
    Opaque(Opaque),
}

/// The builtin types a snapshot's schema never uses but a pickle of builtin data may hold (a key added by hand).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Opaque {
    Bytes,
    ByteArray,
    Set,
    FrozenSet,
}

impl Opaque {
    fn name(self) -> &'static str {
        match self {
            Opaque::Bytes => "bytes",
            Opaque::ByteArray => "bytearray",
            Opaque::Set => "set",
            Opaque::FrozenSet => "frozenset",
        }
    }
}

/// Values nest as deep as the input says (a 305-byte pickle can nest 200,000 tuples): dropping a tree by recursion
/// would overflow the stack, so a container's children are dropped here from a heap stack instead, each container
/// emptied before it goes. Shared containers (`Rc`s the memo still holds) are left to their last owner.
impl Drop for Value {
    #[inline]
    fn drop(&mut self) {
        // Scalars (most of a memo: every key, every consumed entry) have no children: no heap stack for them.
        if !matches!(self, Value::List(_) | Value::Dict(_) | Value::Tuple(_)) {
            return;
        }
        let mut stack = Vec::new();
        take_children(self, &mut stack);
        while let Some(mut value) = stack.pop() {
            take_children(&mut value, &mut stack);
            // `value` goes now, with no children left to recurse into.
        }
    }
}

/// Moves the children of `value` (a container nobody else holds) onto `stack`, leaving it empty.
fn take_children(value: &mut Value, stack: &mut Vec<Value>) {
    match value {
        Value::List(list) => {
            if let Some(list) = Rc::get_mut(list) {
                stack.append(&mut list.get_mut().items);
            }
        }
        Value::Dict(dict) => {
            if let Some(dict) = Rc::get_mut(dict) {
                for (key, item) in dict.get_mut().items.drain(..) {
                    stack.push(key);
                    stack.push(item);
                }
            }
        }
        Value::Tuple(items) => {
            if let Some(items) = Rc::get_mut(items) {
                stack.append(items);
            }
        }
        _ => {}
    }
}

impl Value {
    /// Python's name of the value's type, for error messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::Long(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) | Value::Short(_) => "str",
            Value::List(_) | Value::Stack(_) => "list",
            Value::Dict(_) | Value::Frame(_) => "dict",
            Value::Tuple(_) => "tuple",
            Value::Consumed | Value::Taken => "trace entry taken earlier (shared through the memo)",
            Value::Converted(_) => "object read earlier (shared through the memo)",
            Value::Hole => "missing memo entry",
            Value::Opaque(kind) => kind.name(),
        }
    }

    /// Its type, with its value when it is a plain one (`str "True"`, `int 5`): what an error says it found.
    pub(crate) fn described(&self) -> String {
        let text = |text: &str| {
            const SHOWN_CHARS: usize = 60;
            match text.char_indices().nth(SHOWN_CHARS) {
                Some((end, _)) => format!("str {:?}...", &text[..end]),
                None => format!("str {text:?}"),
            }
        };
        match self {
            Value::Bool(value) => format!("bool {}", if *value { "True" } else { "False" }),
            Value::Int(value) => format!("int {value}"),
            // `{:?}` keeps a whole float a float: 150000000.0, not an int's 150000000.
            Value::Float(value) => format!("float {value:?}"),
            Value::Str(value) => text(value),
            Value::Short(value) => text(value.as_str()),
            other => other.type_name().to_owned(),
        }
    }

    /// The int, of any width, if the value is one (bools count as 0 and 1, as in Python).
    pub(crate) fn as_int(&self) -> Option<Int<'_>> {
        match self {
            Value::Int(value) => Some(Int::Fits(i128::from(*value))),
            Value::Long(value) => Some(value.to_i128().map_or(Int::Long(value), Int::Fits)),
            Value::Bool(value) => Some(Int::Fits(i128::from(*value))),
            _ => None,
        }
    }

    /// The int, if the value is one that fits `i128`.
    #[cfg(test)]
    pub(crate) fn as_i128(&self) -> Option<i128> {
        self.as_int()?.to()
    }
}

/// A str of up to 14 bytes, inline.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShortStr {
    len: u8,
    bytes: [u8; 14],
}

impl ShortStr {
    fn new(text: &str) -> Option<Self> {
        let mut bytes = [0; 14];
        bytes.get_mut(..text.len())?.copy_from_slice(text.as_bytes());
        Some(Self { len: text.len() as u8, bytes })
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

// A value stays two words.
const _: () = assert!(size_of::<Value>() == 16);

/// The pickle memo, in five bytes a slot: most slots of a snapshot's memo are its trace entries' dicts, taken as they
/// arrive ([`Value::Consumed`]), and their `compile_context` strs, each equal to the one before (`"N/A"`), and a
/// 16-byte value for each would be a third of the import's peak (two slots an entry, against ~75 bytes of pickle).
/// So a slot is an index into `values` (with the sink's atom of its str beside it), and slots holding the same
/// immutable value share one entry there: the one [`Value::Consumed`] and the one [`Value::Hole`], a short str
/// equal to the latest value stored, and each pair of ints read directly ([`Scan::put_pair`]). A shared entry is copied before it is changed ([`Memo::get_mut`]).
///
/// `Memo::default()` is an empty memo with no entry at all (no allocation): for converting values that no memo
/// refers to.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    /// Per slot: the index of its value in `values`.
    slots: Vec<u32>,
    /// The sink's atom of each memo'd str (0 for anything else), per slot.
    atoms: Vec<u8>,
    /// The values; `values[0]` is [`Value::Consumed`], `values[1]` [`Value::Hole`].
    values: Vec<Value>,
    /// Per value: whether more than one slot may hold it.
    shared: Vec<bool>,
    /// While a mark is open ([`Memo::mark`]): the slots given a copy of a shared value since, with the value they had,
    /// so that a rewind gives them back their value (the copies, past the mark, go).
    copied: Option<Vec<(usize, u32)>>,
    /// The value of each pair of ints put by [`Memo::push_pair`], shared: PyTorch 2.12 memoizes a new `pool_id` pair
    /// for every trace entry, almost all `(0, 0)`.
    pairs: heapscope_core::hash::FastMap<(i64, i64), u32>,
}

/// Where a memo stood, to rewind it to ([`Memo::mark`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MemoMark {
    slots: usize,
    values: usize,
}

impl Memo {
    const CONSUMED: u32 = 0;
    const HOLE: u32 = 1;

    fn new() -> Self {
        Self {
            slots: Vec::new(),
            atoms: Vec::new(),
            values: vec![Value::Consumed, Value::Hole],
            shared: vec![true, true],
            copied: None,
            pairs: heapscope_core::hash::FastMap::default(),
        }
    }

    /// Slots in use.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Slot `slot`'s value.
    #[inline]
    pub(crate) fn get(&self, slot: usize) -> Option<&Value> {
        self.values.get(*self.slots.get(slot)? as usize)
    }

    /// Slot `slot`'s atom (0 for anything but a memo'd str the sink knows).
    #[inline]
    fn atom(&self, slot: usize) -> u8 {
        self.atoms.get(slot).copied().unwrap_or(0)
    }

    /// Slot `slot`'s value, to change: a value other slots may hold is first copied for this one.
    pub(crate) fn get_mut(&mut self, slot: usize) -> Option<&mut Value> {
        let index = *self.slots.get(slot)? as usize;
        let index = if self.shared[index] { self.give_own(slot, self.values[index].clone())? } else { index };
        self.values.get_mut(index)
    }

    /// Gives slot `slot` the value `value` (nothing when there is no such slot, or no room for another value).
    #[inline]
    pub(crate) fn set(&mut self, slot: usize, value: Value) {
        let Some(&index) = self.slots.get(slot) else { return };
        if self.shared[index as usize] {
            // What `get_mut` would copy is replaced anyway.
            let _full = self.give_own(slot, value);
        } else {
            self.values[index as usize] = value;
        }
    }

    /// Slot `slot`, which holds a shared value, gets an entry of its own holding `value`: its index (`None` past
    /// 2^32 values). Under an open mark the slot's shared value is written down, for a rewind to give back.
    fn give_own(&mut self, slot: usize, value: Value) -> Option<usize> {
        let shared = self.slots[slot];
        let index = self.push_value(value)?;
        if let Some(copied) = &mut self.copied {
            copied.push((slot, shared));
        }
        self.slots[slot] = index;
        Some(index as usize)
    }

    /// A new slot at the end holding `value`, with `atom` (`None` past 2^32 values).
    #[inline]
    fn push(&mut self, value: Value, atom: u8) -> Option<()> {
        let index = self.share(value)?;
        self.slots.push(index);
        self.atoms.push(atom);
        Some(())
    }

    /// A new slot at the end holding the tuple `(first, second)`, one value for every slot holding the same pair (`None`
    /// past 2^32 values).
    fn push_pair(&mut self, first: i64, second: i64) -> Option<()> {
        let index = match self.pairs.get(&(first, second)) {
            Some(&index) => index,
            None => {
                let index = self.push_value(Value::Tuple(Rc::new(vec![Value::Int(first), Value::Int(second)])))?;
                self.shared[index as usize] = true;
                self.pairs.insert((first, second), index);
                index
            }
        };
        self.slots.push(index);
        self.atoms.push(0);
        Some(())
    }

    /// Slot `slot` (past the end too: the slots between are holes) holds `value`, with `atom` (`None` past 2^32
    /// values).
    fn put(&mut self, slot: usize, value: Value, atom: u8) -> Option<()> {
        let index = self.share(value)?;
        if slot >= self.slots.len() {
            self.slots.resize(slot + 1, Self::HOLE);
            self.atoms.resize(slot + 1, 0);
        }
        self.slots[slot] = index;
        self.atoms[slot] = atom;
        Some(())
    }

    /// The index of an entry holding `value`: a shared one where one holds the same immutable value, else a new one.
    #[inline]
    fn share(&mut self, value: Value) -> Option<u32> {
        match value {
            Value::Consumed => Some(Self::CONSUMED),
            Value::Hole => Some(Self::HOLE),
            Value::Short(short) if matches!(self.values.last(), Some(Value::Short(last)) if last.as_bytes() == short.as_bytes()) =>
            {
                let last = self.values.len() - 1;
                self.shared[last] = true;
                u32::try_from(last).ok()
            }
            value => self.push_value(value),
        }
    }

    /// A new entry holding `value`: its index, `None` past 2^32 values (a pickle of billions of memo puts, refused).
    #[inline]
    fn push_value(&mut self, value: Value) -> Option<u32> {
        let index = u32::try_from(self.values.len()).ok()?;
        self.values.push(value);
        self.shared.push(false);
        Some(index)
    }

    /// Where the memo stands now, to [`Memo::rewind`] to or [`Memo::keep`] from.
    fn mark(&mut self) -> MemoMark {
        self.copied = Some(Vec::new());
        MemoMark { slots: self.slots.len(), values: self.values.len() }
    }

    /// Everything since the mark stays.
    fn keep(&mut self) {
        self.copied = None;
    }

    /// Back to `mark`: the slots and values added since go, and a slot from before it given a copy of a shared value
    /// since holds that value again.
    fn rewind(&mut self, mark: MemoMark) {
        for (slot, index) in self.copied.take().unwrap_or_default().into_iter().rev() {
            if let Some(word) = self.slots.get_mut(slot) {
                *word = index;
            }
        }
        self.slots.truncate(mark.slots);
        self.atoms.truncate(mark.slots);
        self.values.truncate(mark.values.max(2));
        self.shared.truncate(mark.values.max(2));
        let kept = self.values.len();
        self.pairs.retain(|_, index| (*index as usize) < kept);
    }
}

/// A list under construction or done.
#[derive(Debug, Default)]
pub(crate) struct List {
    /// Items not taken by the sink.
    pub(crate) items: Vec<Value>,
    /// Items ever appended (taken or not): the index of the next one.
    pub(crate) appended: usize,
    /// The sink's tag (0 = nothing special).
    pub(crate) tag: u32,
    /// The memo slot that refers to it, if any.
    pub(crate) memo_slot: Option<u32>,
    /// The sink's mark (0 = none): set when the sink converts it, so that a second reference to it is told apart.
    pub(crate) mark: u32,
}

/// A dict under construction or done.
#[derive(Debug, Default)]
pub(crate) struct Dict {
    /// Key/value pairs in insertion order.
    pub(crate) items: Vec<(Value, Value)>,
    /// The sink's tag (0 = nothing special).
    pub(crate) tag: u32,
    /// The memo slot that refers to it, if any.
    pub(crate) memo_slot: Option<u32>,
    /// The sink's mark (0 = none): set when the sink converts it, so that a second reference to it is told apart.
    pub(crate) mark: u32,
}

impl Dict {
    /// The value under the str key `key` (the last one, as Python keeps it).
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.items.iter().rev().find(|(k, _)| matches!(k, Value::Str(s) if **s == key)).map(|(_, v)| v)
    }
}

/// Where a new container sits in its parent.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Place<'a> {
    /// The pickle's top-level object.
    Root,
    /// The value of `key` in a dict tagged `parent`.
    Key {
        /// The dict's tag.
        parent: u32,
        /// The key.
        key: &'a str,
    },
    /// Element `index` of a list tagged `parent`.
    Index {
        /// The list's tag.
        parent: u32,
        /// The index.
        index: usize,
    },
}

/// A problem while reading: the pickle is malformed, the stream failed, or the sink refused an item.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// Malformed pickle at a byte offset (of the decompressed stream).
    Malformed {
        /// Offset of the opcode or field.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// The underlying reader failed.
    Io {
        /// Offset reached in the pickle stream, if inside it.
        offset: Option<u64>,
        /// The error.
        error: io::Error,
    },
    /// The sink found an item that does not fit the schema.
    Schema {
        /// Where, e.g. `device_traces[0][17].action`.
        path: String,
        /// What is wrong.
        what: String,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Malformed { offset, what } => write!(formatter, "malformed pickle at byte {offset}: {what}"),
            ReadError::Io { offset: Some(offset), error } => write!(formatter, "read failed at byte {offset}: {error}"),
            ReadError::Io { offset: None, error } => write!(formatter, "read failed after the pickle: {error}"),
            ReadError::Schema { path, what } => write!(formatter, "{path}: {what}"),
        }
    }
}

/// Takes items out of the stream as they arrive.
pub(crate) trait Sink {
    /// The tag of a container created at `place` (0 = nothing special).
    fn tag(&mut self, place: Place<'_>) -> u32;

    /// `item` is appended as element `index` of a list tagged `list_tag`: take it (`Ok(None)`) or hand it
    /// back to be stored (`Ok(Some(item))`). `memo` may be updated (see the module doc).
    ///
    /// # Errors
    /// A [`ReadError::Schema`] when the item does not fit.
    fn append(&mut self, list_tag: u32, index: usize, item: Value, memo: &mut Memo) -> Result<Option<Value>, ReadError>;

    /// An `APPEND` / `APPENDS` to a list tagged `list_tag` is done (every item of the batch was handed to
    /// [`Sink::append`] or read directly). Default: nothing.
    fn appended(&mut self, list_tag: u32) {
        let _ = list_tag;
    }

    /// The sink's small id for a memo'd str (0 = nothing special), computed once per memo slot so that a
    /// fast path matches a key or a name by an integer compare.
    fn atom(_text: &str) -> u8
    where
        Self: Sized,
    {
        0
    }

    /// Whether [`Sink::read_item`] may be tried for dicts appended to a list tagged `list_tag`.
    fn reads_items(&self, _list_tag: u32) -> bool {
        false
    }

    /// A dict (its `EMPTY_DICT` just read) is about to become element `index` of the list tagged
    /// `list_tag`: the sink may read it from `scan` through its closing `SETITEMS` and take it (`true`), or
    /// give up (`false`) at any point: the machine then rewinds the input and the memo and builds the dict
    /// generically, so errors are reported there, by the generic path.
    fn read_item(&mut self, _list_tag: u32, _index: usize, _scan: &mut Scan<'_, '_>) -> bool {
        false
    }
}

/// What [`Scan::next`] found.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Token {
    /// A str (new, or from the memo) with the sink's atom for it.
    Str {
        /// [`Sink::atom`] of the text.
        atom: u8,
        /// Where the text is.
        at: StrAt,
    },
    /// An int that fits `i64` (bools count as 0 and 1, as `Value::as_int` has them).
    Int(i64),
    /// An int in `2^63..2^64` (a `LONG1` of 9 bytes: a stream pointer, or PyTorch's `uint64_t` of a -1 line).
    U64(u64),
    /// `None`.
    None,
    /// A float.
    Float,
    /// A memo'd object other than a str (a memo slot).
    Memo(usize),
    /// `EMPTY_DICT`.
    EmptyDict,
    /// `EMPTY_LIST`.
    EmptyList,
    /// `MARK`.
    Mark,
    /// `SETITEM`.
    SetItem,
    /// `SETITEMS`.
    SetItems,
    /// `APPEND`.
    Append,
    /// `APPENDS`.
    Appends,
    /// `TUPLE2`.
    Tuple2,
    /// Anything else, a truncated or invalid item: the fast path gives up.
    Other,
}

/// Where a str's text is: its memo slot, or (`NOT_MEMOED`) the str just read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StrAt(u32);

const NOT_MEMOED: u32 = u32::MAX;

/// A sink's fast path over the input ([`Sink::read_item`]): reads plain items and memo puts, never fails
/// (an [`Token::Other`] or a `None` tells the sink to give up). New memo'd strs are stored as
/// [`Value::Short`] (no allocation; longer ones as `Value::Str`) and decoded only if something asks for their text.
pub(crate) struct Scan<'a, 'm> {
    buf: &'a [u8],
    pos: usize,
    memo: &'m mut Memo,
    atom: fn(&str) -> u8,
    /// Offset and length of the latest str read that was not memo'd.
    last_str: (usize, usize),
    /// The latest new short str read, with its atom (kept by the machine from one item to the next).
    recent: &'m mut Option<(ShortStr, u8)>,
}

impl<'a> Scan<'a, '_> {
    #[inline]
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let buf = self.buf;
        let bytes = buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(bytes)
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut array = [0; N];
        array.copy_from_slice(self.bytes(N)?);
        Some(array)
    }

    /// Skips `FRAME` opcodes; the next opcode, not consumed.
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        loop {
            let op = *self.buf.get(self.pos)?;
            if op != 0x95 {
                return Some(op);
            }
            self.bytes(9)?;
        }
    }

    /// Whether the next opcode is one of `ops` (not consumed).
    pub(crate) fn next_is(&mut self, ops: &[u8]) -> bool {
        self.peek().is_some_and(|op| ops.contains(&op))
    }

    /// Whether the next opcode is a memo get (`BINGET`, `LONG_BINGET`) followed by opcode `then` (not consumed).
    pub(crate) fn memo_get_then(&mut self, then: u8) -> bool {
        let after = match self.peek() {
            Some(b'h') => 2,
            Some(b'j') => 5,
            _ => return false,
        };
        self.buf.get(self.pos + after) == Some(&then)
    }

    /// The next item.
    #[inline(always)]
    pub(crate) fn next(&mut self) -> Token {
        self.next_item().unwrap_or(Token::Other)
    }

    #[inline(always)]
    fn next_item(&mut self) -> Option<Token> {
        let op = self.peek()?;
        self.pos += 1;
        Some(match op {
            b'K' => Token::Int(i64::from(self.array::<1>()?[0])),
            b'M' => Token::Int(i64::from(u16::from_le_bytes(self.array()?))),
            b'J' => Token::Int(i64::from(i32::from_le_bytes(self.array()?))),
            0x8a => {
                let len = usize::from(self.array::<1>()?[0]);
                if len == 9 {
                    // Non-negative when the top byte is 0: the low eight bytes are the value.
                    let [low @ .., top] = self.array::<9>()?;
                    return (top == 0).then_some(Token::U64(u64::from_le_bytes(low)));
                }
                if len > 8 {
                    return None;
                }
                let start = self.pos;
                let bytes = self.bytes(len)?;
                if len == 0 {
                    return Some(Token::Int(0));
                }
                // A whole word when the input has one (no variable-length copy), else byte by byte.
                let word = match self.buf.get(start..start + 8) {
                    Some(word) => u64::from_le_bytes(word.try_into().ok()?),
                    None => bytes.iter().rev().fold(0, |word, &byte| (word << 8) | u64::from(byte)),
                };
                // Keep the low `len` bytes and extend their sign.
                let shift = 64 - 8 * len as u32;
                Token::Int(((word << shift) as i64) >> shift)
            }
            b'N' => Token::None,
            0x88 => Token::Int(1),
            0x89 => Token::Int(0),
            b'G' => {
                self.bytes(8)?;
                Token::Float
            }
            0x8c => {
                let len = usize::from(self.array::<1>()?[0]);
                self.new_str(len)?
            }
            b'X' => {
                let len = u32::from_le_bytes(self.array()?) as usize;
                self.new_str(len)?
            }
            b'h' => {
                let slot = usize::from(self.array::<1>()?[0]);
                self.memo_item(slot)?
            }
            b'j' => {
                let slot = u32::from_le_bytes(self.array()?) as usize;
                self.memo_item(slot)?
            }
            b'}' => Token::EmptyDict,
            b']' => Token::EmptyList,
            b'(' => Token::Mark,
            b's' => Token::SetItem,
            b'u' => Token::SetItems,
            b'a' => Token::Append,
            b'e' => Token::Appends,
            0x86 => Token::Tuple2,
            _ => Token::Other,
        })
    }

    fn new_str(&mut self, len: usize) -> Option<Token> {
        let start = self.pos;
        let bytes = self.bytes(len)?;
        // A new str equal to the latest short one (PyTorch writes each entry's `compile_context` anew): valid UTF-8
        // with a known atom already.
        let (value, atom) = match *self.recent {
            Some((short, atom)) if short.as_bytes() == bytes => (Value::Short(short), atom),
            _ => {
                let text = std::str::from_utf8(bytes).ok()?;
                let atom = (self.atom)(text);
                match ShortStr::new(text) {
                    Some(short) => {
                        *self.recent = Some((short, atom));
                        (Value::Short(short), atom)
                    }
                    None => (Value::Str(Rc::new(text.to_owned())), atom),
                }
            }
        };
        let slot = match self.put_next(value, atom)? {
            Some(slot) => u32::try_from(slot).ok().filter(|&slot| slot != NOT_MEMOED)?,
            None => {
                self.last_str = (start, len);
                NOT_MEMOED
            }
        };
        Some(Token::Str { atom, at: StrAt(slot) })
    }

    #[inline]
    fn memo_item(&mut self, slot: usize) -> Option<Token> {
        match self.memo.get(slot)? {
            Value::Str(_) | Value::Short(_) => Some(Token::Str {
                atom: self.memo.atom(slot),
                at: StrAt(u32::try_from(slot).ok().filter(|&slot| slot != NOT_MEMOED)?),
            }),
            Value::Hole => None,
            _ => Some(Token::Memo(slot)),
        }
    }

    /// Puts `value` in the memo if a memo put comes next: `Some(Some(slot))`, `Some(None)` when none does,
    /// `None` (give up) for a put anywhere but the memo's end.
    #[inline(always)]
    fn put_next(&mut self, value: Value, atom: u8) -> Option<Option<usize>> {
        let Some(slot) = self.next_put_slot()? else { return Some(None) };
        self.memo.push(value, atom)?;
        Some(Some(slot))
    }

    /// Takes a memo put if one comes next: `Some(Some(slot))` (the memo's end), `Some(None)` when none does, `None`
    /// (give up) for a put anywhere but the memo's end.
    #[inline(always)]
    fn next_put_slot(&mut self) -> Option<Option<usize>> {
        let slot = match self.peek() {
            Some(0x94) => {
                self.pos += 1;
                self.memo.len()
            }
            Some(b'q') => {
                self.pos += 1;
                usize::from(self.array::<1>()?[0])
            }
            Some(b'r') => {
                self.pos += 1;
                u32::from_le_bytes(self.array()?) as usize
            }
            _ => return Some(None),
        };
        (slot == self.memo.len()).then_some(Some(slot))
    }

    /// After an `EMPTY_DICT`/`EMPTY_LIST`: takes a following memo put, reserving the slot (a hole until
    /// [`Scan::set_memo`]).
    #[inline(always)]
    pub(crate) fn put_container(&mut self) -> Option<Option<usize>> {
        self.put_next(Value::Hole, 0)
    }

    /// After the `EMPTY_DICT` of an item the sink takes: takes a following memo put, storing
    /// [`Value::Consumed`] at once (what the slot holds once the item is taken; if the sink gives up, the memo
    /// is rewound anyway). A reference to the slot from inside the item reads as a taken entry, which no
    /// field the sink decodes accepts, as a hole would not.
    #[inline(always)]
    pub(crate) fn put_taken(&mut self) -> Option<Option<usize>> {
        self.put_next(Value::Consumed, 0)
    }

    /// After the `TUPLE2` of two ints: takes a following memo put, storing the tuple (built only then).
    pub(crate) fn put_pair(&mut self, first: i64, second: i64) -> Option<()> {
        if self.next_put_slot()?.is_some() {
            self.memo.push_pair(first, second)?;
        }
        Some(())
    }

    /// The memo (for interning).
    pub(crate) fn memo_mut(&mut self) -> &mut Memo {
        self.memo
    }

    /// Replaces a memo entry.
    #[inline]
    pub(crate) fn set_memo(&mut self, slot: usize, value: Value) {
        self.memo.set(slot, value);
    }

    /// The text of a str item, shared with its memo entry.
    pub(crate) fn text(&mut self, at: StrAt) -> Rc<String> {
        let (start, len, slot) = match at.0 {
            NOT_MEMOED => (self.last_str.0, self.last_str.1, None),
            slot => match self.memo.get(slot as usize) {
                Some(Value::Str(text)) => return Rc::clone(text),
                Some(Value::Short(short)) => {
                    let text = Rc::new(short.as_str().to_owned());
                    self.set_memo(slot as usize, Value::Str(Rc::clone(&text)));
                    return text;
                }
                _ => return Rc::default(),
            },
        };
        let text =
            Rc::new(self.buf.get(start..start + len).and_then(|b| std::str::from_utf8(b).ok()).unwrap_or_default().to_owned());
        if let Some(slot) = slot {
            self.set_memo(slot, Value::Str(Rc::clone(&text)));
        }
        text
    }
}

/// A sink that takes nothing: a plain generic decode.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct KeepAll;

#[cfg(test)]
impl Sink for KeepAll {
    fn tag(&mut self, _place: Place<'_>) -> u32 {
        0
    }

    fn append(&mut self, _list_tag: u32, _index: usize, item: Value, _memo: &mut Memo) -> Result<Option<Value>, ReadError> {
        Ok(Some(item))
    }
}

const CHUNK_BYTES: usize = 1 << 20;
/// What a sink's fast path may look ahead ([`Sink::read_item`]); an item longer than this is read generically.
const WINDOW_BYTES: usize = 64 * 1024;

/// A byte source with its own buffer, so single opcodes cost a bounds check and a sink's fast path can
/// scan a window of the input and back off.
struct Input<R> {
    reader: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Stream offset of `buf[0]`.
    base: u64,
    /// The reader reported the end of the stream.
    eof: bool,
}

impl<R: Read> Input<R> {
    fn new(reader: R) -> Self {
        Self { reader, buf: vec![0; CHUNK_BYTES], pos: 0, end: 0, base: 0, eof: false }
    }

    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Moves the unread bytes to the start of the buffer.
    fn compact(&mut self) {
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
    }

    /// Reads once into the free part of the buffer; `Ok(false)` at the end of the stream.
    fn read_more(&mut self) -> Result<bool, ReadError> {
        loop {
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(read) => {
                    self.end += read;
                    return Ok(true);
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(ReadError::Io { offset: Some(self.base + self.end as u64), error }),
            }
        }
    }

    /// Makes `n` bytes available at `pos`, or fails with "truncated".
    #[cold]
    fn fill(&mut self, n: usize, what: &str) -> Result<(), ReadError> {
        self.compact();
        while self.end < n {
            if self.end == self.buf.len() {
                // Grow with the data actually present, never by a length the file merely claims.
                let grown = (self.buf.len() * 2).min(n.max(CHUNK_BYTES)).max(self.buf.len() + CHUNK_BYTES);
                self.buf.resize(grown, 0);
            }
            if !self.read_more()? {
                return Err(ReadError::Malformed {
                    offset: self.base + self.end as u64,
                    what: format!("truncated: the stream ends inside {what} ({n} bytes needed, {} left)", self.end),
                });
            }
        }
        Ok(())
    }

    /// Makes [`WINDOW_BYTES`] available at `pos` (fewer only at the end of the stream).
    #[inline]
    fn window(&mut self) -> Result<(), ReadError> {
        if self.end - self.pos >= WINDOW_BYTES || self.eof {
            return Ok(());
        }
        self.refill_window()
    }

    #[cold]
    fn refill_window(&mut self) -> Result<(), ReadError> {
        self.compact();
        while self.end < WINDOW_BYTES && self.read_more()? {}
        Ok(())
    }

    /// The next byte, not consumed; `None` at the end or on a read error (which the next read reports).
    fn peek_byte(&mut self) -> Option<u8> {
        if self.pos >= self.end {
            self.fill(1, "").ok()?;
        }
        self.buf.get(self.pos).copied()
    }

    #[inline]
    fn byte(&mut self, what: &str) -> Result<u8, ReadError> {
        if self.pos >= self.end {
            self.fill(1, what)?;
        }
        let byte = self.buf[self.pos];
        self.pos += 1;
        Ok(byte)
    }

    #[inline]
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], ReadError> {
        if self.end - self.pos < n {
            self.fill(n, what)?;
        }
        let start = self.pos;
        self.pos += n;
        Ok(&self.buf[start..start + n])
    }

    #[inline]
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ReadError> {
        let bytes = self.take(N, what)?;
        let mut array = [0; N];
        array.copy_from_slice(bytes);
        Ok(array)
    }
}

/// Memo slots a put may open beyond the bytes read so far: gaps a writer may leave, in total, not per put.
const MEMO_SLACK_SLOTS: usize = 1 << 16;

/// The pickle machine.
struct Machine<S> {
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Memo,
    /// See [`Scan`]'s `recent`.
    recent_str: Option<(ShortStr, u8)>,
    sink: S,
}

/// Reads one pickle from `reader`, handing list items to `sink` as they arrive; returns the top-level
/// value and the sink.
///
/// # Errors
/// [`ReadError`] for malformed or truncated input, a failing reader, or an item the sink refuses.
pub(crate) fn read_pickle<R: Read, S: Sink>(reader: R, sink: S) -> Result<(Value, S), ReadError> {
    let mut input = Input::new(reader);
    let mut machine =
        Machine { stack: Vec::with_capacity(64), marks: Vec::with_capacity(16), memo: Memo::new(), recent_str: None, sink };
    let value = machine.run(&mut input)?;
    // Nothing may follow the pickle: trailing bytes mean two files joined, or something that only starts like a
    // snapshot (10 GiB of zeros after one are refused here, not read through).
    input.compact();
    if input.end > 0 || input.read_more()? {
        return Err(malformed(
            input.offset(),
            "bytes after the pickle's STOP: a snapshot file holds one pickle (two files joined, or a second gzip member?)",
        ));
    }
    Ok((value, machine.sink))
}

fn malformed(offset: u64, what: impl Into<String>) -> ReadError {
    ReadError::Malformed { offset, what: what.into() }
}

/// Decodes a little-endian two's complement int of any width (`LONG1`, `LONG4`).
fn decode_long(bytes: &[u8]) -> Value {
    match LongInt::decode(bytes) {
        Ok(small) => Value::Int(small),
        Err(long) => Value::Long(Box::new(long)),
    }
}

impl<S: Sink> Machine<S> {
    fn run<R: Read>(&mut self, input: &mut Input<R>) -> Result<Value, ReadError> {
        let mut protocol_seen = false;
        let mut first_opcode = None;
        loop {
            let at = input.offset();
            let opcode = input.byte("an opcode")?;
            first_opcode.get_or_insert(opcode);
            match opcode {
                // PROTO
                0x80 => {
                    protocol_seen = true;
                    let version = input.byte("PROTO")?;
                    if version > 5 {
                        return Err(malformed(at, format!("unsupported pickle protocol {version} (2 to 5 are)")));
                    }
                }
                // FRAME: framing is a hint for buffered readers; ours buffers anyway.
                0x95 => {
                    input.take(8, "FRAME")?;
                }
                // STOP
                b'.' => {
                    let value = self.pop(at, "STOP")?;
                    if !self.stack.is_empty() || !self.marks.is_empty() {
                        return Err(malformed(at, "STOP with more than one object on the stack"));
                    }
                    return Ok(value);
                }
                // NONE, NEWTRUE, NEWFALSE
                b'N' => self.stack.push(Value::None),
                0x88 => self.stack.push(Value::Bool(true)),
                0x89 => self.stack.push(Value::Bool(false)),
                // BININT, BININT1, BININT2
                b'J' => {
                    let value = i32::from_le_bytes(input.array("BININT")?);
                    self.stack.push(Value::Int(i64::from(value)));
                }
                b'K' => {
                    let value = input.byte("BININT1")?;
                    self.stack.push(Value::Int(i64::from(value)));
                }
                b'M' => {
                    let value = u16::from_le_bytes(input.array("BININT2")?);
                    self.stack.push(Value::Int(i64::from(value)));
                }
                // LONG1, LONG4
                0x8a => {
                    let length = usize::from(input.byte("LONG1")?);
                    let value = decode_long(input.take(length, "LONG1")?);
                    self.stack.push(value);
                }
                0x8b => {
                    let length = i32::from_le_bytes(input.array("LONG4")?);
                    let length = usize::try_from(length).map_err(|_| malformed(at, "LONG4 with a negative length"))?;
                    let value = decode_long(input.take(length, "LONG4")?);
                    self.stack.push(value);
                }
                // BINFLOAT
                b'G' => {
                    let value = f64::from_be_bytes(input.array("BINFLOAT")?);
                    self.stack.push(Value::Float(value));
                }
                // SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
                0x8c => {
                    let length = usize::from(input.byte("SHORT_BINUNICODE")?);
                    self.push_str(input, length, "SHORT_BINUNICODE")?;
                }
                b'X' => {
                    let length = u32::from_le_bytes(input.array("BINUNICODE")?);
                    self.push_str(input, length as usize, "BINUNICODE")?;
                }
                0x8d => {
                    let length = u64::from_le_bytes(input.array("BINUNICODE8")?);
                    let length = usize::try_from(length).map_err(|_| malformed(at, "BINUNICODE8 length overflows"))?;
                    self.push_str(input, length, "BINUNICODE8")?;
                }
                // SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8: read past.
                b'C' => {
                    let length = usize::from(input.byte("SHORT_BINBYTES")?);
                    self.push_opaque(input, length, Opaque::Bytes, "SHORT_BINBYTES")?;
                }
                b'B' => {
                    let length = u32::from_le_bytes(input.array("BINBYTES")?);
                    self.push_opaque(input, length as usize, Opaque::Bytes, "BINBYTES")?;
                }
                0x8e | 0x96 => {
                    let (kind, what) =
                        if opcode == 0x8e { (Opaque::Bytes, "BINBYTES8") } else { (Opaque::ByteArray, "BYTEARRAY8") };
                    let length = u64::from_le_bytes(input.array(what)?);
                    let length = usize::try_from(length).map_err(|_| malformed(at, format!("{what} length overflows")))?;
                    self.push_opaque(input, length, kind, what)?;
                }
                // EMPTY_SET, ADDITEMS, FROZENSET: the items are dropped, the set kept as its type.
                0x8f => self.stack.push(Value::Opaque(Opaque::Set)),
                0x90 => {
                    let mark = self.pop_mark(at, "ADDITEMS")?;
                    drop(self.stack.split_off(mark));
                    match self.stack.last() {
                        Some(Value::Opaque(Opaque::Set)) => {}
                        Some(other) => return Err(malformed(at, format!("ADDITEMS on a {}, not a set", other.type_name()))),
                        None => return Err(malformed(at, "ADDITEMS on an empty stack")),
                    }
                }
                0x91 => {
                    let mark = self.pop_mark(at, "FROZENSET")?;
                    drop(self.stack.split_off(mark));
                    self.stack.push(Value::Opaque(Opaque::FrozenSet));
                }
                // EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE
                b'}' => {
                    if let Some((list_tag, index)) = self.list_parent()
                        && self.sink.reads_items(list_tag)
                    {
                        input.window()?;
                        let mark = self.memo.mark();
                        let mut scan = Scan {
                            buf: &input.buf[..input.end],
                            pos: input.pos,
                            memo: &mut self.memo,
                            atom: S::atom,
                            last_str: (0, 0),
                            recent: &mut self.recent_str,
                        };
                        if self.sink.read_item(list_tag, index, &mut scan) {
                            input.pos = scan.pos;
                            self.memo.keep();
                            self.stack.push(Value::Taken);
                            continue;
                        }
                        self.memo.rewind(mark);
                    }
                    let tag = self.new_tag();
                    self.stack.push(Value::Dict(Rc::new(RefCell::new(Dict { tag, ..Dict::default() }))));
                }
                b']' => {
                    let tag = self.new_tag();
                    self.stack.push(Value::List(Rc::new(RefCell::new(List { tag, ..List::default() }))));
                }
                b')' => self.stack.push(Value::Tuple(Rc::new(Vec::new()))),
                // MARK
                b'(' => self.marks.push(self.stack.len()),
                // TUPLE1, TUPLE2, TUPLE3, TUPLE
                0x85..=0x87 => {
                    let count = usize::from(opcode - 0x84);
                    if self.stack.len() < count + self.marks.last().copied().unwrap_or(0) {
                        return Err(malformed(at, format!("TUPLE{count} with fewer than {count} objects on the stack")));
                    }
                    let items = self.stack.split_off(self.stack.len() - count);
                    self.stack.push(Value::Tuple(Rc::new(items)));
                }
                b't' => {
                    let mark = self.pop_mark(at, "TUPLE")?;
                    let items = self.stack.split_off(mark);
                    self.stack.push(Value::Tuple(Rc::new(items)));
                }
                // LIST, DICT (mark-based constructors)
                b'l' => {
                    let mark = self.pop_mark(at, "LIST")?;
                    let items = self.stack.split_off(mark);
                    let tag = self.new_tag();
                    let appended = items.len();
                    self.stack.push(Value::List(Rc::new(RefCell::new(List { items, appended, tag, ..List::default() }))));
                }
                b'd' => {
                    let mark = self.pop_mark(at, "DICT")?;
                    let items = self.stack.split_off(mark);
                    let tag = self.new_tag();
                    let dict = Dict { items: pairs(items, at, "DICT")?, tag, ..Dict::default() };
                    self.stack.push(Value::Dict(Rc::new(RefCell::new(dict))));
                }
                // SETITEM, SETITEMS
                b's' => {
                    if self.stack.len() < 3 + self.marks.last().copied().unwrap_or(0) {
                        return Err(malformed(at, "SETITEM with fewer than three objects on the stack"));
                    }
                    self.set_items(self.stack.len() - 2, at, "SETITEM")?;
                }
                b'u' => {
                    let mark = self.pop_mark(at, "SETITEMS")?;
                    self.set_items(mark, at, "SETITEMS")?;
                }
                // APPEND, APPENDS
                b'a' => {
                    if self.stack.len() < 2 + self.marks.last().copied().unwrap_or(0) {
                        return Err(malformed(at, "APPEND with fewer than two objects on the stack"));
                    }
                    self.append(self.stack.len() - 1, at, "APPEND")?;
                }
                b'e' => {
                    let mark = self.pop_mark(at, "APPENDS")?;
                    self.append(mark, at, "APPENDS")?;
                }
                // MEMOIZE, BINPUT, LONG_BINPUT
                0x94 => {
                    let slot = self.memo.len();
                    self.put(slot, at, "MEMOIZE")?;
                }
                b'q' => {
                    let slot = usize::from(input.byte("BINPUT")?);
                    self.put(slot, at, "BINPUT")?;
                }
                b'r' => {
                    let slot = u32::from_le_bytes(input.array("LONG_BINPUT")?) as usize;
                    self.put(slot, at, "LONG_BINPUT")?;
                }
                // BINGET, LONG_BINGET
                b'h' => {
                    let slot = usize::from(input.byte("BINGET")?);
                    self.get(slot, at)?;
                }
                b'j' => {
                    let slot = u32::from_le_bytes(input.array("LONG_BINGET")?) as usize;
                    self.get(slot, at)?;
                }
                // POP, POP_MARK, DUP
                b'0' => {
                    self.pop(at, "POP")?;
                }
                b'1' => {
                    let mark = self.pop_mark(at, "POP_MARK")?;
                    self.stack.truncate(mark);
                }
                b'2' => {
                    let top = self.stack.last().cloned().ok_or_else(|| malformed(at, "DUP on an empty stack"))?;
                    self.stack.push(top);
                }
                // GLOBAL, STACK_GLOBAL, REDUCE: only python's own reductions of builtin types no snapshot key holds (bytes as
                // `_codecs.encode` before protocol 3, sets before 4, bytearrays before 5), kept as their type as the
                // later protocols' opcodes for them are; any other class is refused, named.
                b'c' => {
                    let module = read_line(input, "GLOBAL")?;
                    let name = read_line(input, "GLOBAL")?;
                    self.stack.push(Value::Opaque(builtin_reduction(&module, &name, at, "GLOBAL")?));
                }
                0x93 => {
                    let name = self.pop(at, "STACK_GLOBAL")?;
                    let module = self.pop(at, "STACK_GLOBAL")?;
                    let (Value::Str(module), Value::Str(name)) = (&module, &name) else {
                        return Err(malformed(at, "STACK_GLOBAL of something other than two strs"));
                    };
                    self.stack.push(Value::Opaque(builtin_reduction(module, name, at, "STACK_GLOBAL")?));
                }
                b'R' => {
                    let arguments = self.pop(at, "REDUCE")?;
                    let callable = self.pop(at, "REDUCE")?;
                    match (callable, arguments) {
                        (Value::Opaque(kind), Value::Tuple(_)) => self.stack.push(Value::Opaque(kind)),
                        (callable, arguments) => {
                            return Err(malformed(
                                at,
                                format!(
                                    "REDUCE of a {} with a {}: a snapshot holds only builtin data",
                                    callable.type_name(),
                                    arguments.type_name()
                                ),
                            ));
                        }
                    }
                }
                0x81 | 0x92 | b'i' | b'o' | b'b' => {
                    return Err(malformed(
                        at,
                        format!("opcode 0x{opcode:02x} builds an object of a class; a snapshot holds only builtin data"),
                    ));
                }
                // A stream that opened as a protocol 0 or 1 pickle does (MARK, EMPTY_DICT, EMPTY_LIST, no PROTO): say so.
                _ if !protocol_seen && matches!(first_opcode, Some(b'(' | b'}' | b']')) => {
                    return Err(malformed(
                        at,
                        format!(
                            "unknown or unsupported opcode 0x{opcode:02x} in a pickle with no PROTO opcode: protocol 0 or \
                             1? heapscope reads protocols 2 to 5 (torch.cuda.memory._dump_snapshot writes 4); re-save it \
                             with pickle.dump(snapshot, f, protocol=4)"
                        ),
                    ));
                }
                // gzip's magic where the pickle should start: the file was gzipped once more than it was read.
                0x1f if at == 0 && input.peek_byte() == Some(0x8b) => {
                    return Err(malformed(
                        at,
                        "gzip data where the pickle starts: the file is gzip-compressed twice; gunzip it once (gzip -d) \
                         and open the result",
                    ));
                }
                _ => return Err(malformed(at, format!("unknown or unsupported opcode 0x{opcode:02x}"))),
            }
        }
    }

    fn pop(&mut self, at: u64, what: &str) -> Result<Value, ReadError> {
        if self.stack.len() <= self.marks.last().copied().unwrap_or(0) && !self.marks.is_empty() {
            return Err(malformed(at, format!("{what} with a mark on top of the stack")));
        }
        self.stack.pop().ok_or_else(|| malformed(at, format!("{what} on an empty stack")))
    }

    fn pop_mark(&mut self, at: u64, what: &str) -> Result<usize, ReadError> {
        self.marks.pop().ok_or_else(|| malformed(at, format!("{what} without a mark")))
    }

    /// Pushes the str of the next `length` bytes. Python writes a str's lone surrogates (a file name it could not
    /// decode) as the UTF-8 of those code points, which is not UTF-8: each byte of them reads as U+FFFD, as the rest
    /// of the snapshot does not depend on it, rather than the file being refused.
    fn push_str<R: Read>(&mut self, input: &mut Input<R>, length: usize, what: &str) -> Result<(), ReadError> {
        let bytes = input.take(length, what)?;
        self.stack.push(Value::Str(Rc::new(String::from_utf8_lossy(bytes).into_owned())));
        Ok(())
    }

    /// Reads past the next `length` bytes (a bytes or bytearray value) and pushes their type.
    fn push_opaque<R: Read>(&mut self, input: &mut Input<R>, length: usize, kind: Opaque, what: &str) -> Result<(), ReadError> {
        input.take(length, what)?;
        self.stack.push(Value::Opaque(kind));
        Ok(())
    }

    /// The tag of the list and the index a container about to be pushed will have, if its parent is a list.
    #[inline]
    fn list_parent(&self) -> Option<(u32, usize)> {
        let len = self.stack.len();
        let mark = self.marks.last().copied();
        if let Some(mark) = mark.filter(|&mark| mark > 0 && mark <= len) {
            match &self.stack[mark - 1] {
                Value::List(list) => {
                    let list = list.borrow();
                    return Some((list.tag, list.appended + len - mark));
                }
                Value::Dict(_) if (len - mark) % 2 == 1 => return None,
                _ => {}
            }
        }
        match self.stack.last() {
            Some(Value::List(list)) if len > mark.unwrap_or(0) => {
                let list = list.borrow();
                Some((list.tag, list.appended))
            }
            _ => None,
        }
    }

    /// The tag of a container about to be pushed (see the module doc).
    fn new_tag(&mut self) -> u32 {
        let len = self.stack.len();
        let mark = self.marks.last().copied();
        if len == 0 && mark.is_none() {
            return self.sink.tag(Place::Root);
        }
        if let Some(mark) = mark.filter(|&mark| mark > 0 && mark <= len) {
            let after = len - mark;
            match &self.stack[mark - 1] {
                Value::List(list) => {
                    let (parent, index) = {
                        let list = list.borrow();
                        (list.tag, list.appended + after)
                    };
                    return self.sink.tag(Place::Index { parent, index });
                }
                Value::Dict(dict) if after % 2 == 1 => {
                    let parent = dict.borrow().tag;
                    return match &self.stack[len - 1] {
                        Value::Str(key) => {
                            let key = Rc::clone(key);
                            self.sink.tag(Place::Key { parent, key: &key })
                        }
                        _ => 0,
                    };
                }
                _ => {}
            }
        }
        let floor = mark.unwrap_or(0);
        if len > floor
            && let Value::List(list) = &self.stack[len - 1]
        {
            let (parent, index) = {
                let list = list.borrow();
                (list.tag, list.appended)
            };
            return self.sink.tag(Place::Index { parent, index });
        }
        if len >= floor + 2
            && let (Value::Dict(dict), Value::Str(key)) = (&self.stack[len - 2], &self.stack[len - 1])
        {
            let parent = dict.borrow().tag;
            let key = Rc::clone(key);
            return self.sink.tag(Place::Key { parent, key: &key });
        }
        0
    }

    /// Moves the pairs from `start` to the top of the stack into the dict just below `start`.
    fn set_items(&mut self, start: usize, at: u64, what: &str) -> Result<(), ReadError> {
        let count = self.stack.len() - start;
        if !count.is_multiple_of(2) {
            return Err(malformed(at, format!("{what} with an odd number of objects ({count})")));
        }
        let dict = match start.checked_sub(1).map(|below| &self.stack[below]) {
            Some(Value::Dict(dict)) if start > self.marks.last().copied().unwrap_or(0) => Rc::clone(dict),
            Some(other) => return Err(malformed(at, format!("{what} on a {}, not a dict", other.type_name()))),
            None => return Err(malformed(at, format!("{what} without a dict"))),
        };
        let mut dict = dict.borrow_mut();
        dict.items.reserve(count / 2);
        let mut drain = self.stack.drain(start..);
        while let (Some(key), Some(value)) = (drain.next(), drain.next()) {
            dict.items.push((key, value));
        }
        Ok(())
    }

    /// Moves the items from `start` to the top of the stack into the list just below `start` (or to the sink).
    fn append(&mut self, start: usize, at: u64, what: &str) -> Result<(), ReadError> {
        let list = match start.checked_sub(1).map(|below| &self.stack[below]) {
            Some(Value::List(list)) if start > self.marks.last().copied().unwrap_or(0) => Rc::clone(list),
            Some(other) => return Err(malformed(at, format!("{what} on a {}, not a list", other.type_name()))),
            None => return Err(malformed(at, format!("{what} without a list"))),
        };
        let (tag, mut index) = {
            let list = list.borrow();
            (list.tag, list.appended)
        };
        if tag == 0 {
            let mut list = list.borrow_mut();
            list.appended += self.stack.len() - start;
            list.items.extend(self.stack.drain(start..));
            return Ok(());
        }
        // The list is not borrowed while the sink converts an item: an item may refer to the list itself (through the
        // memo), which its conversion then reads as it stands, and refuses.
        let mut items = std::mem::take(&mut self.stack);
        let mut result = Ok(());
        for item in items.drain(start..) {
            if matches!(item, Value::Taken) {
                index += 1;
                continue;
            }
            match self.sink.append(tag, index, item, &mut self.memo) {
                Ok(Some(item)) => list.borrow_mut().items.push(item),
                Ok(None) => {}
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
            index += 1;
        }
        list.borrow_mut().appended = index;
        self.stack = items;
        self.sink.appended(tag);
        result
    }

    fn put(&mut self, slot: usize, at: u64, what: &str) -> Result<(), ReadError> {
        let top = match self.stack.last() {
            Some(top) if self.stack.len() > self.marks.last().copied().unwrap_or(0) => top.clone(),
            _ => return Err(malformed(at, format!("{what} with no object on top of the stack"))),
        };
        let slot_u32 = u32::try_from(slot).map_err(|_| malformed(at, "memo slot overflows"))?;
        match &top {
            Value::List(list) => list.borrow_mut().memo_slot = Some(slot_u32),
            Value::Dict(dict) => dict.borrow_mut().memo_slot = Some(slot_u32),
            _ => {}
        }
        let atom = match &top {
            Value::Str(text) => S::atom(text),
            _ => 0,
        };
        if slot > self.memo.len() && slot > usize::try_from(at).unwrap_or(usize::MAX).saturating_add(MEMO_SLACK_SLOTS) {
            // A pickle writes at most one memo slot per opcode, so a slot past the bytes read (with some slack for
            // gaps) is a corrupt or hostile index: refused, so the memo stays bounded by the input, in total.
            return Err(malformed(
                at,
                format!("{what} to memo slot {slot}, past the {at} bytes read (memo in use: {})", self.memo.len()),
            ));
        }
        self.memo.put(slot, top, atom).ok_or_else(|| malformed(at, format!("{what}: the memo holds 2^32 objects already")))
    }

    fn get(&mut self, slot: usize, at: u64) -> Result<(), ReadError> {
        match self.memo.get(slot) {
            Some(Value::Hole) | None => Err(malformed(at, format!("memo slot {slot} was never written"))),
            Some(Value::Short(short)) => {
                let value = Value::Str(Rc::new(short.as_str().to_owned()));
                self.memo.set(slot, value.clone());
                self.stack.push(value);
                Ok(())
            }
            Some(value) => {
                self.stack.push(value.clone());
                Ok(())
            }
        }
    }
}

/// A line of a protocol 0 style argument (`GLOBAL`'s module and name), without its newline: at most 256 bytes of UTF-8.
fn read_line<R: Read>(input: &mut Input<R>, what: &str) -> Result<String, ReadError> {
    let mut line = Vec::new();
    loop {
        match input.byte(what)? {
            b'\n' => break,
            _ if line.len() >= 256 => return Err(malformed(input.offset(), format!("{what}: a name longer than 256 bytes"))),
            byte => line.push(byte),
        }
    }
    String::from_utf8(line).map_err(|_| malformed(input.offset(), format!("{what}: a name that is not UTF-8")))
}

/// The builtin type python's pickler builds through `module.name` in protocols 2 to 4 for values a snapshot's schema
/// never holds (`_codecs.encode` for bytes, `set`, `frozenset`, `bytearray`, `bytes`); any other class is refused,
/// named (`what`: the opcode, at byte `at`).
fn builtin_reduction(module: &str, name: &str, at: u64, what: &str) -> Result<Opaque, ReadError> {
    let builtins = matches!(module, "builtins" | "__builtin__");
    match (module, name) {
        ("_codecs", "encode") => Ok(Opaque::Bytes),
        (_, "bytes") if builtins => Ok(Opaque::Bytes),
        (_, "bytearray") if builtins => Ok(Opaque::ByteArray),
        (_, "set") if builtins => Ok(Opaque::Set),
        (_, "frozenset") if builtins => Ok(Opaque::FrozenSet),
        _ => {
            Err(malformed(at, format!("{what} names {module}.{name}, an object of a class; a snapshot holds only builtin data")))
        }
    }
}

fn pairs(items: Vec<Value>, at: u64, what: &str) -> Result<Vec<(Value, Value)>, ReadError> {
    if !items.len().is_multiple_of(2) {
        return Err(malformed(at, format!("{what} with an odd number of objects ({})", items.len())));
    }
    let mut pairs = Vec::with_capacity(items.len() / 2);
    let mut iter = items.into_iter();
    while let (Some(key), Some(value)) = (iter.next(), iter.next()) {
        pairs.push((key, value));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> Result<Value, ReadError> {
        read_pickle(bytes, KeepAll).map(|(value, _)| value)
    }

    fn render(value: &Value) -> String {
        match value {
            Value::None => "None".into(),
            Value::Bool(value) => if *value { "True" } else { "False" }.into(),
            Value::Int(value) => value.to_string(),
            Value::Long(value) => value.to_string(),
            Value::Float(value) => format!("{value:?}"),
            Value::Str(value) => format!("{value:?}"),
            Value::List(list) => format!("[{}]", list.borrow().items.iter().map(render).collect::<Vec<_>>().join(", ")),
            Value::Dict(dict) => format!(
                "{{{}}}",
                dict.borrow().items.iter().map(|(k, v)| format!("{}: {}", render(k), render(v))).collect::<Vec<_>>().join(", ")
            ),
            Value::Tuple(items) if items.len() == 1 => format!("({},)", render(&items[0])),
            Value::Tuple(items) => format!("({})", items.iter().map(render).collect::<Vec<_>>().join(", ")),
            other => other.type_name().into(),
        }
    }

    #[test]
    fn decodes_hand_made_pickles() {
        // (bytes, expected rendering) — what Python writes for small builtin objects.
        let cases: &[(&[u8], &str)] = &[
            (b"\x80\x04N.", "None"),
            (b"\x80\x02K\x05.", "5"),
            (b"\x80\x02M\xe8\x03.", "1000"),
            (b"\x80\x02J\xff\xff\xff\xff.", "-1"),
            (b"\x80\x02\x8a\x05\x00\x00\x00\x00\x01.", "4294967296"),
            (b"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.", "18446744073709551615"),
            (b"\x80\x02\x8a\x00.", "0"),
            (b"\x80\x02\x8a\x01\xff.", "-1"),
            (b"\x80\x02\x8b\x02\x00\x00\x00\x00\x01.", "256"),
            (b"\x80\x02\x8a\x0b\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff.", "-2^80"),
            (b"\x80\x02\x8a\x11\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01.", "2^128"),
            (
                b"\x80\x02\x8b\x1a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01.",
                "2^200",
            ),
            (b"\x80\x04\x88.", "True"),
            (b"\x80\x04\x89.", "False"),
            (b"\x80\x04G?\xf8\x00\x00\x00\x00\x00\x00.", "1.5"),
            (b"\x80\x04\x8c\x02hi\x94.", "\"hi\""),
            // Bytes and sets, read past as their type (protocol 5, as Python writes them).
            (b"\x80\x05C\x02ab\x94.", "bytes"),
            (b"\x80\x05B\x02\x00\x00\x00ab.", "bytes"),
            (b"\x80\x05\x8e\x02\x00\x00\x00\x00\x00\x00\x00ab.", "bytes"),
            (b"\x80\x05\x96\x02\x00\x00\x00\x00\x00\x00\x00xy\x94.", "bytearray"),
            (b"\x80\x05\x8f\x94(K\x01K\x02\x90.", "set"),
            (b"\x80\x05\x8f\x94.", "set"),
            (b"\x80\x05(K\x03\x91\x94.", "frozenset"),
            (b"\x80\x05}\x94\x8c\x01k\x94C\x01\x00\x94s.", "{\"k\": bytes}"),
            // Lone surrogates, as Python writes them (`surrogatepass`), and bytes that are no UTF-8 at all.
            (b"\x80\x04\x8c\x05a\xed\xa0\x80b.", "\"a\u{fffd}\u{fffd}\u{fffd}b\""),
            (b"\x80\x04\x8c\x02\xff\xfe.", "\"\u{fffd}\u{fffd}\""),
            (b"\x80\x02X\x02\x00\x00\x00hi.", "\"hi\""),
            (b"\x80\x04\x8d\x02\x00\x00\x00\x00\x00\x00\x00hi.", "\"hi\""),
            (b"\x80\x04]\x94(K\x01K\x02e.", "[1, 2]"),
            (b"\x80\x04]\x94K\x01a.", "[1]"),
            (b"\x80\x04}\x94(\x8c\x01a\x94K\x01\x8c\x01b\x94h\x01u.", "{\"a\": 1, \"b\": \"a\"}"),
            (b"\x80\x04}\x94\x8c\x01a\x94K\x01s.", "{\"a\": 1}"),
            (b"\x80\x04K\x01K\x02\x86\x94.", "(1, 2)"),
            (b"\x80\x04K\x01\x85.", "(1,)"),
            (b"\x80\x04K\x01K\x02K\x03\x87.", "(1, 2, 3)"),
            (b"\x80\x04(K\x01K\x02K\x03K\x04t.", "(1, 2, 3, 4)"),
            (b"\x80\x04).", "()"),
            (b"\x80\x02]q\x00(]q\x01h\x01e.", "[[], []]"),
            (b"\x80\x02]r\x00\x01\x00\x00(]r\x01\x00\x00\x00j\x01\x00\x00\x00e.", "[[], []]"),
            (b"\x95\x05\x00\x00\x00\x00\x00\x00\x00\x80\x04K\x07.", "7"),
            (b"(K\x01K\x02l.", "[1, 2]"),
            (b"(\x8c\x01kK\x02d.", "{\"k\": 2}"),
            (b"K\x01K\x020.", "1"),
            (b"K\x01(K\x02K\x031.", "1"),
        ];
        for (bytes, expected) in cases {
            let value = decode(bytes).unwrap_or_else(|error| panic!("{bytes:?}: {error}"));
            assert_eq!(render(&value), *expected, "{bytes:?}");
        }
    }

    #[test]
    fn rejects_malformed_pickles_with_offsets() {
        // (bytes, expected fragment of the message)
        let cases: &[(&[u8], &str)] = &[
            (b"", "at byte 0: truncated"),
            (b"\x80\x04", "at byte 2: truncated"),
            (b"\x80\x04K", "truncated"),
            (b"\x80\x04\xff.", "at byte 2: unknown or unsupported opcode 0xff"),
            (
                b"(dp0\nVsegments\np1\n(lp2\ns.",
                "at byte 2: unknown or unsupported opcode 0x70 in a pickle with no PROTO opcode: protocol 0 or 1?",
            ),
            (b"\x80\x06N.", "unsupported pickle protocol 6"),
            (b"\x80\x04.", "STOP on an empty stack"),
            (b"\x80\x04K\x01K\x02.", "STOP with more than one object"),
            (b"\x80\x04N.N.", "bytes after the pickle's STOP"),
            (b"\x80\x04N.\x00", "bytes after the pickle's STOP"),
            (b"\x80\x04e.", "APPENDS without a mark"),
            (b"\x80\x04K\x01(K\x02e.", "APPENDS on a int, not a list"),
            (b"\x80\x04}(K\x01u.", "odd number"),
            (b"\x80\x04h\x03.", "memo slot 3 was never written"),
            (b"\x80\x04cnumpy\nndarray\n.", "GLOBAL names numpy.ndarray, an object of a class"),
            (b"\x80\x04\x8c\x05numpy\x8c\x07ndarray\x93.", "STACK_GLOBAL names numpy.ndarray, an object of a class"),
            (b"\x80\x04K\x01)R.", "REDUCE of a int with a tuple"),
            (b"\x80\x04c__builtin__\nset\nK\x01R.", "REDUCE of a set with a int"),
            (b"\x80\x04X\xff\xff\xff\x7fab", "truncated"),
            (b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7fab", "truncated"),
            (b"\x80\x04Nr\xff\xff\xff\x7f.", "past the 3 bytes read"),
            (b"\x80\x04\x94.", "MEMOIZE with no object"),
            (b"\x80\x04](K\x01\x90.", "ADDITEMS on a list, not a set"),
            (b"\x80\x04K\x01\x91.", "FROZENSET without a mark"),
            (b"\x80\x04C\x05ab", "truncated"),
            (b"\x1f\x8b\x08\x00", "the file is gzip-compressed twice"),
        ];
        for (bytes, expected) in cases {
            let error = decode(bytes).err().unwrap_or_else(|| panic!("{bytes:?} decoded"));
            let message = error.to_string();
            assert!(message.contains(expected), "{bytes:?}: {message:?} lacks {expected:?}");
        }
    }

    /// Python's protocol 2 to 4 reductions of the builtin types no snapshot key holds (bytes, sets, bytearrays) read as
    /// those types, as the later protocols' own opcodes for them do: a file's protocol does not decide whether it reads.
    #[test]
    fn builtin_reductions_read_as_their_type_table() {
        // (pickle.dumps(value, protocol), the type), from python 3.
        let cases: [(&[u8], Opaque); 7] = [
            (b"\x80\x02c_codecs\nencode\nq\x00X\x02\x00\x00\x00abq\x01X\x06\x00\x00\x00latin1q\x02\x86q\x03Rq\x04.", Opaque::Bytes),
            (b"\x80\x02c__builtin__\nbytes\nq\x00)Rq\x01.", Opaque::Bytes),
            (b"\x80\x02c__builtin__\nset\nq\x00]q\x01(K\x01K\x02e\x85q\x02Rq\x03.", Opaque::Set),
            (b"\x80\x03cbuiltins\nfrozenset\nq\x00]q\x01K\x03a\x85q\x02Rq\x03.", Opaque::FrozenSet),
            (
                b"\x80\x02c__builtin__\nbytearray\nq\x00c_codecs\nencode\nq\x01X\x02\x00\x00\x00xyq\x02X\x06\x00\x00\x00latin1q\x03\x86q\x04Rq\x05\x85q\x06Rq\x07.",
                Opaque::ByteArray,
            ),
            (b"\x80\x03cbuiltins\nbytearray\nq\x00C\x02xyq\x01\x85q\x02Rq\x03.", Opaque::ByteArray),
            (
                b"\x80\x04\x95#\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x94\x8c\tbytearray\x94\x93\x94C\x02xy\x94\x85\x94R\x94.",
                Opaque::ByteArray,
            ),
        ];
        for (bytes, kind) in cases {
            match decode(bytes) {
                Ok(Value::Opaque(read)) => assert_eq!(read, kind, "{bytes:?}"),
                other => panic!("{bytes:?}: {other:?}"),
            }
        }
    }

    /// Issue 17: values nested a million deep under a key the importer ignores — tuples (a 305-byte gzipped file
    /// nests 200,000), lists, dicts — read and drop without overflowing the stack.
    #[test]
    fn values_nested_a_million_deep_drop_without_recursion() {
        const DEPTH: usize = 1_000_000;
        let snapshot = |nested: Vec<u8>| {
            let mut bytes = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]]a\x8c\x14external_annotations".to_vec();
            bytes.extend(nested);
            bytes.extend(b"u.");
            bytes
        };
        let tuples = [b"N".to_vec(), vec![0x85; DEPTH]].concat();
        let lists = [vec![b']'; DEPTH], vec![b'a'; DEPTH - 1]].concat();
        let dicts = [b"}".to_vec(), b"\x8c\x01k}".repeat(DEPTH - 1), vec![b's'; DEPTH - 1]].concat();
        for (what, nested) in [("tuples", tuples), ("lists", lists), ("dicts", dicts)] {
            let read = crate::parse_snapshot(snapshot(nested).as_slice(), "deep.pickle");
            let snapshot = read.unwrap_or_else(|error| panic!("{what}: {error}"));
            assert_eq!(snapshot.device_traces.len(), 1, "{what}");
        }
    }

    /// What each slot reads as, in the memo's own words.
    fn slots(memo: &Memo) -> Vec<String> {
        (0..memo.len())
            .map(|slot| match memo.get(slot) {
                Some(Value::Short(short)) => format!("short {}", short.as_str()),
                Some(Value::Str(text)) => format!("str {text}"),
                Some(Value::Int(number)) => format!("int {number}"),
                Some(other) => other.type_name().to_owned(),
                None => "none".to_owned(),
            })
            .collect()
    }

    #[test]
    fn the_compact_memo_shares_equal_values_and_copies_before_a_change() {
        let short = |text| Value::Short(ShortStr::new(text).unwrap());
        let mut memo = Memo::new();
        // A trace's pattern: an entry's dict taken, then its "N/A"; a str that differs; an int.
        for _ in 0..3 {
            memo.push(Value::Consumed, 0).unwrap();
            memo.push(short("N/A"), 7).unwrap();
        }
        memo.push(short("other"), 0).unwrap();
        memo.push(Value::Int(5), 0).unwrap();
        assert_eq!(memo.values.len(), 2 + 2 + 1, "one entry for the three N/A, one for other, one for the int");
        assert_eq!(memo.atom(1), 7);
        // Changing one shared slot leaves the others as they were.
        memo.set(3, Value::Str(Rc::new("N/A".to_owned())));
        let taken = "trace entry taken earlier (shared through the memo)";
        let after_the_change = [taken, "short N/A", taken, "str N/A", taken, "short N/A"];
        assert_eq!(slots(&memo)[..6], after_the_change);
        // A put past the end leaves holes between.
        memo.put(10, Value::Int(1), 0).unwrap();
        assert_eq!(slots(&memo)[8..], ["missing memo entry", "missing memo entry", "int 1"]);
        // A rewind drops what came after the mark, and a slot from before it that was given a copy holds its value again.
        let mark = memo.mark();
        memo.push(short("N/A"), 7).unwrap();
        memo.set(5, Value::Int(9));
        memo.set(0, Value::Int(8));
        memo.rewind(mark);
        assert_eq!(memo.len(), 11);
        assert_eq!(slots(&memo)[..6], after_the_change);
        // Kept, the changes stay.
        let _mark = memo.mark();
        memo.set(5, Value::Int(9));
        memo.keep();
        assert_eq!(slots(&memo)[5], "int 9");
        assert_eq!(slots(&memo)[1], "short N/A");
    }

    /// PyTorch 2.12 memoizes a new `pool_id` pair for every trace entry: one value for each distinct pair, the "N/A"
    /// between them still shared, a changed slot copied, a rewind forgetting the pairs it drops.
    #[test]
    fn the_compact_memo_holds_each_pair_once() {
        let short = |text| Value::Short(ShortStr::new(text).unwrap());
        let mut memo = Memo::new();
        for entry in 0..1000 {
            memo.push(Value::Consumed, 0).unwrap();
            memo.push(short("N/A"), 7).unwrap();
            memo.push_pair(0, i64::from(entry % 1000 == 999)).unwrap();
        }
        // The pairs (0, 0) and (0, 1), two N/A (the first pair was stored between them): not one value an entry.
        assert_eq!(memo.values.len(), 2 + 2 + 2);
        fn pair(memo: &Memo, slot: usize) -> Option<(i64, i64)> {
            match memo.get(slot) {
                Some(Value::Tuple(items)) => match items.as_slice() {
                    [Value::Int(first), Value::Int(second)] => Some((*first, *second)),
                    _ => None,
                },
                _ => None,
            }
        }
        assert_eq!((pair(&memo, 2), pair(&memo, 2999)), (Some((0, 0)), Some((0, 1))));
        memo.set(5, Value::Int(4));
        assert_eq!((slots(&memo)[5].as_str(), pair(&memo, 8)), ("int 4", Some((0, 0))), "copied first");
        let mark = memo.mark();
        memo.push_pair(7, 7).unwrap();
        memo.rewind(mark);
        memo.push(short("x"), 0).unwrap();
        memo.push_pair(7, 7).unwrap();
        assert_eq!(pair(&memo, memo.len() - 1), Some((7, 7)), "a pair dropped by a rewind is made anew");
    }

    #[test]
    fn memo_shares_objects() {
        // [l, l] where l = [1]: both elements are the same Rc.
        let value = decode(b"\x80\x04]\x94(]\x94K\x01ah\x01e.").unwrap();
        let Value::List(outer) = &value else { panic!("not a list") };
        let outer = outer.borrow();
        let (Value::List(first), Value::List(second)) = (&outer.items[0], &outer.items[1]) else { panic!("not lists") };
        assert!(Rc::ptr_eq(first, second));
        assert_eq!(first.borrow().items.len(), 1);
    }
}
