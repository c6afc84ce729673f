//! Reading snapshot files: gzip or raw pickle, PyTorch ≥ 2.1 and legacy (≤ 2.0) schemas, into [`Snapshot`];
//! also `torch.cuda.memory_snapshot()`'s output, a list of segments: a state with no trace (an empty trace
//! for each device up to the highest the segments name).
//!
//! The pickle is decoded by the crate-private streaming reader (`pickle_read.rs`); this module is its sink: it takes each
//! trace entry as the pickle appends it to a device's trace list, converts it to a [`TraceEntry`] and interns its
//! frames, takes each segment the same way as the root's `segments` list receives it (so the generic values of a
//! segment and its blocks, and the memo slots holding them, go at once: the peak stays near the typed model's
//! size), then converts the rest (settings, a top-level list of segments) from the generic values at the end.
//! A file of 4 MiB of pickle or more is read, and gunzipped, on a second thread while it is parsed
//! (`read_ahead.rs`): a gzip file then imports in about the time of its parse alone.
//!
//! The schema never shares a trace list, a segment, a segment's block list or a block: each converted one is
//! marked (the object itself, and its memo slot as `Value::Converted`), and a second reference to it, through the
//! memo or `DUP`, is refused naming both places, instead of converted again (`[segment] * 20000` would otherwise turn
//! 280 bytes into gigabytes).
//!
//! Frames are interned twice over: each frame dict becomes an entry of a frame table (deduplicated by
//! content), each frame list a list of frame ids deduplicated by content into a [`StackId`]; and the memo
//! slot of a converted frame list is replaced by the `StackId`, so a list shared through the memo by every
//! event is decoded once. A frame's strs are `Arc<str>`s, one per distinct str of the pickle: a long file name
//! shared through the memo by the frames of many lists is held once (`tests/import_memory.rs`).
//!
//! Ints are read at any width (`LONG1` / `LONG4`); one that does not fit its field is an error naming the
//! value and the key path (`device_traces[0][3].size: 2^80 does not fit a u64 ...`), except a frame's
//! `line`, which is informational and never costs the file: a line in `2^63..2^64` is PyTorch's `uint64_t`
//! of a negative line (2^64 - 1 for Python's -1, "no line", seen in `torch/_subclasses/fake_tensor.py`
//! frames) and is read as that negative number, `None` as -1, and anything wider saturates.
//!
//! Missing keys default as PyTorch's MemoryViz does: `frames` = [], a block's `requested_size` = its
//! `size`, legacy blocks (`history` instead of `frames`) take the first history entry's `frames` and
//! `real_size`, a block's missing `address` follows the previous block. A trace entry's `category`,
//! `user_metadata` and `compile_context` strs become its category (the first of them naming one, see
//! [`CategoryKey`]; other values of `user_metadata` are allowed and ignored). Keys the model does not hold
//! (`external_annotations`, pinned-memory settings) are ignored; `heapscope_contender_export`, which heapscope writes in
//! an export of a contender other than PyTorch's allocator, is read as [`ContenderExport`].

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use flate2::bufread::MultiGzDecoder;

use super::pickle_int::Int;
use super::pickle_read::{self, Dict, List, Memo, Place, ReadError, Scan, Sink, Token, Value};
use super::read_ahead::ReadAhead;
use super::snapshot::{
    Action, Block, BlockState, Category, CategoryId, CategoryKey, ContenderExport, Frame, Pool, PoolId, RecordedSettings,
    Segment, Snapshot, StackId, TraceEntry, UnknownAction,
};

/// Why a snapshot file could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The file could not be opened or read (or its gzip stream is corrupt).
    #[error("{file}: cannot read: {error}")]
    Io {
        /// The file.
        file: String,
        /// The I/O error (in the message, so not repeated as a source).
        error: io::Error,
    },
    /// The bytes are not a pickle this reader understands.
    #[error("{file}: not a valid pickle: at byte {offset} of the pickle stream: {what}")]
    Pickle {
        /// The file.
        file: String,
        /// Offset in the (decompressed) pickle stream.
        offset: u64,
        /// What is wrong, e.g. `unknown or unsupported opcode 0x95`.
        what: String,
    },
    /// The pickle is fine but does not hold a memory snapshot.
    #[error("{file}: not a PyTorch memory snapshot: {path}: {what}")]
    Schema {
        /// The file.
        file: String,
        /// Where, e.g. `device_traces[0][17].action`.
        path: String,
        /// What is wrong, e.g. `expected str, found int`.
        what: String,
    },
}

/// Reads a snapshot file (`torch.cuda.memory._dump_snapshot`), gzip-compressed or not.
///
/// # Errors
/// [`SnapshotError`] naming the file and what is wrong where.
pub fn read_snapshot(path: &Path) -> Result<Snapshot, SnapshotError> {
    read_snapshot_ahead(path, READ_AHEAD_FROM_BYTES, READ_AHEAD_CHUNK_BYTES)
}

/// Pickles of at least this many bytes are read (and gunzipped) on a second thread ([`ReadAhead`]): below, the
/// thread would cost more than it saves.
const READ_AHEAD_FROM_BYTES: u64 = 4 << 20;

/// The chunks of a [`ReadAhead`].
const READ_AHEAD_CHUNK_BYTES: usize = 256 << 10;

/// [`read_snapshot`], reading ahead on a second thread in chunks of `chunk_bytes` when the pickle is known to hold at
/// least `from_bytes` bytes.
fn read_snapshot_ahead(path: &Path, from_bytes: u64, chunk_bytes: usize) -> Result<Snapshot, SnapshotError> {
    let name = heapscope_core::path_name(path);
    let io_error = |error| SnapshotError::Io { file: name.clone(), error };
    let mut file = File::open(path).map_err(io_error)?;
    let hint = pickle_size_hint(&mut file).map_err(io_error)?;
    let input = Decompressed::new(file).map_err(io_error)?;
    let gzip = input.is_gzip();
    let decoder = Decoder::with_size_hint(hint);
    // A file of known size only: a pipe's writer may stall, and the thread would wait for it after a parse error.
    if hint.is_some_and(|bytes| bytes >= from_bytes) {
        let ahead = ReadAhead::spawn(input, chunk_bytes).map_err(io_error)?;
        parse_decompressed(ahead, gzip, &name, decoder)
    } else {
        parse_decompressed(input, gzip, &name, decoder)
    }
}

/// A pickle stream: the bytes of a reader, or their gunzipped stream when they start with gzip's magic bytes.
enum Decompressed<R: Read> {
    Raw(BufReader<R>),
    Gzip(Box<MultiGzDecoder<BufReader<R>>>),
}

impl<R: Read> Decompressed<R> {
    fn new(reader: R) -> io::Result<Self> {
        let mut reader = BufReader::with_capacity(256 * 1024, reader);
        Ok(if reader.fill_buf()?.starts_with(&[0x1f, 0x8b]) {
            Self::Gzip(Box::new(MultiGzDecoder::new(reader)))
        } else {
            Self::Raw(reader)
        })
    }

    fn is_gzip(&self) -> bool {
        matches!(self, Self::Gzip(_))
    }
}

impl<R: Read> Read for Decompressed<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Raw(reader) => reader.read(out),
            Self::Gzip(reader) => reader.read(out),
        }
    }
}

/// The size of the file's pickle, if it can tell: a regular file's length, or a gzip file's recorded
/// length of its (last member's) data, at least the file's. Leaves the file at its start (an error if it
/// cannot).
fn pickle_size_hint(file: &mut File) -> io::Result<Option<u64>> {
    use std::io::{Seek, SeekFrom};
    let Some(len) = file.metadata().ok().filter(std::fs::Metadata::is_file).map(|metadata| metadata.len()) else {
        return Ok(None); // a pipe or the like: nothing read, nothing to rewind
    };
    let mut probe = || -> io::Result<u64> {
        let mut head = [0; 2];
        if len < 18 {
            return Ok(len);
        }
        file.read_exact(&mut head)?;
        if head != [0x1f, 0x8b] {
            return Ok(len);
        }
        let mut size = [0; 4];
        file.seek(SeekFrom::End(-4))?;
        file.read_exact(&mut size)?;
        Ok(u64::from(u32::from_le_bytes(size)).max(len))
    };
    let hint = probe().ok();
    file.rewind()?;
    Ok(hint)
}

/// Parses a snapshot from `reader` (gzip detected by its magic bytes, else raw pickle); `name` names the
/// input in errors.
///
/// # Errors
/// [`SnapshotError`] naming `name` and what is wrong where.
pub fn parse_snapshot(reader: impl Read, name: &str) -> Result<Snapshot, SnapshotError> {
    parse(reader, name, Decoder::default())
}

/// [`parse_snapshot`] with a given sink.
fn parse(reader: impl Read, name: &str, decoder: Decoder) -> Result<Snapshot, SnapshotError> {
    let input = Decompressed::new(reader).map_err(|error| SnapshotError::Io { file: name.to_owned(), error })?;
    let gzip = input.is_gzip();
    parse_decompressed(input, gzip, name, decoder)
}

/// Parses the pickle stream `input` (gunzipped by now when `gzip`) with `decoder`.
fn parse_decompressed(mut input: impl Read, gzip: bool, name: &str, decoder: Decoder) -> Result<Snapshot, SnapshotError> {
    // A snapshot's pickle opens with PROTO (protocol 2 and later) or a dict or list (0 and 1): anything else is no
    // pickle of one (text gzipped, another format), said with what it holds rather than as a stray opcode's error.
    let convert_error = |error: ReadError| match error {
        ReadError::Malformed { offset, what } => SnapshotError::Pickle { file: name.to_owned(), offset, what },
        ReadError::Io { offset, error } => SnapshotError::Io {
            file: name.to_owned(),
            error: {
                // The decompressor's "unexpected end of file" is a gzip file cut short (a download or copy stopped), or
                // a few stray bytes after it; its "invalid gzip header" after the first member, bytes after the stream
                // that are no gzip member (padding, another file's data), which a snapshot file does not hold.
                let cut = match (gzip, error.kind()) {
                    (true, io::ErrorKind::UnexpectedEof) => {
                        " (the gzip stream is cut short: its last bytes, or its 8-byte trailer of CRC and length, are \
                         missing; or a few bytes that are no gzip member follow it)"
                    }
                    (true, _) if error.to_string().contains("invalid gzip header") => {
                        " (bytes after the gzip stream that are no gzip member: padding or another file's data)"
                    }
                    (true, io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData) => {
                        // Where the pickle reader stood says nothing of where: the stream is decompressed ahead of it.
                        return SnapshotError::Io {
                            file: name.to_owned(),
                            error: io::Error::new(
                                error.kind(),
                                format!(
                                    "the gzip stream is damaged: {error} (its compressed bytes are not what gzip wrote: a \
                                     copy or download went wrong; `gzip -t` says the same)"
                                ),
                            ),
                        };
                    }
                    _ => "",
                };
                match offset {
                    Some(offset) => io::Error::new(error.kind(), format!("at byte {offset} of the pickle stream: {error}{cut}")),
                    None => io::Error::new(error.kind(), format!("after the pickle's end: {error}{cut}")),
                }
            },
        },
        ReadError::Schema { path, what } => SnapshotError::Schema { file: name.to_owned(), path, what },
    };
    let mut head = Vec::with_capacity(8);
    (&mut input).take(8).read_to_end(&mut head).map_err(|error| convert_error(ReadError::Io { offset: Some(0), error }))?;
    if head.first().is_some_and(|byte| !matches!(byte, 0x80 | b'(' | b'}' | b']')) {
        let holds = if gzip { "the gzip stream holds" } else { "it starts with" };
        // A trace of heapscope's gzipped: its magic, or text (a CSV trace).
        let trace = heapscope_core::trace::Trace::is_native(&head)
            || head.iter().all(|&byte| byte.is_ascii_graphic() || byte.is_ascii_whitespace());
        let hint = if gzip && trace {
            "; a gzip-compressed heapscope or CSV trace? those are read as they are written: gunzip it first"
        } else {
            ""
        };
        return Err(SnapshotError::Pickle {
            file: name.to_owned(),
            offset: 0,
            what: format!(
                "no pickle of a snapshot (one opens with 0x80 and its protocol, or `(`, `}}` or `]`): {holds} {}{hint}",
                shown_bytes(&head)
            ),
        });
    }
    let mut input = head.as_slice().chain(input);
    let result = match pickle_read::read_pickle(&mut input, decoder) {
        // Read the rest so that the gzip trailer (CRC, length) is checked: a cut file is an error.
        Ok(result) if gzip => {
            io::copy(&mut input, &mut io::sink()).map(|_| result).map_err(|error| ReadError::Io { offset: None, error })
        }
        // A pickle that makes no sense from a gzip stream that is damaged: the damage is the cause, said instead (a
        // flipped byte decompresses to stray opcodes, found before the CRC at the end).
        Err(error @ (ReadError::Malformed { .. } | ReadError::Schema { .. })) if gzip => {
            match io::copy(&mut input, &mut io::sink()) {
                Err(damage) => Err(ReadError::Io { offset: None, error: damage }),
                Ok(_) => Err(error),
            }
        }
        other => other,
    };
    let (root, decoder) = result.map_err(convert_error)?;
    decoder.finish(&root).map_err(|Issue { path, what }| SnapshotError::Schema { file: name.to_owned(), path, what })
}

/// Segments whose dict says nothing of `is_expandable` (`untold`: device and address; PyTorch writes the key from 2.1 on,
/// files stripped or converted by other tools may not): expandable where their device's trace maps or unmaps pages
/// inside them (a `segment_map` / `segment_unmap`, which only expandable segments make), else not, as before PyTorch
/// had them.
fn infer_expandable(segments: &mut [Segment], device_traces: &[Vec<TraceEntry>], untold: &[(u32, u64)]) {
    if untold.is_empty() {
        return;
    }
    let untold: std::collections::HashSet<(u32, u64)> = untold.iter().copied().collect();
    // Per device, the page runs the trace maps or unmaps, by address.
    let runs: Vec<Vec<u64>> = device_traces
        .iter()
        .map(|entries| {
            let mut addresses: Vec<u64> = entries
                .iter()
                .filter(|entry| matches!(entry.action, Action::SegmentMap | Action::SegmentUnmap))
                .map(|entry| entry.addr)
                .collect();
            addresses.sort_unstable();
            addresses
        })
        .collect();
    for segment in segments.iter_mut().filter(|segment| untold.contains(&(segment.device, segment.address))) {
        let Some(addresses) = runs.get(segment.device as usize) else { continue };
        let first = addresses.partition_point(|&address| address < segment.address);
        segment.is_expandable =
            addresses.get(first).is_some_and(|&address| address < segment.address.saturating_add(segment.total_size));
    }
}

/// Bytes as hex and as text, for saying what a file holds instead: `68 65 6c 6c 6f ("hello")`.
pub fn shown_bytes(bytes: &[u8]) -> String {
    let hex: Vec<String> = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    let text: String =
        bytes.iter().map(|&byte| if byte.is_ascii_graphic() || byte == b' ' { byte as char } else { '.' }).collect();
    format!("{} ({text:?})", hex.join(" "))
}

/// A schema problem: where and what.
#[derive(Debug)]
struct Issue {
    path: String,
    what: String,
}

impl Issue {
    fn new(path: impl Into<String>, what: impl Into<String>) -> Self {
        Self { path: path.into(), what: what.into() }
    }

    fn expected(path: impl Into<String>, expected: &str, found: &Value) -> Self {
        Self::new(path, format!("expected {expected}, found {}", found.described()))
    }
}

impl From<Issue> for ReadError {
    fn from(Issue { path, what }: Issue) -> Self {
        ReadError::Schema { path, what }
    }
}

/// Devices a snapshot may have: the traces of `device_traces`, the devices a list of segments names (each gets an
/// empty trace). A bound on what a few bytes can ask for (one empty list shared through the memo as every trace).
const MAX_DEVICES: u32 = 1024;

const TAG_ROOT: u32 = 1;
const TAG_DEVICE_TRACES: u32 = 2;
/// Tags from here on name a list of segments: `TAG_SEGMENTS_BASE + index into Decoder::segment_lists`.
const TAG_SEGMENTS_BASE: u32 = 1 << 31;
/// Tags from here on name a device trace list: `TAG_TRACE_BASE + index into Decoder::traces`.
const TAG_TRACE_BASE: u32 = 16;

/// What a list's tag names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tagged {
    /// The root's `segments`: an index into `Decoder::segment_lists`.
    Segments(usize),
    /// A device's trace: an index into `Decoder::traces`.
    Trace(usize),
    /// Any other list.
    Other,
}

impl Tagged {
    #[inline]
    fn of(tag: u32) -> Self {
        match (tag.checked_sub(TAG_SEGMENTS_BASE), tag.checked_sub(TAG_TRACE_BASE)) {
            (Some(list), _) => Tagged::Segments(list as usize),
            (None, Some(slot)) => Tagged::Trace(slot as usize),
            (None, None) => Tagged::Other,
        }
    }
}

/// A frame as the pickle holds it (strings shared with the pickle's memo).
type RawFrame = (Rc<String>, i64, Rc<String>);

/// A fast non-cryptographic hasher (the `FxHash` mix) for the interning tables: their keys come from
/// the file, but a collision costs time only, and the tables are small (distinct frames and stacks).
#[derive(Default)]
struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, value: u8) {
        self.write_u64(u64::from(value));
    }

    #[inline]
    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    #[inline]
    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type FxMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FxHasher>>;

/// Interns frames and frame lists.
#[derive(Debug)]
struct Frames {
    frame_ids: FxMap<RawFrame, u32>,
    frames: Vec<RawFrame>,
    stack_ids: FxMap<Vec<u32>, u32>,
    stacks: Vec<Vec<u32>>,
    scratch: Vec<u32>,
}

impl Default for Frames {
    fn default() -> Self {
        Self {
            frame_ids: FxMap::default(),
            frames: Vec::new(),
            stack_ids: FxMap::from_iter([(Vec::new(), 0)]),
            stacks: vec![Vec::new()],
            scratch: Vec::new(),
        }
    }
}

impl Frames {
    /// Interns the frame list `value` found at `path`; replaces converted memo entries (see the module doc).
    fn intern(&mut self, value: &Value, memo: &mut Memo, path: &dyn Fn() -> String) -> Result<StackId, Issue> {
        let list = match value {
            Value::Stack(id) => return Ok(StackId(*id)),
            Value::List(list) => list,
            Value::None => return Ok(StackId::NONE),
            other => return Err(Issue::expected(path(), "list", other)),
        };
        let list = list.borrow();
        self.scratch.clear();
        for (index, item) in list.items.iter().enumerate() {
            let id = match item {
                Value::Frame(id) => *id,
                Value::Dict(dict) => self.frame_of_dict(&dict.borrow(), memo, &|| format!("{}[{index}]", path()))?,
                other => return Err(Issue::expected(format!("{}[{index}]", path()), "dict", other)),
            };
            self.scratch.push(id);
        }
        let id = self.stack_of_scratch(path)?;
        if let Some(entry) = list.memo_slot.and_then(|slot| memo.get_mut(slot as usize)) {
            *entry = Value::Stack(id);
        }
        Ok(StackId(id))
    }

    /// Interns the frame dict `dict` found at `frame_path`; replaces its memo entry.
    fn frame_of_dict(&mut self, dict: &Dict, memo: &mut Memo, frame_path: &dyn Fn() -> String) -> Result<u32, Issue> {
        let text = |key: &str| -> Result<Rc<String>, Issue> {
            match dict.get(key) {
                Some(Value::Str(text)) => Ok(Rc::clone(text)),
                Some(other) => Err(Issue::expected(format!("{}.{key}", frame_path()), "str", other)),
                None => Ok(Rc::new(String::new())),
            }
        };
        let line = match dict.get("line") {
            Some(value) => frame_line(value).ok_or_else(|| Issue::expected(format!("{}.line", frame_path()), "int", value))?,
            None => LINE_UNKNOWN,
        };
        let id = self.frame_id((text("filename")?, line, text("name")?), frame_path)?;
        if let Some(entry) = dict.memo_slot.and_then(|slot| memo.get_mut(slot as usize)) {
            *entry = Value::Frame(id);
        }
        Ok(id)
    }

    fn frame_id(&mut self, raw: RawFrame, path: &dyn Fn() -> String) -> Result<u32, Issue> {
        Ok(match self.frame_ids.get(&raw) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(self.frames.len()).map_err(|_| Issue::new(path(), "too many frames"))?;
                self.frames.push(raw.clone());
                self.frame_ids.insert(raw, id);
                id
            }
        })
    }

    /// Interns the frame list in `scratch`.
    fn stack_of_scratch(&mut self, path: &dyn Fn() -> String) -> Result<u32, Issue> {
        if self.scratch.is_empty() {
            return Ok(StackId::NONE.0); // the empty list, interned first (every block's `frames` in most files)
        }
        Ok(match self.stack_ids.get(self.scratch.as_slice()) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(self.stacks.len()).map_err(|_| Issue::new(path(), "too many frame lists"))?;
                self.stacks.push(self.scratch.clone());
                self.stack_ids.insert(self.scratch.clone(), id);
                id
            }
        })
    }

    fn into_stacks(self) -> Vec<Vec<Frame>> {
        // Each distinct str of the pickle (one `Rc` of the memo) becomes one `Arc<str>`, shared by every frame that
        // holds it: a long file name shared through the memo by a thousand frames is not copied a thousand times.
        let mut shared: FxMap<*const String, Arc<str>> = FxMap::default();
        let mut share =
            |text: &Rc<String>| Arc::clone(shared.entry(Rc::as_ptr(text)).or_insert_with(|| Arc::from(text.as_str())));
        let frames: Vec<Frame> = self
            .frames
            .iter()
            .map(|(filename, line, name)| Frame { filename: share(filename), line: *line, name: share(name) })
            .collect();
        self.stacks.into_iter().map(|ids| ids.into_iter().map(|id| frames[id as usize].clone()).collect()).collect()
    }
}

/// The categories of the trace entries, interned ([`Snapshot::categories`]).
#[derive(Debug, Default)]
struct Categories {
    ids: FxMap<(CategoryKey, Rc<String>), u16>,
    list: Vec<Category>,
}

impl Categories {
    /// The id of `text` under `key` (`None` for text that names no category); past `u16::MAX - 1` (65,534) distinct
    /// ones, the last id, [`Category::MORE`].
    fn id(&mut self, key: CategoryKey, text: &Rc<String>) -> Option<CategoryId> {
        if !CategoryKey::names_one(text) {
            return None;
        }
        if let Some(&id) = self.ids.get(&(key, Rc::clone(text))) {
            return Some(CategoryId(id));
        }
        if self.list.is_empty() {
            self.list.push(Category::none());
        }
        let Ok(id) = u16::try_from(self.list.len()) else { return Some(CategoryId(u16::MAX)) };
        let name: &str = if id == u16::MAX { Category::MORE } else { text };
        self.list.push(Category { key, name: Arc::from(name) });
        self.ids.insert((key, Rc::clone(text)), id);
        Some(CategoryId(id))
    }

    fn into_list(self) -> Vec<Category> {
        self.list
    }
}

/// The memory pools the trace entries name, interned ([`Snapshot::pool_ids`]).
#[derive(Debug, Default)]
struct PoolIds {
    ids: FxMap<(i64, i64), u8>,
    list: Vec<(i64, i64)>,
}

impl PoolIds {
    /// The id of `pool`: [`PoolId::DEFAULT`] for `(0, 0)`; past 254 private pools, [`PoolId::MORE`]. The list holds
    /// `(0, 0)` from the first entry that names its pool on: a file that names them, every one the default.
    fn id(&mut self, pool: (i64, i64)) -> PoolId {
        if self.list.is_empty() {
            self.list.push((0, 0));
        }
        if pool == (0, 0) {
            return PoolId::DEFAULT;
        }
        if let Some(&id) = self.ids.get(&pool) {
            return PoolId(id);
        }
        let Ok(id) = u8::try_from(self.list.len()) else { return PoolId::MORE };
        self.list.push(pool);
        self.ids.insert(pool, id);
        PoolId(id)
    }

    fn into_list(self) -> Vec<(i64, i64)> {
        self.list
    }
}

/// The sink: takes trace entries as they stream by, converts the rest at the end.
#[derive(Debug, Default)]
struct Decoder {
    /// (device index, entries) for every list tagged as a device trace.
    traces: Vec<(usize, Vec<TraceEntry>)>,
    frames: Frames,
    categories: Categories,
    pool_ids: PoolIds,
    /// Entries to reserve for the first trace list.
    reserve: usize,
    /// Never read trace entries directly (tests: the generic path is the reference).
    generic_only: bool,
    /// Entries built generically in the current batch, `(index, entry)`, merged in at the batch's end: inserting each
    /// where it belongs would move the batch's later entries once per fallback (quadratic in the batch).
    late: Vec<(usize, TraceEntry)>,
    /// Where each list or dict converted as a trace, a segment, a segment's blocks or a block was: the object keeps
    /// its index + 1 as its mark (a released memo slot as [`Value::Converted`]). The schema never shares one, so a
    /// second reference (through the memo) is refused instead of converted again — `[segment] * 20000` would
    /// otherwise turn 280 bytes into gigabytes.
    converted: Vec<Seen>,
    /// The segments of every list tagged as the root's `segments` (`TAG_SEGMENTS_BASE + index`), each with its index
    /// in the list, converted as they arrive (read directly, or at their `APPENDS` when built generically: hence
    /// the indices) so that their generic values (and the memo slots holding them) go at once.
    segment_lists: Vec<Vec<(usize, Segment)>>,
    /// The memo slots (and places) of the segment being read directly, marked once it is taken.
    pending_marks: Vec<(Option<usize>, Seen)>,
    /// The entries of actions heapscope does not know.
    unknown: UnknownActions,
    /// Segments whose dict has no `is_expandable` key, `(device, address)`: told by the trace at the end
    /// ([`infer_expandable`]).
    kind_untold: Vec<(u32, u64)>,
}

/// The entries of actions heapscope does not know ([`Action::Unknown`]), each distinct name held once.
#[derive(Debug, Default)]
struct UnknownActions {
    names: std::collections::HashSet<Arc<str>>,
    /// Each with the trace list it was read into while streaming (`Decoder::traces`' slot, set in `streaming`):
    /// such a list is a device's trace only if the root's `device_traces` holds it in the end.
    entries: Vec<(Option<usize>, UnknownAction)>,
    /// The slot of the trace list entries are read into now, `None` for the final lists themselves.
    streaming: Option<usize>,
}

impl UnknownActions {
    /// Notes that element `entry` of device `device`'s trace is of the action `name`.
    fn note(&mut self, device: usize, entry: usize, name: &str) {
        let name = match self.names.get(name) {
            Some(held) => Arc::clone(held),
            None => {
                let held: Arc<str> = Arc::from(name);
                self.names.insert(Arc::clone(&held));
                held
            }
        };
        self.entries.push((self.streaming, UnknownAction { device, entry, name }));
    }

    /// The entries by device and index, as [`Snapshot::unknown_actions`] holds them. `devices[slot]`: the device
    /// whose trace the list of that slot became, `None` where it became none (a list read as a trace while
    /// streaming that the root's `device_traces` does not hold): its entries are no device's.
    fn into_sorted(self, devices: &[Option<usize>]) -> Vec<UnknownAction> {
        let mut entries: Vec<UnknownAction> = self
            .entries
            .into_iter()
            .filter_map(|(slot, unknown)| match slot {
                None => Some(unknown),
                Some(slot) => {
                    let device = (*devices.get(slot)?)?;
                    Some(UnknownAction { device, ..unknown })
                }
            })
            .collect();
        entries.sort_by_key(|unknown| (unknown.device, unknown.entry));
        entries
    }
}

/// Where a list or dict was converted (see `Decoder::converted`): the path a refusal of a second reference names.
#[derive(Clone, Copy, Debug)]
enum Seen {
    /// The root's `segments` list.
    Segments,
    /// `device_traces[device]`.
    Trace(u32),
    /// `segments[index]`, or `[index]` in a list of segments (`listed`).
    Segment { listed: bool, index: u32 },
    /// That segment's `blocks`.
    Blocks { listed: bool, index: u32 },
    /// Block `block` of that segment.
    Block { listed: bool, index: u32, block: u32 },
}

impl Seen {
    fn segment(listed: bool, index: usize) -> Self {
        Seen::Segment { listed, index: u32::try_from(index).unwrap_or(u32::MAX) }
    }
}

impl std::fmt::Display for Seen {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let segment = |formatter: &mut std::fmt::Formatter<'_>, listed: bool, index: u32| {
            if listed { write!(formatter, "[{index}]") } else { write!(formatter, "segments[{index}]") }
        };
        match *self {
            Seen::Segments => formatter.write_str("segments"),
            Seen::Trace(device) => write!(formatter, "device_traces[{device}]"),
            Seen::Segment { listed, index } => segment(formatter, listed, index),
            Seen::Blocks { listed, index } => {
                segment(formatter, listed, index)?;
                formatter.write_str(".blocks")
            }
            Seen::Block { listed, index, block } => {
                segment(formatter, listed, index)?;
                write!(formatter, ".blocks[{block}]")
            }
        }
    }
}

/// Lets go of a converted list or dict that `memo` holds: its slot keeps only its mark ([`Value::Converted`]).
fn release(value: &Value, memo: &mut Memo) {
    let (slot, mark) = match value {
        Value::List(list) => {
            let list = list.borrow();
            (list.memo_slot, list.mark)
        }
        Value::Dict(dict) => {
            let dict = dict.borrow();
            (dict.memo_slot, dict.mark)
        }
        _ => return,
    };
    let Some(entry) = slot.and_then(|slot| memo.get_mut(slot as usize)) else { return };
    // The slot may hold another object by now (a put may reuse it).
    let same = match (entry as &Value, value) {
        (Value::List(held), Value::List(list)) => Rc::ptr_eq(held, list),
        (Value::Dict(held), Value::Dict(dict)) => Rc::ptr_eq(held, dict),
        _ => false,
    };
    if same && mark != 0 {
        *entry = Value::Converted(mark);
    }
}

impl Decoder {
    /// A decoder for a pickle of `pickle_bytes` bytes, if known. Every trace entry takes at least ~30
    /// bytes of pickle, typically 70 to 90: room for the entries a pickle of this size holds is reserved
    /// (address space only until used) so the trace never moves while it grows; beyond it, it grows as
    /// usual.
    fn with_size_hint(pickle_bytes: Option<u64>) -> Self {
        let reserve = pickle_bytes.map_or(0, |bytes| usize::try_from(bytes / 48).unwrap_or(0));
        Self { reserve, ..Self::default() }
    }
}

impl Sink for Decoder {
    fn tag(&mut self, place: Place<'_>) -> u32 {
        match place {
            Place::Root => TAG_ROOT,
            Place::Key { parent: TAG_ROOT, key: "device_traces" } => TAG_DEVICE_TRACES,
            Place::Key { parent: TAG_ROOT, key: "segments" } => match u32::try_from(self.segment_lists.len()) {
                Ok(id) if id < u32::MAX - TAG_SEGMENTS_BASE => {
                    self.segment_lists.push(Vec::new());
                    TAG_SEGMENTS_BASE + id
                }
                _ => 0,
            },
            Place::Index { parent: TAG_DEVICE_TRACES, index } => match u32::try_from(self.traces.len()) {
                Ok(id) if id < TAG_SEGMENTS_BASE - TAG_TRACE_BASE => {
                    let mut entries = Vec::new();
                    // Address space only: a failure is no error, the list then grows as it goes.
                    let _ = entries.try_reserve_exact(std::mem::take(&mut self.reserve));
                    self.traces.push((index, entries));
                    TAG_TRACE_BASE + id
                }
                _ => 0,
            },
            _ => 0,
        }
    }

    fn append(&mut self, list_tag: u32, index: usize, item: Value, memo: &mut Memo) -> Result<Option<Value>, ReadError> {
        let slot = match Tagged::of(list_tag) {
            Tagged::Segments(list) => {
                let segment = self.segment(&item, Seen::segment(false, index))?;
                self.segment_lists[list].push((index, segment));
                release_segment(&item, memo);
                return Ok(None);
            }
            Tagged::Trace(slot) => slot,
            Tagged::Other => return Ok(Some(item)),
        };
        let Some(&(device, _)) = self.traces.get(slot) else { return Ok(Some(item)) };
        let interned = (&mut self.frames, &mut self.categories, &mut self.pool_ids);
        self.unknown.streaming = Some(slot);
        let entry = convert_entry(&item, device, index, interned, &mut self.unknown, memo);
        self.unknown.streaming = None;
        self.take_entry(slot, index, entry?);
        Ok(None)
    }

    fn atom(text: &str) -> u8 {
        match text {
            "action" => KEY_ACTION,
            "addr" => KEY_ADDR,
            "size" => KEY_SIZE,
            "stream" => KEY_STREAM,
            "time_us" => KEY_TIME_US,
            "device_free" => KEY_DEVICE_FREE,
            "frames" => KEY_FRAMES,
            "filename" => KEY_FILENAME,
            "line" => KEY_LINE,
            "name" => KEY_NAME,
            "device" => KEY_DEVICE,
            "address" => KEY_ADDRESS,
            "total_size" => KEY_TOTAL_SIZE,
            "allocated_size" => KEY_ALLOCATED_SIZE,
            "active_size" => KEY_ACTIVE_SIZE,
            "requested_size" => KEY_REQUESTED_SIZE,
            "segment_type" => KEY_SEGMENT_TYPE,
            "segment_pool_id" => KEY_SEGMENT_POOL_ID,
            "is_expandable" => KEY_IS_EXPANDABLE,
            "blocks" => KEY_BLOCKS,
            "state" => KEY_STATE,
            "history" => KEY_HISTORY,
            "large" => NAME_LARGE,
            "small" => NAME_SMALL,
            "active_allocated" => NAME_ACTIVE_ALLOCATED,
            "active_pending_free" => NAME_ACTIVE_PENDING_FREE,
            "inactive" => NAME_INACTIVE,
            "category" => KEY_CATEGORY,
            "user_metadata" => KEY_CATEGORY + 1,
            "compile_context" => KEY_CATEGORY + 2,
            "pool_id" => KEY_POOL_ID,
            "" | "N/A" => NAME_NO_CATEGORY,
            _ => match Action::from_name(text).and_then(|action| ACTIONS.iter().position(|&known| known == action)) {
                Some(index) => ATOM_ACTION + index as u8,
                None => 0,
            },
        }
    }

    fn appended(&mut self, list_tag: u32) {
        if let Tagged::Trace(slot) = Tagged::of(list_tag)
            && !self.late.is_empty()
        {
            self.merge_late(slot);
        }
    }

    fn reads_items(&self, list_tag: u32) -> bool {
        !self.generic_only
            && match Tagged::of(list_tag) {
                Tagged::Segments(list) => list < self.segment_lists.len(),
                Tagged::Trace(slot) => slot < self.traces.len(),
                Tagged::Other => false,
            }
    }

    fn read_item(&mut self, list_tag: u32, index: usize, scan: &mut Scan<'_, '_>) -> bool {
        // Called only where `reads_items` said yes: a segments or a trace list.
        let slot = match Tagged::of(list_tag) {
            Tagged::Segments(list) => return self.read_segment(list, index, scan),
            Tagged::Trace(slot) => slot,
            Tagged::Other => return false,
        };
        match fast_entry(scan, (&mut self.frames, &mut self.categories, &mut self.pool_ids)) {
            Some(entry) => {
                self.take_entry(slot, index, entry);
                true
            }
            None => false,
        }
    }
}

impl Decoder {
    /// Reads segment `index` of segments list `list` directly from the input (see [`Sink::read_item`]); `false` to
    /// leave it to the generic path.
    fn read_segment(&mut self, list: usize, index: usize, scan: &mut Scan<'_, '_>) -> bool {
        self.pending_marks.clear();
        let Some((segment, kind_told)) = fast_segment(scan, &mut self.frames, index, &mut self.pending_marks) else {
            return false;
        };
        if !kind_told {
            self.kind_untold.push((segment.device, segment.address));
        }
        // Taken: its dict, blocks list and blocks are marked as converted, as the generic path marks them.
        for (slot, seen) in self.pending_marks.drain(..) {
            self.converted.push(seen);
            let mark = u32::try_from(self.converted.len()).unwrap_or(u32::MAX);
            if let Some(slot) = slot {
                scan.set_memo(slot, Value::Converted(mark));
            }
        }
        self.segment_lists[list].push((index, segment));
        true
    }

    /// Stores element `index` of trace list `slot`. Entries read directly arrive at once, ones built
    /// generically (a fast-path fallback) at the list's `APPENDS`, after later entries of the same batch:
    /// every index below theirs is there by then, so their index is their position.
    fn take_entry(&mut self, slot: usize, index: usize, entry: TraceEntry) {
        let entries = &mut self.traces[slot].1;
        if index < entries.len() || !self.late.is_empty() {
            // Its place is among entries already read directly: merged in once the batch is done.
            self.late.push((index, entry));
        } else {
            entries.push(entry);
        }
    }

    /// Merges the batch's late entries into trace list `slot`, each at its index, in one pass over the batch.
    fn merge_late(&mut self, slot: usize) {
        let mut late = std::mem::take(&mut self.late);
        late.sort_by_key(|&(index, _)| index);
        let entries = &mut self.traces[slot].1;
        let first = late.first().map_or(entries.len(), |&(index, _)| index).min(entries.len());
        let early = entries.split_off(first);
        let mut early = early.into_iter();
        let mut late = late.into_iter().peekable();
        loop {
            match late.peek() {
                Some(&(index, _)) if index <= entries.len() => entries.extend(late.next().map(|(_, entry)| entry)),
                _ => match early.next() {
                    Some(entry) => entries.push(entry),
                    None => {
                        entries.extend(late.map(|(_, entry)| entry));
                        break;
                    }
                },
            }
        }
    }
}

// Atoms (`Sink::atom`): keys of trace entries and frames, and action names.
const KEY_ACTION: u8 = 1;
const KEY_ADDR: u8 = 2;
const KEY_SIZE: u8 = 3;
const KEY_STREAM: u8 = 4;
const KEY_TIME_US: u8 = 5;
const KEY_DEVICE_FREE: u8 = 6;
const KEY_FRAMES: u8 = 7;
const KEY_FILENAME: u8 = 8;
const KEY_LINE: u8 = 9;
const KEY_NAME: u8 = 10;
// Keys of segments and blocks, and their str values.
const KEY_DEVICE: u8 = 11;
const KEY_ADDRESS: u8 = 12;
const KEY_TOTAL_SIZE: u8 = 13;
const KEY_ALLOCATED_SIZE: u8 = 14;
const KEY_ACTIVE_SIZE: u8 = 15;
const KEY_REQUESTED_SIZE: u8 = 16;
const KEY_SEGMENT_TYPE: u8 = 17;
const KEY_SEGMENT_POOL_ID: u8 = 18;
const KEY_IS_EXPANDABLE: u8 = 19;
const KEY_BLOCKS: u8 = 20;
const KEY_STATE: u8 = 21;
const KEY_HISTORY: u8 = 22;
const NAME_LARGE: u8 = 23;
const NAME_SMALL: u8 = 24;
const NAME_ACTIVE_ALLOCATED: u8 = 25;
const NAME_ACTIVE_PENDING_FREE: u8 = 26;
const NAME_INACTIVE: u8 = 27;
// The keys an entry's category comes from (in `CategoryKey::ALL`'s order), and PyTorch's defaults for them.
const KEY_CATEGORY: u8 = 28;
const NAME_NO_CATEGORY: u8 = 31;
/// `ATOM_ACTION + i` is the name of `ACTIONS[i]`.
const ATOM_ACTION: u8 = 32;
const ACTIONS: [Action; Action::ALL.len()] = Action::ALL;
/// A trace entry's memory pool (PyTorch 2.12).
const KEY_POOL_ID: u8 = ATOM_ACTION + ACTIONS.len() as u8;

fn no_path() -> String {
    String::new()
}

/// Reads a dict's pairs (after its `EMPTY_DICT` and memo put): `MARK` pairs `SETITEMS`, or one pair and
/// `SETITEM`; keys must be strs. `None` to give up.
#[inline(always)]
fn scan_pairs<'a, 'm>(scan: &mut Scan<'a, 'm>, mut pair: impl FnMut(&mut Scan<'a, 'm>, u8, Token) -> Option<()>) -> Option<()> {
    match scan.next() {
        Token::Mark => loop {
            match scan.next() {
                Token::SetItems => return Some(()),
                Token::Str { atom, .. } => {
                    let value = scan.next();
                    pair(scan, atom, value)?;
                }
                _ => return None,
            }
        },
        Token::Str { atom, .. } => {
            let value = scan.next();
            pair(scan, atom, value)?;
            matches!(scan.next(), Token::SetItem).then_some(())
        }
        _ => None,
    }
}

/// A value the fast path ignores: a plain one (containers make it give up).
fn plain(value: Token) -> Option<()> {
    matches!(value, Token::Str { .. } | Token::Int(_) | Token::U64(_) | Token::None | Token::Float | Token::Memo(_)).then_some(())
}

fn u64_of(value: Token) -> Option<u64> {
    match value {
        Token::Int(number) => u64::try_from(number).ok(),
        Token::U64(number) => Some(number),
        _ => None,
    }
}

/// The fast path for a trace entry (see `Sink::read_item`): the dict's keys matched as atoms, values
/// decoded straight into a [`TraceEntry`]. Gives up (`None`) on anything `convert_entry` would reject or
/// that is not plain, so that errors come from the generic path.
fn fast_entry(
    scan: &mut Scan<'_, '_>,
    (frames, categories, pool_ids): (&mut Frames, &mut Categories, &mut PoolIds),
) -> Option<TraceEntry> {
    scan.put_taken()?;
    let mut fields = EntryFields::default();
    scan_pairs(scan, |scan, key, value| {
        match key {
            KEY_ACTION => match value {
                Token::Str { atom, .. } if atom >= ATOM_ACTION => {
                    fields.action = Some(*ACTIONS.get(usize::from(atom - ATOM_ACTION))?);
                }
                _ => return None,
            },
            KEY_ADDR => fields.addr = Some(u64_of(value)?),
            KEY_SIZE => fields.size = Some(u64_of(value)?),
            KEY_STREAM => fields.stream = u64_of(value)?,
            KEY_TIME_US => {
                fields.time_us = match value {
                    Token::None => None,
                    // `i64::MIN` is how an entry holds no time: refused by the generic path.
                    Token::Int(number) if number != i64::MIN => Some(number),
                    _ => return None,
                }
            }
            KEY_DEVICE_FREE => {
                // `u64::MAX` is how an entry holds no driver's free bytes: refused by the generic path.
                fields.device_free = match value {
                    Token::None => None,
                    value => Some(u64_of(value).filter(|&free| free != u64::MAX)?),
                }
            }
            KEY_FRAMES => fields.frames = fast_frames(scan, frames, value)?,
            KEY_POOL_ID => fields.pool_id = pool_ids.id(fast_pair(scan, value)?),
            KEY_CATEGORY..NAME_NO_CATEGORY => match value {
                // PyTorch's defaults, checked by their atom: no text is made for them.
                Token::Str { atom: NAME_NO_CATEGORY, .. } => {}
                Token::Str { at, .. } => {
                    let key = CategoryKey::ALL[usize::from(key - KEY_CATEGORY)];
                    let text = scan.text(at);
                    fields.category(key, categories.id(key, &text));
                }
                _ => plain(value)?,
            },
            _ => plain(value)?,
        }
        Some(())
    })?;
    // The dict is complete only if nothing more is set on it: the next opcode starts the next entry or
    // appends.
    if !scan.next_is(b"}ea") {
        return None;
    }
    fields.finish().ok()
}

/// An entry's `frames` value: `None`, a memo'd frame list, or a new list of frame dicts.
fn fast_frames(scan: &mut Scan<'_, '_>, frames: &mut Frames, value: Token) -> Option<StackId> {
    match value {
        Token::None => Some(StackId::NONE),
        Token::Memo(slot) => match scan.memo_mut().get(slot)? {
            Value::Stack(id) => Some(StackId(*id)),
            list @ Value::List(_) => {
                let list = list.clone();
                frames.intern(&list, scan.memo_mut(), &no_path).ok()
            }
            _ => None,
        },
        Token::EmptyList => {
            let list_slot = scan.put_container()?;
            frames.scratch.clear();
            if scan.next_is(b"(") {
                scan.next();
                loop {
                    match scan.next() {
                        Token::Appends => break,
                        item => {
                            let id = fast_frame(scan, frames, item)?;
                            frames.scratch.push(id);
                        }
                    }
                }
            } else if scan.next_is(b"}") || scan.memo_get_then(b'a') {
                // One item and `APPEND` (an empty list is followed by the next key, perhaps a memo get, instead).
                let item = scan.next();
                let id = fast_frame(scan, frames, item)?;
                frames.scratch.push(id);
                if !matches!(scan.next(), Token::Append) {
                    return None;
                }
            }
            let id = frames.stack_of_scratch(&no_path).ok()?;
            if let Some(slot) = list_slot {
                scan.set_memo(slot, Value::Stack(id));
            }
            Some(StackId(id))
        }
        _ => None,
    }
}

/// An element of a new frame list: a new frame dict or a memo'd one.
fn fast_frame(scan: &mut Scan<'_, '_>, frames: &mut Frames, item: Token) -> Option<u32> {
    match item {
        Token::Memo(slot) => match scan.memo_mut().get(slot)? {
            Value::Frame(id) => Some(*id),
            Value::Dict(dict) => {
                let dict = Rc::clone(dict);
                frames.frame_of_dict(&dict.borrow(), scan.memo_mut(), &no_path).ok()
            }
            _ => None,
        },
        Token::EmptyDict => {
            let slot = scan.put_container()?;
            let mut filename = None;
            let mut name = None;
            let mut line = LINE_UNKNOWN;
            scan_pairs(scan, |scan, key, value| {
                match (key, value) {
                    (KEY_FILENAME, Token::Str { at, .. }) => filename = Some(scan.text(at)),
                    (KEY_NAME, Token::Str { at, .. }) => name = Some(scan.text(at)),
                    (KEY_LINE, Token::Int(number)) => line = number,
                    // PyTorch's `uint64_t` of a negative line (see `frame_line`).
                    (KEY_LINE, Token::U64(number)) => line = number as i64,
                    (KEY_FILENAME | KEY_NAME | KEY_LINE, _) => return None,
                    _ => plain(value)?,
                }
                Some(())
            })?;
            let id = frames.frame_id((filename.unwrap_or_default(), line, name.unwrap_or_default()), &no_path).ok()?;
            if let Some(slot) = slot {
                scan.set_memo(slot, Value::Frame(id));
            }
            Some(id)
        }
        _ => None,
    }
}

/// The fast path for a segment (see `Sink::read_item`), like [`fast_entry`]: keys matched as atoms, values decoded
/// straight into a [`Segment`] and its blocks. Gives up (`None`) on anything `Decoder::segment` would reject, on a
/// key met twice, on a blocks list or block from the memo (shared: refused by the generic path) and on legacy blocks
/// (`history`). `marks` gets the memo slots of the dict, its blocks list and its blocks, with their places.
fn fast_segment(
    scan: &mut Scan<'_, '_>,
    frames: &mut Frames,
    index: usize,
    marks: &mut Vec<(Option<usize>, Seen)>,
) -> Option<(Segment, bool)> {
    let index = u32::try_from(index).unwrap_or(u32::MAX);
    marks.push((scan.put_container()?, Seen::Segment { listed: false, index }));
    let mut seen_keys = 0u32;
    let mut segment = Segment {
        device: 0,
        address: 0,
        total_size: 0,
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream: 0,
        segment_type: Pool::Large,
        segment_pool_id: (0, 0),
        is_expandable: false,
        frames: StackId::NONE,
        blocks: Vec::new(),
    };
    let (mut address, mut total_size, mut allocated, mut active, mut requested) = (None, None, None, None, None);
    let mut blocks_value = None;
    scan_pairs(scan, |scan, key, value| {
        first_time(&mut seen_keys, key)?;
        match key {
            // Past the devices read: the generic path names it.
            KEY_DEVICE => segment.device = u32::try_from(u64_of(value)?).ok().filter(|&device| device < MAX_DEVICES)?,
            KEY_ADDRESS => address = Some(u64_of(value)?),
            KEY_TOTAL_SIZE => total_size = Some(u64_of(value)?),
            KEY_ALLOCATED_SIZE => allocated = Some(u64_of(value)?),
            KEY_ACTIVE_SIZE => active = Some(u64_of(value)?),
            KEY_REQUESTED_SIZE => requested = Some(u64_of(value)?),
            KEY_STREAM => segment.stream = u64_of(value)?,
            KEY_SEGMENT_TYPE => {
                segment.segment_type = match value {
                    Token::Str { atom: NAME_LARGE, .. } => Pool::Large,
                    Token::Str { atom: NAME_SMALL, .. } => Pool::Small,
                    _ => return None,
                }
            }
            KEY_SEGMENT_POOL_ID => segment.segment_pool_id = fast_pair(scan, value)?,
            // A bool (NEWTRUE / NEWFALSE read as 1 / 0) or an int, as Python tests it.
            KEY_IS_EXPANDABLE => {
                segment.is_expandable = match value {
                    Token::Int(number) => number != 0,
                    Token::U64(_) => true,
                    _ => return None,
                }
            }
            KEY_FRAMES => segment.frames = fast_frames(scan, frames, value)?,
            KEY_BLOCKS => blocks_value = Some(fast_blocks(scan, frames, index, value, marks)?),
            _ => plain(value)?,
        }
        Some(())
    })?;
    if !scan.next_is(b"}ea") {
        return None;
    }
    segment.address = address?;
    segment.total_size = total_size?;
    let mut next_address = segment.address;
    // No `blocks`: refused by the generic path (PyTorch writes them for every segment; none would leave it all unknown).
    for block in blocks_value? {
        let block = Block {
            address: block.address.unwrap_or(next_address),
            size: block.size,
            requested_size: block.requested_size.unwrap_or(block.size),
            state: block.state,
            frames: block.frames,
        };
        next_address = block.address.saturating_add(block.size);
        segment.blocks.push(block);
    }
    let sum =
        |keep: fn(&Block) -> bool, size: fn(&Block) -> u64| segment.blocks.iter().filter(|b| keep(b)).map(size).sum::<u64>();
    let is_allocated = |block: &Block| block.state == BlockState::ActiveAllocated;
    let is_active = |block: &Block| block.state != BlockState::Inactive;
    segment.allocated_size = allocated.unwrap_or_else(|| sum(is_allocated, |b| b.size));
    segment.active_size = active.unwrap_or_else(|| sum(is_active, |b| b.size));
    segment.requested_size = requested.unwrap_or_else(|| sum(is_active, |b| b.requested_size));
    let kind_told = seen_keys & 1u32.checked_shl(u32::from(KEY_IS_EXPANDABLE)).unwrap_or(0) != 0;
    Some((segment, kind_told))
}

/// A block as the fast path reads it: the address and requested size may default (from the blocks before it, from
/// its size).
struct FastBlock {
    address: Option<u64>,
    size: u64,
    requested_size: Option<u64>,
    state: BlockState,
    frames: StackId,
}

/// A segment's `blocks`: `None`, or a new list of new block dicts.
fn fast_blocks(
    scan: &mut Scan<'_, '_>,
    frames: &mut Frames,
    index: u32,
    value: Token,
    marks: &mut Vec<(Option<usize>, Seen)>,
) -> Option<Vec<FastBlock>> {
    match value {
        Token::None => return Some(Vec::new()),
        Token::EmptyList => {}
        _ => return None,
    }
    marks.push((scan.put_container()?, Seen::Blocks { listed: false, index }));
    let mut blocks = Vec::new();
    let mut block = |scan: &mut Scan<'_, '_>, item: Token, blocks: &mut Vec<FastBlock>| -> Option<()> {
        let Token::EmptyDict = item else { return None };
        let number = u32::try_from(blocks.len()).ok()?;
        marks.push((scan.put_container()?, Seen::Block { listed: false, index, block: number }));
        blocks.push(fast_block(scan, frames)?);
        Some(())
    };
    if scan.next_is(b"(") {
        scan.next();
        loop {
            match scan.next() {
                Token::Appends => break,
                item => block(scan, item, &mut blocks)?,
            }
        }
    } else if scan.next_is(b"}") {
        let item = scan.next();
        block(scan, item, &mut blocks)?;
        if !matches!(scan.next(), Token::Append) {
            return None;
        }
    }
    Some(blocks)
}

/// `Some` the first time known key `key` (an atom; 0 for a key of no interest, always `Some`) is met in a dict whose
/// keys met so far are the bits of `seen`; `None` for a key met twice, which leaves the fast path.
fn first_time(seen: &mut u32, key: u8) -> Option<()> {
    if key != 0 {
        let bit = 1u32.checked_shl(u32::from(key))?;
        if *seen & bit != 0 {
            return None;
        }
        *seen |= bit;
    }
    Some(())
}

/// A new block dict (its `EMPTY_DICT` and memo put read).
fn fast_block(scan: &mut Scan<'_, '_>, frames: &mut Frames) -> Option<FastBlock> {
    let mut seen_keys = 0u32;
    let (mut address, mut size, mut requested_size, mut state, mut stack) = (None, None, None, None, StackId::NONE);
    scan_pairs(scan, |scan, key, value| {
        first_time(&mut seen_keys, key)?;
        match key {
            KEY_ADDRESS => address = Some(u64_of(value)?),
            KEY_SIZE => size = Some(u64_of(value)?),
            KEY_REQUESTED_SIZE => requested_size = Some(u64_of(value)?).filter(|&requested| requested != 0),
            KEY_STATE => {
                state = Some(match value {
                    Token::Str { atom: NAME_ACTIVE_ALLOCATED, .. } => BlockState::ActiveAllocated,
                    Token::Str { atom: NAME_ACTIVE_PENDING_FREE, .. } => BlockState::ActivePendingFree,
                    Token::Str { atom: NAME_INACTIVE, .. } => BlockState::Inactive,
                    _ => return None,
                });
            }
            KEY_FRAMES => stack = fast_frames(scan, frames, value)?,
            KEY_HISTORY => return None,
            _ => plain(value)?,
        }
        Some(())
    })?;
    Some(FastBlock { address, size: size?, requested_size, state: state?, frames: stack })
}

/// A `segment_pool_id`: `None` (0, 0), a new pair of ints (`TUPLE2`, perhaps memo'd) or a memo'd one.
fn fast_pair(scan: &mut Scan<'_, '_>, value: Token) -> Option<(i64, i64)> {
    match value {
        Token::None => Some((0, 0)),
        Token::Int(first) => {
            let Token::Int(second) = scan.next() else { return None };
            let Token::Tuple2 = scan.next() else { return None };
            scan.put_pair(first, second)?;
            Some((first, second))
        }
        Token::Memo(slot) => match scan.memo_mut().get(slot)? {
            Value::Tuple(items) => match items.as_slice() {
                [Value::Int(first), Value::Int(second)] => Some((*first, *second)),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

/// An int at `path` that must fit `T` (`type_name` in the message): any pickled int is read, one that does
/// not fit is named with its value.
fn to_int<T: TryFrom<i128>>(value: &Value, type_name: &str, path: &dyn Fn() -> String) -> Result<T, Issue> {
    let int = value.as_int().ok_or_else(|| Issue::expected(path(), "int", value))?;
    int.to().ok_or_else(|| Issue::new(path(), format!("{int} does not fit {type_name}")))
}

/// The items of a list or a tuple (`None` for any other value).
fn sequence_items(value: &Value) -> Option<Vec<Value>> {
    match value {
        Value::List(list) => Some(list.borrow().items.clone()),
        Value::Tuple(items) => Some(items.to_vec()),
        _ => None,
    }
}

/// A memory pool's id at `path` (a segment's `segment_pool_id`, a trace entry's `pool_id`): a pair of ints, as a
/// tuple or a list; `None` is the default pools' `(0, 0)`.
fn to_pool_id(value: &Value, path: &dyn Fn() -> String) -> Result<(i64, i64), Issue> {
    if matches!(value, Value::None) {
        return Ok((0, 0));
    }
    let items = sequence_items(value).ok_or_else(|| Issue::expected(path(), "tuple or list", value))?;
    match items.as_slice() {
        [first, second] => Ok((to_i64(first, path)?, to_i64(second, path)?)),
        _ => Err(Issue::new(path(), format!("expected a pair, found {} items", items.len()))),
    }
}

/// An int in `0..2^64` at `path`.
fn to_u64(value: &Value, path: &dyn Fn() -> String) -> Result<u64, Issue> {
    to_int(value, "a u64 (0 to 2^64 - 1)", path)
}

/// An int in `i64` at `path`.
fn to_i64(value: &Value, path: &dyn Fn() -> String) -> Result<i64, Issue> {
    to_int(value, "an i64 (-2^63 to 2^63 - 1)", path)
}

/// A frame's `line`; `None` (an error) when the value is neither an int nor Python's `None`. The line is informational, so a
/// value never costs the file: PyTorch keeps lines in a C++ `uint64_t` (`torch::unwind::Frame::lineno`),
/// so Python's -1 for a line it does not know (`PyCode_Addr2Line`) arrives as 2^64 - 1; a line in
/// `2^63..2^64` is read back as that negative `i64` (two's complement), `None` as -1, and anything wider
/// is saturated to `i64::MIN` / `i64::MAX`.
fn frame_line(value: &Value) -> Option<i64> {
    if matches!(value, Value::None) {
        return Some(LINE_UNKNOWN);
    }
    let int = value.as_int()?;
    Some(match (int.to::<i64>(), int.to::<u64>()) {
        (Some(line), _) => line,
        (None, Some(wrapped)) => wrapped as i64,
        (None, None) if int.is_negative() => i64::MIN,
        (None, None) => i64::MAX,
    })
}

/// A frame's line where the file tells none (`None`, or no `line` key): Python's own -1, shown as `?`.
const LINE_UNKNOWN: i64 = -1;

/// Converts one trace entry (element `index` of device `device`'s trace).
fn convert_entry(
    item: &Value,
    device: usize,
    index: usize,
    (frames, categories, pool_ids): (&mut Frames, &mut Categories, &mut PoolIds),
    unknown: &mut UnknownActions,
    memo: &mut Memo,
) -> Result<TraceEntry, Issue> {
    let here = || format!("device_traces[{device}][{index}]");
    let dict = match item {
        Value::Dict(dict) => dict,
        // An entry's dict that an earlier entry is (not kept once taken, so not named): said as other shared objects are.
        Value::Consumed | Value::Taken => {
            return Err(Issue::new(
                here(),
                "the same object as an earlier trace entry (a memo reference): a snapshot never shares it, so it is not \
                 read twice",
            ));
        }
        other => return Err(Issue::expected(here(), "dict", other)),
    };
    let dict = dict.borrow();
    let mut fields = EntryFields::default();
    // The name of an action this reader does not know, noted once the dict is read: a key set twice holds its last
    // value, as Python's dict does.
    let mut unknown_name = None;
    for (key, value) in &dict.items {
        let Value::Str(key) = key else { continue };
        let key: &str = key;
        let path = || format!("{}.{key}", here());
        match key {
            "action" => {
                let Value::Str(name) = value else { return Err(Issue::expected(path(), "str", value)) };
                // A later PyTorch's action: read as a mark, its name kept.
                let action = Action::from_name(name);
                unknown_name = if action.is_none() { Some(name) } else { None };
                fields.action = Some(action.unwrap_or(Action::Unknown));
            }
            "addr" => fields.addr = Some(to_u64(value, &path)?),
            "size" => fields.size = Some(to_u64(value, &path)?),
            "stream" => fields.stream = to_u64(value, &path)?,
            "time_us" => {
                fields.time_us = match value {
                    Value::None => None,
                    value => match to_i64(value, &path)? {
                        i64::MIN => return Err(Issue::new(path(), "-2^63 is no time (the value heapscope holds for none)")),
                        time_us => Some(time_us),
                    },
                }
            }
            "device_free" => {
                fields.device_free = match value {
                    Value::None => None,
                    value => match to_u64(value, &path)? {
                        u64::MAX => {
                            return Err(Issue::new(
                                path(),
                                "2^64 - 1 free bytes: past PyTorch's int64 (the value heapscope holds for none)",
                            ));
                        }
                        free => Some(free),
                    },
                }
            }
            "frames" => fields.frames = frames.intern(value, memo, &path)?,
            "pool_id" => fields.pool_id = pool_ids.id(to_pool_id(value, &path)?),
            // Any value is allowed there (`user_metadata` may be anything); a str names a category.
            "category" | "user_metadata" | "compile_context" => {
                if let (Value::Str(text), Some(key)) = (value, CategoryKey::ALL.into_iter().find(|k| k.as_str() == key)) {
                    fields.category(key, categories.id(key, text));
                }
            }
            _ => {}
        }
    }
    let entry = fields.finish().map_err(|key| Issue::new(format!("{}.{key}", here()), "missing key"))?;
    if let Some(name) = unknown_name {
        unknown.note(device, index, name);
    }
    if let Some(slot) = dict.memo_slot.and_then(|slot| memo.get_mut(slot as usize)) {
        *slot = Value::Consumed;
    }
    Ok(entry)
}

/// A trace entry's fields as they are read, by either path.
#[derive(Default)]
struct EntryFields {
    action: Option<Action>,
    addr: Option<u64>,
    size: Option<u64>,
    stream: u64,
    time_us: Option<i64>,
    device_free: Option<u64>,
    frames: StackId,
    category: Option<(CategoryKey, CategoryId)>,
    pool_id: PoolId,
}

impl EntryFields {
    /// Takes `id` read under `key` where no key before it in [`CategoryKey::ALL`] named one.
    fn category(&mut self, key: CategoryKey, id: Option<CategoryId>) {
        if let Some(id) = id
            && self.category.is_none_or(|(first, _)| key < first)
        {
            self.category = Some((key, id));
        }
    }

    /// The entry, or the key it lacks: `addr` may be missing from `oom`, `snapshot` and `user_defined` entries
    /// (MemoryViz's default 0), `size` from `snapshot` and `user_defined` entries.
    fn finish(self) -> Result<TraceEntry, &'static str> {
        let action = self.action.ok_or("action")?;
        let addr = match self.addr {
            Some(addr) => addr,
            None if action == Action::Oom || action.is_mark() => 0,
            None => return Err("addr"),
        };
        let size = match self.size {
            Some(size) => size,
            None if action.is_mark() => 0,
            None => return Err("size"),
        };
        let Self { stream, time_us, device_free, frames, category, pool_id, .. } = self;
        let category = category.map_or(CategoryId::NONE, |(_, id)| id);
        let mut entry = TraceEntry::new(action, addr, size);
        (entry.stream, entry.frames, entry.category, entry.pool_id) = (stream, frames, category, pool_id);
        Ok(entry.with_time_us(time_us).with_device_free(device_free))
    }
}

/// A dict's fields with the dict's path, for the end-of-file conversion.
struct Fields<'a> {
    dict: std::cell::Ref<'a, Dict>,
    path: &'a str,
}

impl<'a> Fields<'a> {
    fn of(value: &'a Value, path: &'a str) -> Result<Self, Issue> {
        match value {
            Value::Dict(dict) => Ok(Self { dict: dict.borrow(), path }),
            other => Err(Issue::expected(path, "dict", other)),
        }
    }

    fn key_path(&self, key: &str) -> String {
        if self.path.is_empty() { key.to_owned() } else { format!("{}.{key}", self.path) }
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.dict.get(key)
    }

    fn required(&self, key: &str) -> Result<&Value, Issue> {
        self.get(key).ok_or_else(|| Issue::new(self.key_path(key), "missing key"))
    }

    fn u64(&self, key: &str) -> Result<Option<u64>, Issue> {
        self.get(key).map(|value| to_u64(value, &|| self.key_path(key))).transpose()
    }

    fn required_u64(&self, key: &str) -> Result<u64, Issue> {
        to_u64(self.required(key)?, &|| self.key_path(key))
    }

    fn str(&self, key: &str) -> Result<Option<&str>, Issue> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Str(text)) => Ok(Some(text)),
            Some(other) => Err(Issue::expected(self.key_path(key), "str", other)),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, Issue> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(value)) => Ok(Some(*value)),
            Some(other) => match other.as_int() {
                Some(int) => Ok(Some(int.to::<i128>() != Some(0))),
                None => Err(Issue::expected(self.key_path(key), "bool", other)),
            },
        }
    }

    fn list(&self, key: &str) -> Result<Option<Vec<Value>>, Issue> {
        match self.get(key) {
            None | Some(Value::None) => Ok(None),
            Some(value) => sequence_items(value).map(Some).ok_or_else(|| Issue::expected(self.key_path(key), "list", value)),
        }
    }
}

impl Decoder {
    /// Refuses `value` at `seen` when it was converted already at another place (a memo reference to it): see
    /// `converted`; else marks it as converted there.
    fn once(&mut self, value: &Value, seen: Seen) -> Result<(), Issue> {
        let busy = || {
            Issue::new(seen.to_string(), "the same object as one that holds it (a memo reference): a snapshot never shares it")
        };
        let (mut list, mut dict);
        let mark = match value {
            Value::Converted(mark) => return Err(self.shared(*mark, seen)),
            // An empty list holds nothing to read twice (`[[]] * 8` as the traces of devices that record nothing).
            Value::List(held) if self.holds_nothing(held) => return Ok(()),
            Value::List(held) => {
                list = held.try_borrow_mut().map_err(|_| busy())?;
                &mut list.mark
            }
            Value::Dict(held) => {
                dict = held.try_borrow_mut().map_err(|_| busy())?;
                &mut dict.mark
            }
            _ => return Ok(()),
        };
        if *mark != 0 {
            return Err(self.shared(*mark, seen));
        }
        self.converted.push(seen);
        *mark = u32::try_from(self.converted.len()).unwrap_or(u32::MAX);
        Ok(())
    }

    /// Whether `list` is empty: no item, nothing read directly into it as it arrived (trace entries, see
    /// [`Sink::read_item`]; segments, which a segments list always has read so), and not met before holding any.
    fn holds_nothing(&self, list: &std::cell::RefCell<List>) -> bool {
        list.try_borrow().is_ok_and(|list| {
            let read_directly = match Tagged::of(list.tag) {
                Tagged::Segments(_) => true,
                Tagged::Trace(slot) => self.traces.get(slot).is_some_and(|(_, entries)| !entries.is_empty()),
                Tagged::Other => false,
            };
            // A marked list held something when it was met (what was read directly into it is taken since).
            list.mark == 0 && list.items.is_empty() && !read_directly
        })
    }

    /// The refusal of a second reference, at `seen`, to the object marked `mark`.
    fn shared(&self, mark: u32, seen: Seen) -> Issue {
        let first = self.converted.get((mark as usize).wrapping_sub(1)).map_or_else(|| "another".to_owned(), Seen::to_string);
        Issue::new(
            seen.to_string(),
            format!("the same object as {first} (a memo reference): a snapshot never shares it, so it is not read twice"),
        )
    }

    /// Converts the top-level value, with the trace entries already taken.
    fn finish(mut self, root: &Value) -> Result<Snapshot, Issue> {
        let top = match root {
            Value::Dict(_) => Fields::of(root, "")?,
            Value::List(list) => return self.segments_only(&list.borrow().items),
            other => {
                return Err(Issue::expected(
                    "<top level>",
                    "dict (a snapshot) or list (the segments of torch.cuda.memory_snapshot())",
                    other,
                ));
            }
        };
        // A list tagged as segments had its items converted as they arrived (after any the list was built with).
        if let Some(list) = top.get("segments") {
            self.once(list, Seen::Segments)?;
        }
        let streamed = match top.get("segments") {
            Some(Value::List(list)) => match Tagged::of(list.borrow().tag) {
                Tagged::Segments(id) => self.segment_lists.get_mut(id).map(std::mem::take),
                _ => None,
            },
            _ => None,
        };
        let segments_value = top.list("segments")?.ok_or_else(|| Issue::new("segments", "missing key"))?;
        let mut segments = Vec::with_capacity(segments_value.len() + streamed.as_ref().map_or(0, Vec::len));
        for (index, value) in segments_value.iter().enumerate() {
            segments.push(self.segment(value, Seen::segment(false, index))?);
        }
        let mut streamed = streamed.unwrap_or_default();
        streamed.sort_by_key(|&(index, _)| index);
        segments.extend(streamed.into_iter().map(|(_, segment)| segment));
        let traces = top.list("device_traces")?.unwrap_or_default();
        if traces.len() > MAX_DEVICES as usize {
            return Err(Issue::new("device_traces", format!("{} devices (at most {MAX_DEVICES} are read)", traces.len())));
        }
        let mut device_traces = Vec::new();
        // The device each streamed trace list became (see `UnknownActions::into_sorted`).
        let mut devices_of_slots = vec![None; self.traces.len()];
        for (device, value) in traces.iter().enumerate() {
            let path = format!("device_traces[{device}]");
            self.once(value, Seen::Trace(u32::try_from(device).unwrap_or(u32::MAX)))?;
            let list = match value {
                Value::List(list) => list.borrow(),
                other => return Err(Issue::expected(path, "list", other)),
            };
            // Each tagged list is one trace list object, met once here (`once` refused a second reference).
            let mut entries = match Tagged::of(list.tag) {
                Tagged::Trace(slot) if slot < self.traces.len() => {
                    devices_of_slots[slot] = Some(device);
                    std::mem::take(&mut self.traces[slot].1)
                }
                _ => Vec::new(),
            };
            let taken = entries.len();
            for (offset, item) in list.items.iter().enumerate() {
                let interned = (&mut self.frames, &mut self.categories, &mut self.pool_ids);
                entries.push(convert_entry(item, device, taken + offset, interned, &mut self.unknown, &mut Memo::default())?);
            }
            entries.shrink_to_fit();
            device_traces.push(entries);
        }
        let settings = match top.get("allocator_settings") {
            None | Some(Value::None) => None,
            Some(value) => Some(settings(value)?),
        };
        let contender_export = match top.get(ContenderExport::KEY) {
            None | Some(Value::None) => None,
            Some(value) => Some(contender_export(value, &device_traces)?),
        };
        infer_expandable(&mut segments, &device_traces, &self.kind_untold);
        Ok(Snapshot {
            segments,
            device_traces,
            settings,
            frame_stacks: self.frames.into_stacks(),
            categories: self.categories.into_list(),
            pool_ids: self.pool_ids.into_list(),
            unknown_actions: self.unknown.into_sorted(&devices_of_slots),
            contender_export,
        })
    }

    /// `torch.cuda.memory_snapshot()`'s output: a list of segments (`[3]` in paths) and no trace. Each device
    /// up to the highest one the segments name gets an empty trace, so that device `d`'s state is
    /// `device_traces[d]` with its segments, as for a snapshot.
    fn segments_only(mut self, items: &[Value]) -> Result<Snapshot, Issue> {
        let mut segments = Vec::with_capacity(items.len());
        for (index, value) in items.iter().enumerate() {
            segments.push(self.segment(value, Seen::segment(true, index))?);
        }
        let devices = segments.iter().map(|segment| segment.device as usize + 1).max().unwrap_or(0);
        Ok(Snapshot {
            segments,
            device_traces: vec![Vec::new(); devices],
            settings: None,
            frame_stacks: self.frames.into_stacks(),
            categories: Vec::new(),
            pool_ids: Vec::new(),
            unknown_actions: Vec::new(),
            contender_export: None,
        })
    }

    /// Converts the segment `value` found at `seen` (a `Seen::Segment`), refusing it (or its blocks) if converted
    /// before.
    fn segment(&mut self, value: &Value, seen: Seen) -> Result<Segment, Issue> {
        let Seen::Segment { listed, index } = seen else { unreachable!("a segment's place") };
        self.once(value, seen)?;
        let path = &seen.to_string();
        let fields = Fields::of(value, path)?;
        let address = fields.required_u64("address")?;
        let total_size = fields.required_u64("total_size")?;
        self.once(fields.required("blocks")?, Seen::Blocks { listed, index })?;
        // Required: PyTorch writes them for every segment, and a segment without them says nothing of what it holds
        // (every command would read it differently).
        let blocks_value = fields.list("blocks")?.unwrap_or_default();
        let mut blocks = Vec::with_capacity(blocks_value.len());
        let mut next_address = address;
        for (block_index, block) in blocks_value.iter().enumerate() {
            self.once(block, Seen::Block { listed, index, block: u32::try_from(block_index).unwrap_or(u32::MAX) })?;
            let block = self.block(block, &format!("{path}.blocks[{block_index}]"), next_address)?;
            next_address = block.address.saturating_add(block.size);
            blocks.push(block);
        }
        let sum = |keep: fn(&Block) -> bool, size: fn(&Block) -> u64| blocks.iter().filter(|b| keep(b)).map(size).sum::<u64>();
        let allocated = |block: &Block| block.state == BlockState::ActiveAllocated;
        let active = |block: &Block| block.state != BlockState::Inactive;
        let segment_type = match fields.str("segment_type")? {
            None | Some("large") => Pool::Large,
            Some("small") => Pool::Small,
            Some(other) => {
                return Err(Issue::new(fields.key_path("segment_type"), format!("expected 'large' or 'small', found {other:?}")));
            }
        };
        let segment_pool_id = match fields.get("segment_pool_id") {
            None => (0, 0),
            Some(value) => to_pool_id(value, &|| fields.key_path("segment_pool_id"))?,
        };
        let frames = match fields.get("frames") {
            None => StackId::NONE,
            Some(value) => self.frames.intern(value, &mut Memo::default(), &|| fields.key_path("frames"))?,
        };
        let device: u32 = match fields.get("device") {
            Some(device) => to_int(device, "a device index (u32)", &|| fields.key_path("device"))?,
            None => 0,
        };
        // Each device up to the highest named gets a state: a huge index would claim memory for every one below it.
        if device >= MAX_DEVICES {
            return Err(Issue::new(
                fields.key_path("device"),
                format!("device {device} (at most {MAX_DEVICES} devices are read)"),
            ));
        }
        Ok(Segment {
            device,
            address,
            total_size,
            allocated_size: fields.u64("allocated_size")?.unwrap_or_else(|| sum(allocated, |b| b.size)),
            active_size: fields.u64("active_size")?.unwrap_or_else(|| sum(active, |b| b.size)),
            requested_size: fields.u64("requested_size")?.unwrap_or_else(|| sum(active, |b| b.requested_size)),
            stream: fields.u64("stream")?.unwrap_or(0),
            segment_type,
            segment_pool_id,
            is_expandable: match fields.bool("is_expandable")? {
                Some(told) => told,
                None => {
                    self.kind_untold.push((device, address));
                    false
                }
            },
            frames,
            blocks,
        })
    }

    fn block(&mut self, value: &Value, path: &str, default_address: u64) -> Result<Block, Issue> {
        let fields = Fields::of(value, path)?;
        let size = fields.required_u64("size")?;
        let state = match fields.str("state")? {
            Some("active_allocated") => BlockState::ActiveAllocated,
            Some("active_pending_free") => BlockState::ActivePendingFree,
            Some("inactive") => BlockState::Inactive,
            Some(other) => return Err(Issue::new(fields.key_path("state"), format!("unknown block state {other:?}"))),
            None => return Err(Issue::new(fields.key_path("state"), "missing key")),
        };
        let mut requested_size = fields.u64("requested_size")?.filter(|&requested| requested != 0);
        let frames = match (fields.get("frames"), fields.list("history")?) {
            (Some(frames), _) => self.frames.intern(frames, &mut Memo::default(), &|| fields.key_path("frames"))?,
            // Legacy (≤ 2.0): the first history entry holds the frames and the requested size.
            (None, Some(history)) if !history.is_empty() => {
                let history_path = format!("{path}.history[0]");
                let first = Fields::of(&history[0], &history_path)?;
                if requested_size.is_none() {
                    requested_size = first.u64("real_size")?;
                }
                match first.get("frames") {
                    Some(frames) => self.frames.intern(frames, &mut Memo::default(), &|| first.key_path("frames"))?,
                    None => StackId::NONE,
                }
            }
            (None, _) => StackId::NONE,
        };
        Ok(Block {
            address: fields.u64("address")?.unwrap_or(default_address),
            size,
            requested_size: requested_size.unwrap_or(size),
            state,
            frames,
        })
    }
}

/// Lets go of a segment converted as it arrived: the memo slots of its dict, its blocks list and their dicts keep
/// only their marks, so its generic values go now rather than at the end of the file.
fn release_segment(segment: &Value, memo: &mut Memo) {
    if let Value::Dict(dict) = segment {
        if let Some(Value::List(blocks)) = dict.borrow().get("blocks") {
            for block in &blocks.borrow().items {
                release(block, memo);
            }
        }
        if let Some(blocks) = dict.borrow().get("blocks") {
            release(blocks, memo);
        }
    }
    release(segment, memo);
}

/// Converts `heapscope_contender_export`: the contender's name, and by device the entries before which the user called
/// `empty_cache()`, in order (two calls in a row before the same entry, and the trace's length for a call after its last
/// entry).
fn contender_export(value: &Value, device_traces: &[Vec<TraceEntry>]) -> Result<ContenderExport, Issue> {
    let fields = Fields::of(value, ContenderExport::KEY)?;
    let contender = fields.str("contender")?.ok_or_else(|| Issue::new(fields.key_path("contender"), "missing key"))?;
    let path = fields.key_path("empty_cache_entries");
    let devices = fields.list("empty_cache_entries")?.unwrap_or_default();
    if devices.len() > device_traces.len() {
        return Err(Issue::new(path, format!("{} devices, and device_traces holds {}", devices.len(), device_traces.len())));
    }
    let mut empty_cache_entries = Vec::with_capacity(devices.len());
    for (device, value) in devices.iter().enumerate() {
        let device_path = format!("{path}[{device}]");
        let Some(items) = sequence_items(value) else { return Err(Issue::expected(device_path, "list", value)) };
        let trace_len = device_traces[device].len();
        let mut entries: Vec<usize> = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let item_path = || format!("{device_path}[{index}]");
            let entry = to_u64(item, &item_path)?;
            // Entry `trace_len`: a call after the last entry.
            let entry = usize::try_from(entry).ok().filter(|&entry| entry <= trace_len).ok_or_else(|| {
                Issue::new(item_path(), format!("entry {entry}, past device_traces[{device}]'s {trace_len} entries"))
            })?;
            if let Some(&before) = entries.last().filter(|&&before| before > entry) {
                return Err(Issue::new(item_path(), format!("entry {entry} after entry {before}: the entries ascend")));
            }
            entries.push(entry);
        }
        empty_cache_entries.push(entries);
    }
    Ok(ContenderExport { contender: contender.into(), empty_cache_entries })
}

/// Converts `allocator_settings`.
fn settings(value: &Value) -> Result<RecordedSettings, Issue> {
    let fields = Fields::of(value, "allocator_settings")?;
    let max_split_size =
        match fields.get("max_split_size") {
            None | Some(Value::None) => None,
            Some(value) => match value.as_int() {
                // -1, and SIZE_MAX or beyond: unlimited.
                Some(Int::Fits(-1)) => None,
                Some(int) if !int.is_negative() && int.to::<u64>().is_none_or(|number| number == u64::MAX) => None,
                Some(int) => Some(int.to::<u64>().ok_or_else(|| {
                    Issue::new(fields.key_path("max_split_size"), format!("expected -1 or a size, found {int}"))
                })?),
                None => return Err(Issue::expected(fields.key_path("max_split_size"), "int", value)),
            },
        };
    let garbage_collection_threshold = match fields.get("garbage_collection_threshold") {
        None => 0.0,
        Some(Value::Float(value)) => *value,
        Some(value) => match value.as_int() {
            Some(int) => int.to_f64(),
            None => return Err(Issue::expected(fields.key_path("garbage_collection_threshold"), "float", value)),
        },
    };
    // What `--alloc-conf` refuses is refused from a file too: the emulation would run on settings PyTorch rejects.
    if !(garbage_collection_threshold == 0.0 || (garbage_collection_threshold > 0.0 && garbage_collection_threshold < 1.0)) {
        return Err(Issue::new(
            fields.key_path("garbage_collection_threshold"),
            format!("{garbage_collection_threshold} is no threshold: 0 (off) or between 0.0 and 1.0"),
        ));
    }
    if let Some(bytes) = max_split_size.filter(|&bytes| bytes < 20 << 20) {
        return Err(Issue::new(fields.key_path("max_split_size"), format!("{bytes} bytes: PyTorch's least is 20 MiB")));
    }
    let divisions_path = || fields.key_path("roundup_power2_divisions");
    let roundup_power2_divisions = match fields.get("roundup_power2_divisions") {
        None | Some(Value::None) => Vec::new(),
        Some(Value::Dict(dict)) => {
            let dict = dict.borrow();
            let mut pairs = Vec::with_capacity(dict.items.len());
            for (key, value) in &dict.items {
                let start = match key {
                    Value::Str(text) => text
                        .parse::<u64>()
                        .map_err(|_| Issue::new(divisions_path(), format!("key {text:?} is not an interval start in MiB")))?,
                    other => to_u64(other, &divisions_path)?,
                };
                pairs.push((start, to_u64(value, &|| format!("{}[{key:?}]", divisions_path()))?));
            }
            pairs
        }
        // Older files: a list, element i for the interval starting at 2^i MiB.
        Some(Value::List(list)) => {
            let list = list.borrow();
            let mut pairs = Vec::with_capacity(list.items.len());
            for (index, value) in list.items.iter().enumerate() {
                let start = 1u64
                    .checked_shl(index as u32)
                    .filter(|_| index < 64)
                    .ok_or_else(|| Issue::new(divisions_path(), "list too long"))?;
                pairs.push((start, to_u64(value, &|| format!("{}[{index}]", divisions_path()))?));
            }
            pairs
        }
        Some(other) => return Err(Issue::expected(divisions_path(), "dict", other)),
    };
    for &(start, divisions) in &roundup_power2_divisions {
        if divisions != 0 && !divisions.is_power_of_two() {
            return Err(Issue::new(
                format!("{}[{start}]", divisions_path()),
                format!("{divisions} divisions: a power of two or 0"),
            ));
        }
    }
    let alloc_conf = fields.str("PYTORCH_CUDA_ALLOC_CONF")?.unwrap_or_default().to_owned();
    // Without its own key, the setting is what the `PYTORCH_CUDA_ALLOC_CONF` string set (else PyTorch's default).
    let expandable_segments = match fields.bool("expandable_segments")? {
        Some(expandable) => expandable,
        None => {
            let mut conf = crate::AllocConf::default();
            conf.parse_overrides(&alloc_conf).is_ok() && conf.expandable_segments
        }
    };
    Ok(RecordedSettings {
        alloc_conf,
        max_split_size,
        garbage_collection_threshold,
        expandable_segments,
        roundup_power2_divisions,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Read as _;
    use std::path::PathBuf;
    use std::process::Command;

    use super::*;

    /// A committed real snapshot (PyTorch 2.11, H200).
    pub(crate) fn asset(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch").join(name)
    }

    pub(crate) const ASSETS: [&str; 4] = [
        "frag_oom-default.pickle.gz",
        "frag_oom-expandable.pickle.gz",
        "gpt2_train_fixed-default.pickle.gz",
        "gpt2_train_fixed-expandable.pickle.gz",
    ];

    /// The decompressed pickle of an asset.
    pub(crate) fn raw_pickle(name: &str) -> Vec<u8> {
        let file = File::open(asset(name)).unwrap();
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(file).read_to_end(&mut bytes).unwrap();
        bytes
    }

    /// A fresh temporary directory for one test.
    pub(crate) fn temp_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("heapscope-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Whether python3 runs here (tests that need it skip, saying so, when it does not).
    pub(crate) fn python3() -> bool {
        let found = Command::new("python3").arg("--version").output().is_ok_and(|output| output.status.success());
        if !found {
            eprintln!("python3 not found: skipping");
        }
        found
    }

    /// Runs a python3 script with `args`; panics with its stderr when it fails.
    pub(crate) fn run_python(script: &str, args: &[&str]) -> String {
        let output = Command::new("python3").arg("-c").arg(script).args(args).output().unwrap();
        assert!(output.status.success(), "python3 failed: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    }

    #[test]
    fn reads_the_real_snapshots() {
        // (file, entries of device 0, segments, blocks, distinct frame lists incl. empty, expandable,
        //  allocs, oom entries, total reserved bytes)
        let cases = [
            ("frag_oom-default.pickle.gz", 141, 20, 20, 6, false, 40, 1, 3_145_728_000u64),
            ("frag_oom-expandable.pickle.gz", 144, 1, 1, 7, true, 41, 0, 3_187_671_040),
            ("gpt2_train_fixed-default.pickle.gz", 18685, 154, 158, 1, false, 6179, 0, 15_286_140_928),
            ("gpt2_train_fixed-expandable.pickle.gz", 18684, 2, 8, 1, true, 6179, 0, 14_543_749_120),
        ];
        for (file, entries, segments, blocks, stacks, expandable, allocs, ooms, reserved) in cases {
            let snapshot = read_snapshot(&asset(file)).unwrap();
            assert_eq!(snapshot.device_traces.len(), 1, "{file}");
            let trace = &snapshot.device_traces[0];
            assert_eq!(trace.len(), entries, "{file}");
            assert_eq!(snapshot.segments.len(), segments, "{file}");
            assert_eq!(snapshot.segments.iter().map(|s| s.blocks.len()).sum::<usize>(), blocks, "{file}");
            assert_eq!(snapshot.frame_stacks.len(), stacks, "{file}");
            assert!(snapshot.frame_stacks[0].is_empty(), "{file}");
            assert_eq!(snapshot.segments.iter().map(|s| s.total_size).sum::<u64>(), reserved, "{file}");
            assert!(snapshot.segments.iter().all(|s| s.is_expandable == expandable), "{file}");
            assert_eq!(trace.iter().filter(|e| e.action == Action::Alloc).count(), allocs, "{file}");
            assert_eq!(trace.iter().filter(|e| e.action == Action::Oom).count(), ooms, "{file}");
            assert!(trace.iter().all(|e| e.time_us().is_some()), "{file}");
            let settings = snapshot.settings.as_ref().unwrap();
            assert_eq!(settings.expandable_segments, expandable, "{file}");
            assert_eq!(settings.max_split_size, None, "{file}");
            assert_eq!(settings.roundup_power2_divisions.len(), 16, "{file}");
            assert_eq!(settings.roundup_power2_divisions[0], (1, 0), "{file}");
            assert_eq!(settings.roundup_power2_divisions[15], (32768, 0), "{file}");
            // Tiling: blocks cover their segment exactly.
            for segment in &snapshot.segments {
                assert_eq!(segment.blocks.iter().map(|b| b.size).sum::<u64>(), segment.total_size, "{file}");
                assert_eq!(segment.blocks[0].address, segment.address, "{file}");
            }
        }
    }

    /// The fast path for trace entries decodes exactly what the generic path does, on every protocol,
    /// with shared, copied and missing frame lists, with ints in 2^63..2^64 (a stream, a frame line of
    /// 2^64 - 1), and with entries the fast path leaves to the generic path (a non-str key, a nested value) in
    /// the middle of a batch.
    #[test]
    fn fast_path_matches_the_generic_path() {
        if !python3() {
            return;
        }
        let dir = temp_dir("fast-path");
        let generator = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/synthetic_snapshot.py");
        let odd = r#"
import pickle, sys
frames = [{"filename": "a.py", "line": 3, "name": "f"}, {"filename": "b.py", "line": 70000, "name": "g"}]
entry = lambda i: {"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0, "time_us": i, "frames": frames}
trace = [entry(i) for i in range(2500)]
trace[5]["stream"] = 2**63 + 5
trace[1200][7] = "int key"
trace[1201]["user_metadata"] = {"nested": [1, 2]}
trace[1202]["frames"] = [dict(f) for f in frames]
trace[1203]["frames"] = [frames[0]]
trace[1204]["frames"] = []
trace[1205]["frames"] = None
trace[1206] = {"action": "snapshot"}
trace[1207]["frames"] = [{"filename": "fake_tensor.py", "line": 2**64 - 1, "name": "f"}, frames[0]]
trace[1208]["frames"] = trace[1207]["frames"]
trace[1209]["frames"] = [{"filename": "c.py", "name": "no_line"}]
block = lambda address, state, **more: {"address": address, "size": 4096, "requested_size": 100, "state": state, **more}
pool = (0, 0)
segment = lambda i, **more: {"device": 0, "address": 2**40 + 2**21 * i, "total_size": 8192, "allocated_size": 4096,
    "active_size": 4096, "requested_size": 100, "stream": 0, "segment_type": "large", "segment_pool_id": pool,
    "is_expandable": False, "frames": [], "blocks": [block(2**40 + 2**21 * i, "active_allocated", frames=frames),
    block(2**40 + 2**21 * i + 4096, "inactive", frames=[])], **more}
segments = [segment(i) for i in range(40)]
segments[1]["segment_pool_id"] = (1, 2)
segments[2]["segment_pool_id"] = [3, 4]
segments[3]["segment_pool_id"] = None
for key in ("allocated_size", "active_size", "requested_size", "device", "stream", "segment_type", "frames"):
    del segments[4][key]
segments[5]["blocks"] = [{"size": 4096, "state": "active_pending_free"}, {"size": 4096, "requested_size": 0, "state": "inactive"}]
segments[6]["blocks"] = [{"size": 4096, "state": "inactive", "history": [{"real_size": 7, "frames": frames}]}]
segments[7]["segment_type"] = "small"
segments[8]["is_expandable"] = True
segments[9]["is_expandable"] = 1
segments[10]["device"] = 1
segments[11]["frames"] = frames
segments[12]["blocks"] = None
segments[13]["extra"] = {"nested": [1]}
segments[14]["blocks"] = [block(2**40, "inactive")]
segments[15]["stream"] = 2**63 + 1
segments[16]["blocks"] = []
for protocol in range(2, 6):
    with open(f"{sys.argv[1]}/odd-{protocol}.pickle", "wb") as f:
        pickle.dump({"segments": segments, "device_traces": [trace, [entry(i) for i in range(3)]]}, f, protocol=protocol)
"#;
        run_python(odd, &[dir.to_str().unwrap()]);
        let mut files: Vec<PathBuf> = (2..=5).map(|protocol| dir.join(format!("odd-{protocol}.pickle"))).collect();
        for protocol in [2, 4, 5] {
            let path = dir.join(format!("syn-{protocol}.pickle"));
            let status = Command::new("python3")
                .arg(generator)
                .arg(&path)
                .args(["--events", "3000", "--protocol", &protocol.to_string()])
                .status()
                .unwrap();
            assert!(status.success());
            files.push(path);
        }
        for path in &files {
            let bytes = std::fs::read(path).unwrap();
            let fast = parse(bytes.as_slice(), "input", Decoder::default()).unwrap_or_else(|error| panic!("{error}"));
            let generic = parse(bytes.as_slice(), "input", Decoder { generic_only: true, ..Decoder::default() }).unwrap();
            assert_eq!(fast, generic, "{}", path.display());
            assert!(fast.device_traces[0].len() >= 2500, "{}", path.display());
        }
        // A frame without a `line` reads as one whose line is unknown (shown `?`), not line 0.
        let odd = parse(std::fs::read(&files[2]).unwrap().as_slice(), "input", Decoder::default()).unwrap();
        let stack = &odd.frame_stacks[odd.device_traces[0][1209].frames.0 as usize];
        assert_eq!((&*stack[0].name, stack[0].line), ("no_line", LINE_UNKNOWN));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// An entry whose value is the trace list it is appended to (through the memo; fuzzing found it): read as the list
    /// stands, where the list was borrowed twice (a panic): as a pool id an error naming the key, from both read paths.
    #[test]
    fn an_entry_holding_its_own_trace_list_is_an_error() {
        if !python3() {
            return;
        }
        let dir = temp_dir("self_trace");
        let script = r#"
import pickle, sys
for key in ("pool_id", "frames"):
    trace = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0} for i in range(3)]
    trace.append({"action": "alloc", "addr": 2**20, "size": 512, "stream": 0, key: trace})
    with open(f"{sys.argv[1]}/{key}.pickle", "wb") as f:
        pickle.dump({"segments": [], "device_traces": [trace]}, f, protocol=4)
"#;
        run_python(script, &[dir.to_str().unwrap()]);
        let read = |key: &str, generic_only: bool| {
            let bytes = std::fs::read(dir.join(format!("{key}.pickle"))).unwrap();
            parse(bytes.as_slice(), "input", Decoder { generic_only, ..Decoder::default() }).map_err(|error| error.to_string())
        };
        for generic_only in [false, true] {
            let error = read("pool_id", generic_only).unwrap_err();
            assert!(error.contains("device_traces[0][3].pool_id: expected a pair"), "generic {generic_only}: {error}");
        }
        // As frames, the list reads as it stands while its items are taken: empty, no frames (both paths alike).
        assert_eq!(read("frames", false), read("frames", true));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// An entry's category is the first of `category`, `user_metadata`, `compile_context` naming one (PyTorch's
    /// defaults `""` and `"N/A"` name none, nor does a `user_metadata` that is not a str); both read paths agree; the
    /// writer puts each back under its key, and Python reads the same labels back.
    #[test]
    fn categories_come_from_the_first_key_naming_one() {
        if !python3() {
            return;
        }
        let dir = temp_dir("categories");
        let script = r#"
import pickle, sys
def entry(i, **labels):
    e = {"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0, "time_us": i, "compile_context": "N/A",
         "user_metadata": ""}
    e.update(labels)
    return e
region = "Torch-Compiled Region: 0/1"
trace = [entry(0), entry(1, compile_context=region), entry(2, user_metadata="forward", compile_context=region),
         entry(3, category="ACTIVATION", user_metadata="forward"), entry(4, user_metadata={"step": 3}),
         entry(5, user_metadata="forward"), entry(6, compile_context="forward")]
trace += [entry(7 + i, user_metadata=["forward", "backward"][i % 2]) for i in range(3000)]
with open(sys.argv[1] + "/labels.pickle", "wb") as f:
    pickle.dump({"segments": [], "device_traces": [trace]}, f, protocol=4)
"#;
        run_python(script, &[dir.to_str().unwrap()]);
        let bytes = std::fs::read(dir.join("labels.pickle")).unwrap();
        let fast = parse(bytes.as_slice(), "labels", Decoder::default()).unwrap();
        let generic = parse(bytes.as_slice(), "labels", Decoder { generic_only: true, ..Decoder::default() }).unwrap();
        assert_eq!(fast, generic);
        let label = |entry: &TraceEntry| fast.category(entry.category).map(ToString::to_string);
        let labels: Vec<Option<String>> = fast.device_traces[0].iter().take(9).map(label).collect();
        let named = |text: &str| Some(text.to_owned());
        assert_eq!(
            labels,
            [
                None,
                named("compile_context: Torch-Compiled Region: 0/1"),
                named("user_metadata: forward"),
                named("category: ACTIVATION"),
                None,
                named("user_metadata: forward"),
                named("compile_context: forward"),
                named("user_metadata: forward"),
                named("user_metadata: backward"),
            ]
        );
        // Interned: one id per (key, text), index 0 none.
        assert_eq!(fast.categories.len(), 6, "{:?}", fast.categories);
        assert_eq!(fast.categories[0], Category::none());
        // Written back under their keys: Python sees the same labels (the defaults are not written).
        let written = dir.join("written.pickle");
        crate::write_snapshot(&fast, File::create(&written).unwrap()).unwrap();
        let check = r#"
import pickle, sys
trace = pickle.load(open(sys.argv[1], "rb"))["device_traces"][0]
keys = ("category", "user_metadata", "compile_context")
print([[(k, e[k]) for k in keys if k in e] for e in trace[:7]])
"#;
        let seen = run_python(check, &[written.to_str().unwrap()]);
        assert_eq!(
            seen.trim(),
            "[[], [('compile_context', 'Torch-Compiled Region: 0/1')], [('user_metadata', 'forward')], \
             [('category', 'ACTIVATION')], [], [('user_metadata', 'forward')], [('compile_context', 'forward')]]"
        );
        let again = read_snapshot(&written).unwrap();
        assert_eq!(again.with_stacks_in_use_order(), fast.with_stacks_in_use_order());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// PyTorch 2.12 writes each trace entry's memory pool (`pool_id`, a pair; `(0, 0)` for the default pools): read
    /// by both paths as tuple, list or `None`, interned by first use; what is not a pair of ints is named.
    #[test]
    fn trace_entries_keep_their_memory_pool() {
        if !python3() {
            return;
        }
        let dir = temp_dir("pool-ids");
        let script = r#"
import pickle, sys
def entry(i, pool):
    return {"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0, "time_us": i, "compile_context": "N/A",
            "user_metadata": "", "pool_id": pool}
graph = (0, 1)
pools = [(0, 0), graph, graph, [0, 2], None, (0, 1), (7, 0), (-1, 2**63 - 1)]
trace = [entry(i, pool) for i, pool in enumerate(pools)] + [entry(8 + i, (0, i % 3)) for i in range(3000)]
with open(sys.argv[1] + "/pools.pickle", "wb") as f:
    pickle.dump({"segments": [], "device_traces": [trace]}, f, protocol=4)
for name, pool in [("three", (0, 1, 2)), ("str", "(0, 1)"), ("float", (0, 1.5)), ("wide", (0, 2**64))]:
    with open(sys.argv[1] + "/bad-" + name + ".pickle", "wb") as f:
        pickle.dump({"segments": [], "device_traces": [[entry(0, (0, 1)), entry(1, pool)]]}, f, protocol=4)
with open(sys.argv[1] + "/defaults.pickle", "wb") as f:
    pickle.dump({"segments": [], "device_traces": [[entry(i, tuple([0, 0])) for i in range(3)]]}, f, protocol=4)
"#;
        run_python(script, &[dir.to_str().unwrap()]);
        let bytes = std::fs::read(dir.join("pools.pickle")).unwrap();
        let fast = parse(bytes.as_slice(), "pools", Decoder::default()).unwrap();
        let generic = parse(bytes.as_slice(), "pools", Decoder { generic_only: true, ..Decoder::default() }).unwrap();
        // The list `[0, 2]` leaves its entry to the end of the fast path's trace: numbered later there.
        assert!(fast.with_stacks_in_use_order() == generic.with_stacks_in_use_order(), "the paths differ");
        let fast = fast.with_stacks_in_use_order();
        let pools: Vec<(i64, i64)> = fast.device_traces[0].iter().take(8).map(|entry| fast.pool_id(entry.pool_id)).collect();
        assert_eq!(pools, [(0, 0), (0, 1), (0, 1), (0, 2), (0, 0), (0, 1), (7, 0), (-1, i64::MAX)]);
        assert_eq!(fast.pool_ids, [(0, 0), (0, 1), (0, 2), (7, 0), (-1, i64::MAX)]);
        let mut written = Vec::new();
        crate::write_snapshot(&fast, &mut written).unwrap();
        let again = parse(written.as_slice(), "written", Decoder::default()).unwrap();
        assert!(again == fast, "written back as read");
        // (file, what the error says)
        let bad = [
            ("three", "device_traces[0][1].pool_id: expected a pair, found 3 items"),
            ("str", "device_traces[0][1].pool_id: expected tuple or list, found str"),
            ("float", "device_traces[0][1].pool_id: expected int, found float"),
            ("wide", "device_traces[0][1].pool_id: 2^64 does not fit an i64"),
        ];
        for (name, said) in bad {
            let error = read_snapshot(&dir.join(format!("bad-{name}.pickle"))).unwrap_err().to_string();
            assert!(error.contains(said), "{name}: {error}");
        }
        // A file naming only the default pools says so, and is written back so.
        let defaults = read_snapshot(&dir.join("defaults.pickle")).unwrap();
        assert_eq!(defaults.pool_ids, [(0, 0)]);
        let mut written = Vec::new();
        crate::write_snapshot(&defaults, &mut written).unwrap();
        assert_eq!(parse(written.as_slice(), "written", Decoder::default()).unwrap().pool_ids, [(0, 0)]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Past 254 private pools the rest share the last id; the default pools stay id 0.
    #[test]
    fn pool_ids_past_eight_bits_share_the_last_id() {
        let mut pool_ids = PoolIds::default();
        assert_eq!(pool_ids.id((0, 0)), PoolId::DEFAULT);
        let ids: Vec<u8> = (1..300).map(|i| pool_ids.id((0, i)).0).collect();
        assert_eq!((ids[0], ids[253], ids[254], ids[298]), (1, 254, u8::MAX, u8::MAX));
        assert_eq!(pool_ids.id((0, 7)), PoolId(7), "known ones keep theirs");
        assert_eq!(pool_ids.into_list().len(), 256);
        // A file naming only the default pools says so.
        let mut pool_ids = PoolIds::default();
        assert_eq!((pool_ids.id((0, 0)), pool_ids.into_list()), (PoolId::DEFAULT, vec![(0, 0)]));
    }

    /// Past 65,534 distinct categories the rest share the last id, named as such (shown without a key: the rest may
    /// come from every key); the defaults name none.
    #[test]
    fn categories_past_sixteen_bits_share_the_last_id() {
        let mut categories = Categories::default();
        let text = |i: u32| Rc::new(format!("region {i}"));
        assert_eq!(categories.id(CategoryKey::CompileContext, &Rc::new("N/A".to_owned())), None);
        assert_eq!(categories.id(CategoryKey::UserMetadata, &Rc::default()), None);
        let ids: Vec<u16> = (0..70_000).map(|i| categories.id(CategoryKey::CompileContext, &text(i)).unwrap().0).collect();
        assert_eq!((ids[0], ids[65_533], ids[65_534], ids[69_999]), (1, 65_534, u16::MAX, u16::MAX));
        assert_eq!(categories.id(CategoryKey::CompileContext, &text(7)), Some(CategoryId(8)), "known ones keep theirs");
        let list = categories.into_list();
        assert_eq!((list.len(), &*list[65_535].name), (65_536, Category::MORE));
        assert_eq!(list[65_535].to_string(), Category::MORE);
        assert_eq!(list[1].to_string(), "compile_context: region 0");
    }

    /// The generator's PyTorch ≥ 2.5 layout (`--layout pytorch --no-frames --one-stream`) has the opcodes of
    /// the shared recordings entry for entry (the generator's own check, with pickletools), and both read paths
    /// read it alike.
    #[test]
    fn synthetic_pytorch_layout_matches_the_shared_files() {
        if !python3() {
            return;
        }
        let dir = temp_dir("pytorch-layout");
        let path = dir.join("pytorch-layout.pickle");
        let generator = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/synthetic_snapshot.py");
        // Writes the layout `flags` ask for, checked against the shared file `shared`; the layout report and the
        // snapshot, read the fast way and the generic way alike.
        let generate = |flags: &[&str], shared: &str| {
            let output = Command::new("python3")
                .arg(generator)
                .arg(&path)
                .args(["--events", "3000", "--layout", "pytorch", "--one-stream", "--check-layout"])
                .arg(asset(shared))
                .args(flags)
                .output()
                .unwrap();
            let report = String::from_utf8_lossy(&output.stdout).into_owned();
            assert!(output.status.success(), "{report}{}", String::from_utf8_lossy(&output.stderr));
            let bytes = std::fs::read(&path).unwrap();
            let fast = parse(bytes.as_slice(), "input", Decoder::default()).unwrap();
            let generic = parse(bytes.as_slice(), "input", Decoder { generic_only: true, ..Decoder::default() }).unwrap();
            assert_eq!(fast, generic);
            (report, fast)
        };
        let (report, fast) = generate(&["--no-frames"], "gpt2_train_fixed-default.pickle.gz");
        assert!(report.contains("19 opcodes: EMPTY_DICT MEMOIZE MARK LONG_BINGET LONG_BINGET LONG_BINGET LONG1"), "{report}");
        let trace = &fast.device_traces[0];
        assert_eq!(trace.len(), 3000);
        assert!(trace.iter().all(|e| e.frames == StackId::NONE && e.stream == 0 && e.time_us().is_some()));
        // With frames: the layout of the frag_oom files (shared frame dicts, new lists, lists shared by an alloc
        // with its segment_alloc and by a free_completed with its free_requested).
        let (report, fast) = generate(&[], "frag_oom-default.pickle.gz");
        assert!(report.contains("field forms, all in the shared file"), "{report}");
        assert!(fast.device_traces[0].iter().all(|e| e.frames != StackId::NONE));
        assert!(fast.frame_stacks.iter().skip(1).all(|stack| stack.len() == 2));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn frag_oom_details() {
        let snapshot = read_snapshot(&asset("frag_oom-default.pickle.gz")).unwrap();
        let trace = &snapshot.device_traces[0];
        let first = &trace[0];
        assert_eq!(first.action, Action::SegmentAlloc);
        assert_eq!((first.addr, first.size, first.stream), (140_333_560_102_912, 157_286_400, 0));
        assert_eq!(first.time_us(), Some(1_795_981_013_729_460));
        let frames = &snapshot.frame_stacks[first.frames.0 as usize];
        assert_eq!(
            frames,
            &vec![
                Frame { filename: "capture.py".into(), line: 83, name: "wl_frag_oom".into() },
                Frame { filename: "capture.py".into(), line: 166, name: "<module>".into() },
            ]
        );
        // The alloc right after shares the same (equal) frame list: one StackId.
        assert_eq!(trace[1].frames, first.frames);
        let oom = trace.iter().find(|e| e.action == Action::Oom).unwrap();
        assert_eq!((oom.addr, oom.size, oom.device_free()), (0, 1_073_741_824, Some(611_450_880)));
        let segment = &snapshot.segments[0];
        assert_eq!(segment.segment_type, Pool::Large);
        assert_eq!(segment.segment_pool_id, (0, 0));
        assert_eq!(segment.blocks[0].state, BlockState::Inactive);
        assert_eq!(segment.blocks[0].requested_size, 104_857_600);
    }

    /// Builds snapshots in Python (legacy and current schemas, several devices, big streams), dumps each with
    /// every protocol from 2 to 5, and checks what we read.
    #[test]
    fn reads_python_written_files_in_every_protocol_and_schema() {
        if !python3() {
            return;
        }
        let dir = temp_dir("protocols");
        let script = r#"
import pickle, sys, gzip, os
out = sys.argv[1]
frames = [{"filename": "a.py", "line": 3, "name": "f"}, {"filename": "b.py", "line": 70000, "name": "g"}]
legacy = {"segments": [{"device": 0, "address": 4096, "total_size": 3072, "allocated_size": 1024, "active_size": 1024,
           "stream": 0, "segment_type": "small",
           "blocks": [{"size": 1024, "state": "active_allocated", "history": [{"addr": 4096, "real_size": 1000, "frames": frames}]},
                      {"size": 2048, "state": "inactive"}]}],
          "device_traces": [[{"action": "alloc", "addr": 4096, "size": 1000, "stream": 0, "frames": frames},
                             {"action": "free_completed", "addr": 4096, "size": 1000, "stream": 0, "frames": frames}]]}
legacy_no_traces = {"segments": []}
current = {"segments": [], "device_traces": [
              [{"action": "alloc", "addr": 2**47, "size": 512, "stream": 2**63 + 5, "time_us": 17, "frames": frames}],
              [{"action": "oom", "device_free": 2**40, "size": 2**31, "stream": 0, "time_us": 18},
               {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 19, "frames": []},
               {"action": "user_defined", "addr": 0, "size": 0, "stream": 0, "time_us": 20,
                "frames": [{"name": "optimizer_step", "filename": "", "line": 0}]}]],
           "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256", "max_split_size": 268435456,
              "garbage_collection_threshold": 0.5, "expandable_segments": True,
              "roundup_power2_divisions": {"1": 4, "2": 8}}}
old_settings = {"segments": [], "device_traces": [], "allocator_settings": {"max_split_size": 2**64 - 1,
              "roundup_power2_divisions": [1, 2, 4]}}
for name, obj in [("legacy", legacy), ("legacy_no_traces", legacy_no_traces), ("current", current), ("old_settings", old_settings)]:
    for protocol in range(2, 6):
        with open(os.path.join(out, f"{name}-{protocol}.pickle"), "wb") as f:
            pickle.dump(obj, f, protocol=protocol)
        with gzip.open(os.path.join(out, f"{name}-{protocol}.pickle.gz"), "wb") as f:
            pickle.dump(obj, f, protocol=protocol)
"#;
        run_python(script, &[dir.to_str().unwrap()]);
        let stack = vec![
            Frame { filename: "a.py".into(), line: 3, name: "f".into() },
            Frame { filename: "b.py".into(), line: 70000, name: "g".into() },
        ];
        let legacy = Snapshot {
            categories: Vec::new(),
            pool_ids: Vec::new(),
            unknown_actions: Vec::new(),
            contender_export: None,
            segments: vec![Segment {
                device: 0,
                address: 4096,
                total_size: 3072,
                allocated_size: 1024,
                active_size: 1024,
                requested_size: 1000,
                stream: 0,
                segment_type: Pool::Small,
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: StackId::NONE,
                blocks: vec![
                    Block {
                        address: 4096,
                        size: 1024,
                        requested_size: 1000,
                        state: BlockState::ActiveAllocated,
                        frames: StackId(1),
                    },
                    Block { address: 5120, size: 2048, requested_size: 2048, state: BlockState::Inactive, frames: StackId::NONE },
                ],
            }],
            device_traces: vec![vec![
                TraceEntry::new(Action::Alloc, 4096, 1000).with_frames(StackId(1)),
                TraceEntry::new(Action::FreeCompleted, 4096, 1000).with_frames(StackId(1)),
            ]],
            settings: None,
            frame_stacks: vec![Vec::new(), stack.clone()],
        };
        let legacy_no_traces = Snapshot { frame_stacks: vec![Vec::new()], ..Snapshot::default() };
        let current = Snapshot {
            categories: Vec::new(),
            pool_ids: Vec::new(),
            unknown_actions: Vec::new(),
            contender_export: None,
            segments: Vec::new(),
            device_traces: vec![
                vec![
                    TraceEntry::new(Action::Alloc, 1 << 47, 512)
                        .with_stream((1 << 63) + 5)
                        .with_time_us(Some(17))
                        .with_frames(StackId(1)),
                ],
                vec![
                    TraceEntry::new(Action::Oom, 0, 1 << 31).with_time_us(Some(18)).with_device_free(Some(1 << 40)),
                    TraceEntry::new(Action::Snapshot, 0, 0).with_time_us(Some(19)),
                    TraceEntry::new(Action::UserDefined, 0, 0).with_time_us(Some(20)).with_frames(StackId(2)),
                ],
            ],
            settings: Some(RecordedSettings {
                alloc_conf: "max_split_size_mb:256".into(),
                max_split_size: Some(268_435_456),
                garbage_collection_threshold: 0.5,
                expandable_segments: true,
                roundup_power2_divisions: vec![(1, 4), (2, 8)],
            }),
            frame_stacks: vec![Vec::new(), stack, vec![Frame { filename: "".into(), line: 0, name: "optimizer_step".into() }]],
        };
        let old_settings = Snapshot {
            settings: Some(RecordedSettings {
                max_split_size: None,
                roundup_power2_divisions: vec![(1, 1), (2, 2), (4, 4)],
                ..RecordedSettings::default()
            }),
            frame_stacks: vec![Vec::new()],
            ..Snapshot::default()
        };
        let cases =
            [("legacy", legacy), ("legacy_no_traces", legacy_no_traces), ("current", current), ("old_settings", old_settings)];
        for (name, expected) in &cases {
            for protocol in 2..=5 {
                for suffix in ["pickle", "pickle.gz"] {
                    let path = dir.join(format!("{name}-{protocol}.{suffix}"));
                    let snapshot = read_snapshot(&path).unwrap_or_else(|error| panic!("{error}"));
                    assert_eq!(&snapshot, expected, "{}", path.display());
                }
            }
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A pickled value, for hand-made protocol 4 pickles (no memo).
    enum P {
        None,
        Bool(bool),
        /// `BININT` (fits `i32`) or `LONG1` of its eight bytes.
        Int(i64),
        /// `LONG1` of these little-endian two's complement bytes.
        Long1(Vec<u8>),
        /// `LONG4` of these bytes.
        Long4(Vec<u8>),
        Str(&'static str),
        /// `BINFLOAT`.
        Float(f64),
        List(Vec<P>),
        Dict(Vec<(&'static str, P)>),
    }

    impl P {
        fn emit(&self, out: &mut Vec<u8>) {
            match self {
                P::None => out.push(b'N'),
                P::Bool(value) => out.push(if *value { 0x88 } else { 0x89 }),
                P::Int(value) => match i32::try_from(*value) {
                    Ok(small) => {
                        out.push(b'J');
                        out.extend(small.to_le_bytes());
                    }
                    Err(_) => out.extend([&[0x8a, 8][..], &value.to_le_bytes()].concat()),
                },
                P::Long1(bytes) => {
                    out.extend([0x8a, u8::try_from(bytes.len()).unwrap()]);
                    out.extend(bytes);
                }
                P::Long4(bytes) => {
                    out.push(0x8b);
                    out.extend(u32::try_from(bytes.len()).unwrap().to_le_bytes());
                    out.extend(bytes);
                }
                P::Str(text) => {
                    out.extend([0x8c, u8::try_from(text.len()).unwrap()]);
                    out.extend(text.as_bytes());
                }
                P::Float(value) => {
                    out.push(b'G');
                    out.extend(value.to_be_bytes());
                }
                P::List(items) => {
                    out.extend(b"](");
                    items.iter().for_each(|item| item.emit(out));
                    out.push(b'e');
                }
                P::Dict(pairs) => {
                    out.extend(b"}(");
                    for (key, value) in pairs {
                        P::Str(key).emit(out);
                        value.emit(out);
                    }
                    out.push(b'u');
                }
            }
        }

        /// `2^exponent` (negated: `-2^exponent`) as `LONG1` bytes.
        fn power_of_two(exponent: usize, negative: bool) -> P {
            let mut bytes = vec![0u8; exponent / 8 + 1];
            bytes[exponent / 8] = 1 << (exponent % 8);
            if bytes[exponent / 8] & 0x80 != 0 {
                bytes.push(0);
            }
            if negative {
                // -x = !x + 1: the low bytes (zeros) stay zero, the rest invert around the one bit.
                let top = bytes.len() - 1;
                let bit = bytes[..=top].iter().position(|&byte| byte != 0).unwrap();
                bytes[bit] = bytes[bit].wrapping_neg();
                for byte in &mut bytes[bit + 1..] {
                    *byte = !*byte;
                }
            }
            P::Long1(bytes)
        }
    }

    /// A small current-schema snapshot pickle, with `value` in place of the field `field` (a frame's
    /// `line`, a trace entry's `addr` / `size` / `stream` / `time_us`, a segment's `total_size` / `device` /
    /// `is_expandable`, or `max_split_size`).
    fn snapshot_with(field: &str, value: P) -> Vec<u8> {
        let mut value = Some(value);
        let mut or = |name: &str, default: P| if name == field { value.take().unwrap() } else { default };
        let frame = P::Dict(vec![("filename", P::Str("fake_tensor.py")), ("line", or("line", P::Int(7))), ("name", P::Str("f"))]);
        let entry = P::Dict(vec![
            ("action", P::Str("alloc")),
            ("addr", or("addr", P::Int(1 << 32))),
            ("size", or("size", P::Int(512))),
            ("stream", or("stream", P::Int(0))),
            ("time_us", or("time_us", P::Int(5))),
            ("device_free", or("device_free", P::Int(7))),
            ("frames", P::List(vec![frame])),
        ]);
        let block = P::Dict(vec![("address", P::Int(1 << 32)), ("size", P::Int(2 << 20)), ("state", P::Str("inactive"))]);
        let segment = P::Dict(vec![
            ("device", or("device", P::Int(0))),
            ("address", P::Int(1 << 32)),
            ("total_size", or("total_size", P::Int(2 << 20))),
            ("segment_type", P::Str("small")),
            ("is_expandable", or("is_expandable", P::Bool(false))),
            ("blocks", P::List(vec![block])),
        ]);
        let settings = P::Dict(vec![("max_split_size", or("max_split_size", P::Int(-1)))]);
        let root = P::Dict(vec![
            ("segments", P::List(vec![segment])),
            ("device_traces", P::List(vec![P::List(vec![entry])])),
            ("allocator_settings", settings),
        ]);
        let mut out = b"\x80\x04".to_vec();
        root.emit(&mut out);
        out.push(b'.');
        out
    }

    /// A segment dict without `is_expandable` (a file stripped or converted by another tool) is expandable where its
    /// device's trace maps or unmaps pages inside it, else not; a segment that says is kept as it says.
    #[test]
    fn a_segment_silent_on_its_kind_takes_it_from_the_trace() {
        let base = 1i64 << 40;
        let bytes_of = |told: Option<bool>, map_at: Option<i64>| -> Vec<u8> {
            let block = P::Dict(vec![("address", P::Int(base)), ("size", P::Int(20 << 20)), ("state", P::Str("inactive"))]);
            let mut pairs = vec![
                ("device", P::Int(0)),
                ("address", P::Int(base)),
                ("total_size", P::Int(20 << 20)),
                ("segment_type", P::Str("large")),
                ("blocks", P::List(vec![block])),
            ];
            if let Some(told) = told {
                pairs.push(("is_expandable", P::Bool(told)));
            }
            let map = |addr: i64| {
                P::Dict(vec![
                    ("action", P::Str("segment_map")),
                    ("addr", P::Int(addr)),
                    ("size", P::Int(20 << 20)),
                    ("stream", P::Int(0)),
                ])
            };
            let root = P::Dict(vec![
                ("segments", P::List(vec![P::Dict(pairs)])),
                ("device_traces", P::List(vec![P::List(map_at.into_iter().map(map).collect())])),
            ]);
            let mut out = b"\x80\x04".to_vec();
            root.emit(&mut out);
            out.push(b'.');
            out
        };
        // (what the segment says, where the trace maps pages, read as expandable)
        let cases = [
            (None, Some(base), true),
            (None, Some(base + (10 << 20)), true),
            (None, None, false),
            (None, Some(base + (20 << 20)), false),
            (Some(false), Some(base), false),
            (Some(true), None, true),
        ];
        for (told, map_at, expandable) in cases {
            let bytes = bytes_of(told, map_at);
            for generic_only in [false, true] {
                let read = parse(bytes.as_slice(), "kind.pickle", Decoder { generic_only, ..Decoder::default() }).unwrap();
                assert_eq!(read.segments[0].is_expandable, expandable, "{told:?} {map_at:?} generic {generic_only}");
            }
        }
    }

    /// The field `snapshot_with` replaced, read back (a bool as 0 or 1, an unlimited `max_split_size` as -1).
    fn field_of(snapshot: &Snapshot, field: &str) -> i128 {
        let entry = &snapshot.device_traces[0][0];
        let segment = &snapshot.segments[0];
        match field {
            "line" => i128::from(snapshot.frame_stacks[entry.frames.0 as usize][0].line),
            "addr" => i128::from(entry.addr),
            "size" => i128::from(entry.size),
            "stream" => i128::from(entry.stream),
            "time_us" => i128::from(entry.time_us().unwrap()),
            "device_free" => i128::from(entry.device_free().unwrap()),
            "total_size" => i128::from(segment.total_size),
            "device" => i128::from(segment.device),
            "is_expandable" => i128::from(segment.is_expandable),
            "max_split_size" => snapshot.settings.as_ref().unwrap().max_split_size.map_or(-1, i128::from),
            other => panic!("no field {other}"),
        }
    }

    /// Ints of every width wherever the schema has an int: read when they fit, else an error that names the
    /// value and the key path. A frame's line never costs the file.
    #[test]
    fn reads_ints_of_any_width() {
        let u64_max = P::Long1([vec![0xff; 8], vec![0]].concat());
        // (field, value, what is read back or a fragment of the error)
        let cases: Vec<(&str, P, Result<i128, &str>)> = vec![
            // PyTorch's uint64 line of a frame Python knew no line for (-1), as in fake_tensor.py's frames.
            ("line", P::Long1([vec![0xff; 8], vec![0]].concat()), Ok(-1)),
            ("line", P::Long1([vec![0xfe; 1], vec![0xff; 7], vec![0]].concat()), Ok(-2)),
            ("line", P::power_of_two(80, false), Ok(i128::from(i64::MAX))),
            ("line", P::power_of_two(80, true), Ok(i128::from(i64::MIN))),
            ("line", P::Long4([vec![0; 300], vec![1]].concat()), Ok(i128::from(i64::MAX))),
            ("line", P::None, Ok(-1)),
            ("line", P::Int(i64::MAX), Ok(i128::from(i64::MAX))),
            ("line", P::Str("12"), Err("device_traces[0][0].frames[0].line: expected int, found str \"12\"")),
            // A whole float shows as a float, not as the int it looks like.
            ("size", P::Float(1.5e8), Err("device_traces[0][0].size: expected int, found float 150000000.0")),
            ("addr", u64_max, Ok(i128::from(u64::MAX))),
            ("addr", P::Long1(vec![0xff]), Err("device_traces[0][0].addr: -1 does not fit a u64 (0 to 2^64 - 1)")),
            ("size", P::power_of_two(80, false), Err("device_traces[0][0].size: 2^80 does not fit a u64")),
            ("size", P::power_of_two(64, false), Err("device_traces[0][0].size: 2^64 does not fit a u64")),
            ("size", P::power_of_two(80, true), Err("device_traces[0][0].size: -2^80 does not fit a u64")),
            ("stream", P::Long4([vec![0; 25], vec![1]].concat()), Err("device_traces[0][0].stream: 2^200 does not fit a u64")),
            ("stream", P::Long1([vec![5], vec![0; 6], vec![0x80, 0]].concat()), Ok((1 << 63) + 5)),
            ("time_us", P::power_of_two(63, false), Err("device_traces[0][0].time_us: 9223372036854775808 does not fit an i64")),
            ("time_us", P::Long1([vec![0; 8], vec![0x80, 0]].concat()), Err("time_us: 2^71 does not fit an i64")),
            // The values an entry holds for "none" are refused, not read as none.
            ("time_us", P::Int(i64::MIN), Err("device_traces[0][0].time_us: -2^63 is no time")),
            ("time_us", P::Int(i64::MIN + 1), Ok(i128::from(i64::MIN) + 1)),
            (
                "device_free",
                P::Long1([vec![0xff; 8], vec![0]].concat()),
                Err("device_traces[0][0].device_free: 2^64 - 1 free bytes"),
            ),
            ("device_free", P::Long1([vec![0xfe], vec![0xff; 7], vec![0]].concat()), Ok(i128::from(u64::MAX - 1))),
            ("total_size", P::power_of_two(70, false), Err("segments[0].total_size: 2^70 does not fit a u64")),
            ("device", P::Int(1 << 40), Err("segments[0].device: 1099511627776 does not fit a device index (u32)")),
            ("device", P::Int(1 << 31), Err("segments[0].device: device 2147483648 (at most 1024 devices are read)")),
            ("device", P::Long1(vec![0xff]), Err("segments[0].device: -1 does not fit a device index")),
            ("is_expandable", P::power_of_two(70, false), Ok(1)),
            ("is_expandable", P::Long1(vec![0; 12]), Ok(0)),
            ("max_split_size", P::Long1([vec![0xff; 8], vec![0]].concat()), Ok(-1)),
            ("max_split_size", P::power_of_two(70, false), Ok(-1)),
            ("max_split_size", P::Int(256 << 20), Ok(256 << 20)),
            ("max_split_size", P::Int(-2), Err("allocator_settings.max_split_size: expected -1 or a size, found -2")),
            (
                "max_split_size",
                P::power_of_two(70, true),
                Err("allocator_settings.max_split_size: expected -1 or a size, found -2^70"),
            ),
        ];
        for (field, value, expected) in cases {
            let bytes = snapshot_with(field, value);
            for decoder in [Decoder::default(), Decoder { generic_only: true, ..Decoder::default() }] {
                let result = parse(bytes.as_slice(), "input.pickle", decoder);
                match (&result, expected) {
                    (Ok(snapshot), Ok(want)) => assert_eq!(field_of(snapshot, field), want, "{field}"),
                    (Err(error), Err(fragment)) => {
                        let message = error.to_string();
                        assert!(message.starts_with("input.pickle: not a PyTorch memory snapshot: "), "{message}");
                        assert!(message.contains(fragment), "{field}: {message:?} lacks {fragment:?}");
                    }
                    (result, expected) => panic!("{field}: {result:?}, expected {expected:?}"),
                }
            }
        }
    }

    /// A segment dict as `torch.cuda.memory_snapshot()` lists it (modern keys), on `device` at `address`:
    /// 2 MiB, its first 512 bytes allocated.
    fn listed_segment(device: i64, address: i64) -> P {
        let block = |offset: i64, size: i64, state: &'static str| {
            P::Dict(vec![
                ("address", P::Int(address + offset)),
                ("size", P::Int(size)),
                ("requested_size", P::Int(if state == "inactive" { 0 } else { 500 })),
                ("state", P::Str(state)),
                ("frames", P::List(Vec::new())),
            ])
        };
        P::Dict(vec![
            ("device", P::Int(device)),
            ("address", P::Int(address)),
            ("total_size", P::Int(2 << 20)),
            ("allocated_size", P::Int(512)),
            ("active_size", P::Int(512)),
            ("requested_size", P::Int(500)),
            ("stream", P::Int(0)),
            ("segment_type", P::Str("small")),
            ("segment_pool_id", P::List(vec![P::Int(0), P::Int(0)])),
            ("is_expandable", P::Bool(false)),
            ("frames", P::List(Vec::new())),
            ("blocks", P::List(vec![block(0, 512, "active_allocated"), block(512, (2 << 20) - 512, "inactive")])),
        ])
    }

    /// Issue 17: a snapshot file holds one pickle. Anything after its STOP — a second pickle, a second gzip member,
    /// zeros — is refused at the first byte after it (not read through), with its offset.
    #[test]
    fn bytes_after_the_pickle_are_refused() {
        use std::io::Write;
        let snapshot = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]u.".to_vec();
        let gzip = |bytes: &[u8]| {
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(bytes).unwrap();
            encoder.finish().unwrap()
        };
        assert!(parse_snapshot(snapshot.as_slice(), "one.pickle").is_ok());
        assert!(parse_snapshot(gzip(&snapshot).as_slice(), "one.pickle.gz").is_ok());
        let cases: [(&str, Vec<u8>); 3] = [
            ("two pickles", [snapshot.clone(), snapshot.clone()].concat()),
            ("a second gzip member", [gzip(&snapshot), gzip(b"N.")].concat()),
            ("zeros after the pickle", gzip(&[snapshot.clone(), vec![0; 1 << 20]].concat())),
        ];
        for (what, bytes) in cases {
            let error = parse_snapshot(bytes.as_slice(), "joined").expect_err(what).to_string();
            assert!(
                error.contains(&format!("byte {}", snapshot.len())) && error.contains("after the pickle's STOP"),
                "{what}: {error}"
            );
        }
    }

    /// A gzip file cut short (its trailer gone with the last bytes of a download) says so, where Python's `pickle.load`
    /// may not notice (it stops at the pickle's STOP); so does one padded with zeros.
    #[test]
    fn a_gzip_file_cut_short_says_so() {
        use std::io::Write;
        let snapshot = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]u.".to_vec();
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(&snapshot).unwrap();
        let whole = encoder.finish().unwrap();
        for cut in [1, 4, 8, 12] {
            let error = parse_snapshot(&whole[..whole.len() - cut], "cut.pickle.gz").expect_err("cut").to_string();
            assert!(error.contains("cut.pickle.gz") && error.contains("the gzip stream is cut short"), "{cut}: {error}");
        }
        // Zeros after a whole stream: no second member, said so (refused, as any bytes after the pickle are).
        let padded = [whole.clone(), vec![0; 100]].concat();
        let error = parse_snapshot(padded.as_slice(), "padded.pickle.gz").expect_err("padded").to_string();
        assert!(error.contains("bytes after the gzip stream that are no gzip member"), "{error}");
    }

    /// A gzip file with a damaged byte says its gzip stream is damaged, the cause, never where the pickle reader stood
    /// (it decompresses ahead) nor the stray opcode or memo slot the damaged bytes decompress to.
    #[test]
    fn a_damaged_gzip_file_says_so() {
        let whole = std::fs::read(asset("gpt2_train_fixed-default.pickle.gz")).unwrap();
        let frag = std::fs::read(asset("frag_oom-default.pickle.gz")).unwrap();
        // (file, byte, bits flipped): early damage fails the first read, of the 8 bytes that tell a pickle.
        let cases = [(&whole, 600, 0x5a), (&whole, 20_000, 0x5a), (&whole, 50_000, 0x5a), (&whole, whole.len() - 100, 0x5a)];
        for (bytes, at, bits) in cases.into_iter().chain([(&frag, 600, 0x5a), (&frag, 106, 1)]) {
            let mut damaged = bytes.clone();
            damaged[at] ^= bits;
            let error = parse_snapshot(damaged.as_slice(), "damaged.pickle.gz").expect_err("damaged").to_string();
            assert!(error.contains("damaged.pickle.gz") && error.contains("the gzip stream is damaged"), "{at}: {error}");
            assert!(!error.contains("pickle stream") && !error.contains("opcode") && !error.contains("memo"), "{at}: {error}");
        }
    }

    /// Issue 17: recorded allocator settings are held to what `--alloc-conf` accepts (a NaN threshold, 3 divisions,
    /// a max split size under 20 MiB are refused, named by key path).
    #[test]
    fn recorded_settings_are_validated() {
        let with = |settings: &[u8]| {
            [b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]\x8c\x12allocator_settings}(".as_slice(), settings, b"uu."]
                .concat()
        };
        let cases: [(Vec<u8>, &str); 5] = [
            (
                with(b"\x8c\x1cgarbage_collection_thresholdG\x7f\xf8\x00\x00\x00\x00\x00\x00"),
                "allocator_settings.garbage_collection_threshold: NaN is no threshold",
            ),
            (with(b"\x8c\x1cgarbage_collection_thresholdG?\xf8\x00\x00\x00\x00\x00\x00"), "1.5 is no threshold"),
            (with(b"\x8c\x18roundup_power2_divisions}(\x8c\x011K\x03u"), "roundup_power2_divisions[1]: 3 divisions"),
            (with(b"\x8c\x0emax_split_sizeJ\x00\x00\x10\x00"), "max_split_size: 1048576 bytes"),
            // A value of the wrong type is shown (a str that reads like the bool it should be).
            (with(b"\x8c\x13expandable_segments\x8c\x04True"), "expandable_segments: expected bool, found str \"True\""),
        ];
        for (bytes, expected) in cases {
            let error = parse_snapshot(bytes.as_slice(), "settings.pickle").expect_err(expected).to_string();
            assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        }
        let fine = with(b"\x8c\x1cgarbage_collection_thresholdG?\xe3333333\x8c\x18roundup_power2_divisions}(\x8c\x011K\x04u");
        assert!(parse_snapshot(fine.as_slice(), "settings.pickle").is_ok());
        // Without an `expandable_segments` key, the setting is the `PYTORCH_CUDA_ALLOC_CONF` string's.
        let conf =
            |text: &str| [b"\x8c\x17PYTORCH_CUDA_ALLOC_CONF\x8c".as_slice(), &[text.len() as u8], text.as_bytes()].concat();
        for (settings, expandable) in [
            (conf("expandable_segments:True"), true),
            (conf("max_split_size_mb:256,expandable_segments:True"), true),
            (conf("expandable_segments:False"), false),
            (conf("not_a_key:1,expandable_segments:True"), false),
            ([conf("expandable_segments:True"), b"\x8c\x13expandable_segments\x89".to_vec()].concat(), false),
        ] {
            let snapshot = parse_snapshot(with(&settings).as_slice(), "settings.pickle").unwrap();
            assert_eq!(snapshot.settings.map(|settings| settings.expandable_segments), Some(expandable), "{settings:?}");
        }
    }

    /// Issue 17: memory bounded by what was read. A trace list, a segment or a segment's blocks shared through the
    /// memo (`[S] * 20000` in 280 gzipped bytes) is refused at its second reference, naming both places (an empty
    /// list, which holds nothing to read twice, is read at each); memo puts
    /// far past the bytes read (100 puts a megaslot apart in 504 bytes) are refused before the memo grows.
    #[test]
    fn memo_sharing_and_memo_gaps_are_refused() {
        let segment = b"}\x94(\x8c\x07address\x4b\x00\x8c\x0atotal_size\x4b\x00\x8c\x06blocks]u";
        let shared_segments = [b"\x80\x04}(\x8c\x08segments](".as_slice(), segment, b"h\x00e\x8c\x0ddevice_traces]u."].concat();
        let entry = b"}(\x8c\x06action\x8c\x05alloc\x8c\x04addrK\x00\x8c\x04sizeM\x00\x02u";
        let shared_traces =
            [b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](]\x94(".as_slice(), entry, b"eh\x00eu."].concat();
        // The same empty list as the trace of three devices (`[[]] * 3`): nothing is read twice.
        let shared_empty = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](]\x94h\x00h\x00eu.".to_vec();
        let shared_blocks = b"\x80\x04}(\x8c\x08segments](}(\x8c\x07address\x4b\x00\x8c\x0atotal_size\x4b\x00\x8c\x06blocks]\x94u}(\x8c\x07address\x4b\x00\x8c\x0atotal_size\x4b\x00\x8c\x06blocksh\x00ue\x8c\x0ddevice_traces]u.".to_vec();
        // A block dict shared by two segments; a segment repeated with DUP (no memo: the same object twice on the
        // stack); a segment met again after it was converted and its memo slot released.
        let block = b"}\x94(\x8c\x04sizeK\x00\x8c\x05state\x8c\x08inactiveu";
        let shared_block_dicts = [
            b"\x80\x04}(\x8c\x08segments](}(\x8c\x07address\x4b\x00\x8c\x0atotal_size\x4b\x00\x8c\x06blocks](".as_slice(),
            block,
            b"eu}(\x8c\x07address\x4b\x00\x8c\x0atotal_size\x4b\x00\x8c\x06blocks](h\x00eue\x8c\x0ddevice_traces]u.",
        ]
        .concat();
        let dup_segments = [b"\x80\x04}(\x8c\x08segments](".as_slice(), segment, b"2e\x8c\x0ddevice_traces]u."].concat();
        let later_segment =
            [b"\x80\x04}(\x8c\x08segments]".as_slice(), segment, b"a\x8c\x0ddevice_traces]\x8c\x05laterh\x00u."].concat();
        let mut gaps = b"\x80\x04N".to_vec();
        for put in 0..100u32 {
            gaps.push(b'r');
            gaps.extend(((put + 1) << 20).to_le_bytes());
        }
        gaps.push(b'.');
        // (pickle, what the error says)
        // The segments list again as a device's trace.
        let segments_as_trace = b"\x80\x04}(\x8c\x08segments]\x94\x8c\x0ddevice_traces]h\x00au.".to_vec();
        // An entry's dict (taken as it arrived) again as the next batch's entry.
        let shared_entry =
            [b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](]\x94(}\x94(".as_slice(), &entry[2..], b"e(h\x01eeu."].concat();
        let cases: [(&[u8], &str); 8] = [
            (&shared_entry, "device_traces[0][1]: the same object as an earlier trace entry (a memo reference)"),
            (&shared_segments, "segments[1]: the same object as segments[0] (a memo reference)"),
            (&shared_traces, "device_traces[1]: the same object as device_traces[0] (a memo reference)"),
            (&shared_blocks, "segments[1].blocks: the same object as segments[0].blocks (a memo reference)"),
            (&gaps, "LONG_BINPUT to memo slot 1048576, past the 3 bytes read"),
            (&shared_block_dicts, "segments[1].blocks[0]: the same object as segments[0].blocks[0] (a memo reference)"),
            (&dup_segments, "segments[1]: the same object as segments[0] (a memo reference)"),
            (&segments_as_trace, "device_traces[0]: the same object as segments (a memo reference)"),
        ];
        for (bytes, expected) in cases {
            let error = parse_snapshot(bytes, "shared.pickle").expect_err(expected).to_string();
            assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        }
        // A reference under a key the importer ignores reads nothing twice: no refusal; nor does an empty list.
        let snapshot = parse_snapshot(later_segment.as_slice(), "later.pickle").expect("an ignored key");
        assert_eq!(snapshot.segments.len(), 1);
        let snapshot = parse_snapshot(shared_empty.as_slice(), "empty.pickle").expect("an empty list shared");
        assert_eq!(snapshot.device_traces, vec![Vec::new(); 3]);
        // ... up to the devices a snapshot may have: `[[]] * 1025` asks for more than it is worth.
        let many =
            [b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](]\x94".as_slice(), &b"h\x00".repeat(1024), b"eu."].concat();
        let error = parse_snapshot(many.as_slice(), "many.pickle").expect_err("1025 devices").to_string();
        assert!(error.contains("device_traces: 1025 devices (at most 1024 are read)"), "{error}");
    }

    /// Issue 17: one `APPENDS` batch of 40,000 trace entries, every other one left to the generic path (a
    /// `user_metadata` list): the late entries are merged in once per batch, in order (inserting each used to move
    /// the rest of the batch: quadratic), and both read paths agree.
    #[test]
    fn a_huge_batch_of_mixed_entries_keeps_its_order() {
        const ENTRIES: u32 = 40_000;
        // As PyTorch writes them: every dict memoized, keys and action names memoized once and fetched back.
        let mut bytes = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](](".to_vec();
        for index in 0..ENTRIES {
            bytes.extend(b"}\x94(");
            bytes.extend(if index == 0 {
                b"\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94".as_slice()
            } else {
                b"h\x01h\x02h\x03"
            });
            bytes.push(b'J');
            bytes.extend((index * 512).to_le_bytes());
            bytes.extend(if index == 0 { b"\x8c\x04size\x94".as_slice() } else { b"h\x04" });
            bytes.extend(b"J\x00\x02\x00\x00");
            bytes.extend(if index == 0 { b"\x8c\x06stream\x94".as_slice() } else { b"h\x05" });
            bytes.extend(b"K\x00");
            match index {
                1 => bytes.extend(b"\x8c\x0duser_metadata\x94](K\x01e"),
                _ if index % 2 == 1 => bytes.extend(b"h\x07](K\x01e"),
                _ => {}
            }
            bytes.push(b'u');
        }
        bytes.extend(b"eeu.");
        let fast = parse(bytes.as_slice(), "batch", Decoder::default()).unwrap();
        let generic = parse(bytes.as_slice(), "batch", Decoder { generic_only: true, ..Decoder::default() }).unwrap();
        assert_eq!(fast, generic);
        let addresses: Vec<u64> = fast.device_traces[0].iter().map(|entry| entry.addr).collect();
        assert_eq!(addresses, (0..u64::from(ENTRIES)).map(|index| index * 512).collect::<Vec<_>>());
    }

    /// `torch.cuda.memory_snapshot()`'s list of segments reads as a snapshot with those segments and an empty
    /// trace for each device up to the highest one named.
    #[test]
    fn reads_memory_snapshot_lists() {
        // (segments' devices, traces expected, or a fragment of the error)
        let cases: Vec<(Vec<i64>, Result<usize, &str>)> = vec![
            (vec![], Ok(0)),
            (vec![0], Ok(1)),
            (vec![0, 0, 0], Ok(1)),
            (vec![2, 0], Ok(3)),
            (vec![1023], Ok(1024)),
            (vec![0, 1024], Err("[1].device: device 1024 (at most 1024 devices are read)")),
            (vec![-1], Err("[0].device: -1 does not fit a device index")),
        ];
        for (devices, expected) in cases {
            let segments =
                devices.iter().enumerate().map(|(k, &device)| listed_segment(device, (1 << 32) + (k as i64) * (4 << 20)));
            let mut bytes = b"\x80\x04".to_vec();
            P::List(segments.collect()).emit(&mut bytes);
            bytes.push(b'.');
            match (parse_snapshot(bytes.as_slice(), "state.pickle"), expected) {
                (Ok(snapshot), Ok(traces)) => {
                    assert_eq!(snapshot.device_traces.len(), traces, "{devices:?}");
                    assert!(snapshot.device_traces.iter().all(Vec::is_empty), "{devices:?}");
                    assert_eq!(snapshot.settings, None);
                    let read: Vec<i64> = snapshot.segments.iter().map(|segment| i64::from(segment.device)).collect();
                    assert_eq!(read, devices);
                    for segment in &snapshot.segments {
                        assert_eq!((segment.total_size, segment.allocated_size, segment.blocks.len()), (2 << 20, 512, 2));
                        assert_eq!(segment.blocks[0].requested_size, 500);
                    }
                }
                (Err(error), Err(fragment)) => {
                    let message = error.to_string();
                    assert!(message.starts_with("state.pickle: not a PyTorch memory snapshot: "), "{message}");
                    assert!(message.contains(fragment), "{devices:?}: {message:?} lacks {fragment:?}");
                }
                (result, expected) => panic!("{devices:?}: {result:?}, expected {expected:?}"),
            }
        }
    }

    /// An action heapscope does not know (a later PyTorch's) is read as a mark with its name kept, by either path, and
    /// written back under that name.
    #[test]
    fn an_unknown_action_is_a_mark_that_keeps_its_name() {
        let body = b"}(\x8c\x08segments]\x8c\x0ddevice_traces]](}\x8c\x06action\x8c\x08snapshots}\x8c\x06action\x8c\x04nopeseau";
        let bytes = [b"\x80\x04".as_slice(), body, b"."].concat();
        for generic_only in [false, true] {
            let snapshot = parse(bytes.as_slice(), "input", Decoder { generic_only, ..Decoder::default() }).unwrap();
            let trace = &snapshot.device_traces[0];
            let actions: Vec<Action> = trace.iter().map(|entry| entry.action).collect();
            assert_eq!(actions, [Action::Snapshot, Action::Unknown]);
            assert!(Action::Unknown.is_mark());
            assert_eq!(snapshot.unknown_actions, [UnknownAction { device: 0, entry: 1, name: "nope".into() }]);
            assert_eq!(snapshot.action_name(0, 1, &trace[1]), "nope");
            assert_eq!(snapshot.action_name(0, 0, &trace[0]), "snapshot");
            let mut written = Vec::new();
            crate::write_snapshot(&snapshot, &mut written).unwrap();
            assert_eq!(parse_snapshot(written.as_slice(), "written").unwrap(), snapshot, "{generic_only}");
        }
    }

    #[test]
    fn rejects_foreign_and_mistyped_files() {
        let pickle = |body: &[u8]| [b"\x80\x04".as_slice(), body, b"."].concat();
        // (bytes, expected fragment of the message)
        let cases: Vec<(Vec<u8>, &str)> = vec![
            // What the file holds, at its first bytes: no pickle of a snapshot opens with anything but PROTO or a
            // dict or list.
            (
                b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec(),
                "at byte 0 of the pickle stream: no pickle of a snapshot (one opens with 0x80 and its protocol, or `(`, `}` or \
                 `]`): it starts with 89 50 4e 47 0d 0a 1a 0a (\".PNG....\")",
            ),
            (b"hello".to_vec(), "it starts with 68 65 6c 6c 6f (\"hello\")"),
            // A CSV trace gzipped: heapscope reads traces as they are written.
            (
                {
                    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                    io::Write::write_all(&mut encoder, b"a,1,4096\nf,1\n").unwrap();
                    encoder.finish().unwrap()
                },
                "the gzip stream holds 61 2c 31 2c 34 30 39 36 (\"a,1,4096\"); a gzip-compressed heapscope or CSV trace? \
                 those are read as they are written: gunzip it first",
            ),
            (b"{\"segments\": []}".to_vec(), "at byte 0 of the pickle stream: no pickle of a snapshot"),
            (Vec::new(), "truncated"),
            (vec![0x1f, 0x8b, 8, 0, 0, 0], "cannot read"),
            (pickle(b"K\x01"), "<top level>: expected dict (a snapshot) or list (the segments of torch.cuda.memory_snapshot()), found int"),
            (pickle(b"]K\x01a"), "[0]: expected dict, found int 1"),
            (pickle(b"](}\x8c\x07addressK\x01s}\x8c\x07addressK\x01se"), "[0].total_size: missing key"),
            (pickle(b"}\x8c\x01aK\x01s"), "segments: missing key"),
            (pickle(b"}\x8c\x08segmentsK\x01s"), "segments: expected list, found int 1"),
            (
                pickle(b"}(\x8c\x08segments]\x8c\x0ddevice_traces]]}\x8c\x06actionK\x01saau"),
                "device_traces[0][0].action: expected str, found int 1",
            ),
            (
                pickle(b"}(\x8c\x08segments]\x8c\x0ddevice_traces]]}\x8c\x06action\x8c\x05allocsaau"),
                "device_traces[0][0].addr: missing key",
            ),
            (
                pickle(b"}(\x8c\x08segments]\x8c\x0ddevice_traces]]}(\x8c\x06action\x8c\x05alloc\x8c\x04addrJ\xff\xff\xff\xff\x8c\x04sizeK\x01uaau"),
                "device_traces[0][0].addr: -1 does not fit a u64 (0 to 2^64 - 1)",
            ),
            (pickle(b"}\x8c\x08segments]}\x8c\x07addressK\x01sas"), "segments[0].total_size: missing key"),
            // A segment without its blocks, through the fast path (a memo'd dict appended to the segments) and the generic
            // one (a list of one segment).
            (
                pickle(b"}\x8c\x08segments]\x94(}\x94(\x8c\x07addressK\x01\x8c\x0atotal_sizeK\x01ues"),
                "segments[0].blocks: missing key",
            ),
            (pickle(b"](}(\x8c\x07addressK\x01\x8c\x0atotal_sizeK\x01ue"), "[0].blocks: missing key"),
            (
                pickle(b"}\x8c\x08segments]}(\x8c\x07addressK\x01\x8c\x0atotal_sizeK\x01\x8c\x06blocks]}\x8c\x04sizeK\x01sauas"),
                "segments[0].blocks[0].state: missing key",
            ),
            (pickle(b"}(\x8c\x08segments]\x8c\x12allocator_settingsK\x01u"), "allocator_settings: expected dict, found int 1"),
        ];
        for (bytes, expected) in cases {
            let error = parse_snapshot(bytes.as_slice(), "input.pickle").err().unwrap_or_else(|| panic!("{bytes:?} parsed"));
            let message = error.to_string();
            assert!(message.starts_with("input.pickle: "), "{message}");
            assert!(message.contains(expected), "{bytes:?}: {message:?} lacks {expected:?}");
        }
    }

    /// A file read ahead on a second thread (in chunks of 4 KiB: hundreds of hand-overs, one inside nearly every kind
    /// of opcode) reads the same as one read directly, gzip or raw; a cut gzip file fails with the same message.
    #[test]
    fn reading_ahead_on_a_thread_reads_the_same() {
        let dir = temp_dir("reading_ahead_on_a_thread_reads_the_same");
        for name in ASSETS {
            let direct = read_snapshot_ahead(&asset(name), u64::MAX, 1).unwrap();
            assert_eq!(read_snapshot_ahead(&asset(name), 0, 4096).unwrap(), direct, "{name}");
            let raw = dir.join(name.trim_end_matches(".gz"));
            std::fs::write(&raw, raw_pickle(name)).unwrap();
            assert_eq!(read_snapshot_ahead(&raw, 0, 4096).unwrap(), direct, "{name}, raw");
        }
        let compressed = std::fs::read(asset("gpt2_train_fixed-default.pickle.gz")).unwrap();
        let cut = dir.join("cut.pickle.gz");
        for length in [3, 100, compressed.len() / 2, compressed.len() - 4] {
            std::fs::write(&cut, &compressed[..length]).unwrap();
            let direct = read_snapshot_ahead(&cut, u64::MAX, 1).unwrap_err().to_string();
            let ahead = read_snapshot_ahead(&cut, 0, 4096).unwrap_err().to_string();
            assert_eq!(ahead, direct, "cut at {length}");
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        // (file, prefixes of the raw pickle to try)
        for (name, prefixes) in [("frag_oom-default.pickle.gz", 3000), ("gpt2_train_fixed-expandable.pickle.gz", 120)] {
            let raw = raw_pickle(name);
            let stride = (raw.len() / prefixes).max(1);
            for length in (0..raw.len()).step_by(stride).chain([raw.len() - 1]) {
                let error = parse_snapshot(&raw[..length], name).expect_err("a truncated pickle parsed");
                assert!(matches!(error, SnapshotError::Pickle { .. }), "{length}: {error}");
            }
            let compressed = std::fs::read(asset(name)).unwrap();
            let stride = (compressed.len() / 300).max(1);
            for length in (0..compressed.len()).step_by(stride) {
                assert!(parse_snapshot(&compressed[..length], name).is_err(), "{name}: gzip prefix of {length} bytes parsed");
            }
        }
    }

    #[test]
    fn corrupted_bytes_never_panic() {
        let raw = raw_pickle("frag_oom-default.pickle.gz");
        let mut errors = 0;
        let mut parsed = 0;
        // A small deterministic generator: every run corrupts the same bytes.
        let mut rng = heapscope_core::rng::Rng::new(0x2545_f491_4f6c_dd1d);
        let mut next = || rng.next_u64();
        for _ in 0..3000 {
            let mut bytes = raw.clone();
            for _ in 0..1 + next() % 3 {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] = next() as u8;
            }
            match parse_snapshot(bytes.as_slice(), "corrupt") {
                Ok(_) => parsed += 1,
                Err(_) => errors += 1,
            }
        }
        assert_eq!(errors + parsed, 3000);
        assert!(errors > 100, "{errors} errors of 3000 corruptions");
    }

    /// Every seed of the `snapshot` fuzz target (`allocator/core/fuzz/seeds/snapshot/`) through the reader as the
    /// target runs it: no panic, a snapshot read writes back and reads again the same (up to the numbering of its
    /// frame stacks); the well-formed seeds read,
    /// the hostile ones (`hostile-*`) are refused. A crash the fuzzer finds, saved there, fails `cargo test`.
    #[test]
    fn fuzz_seeds_replay_through_the_reader() {
        let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/fuzz/seeds/snapshot");
        let mut paths: Vec<PathBuf> =
            std::fs::read_dir(&seeds).unwrap().map(|entry| entry.unwrap().path()).filter(|path| path.is_file()).collect();
        paths.sort();
        assert!(paths.len() >= 20, "{} seeds in {}", paths.len(), seeds.display());
        for path in paths {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).unwrap();
            let result = parse_snapshot(bytes.as_slice(), &name);
            if name.starts_with("hostile-") {
                assert!(result.is_err(), "{name}: read, but it should be refused");
                continue;
            }
            let well_formed =
                ["synthetic-", "frag_oom-", "legacy-", "memory-snapshot-", "deep-"].iter().any(|p| name.starts_with(p));
            match result {
                Ok(snapshot) => {
                    let mut written = Vec::new();
                    crate::write_snapshot(&snapshot, &mut written).unwrap();
                    let again = parse_snapshot(written.as_slice(), "written back").unwrap();
                    assert_eq!(
                        again.with_stacks_in_use_order(),
                        snapshot.with_stacks_in_use_order(),
                        "{name}: read, written and read again differs"
                    );
                }
                Err(error) => assert!(!well_formed, "{name}: {error}"),
            }
        }
    }
}
