//! A recording to replay: a [`Trace`] of allocations and frees for the core's contenders and, when it
//! came from PyTorch, the snapshot itself for the caching-allocator emulation.
//!
//! From a PyTorch snapshot, one device's trace becomes a [`Trace`]: `alloc` allocates under its address,
//! `free_completed` frees (the moment PyTorch reuses the memory), and an `oom` entry becomes a request
//! freed at once — the request PyTorch refused, asked of every contender so each says whether it would
//! have served it. Every event remembers the index of the entry it came from, so verdicts point into the file.
//!
//! ## The start state: the same stream for every contender
//!
//! Most shared snapshots start mid-run (`_record_memory_history()` was switched on after the model was
//! loaded): allocations are live before the first entry. Their set is rebuilt the way MemoryViz and the
//! emulation of PyTorch's allocator rebuild it — the final segments' live blocks, the trace walked backwards
//! (an `alloc` means the block was not live before it, a `free_completed` that it was) — and they open the
//! trace: its first [`Recording::start_events`] events allocate them, in address order, before entry 0. So
//! every contender (a heap, paging, a device heap, PyTorch's emulation, which rebuilds the same blocks) serves
//! exactly the same requests, and their later frees are ordinary frees. A recording that starts from an empty
//! allocator is found without the walk back: the stream is built forward on that guess first, and the guess holds
//! when no entry frees what it did not allocate and every final live block is live at the end (the walk back would
//! find nothing); only otherwise is the trace walked back and the stream built again.
//!
//! ## Moments
//!
//! A recording's moments are numbered by its entries, from 0: entry `N` is `device_traces[device][N]` of a
//! PyTorch snapshot (what `event_index` says in JSON), event `N` of a heapscope trace. [`Moment`] is that
//! numbering, with [`Moment::Start`] for the state before entry 0; every command, report and the app use it.

use std::fmt;
use std::io::Read;
use std::path::Path;
use std::str::FromStr;

use heapscope_core::trace::{Trace, TraceBuilder};
use heapscope_core::{Error, Result};
use heapscope_pytorch::caching::ADDRESS_LIMIT;
use heapscope_pytorch::{Action, BlockState, Snapshot, SnapshotError, StackId, TraceEntry, read_snapshot};

/// What a recording file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `torch.cuda.memory._dump_snapshot` output, gzip-compressed or not.
    PytorchSnapshot,
    /// heapscope's native binary trace.
    Native,
    /// heapscope's compact CSV trace.
    Csv,
    /// A format heapscope recognises and does not read: what it is, and what to do instead.
    Foreign {
        /// What the file is.
        what: &'static str,
        /// What to do instead.
        instead: &'static str,
    },
}

/// What to save instead of a format heapscope does not read.
const SAVE_A_SNAPSHOT: &str = "heapscope reads the pickle `torch.cuda.memory._dump_snapshot(path)` writes (gzip or not), \
                               or `pickle.dump(torch.cuda.memory._snapshot(), f)`";

/// What a path that is no regular file is, in words.
fn file_kind(kind: std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        return "a folder";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    "not a file"
}

/// The format of a file starting with `head`. A pickle of protocol 0 or 1 (it starts with `(`, `}` or `]`, which no
/// CSV line does) goes to the snapshot reader, which says which protocols it reads.
pub fn sniff(head: &[u8]) -> Format {
    let foreign = |what, instead| Format::Foreign { what, instead };
    match head {
        // Before pickles of protocol 0 or 1, which start with `(` (0x28) as zstd's magic does.
        [0x28, 0xb5, 0x2f, 0xfd, ..] => {
            foreign("zstd-compressed", "decompress it first (`zstd -d`); heapscope reads gzip itself")
        }
        [0x1f, 0x8b, ..] | [0x80, 2..=5, ..] | [b'(' | b'}' | b']', ..] => Format::PytorchSnapshot,
        _ if Trace::is_native(head) => Format::Native,
        [b'P', b'K', 3, 4, ..] => foreign("a zip archive, as `torch.save` writes", SAVE_A_SNAPSHOT),
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => {
            foreign("xz-compressed", "decompress it first (`xz -d`); heapscope reads gzip itself")
        }
        [b'B', b'Z', b'h', ..] => foreign("bzip2-compressed", "decompress it first (`bzip2 -d`); heapscope reads gzip itself"),
        _ if head.iter().find(|byte| !byte.is_ascii_whitespace()).is_some_and(|&byte| byte == b'{' || byte == b'[') => {
            foreign("JSON", SAVE_A_SNAPSHOT)
        }
        _ => Format::Csv,
    }
}

/// What a file's extension says it is, and how that format starts: `None` for a name that says nothing (a CSV
/// trace's, or none).
fn format_named(path: &Path) -> Option<(&'static str, &'static str)> {
    let extension = path.extension()?.to_str()?.to_ascii_lowercase();
    match extension.as_str() {
        "pickle" | "pkl" | "pt" | "gz" => {
            Some(("a PyTorch snapshot", "a pickle starts with 0x80 and its protocol (2 to 5), a gzip file with 1f 8b"))
        }
        "hst" => Some(("a heapscope trace", "a native trace starts with `HSTRACE`")),
        _ => None,
    }
}

/// Why a recording file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file cannot be read.
    #[error("cannot read {file}: {error}")]
    Io {
        /// The file.
        file: String,
        /// What the system said.
        error: std::io::Error,
    },
    /// The file is empty.
    #[error("{file}: the file is empty")]
    Empty {
        /// The file.
        file: String,
    },
    /// The path is no regular file (a device such as `/dev/zero`, a FIFO, a socket, a folder): refused before it is
    /// opened, so nothing is read without end and no FIFO without a writer blocks.
    #[error("{file}: not a regular file ({kind}): heapscope reads a recording from a file (save a stream to one first)")]
    NotAFile {
        /// The file.
        file: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// A file named as a snapshot (`.pickle`, `.pkl`, `.pt`, `.gz`) or a native trace (`.hst`) whose first bytes are
    /// neither: not read as a CSV trace, whose error would name a line of what is no text.
    #[error("{file}: not {what}, as its name says: {expected}; this one starts with {head}")]
    NotItsFormat {
        /// The file.
        file: String,
        /// What its name says it is.
        what: &'static str,
        /// How that format starts.
        expected: &'static str,
        /// Its first bytes, in hex and as text.
        head: String,
    },
    /// A format heapscope recognises and does not read (a zip archive, JSON, another compression than gzip).
    #[error("{file}: {what}, which heapscope does not read: {instead}")]
    Foreign {
        /// The file.
        file: String,
        /// What it is.
        what: &'static str,
        /// What to do instead.
        instead: &'static str,
    },
    /// A device other than 0 asked of a trace, which has one.
    #[error("{file}: --device {device} applies to PyTorch snapshots only; a heapscope trace has one device")]
    NoSuchDevice {
        /// The file.
        file: String,
        /// The device asked for.
        device: usize,
    },
    /// A bad snapshot.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A bad trace, or a snapshot whose entries contradict each other.
    #[error(transparent)]
    Recording(#[from] Error),
}

/// A recording ready for replay.
#[derive(Clone, Debug)]
pub struct Recording {
    /// What to call it.
    pub name: String,
    /// The allocations and frees.
    pub trace: Trace,
    /// For each event of `trace`, the index of the entry it came from in the file's own numbering (0 for the
    /// [`Recording::start_events`], which come from no entry).
    pub entry_index: Vec<u64>,
    /// The snapshot, when the recording is PyTorch's.
    pub snapshot: Option<Snapshot>,
    /// The device whose trace this is.
    pub device: usize,
    /// The first events of `trace` that allocate what was live before the first entry (see the module docs).
    pub start_events: usize,
    /// The recorded address of each start event, in order (a PyTorch recording's; empty for a trace).
    pub start_addresses: Vec<u64>,
    /// The recording's entries: the device's trace entries of a snapshot, the events of a trace.
    pub entries: u64,
    /// Frees of allocations the recording does not know (neither live at the start nor allocated since): an
    /// inconsistent file; skipped.
    pub unknown_frees: u64,
    /// Where the snapshot's final segments disagree with what its trace leaves live at its end (nothing for a trace).
    pub final_mismatch: FinalMismatch,
    /// The entries where the recording's user called `empty_cache()` (a snapshot records none: they are told apart
    /// from the allocator's own releases by [`heapscope_pytorch::caching::user_empty_caches`], or listed in heapscope's
    /// export of another contender, [`heapscope_pytorch::ContenderExport`]; a trace's are its events): each an
    /// [`heapscope_core::Event::EmptyCache`] of the trace, which the `pytorch` contender takes as it is.
    pub empty_caches: std::sync::Arc<[usize]>,
    /// Why the user's `empty_cache()` calls could not be told apart, where the emulation of the recorded run refused
    /// the snapshot (none is an event then: [`crate::caveats::empty_caches_untold`] says so).
    pub empty_caches_untold: Option<String>,
}

/// Where a snapshot's final segments disagree with the end of its trace: the segments are the state when the snapshot
/// was taken, the trace leads up to that moment, so what the trace leaves live is what the segments show allocated
/// (or freed but not yet completed). A file that breaks this was edited, cut from another run, or recorded beside
/// allocations the trace does not see; the start state, rebuilt from both (see the module docs), may then be wrong.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FinalMismatch {
    /// Allocations the trace leaves live that no final segment shows allocated.
    pub live_not_in_segments: u64,
    /// Blocks the final segments show allocated whose allocation the trace freed (and did not allocate again).
    pub freed_but_allocated: u64,
    /// The lowest address among both.
    pub first_address: Option<u64>,
}

impl FinalMismatch {
    /// Compares what `builder` holds live once every entry of device `device` is walked with `snapshot`'s final
    /// segments. Zero-byte blocks are left out, as the stream leaves them out.
    fn of(builder: &TraceBuilder, snapshot: &Snapshot, device: usize) -> Self {
        let final_live: heapscope_core::hash::FastSet<u64> =
            final_live_blocks(snapshot, device).filter(|block| block.requested_size > 0).map(|block| block.address).collect();
        let mut mismatch = Self::default();
        let mut note = |address: u64, count: &mut u64| {
            *count += 1;
            mismatch.first_address = Some(mismatch.first_address.map_or(address, |first| first.min(address)));
        };
        let mut live_not_in_segments = 0;
        for address in builder.live_ids().filter(|address| !final_live.contains(address)) {
            note(address, &mut live_not_in_segments);
        }
        let mut freed_but_allocated = 0;
        for &address in final_live.iter().filter(|&&address| !builder.is_live(address)) {
            note(address, &mut freed_but_allocated);
        }
        Self { live_not_in_segments, freed_but_allocated, ..mismatch }
    }

    /// Whether the segments and the trace agree.
    pub fn is_none(&self) -> bool {
        self.live_not_in_segments == 0 && self.freed_but_allocated == 0
    }
}

/// A moment of a recording: before its first entry, or once entry `N` (from 0, the file's own numbering) is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Moment {
    /// Before the first entry: what was live when the recording started.
    Start,
    /// Once entry `N` is done.
    Entry(u64),
}

impl Moment {
    /// Its position in a replay: how many steps in (the start is 0, entry `N` is `N + 1`).
    pub fn position(self) -> u64 {
        match self {
            Moment::Start => 0,
            Moment::Entry(entry) => entry.saturating_add(1),
        }
    }

    /// The moment `position` steps in.
    pub fn at_position(position: u64) -> Self {
        match position {
            0 => Moment::Start,
            steps => Moment::Entry(steps - 1),
        }
    }
}

impl fmt::Display for Moment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Moment::Start => f.write_str("start"),
            Moment::Entry(entry) => write!(f, "entry {entry}"),
        }
    }
}

/// A moment that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is no moment: expected `start` or an entry number (from 0)")]
pub struct BadMoment {
    /// What was given.
    pub text: String,
}

impl FromStr for Moment {
    type Err = BadMoment;

    fn from_str(text: &str) -> Result<Self, BadMoment> {
        match text.trim() {
            "start" => Ok(Moment::Start),
            number => number.parse().map(Moment::Entry).map_err(|_| BadMoment { text: text.to_owned() }),
        }
    }
}

impl Recording {
    /// A recording of a plain trace (entry indices are event indices).
    pub fn from_trace(trace: Trace) -> Self {
        let empty_caches = (0..)
            .zip(trace.events())
            .filter(|(_, event)| **event == heapscope_core::Event::EmptyCache)
            .map(|(index, _)| index)
            .collect();
        Self {
            empty_caches,
            empty_caches_untold: None,
            name: trace.name.clone(),
            entry_index: (0..trace.events().len() as u64).collect(),
            entries: trace.events().len() as u64,
            trace,
            snapshot: None,
            device: 0,
            start_events: 0,
            start_addresses: Vec::new(),
            unknown_frees: 0,
            final_mismatch: FinalMismatch::default(),
        }
    }

    /// Device `device` of a PyTorch snapshot, named `name`.
    ///
    /// # Errors
    /// [`Error::Trace`] when the snapshot has no such device or records nothing on it (no trace entry, no segment:
    /// the message lists the devices it has, see [`missing_device`]), two of its final segments
    /// overlap or end past any device's addresses ([`heapscope_pytorch::caching::segments_describe_a_device`]), or an
    /// entry contradicts the ones before it
    /// (an address allocated twice without a free, a zero-size allocation).
    pub fn from_snapshot(name: &str, snapshot: Snapshot, device: usize) -> Result<Self> {
        if let Some(what) = missing_device(&snapshot, device) {
            return Err(Error::Trace { file: name.to_owned(), line: 0, what });
        }
        // The start state is walked back from the final segments: segments that overlap, or end past any device's
        // addresses, describe no device (every contender would replay an impossible start; an `oom` entry's probe id,
        // from 2^64 - 1 down, could meet such an address).
        heapscope_pytorch::caching::segments_describe_a_device(&snapshot, device).map_err(|error| Error::Trace {
            file: name.to_owned(),
            line: 0,
            what: error.to_string(),
        })?;
        let entries = snapshot.device_traces.get(device).map_or(&[][..], Vec::as_slice);
        // The user's `empty_cache()` calls, which no snapshot records, as the emulation of the recorded run tells them
        // apart from the allocator's own releases: an event of the stream, so that every contender makes them. (A
        // recording the emulation refuses has none; its `pytorch` row says why.) Most recordings free no segment: nothing
        // to tell apart, no capacity to find.
        let frees_segments = entries.iter().any(|entry| matches!(entry.action, Action::SegmentFree | Action::SegmentUnmap));
        let (empty_caches, empty_caches_untold) = if let Some(export) = &snapshot.contender_export {
            // heapscope's export of another contender: its segment frees are that contender's, and the calls are listed.
            (export.empty_cache_entries.get(device).cloned().unwrap_or_default(), None)
        } else if frees_segments {
            let capacity = first_oom_device(&snapshot, device).map(|oom| oom.capacity_bytes());
            match heapscope_pytorch::caching::user_empty_caches(&snapshot, device, capacity) {
                Ok(entries) => (entries, None),
                Err(error) => (Vec::new(), Some(error.to_string())),
            }
        } else {
            (Vec::new(), None)
        };
        // A recording that starts from an empty allocator says so only once walked whole: the stream is built forward
        // on that guess first, and the trace walked back for what was live at the start only where the guess fails.
        let built = match Built::forward(name, device, entries, &[], true, &empty_caches) {
            Ok(Some(built)) if built.accounts_for_the_final_blocks(&snapshot, device) => built,
            _ => {
                let start = live_at_start(&snapshot, device, entries);
                Built::forward(name, device, entries, &start, false, &empty_caches)?.ok_or_else(|| Error::InvalidConfig {
                    what: "the stream built after the walk back gave up as a guess would: a recording bug".to_owned(),
                })?
            }
        };
        let final_mismatch = FinalMismatch::of(&built.builder, &snapshot, device);
        Ok(Self {
            name: name.to_owned(),
            trace: built.builder.finish(),
            entry_index: built.entry_index,
            start_events: built.start_addresses.len(),
            start_addresses: built.start_addresses,
            entries: entries.len() as u64,
            snapshot: Some(snapshot),
            device,
            unknown_frees: built.unknown_frees,
            final_mismatch,
            empty_caches: empty_caches.into(),
            empty_caches_untold,
        })
    }

    /// Opens the recording at `path`: a PyTorch snapshot (gzip-compressed or not; device `device` of it), a
    /// native or a CSV trace, told apart by their first bytes.
    ///
    /// # Errors
    /// [`OpenError`] naming the file and what is wrong with it.
    pub fn open(path: &Path, device: usize) -> Result<Self, OpenError> {
        Self::open_device(path, Some(device))
    }

    /// [`Recording::open`] on device `device` of a snapshot, or with `None` on its [`default_device`] (device 0
    /// of a trace, which has one).
    ///
    /// # Errors
    /// [`OpenError`] naming the file and what is wrong with it.
    pub fn open_device(path: &Path, device: Option<usize>) -> Result<Self, OpenError> {
        let file = heapscope_core::path_name(path);
        let io = |error| OpenError::Io { file: file.clone(), error };
        let kind = std::fs::metadata(path).map_err(io)?.file_type();
        if !kind.is_file() {
            return Err(OpenError::NotAFile { file, kind: file_kind(kind) });
        }
        let mut head = [0u8; 8];
        let mut reader = std::fs::File::open(path).map_err(io)?;
        let read = reader.read(&mut head).map_err(io)?;
        if read == 0 {
            return Err(OpenError::Empty { file });
        }
        // Its size once read from (a file written as it is read has its bytes counted by now).
        if reader.metadata().map_err(io)?.len() == 0 {
            // A file of no size that yields bytes is made as it is read (`/proc`, `/sys`): it may never end.
            return Err(OpenError::NotAFile { file, kind: "a file the system makes as it is read: its size is 0" });
        }
        match sniff(&head[..read]) {
            Format::PytorchSnapshot => {
                let snapshot = read_snapshot(path)?;
                let device = device.unwrap_or_else(|| default_device(&snapshot).device);
                Ok(Self::from_snapshot(&file, snapshot, device)?)
            }
            Format::Foreign { what, instead } => Err(OpenError::Foreign { file, what, instead }),
            Format::Csv if let Some((what, expected)) = format_named(path) => {
                Err(OpenError::NotItsFormat { file, what, expected, head: heapscope_pytorch::import::shown_bytes(&head[..read]) })
            }
            Format::Native | Format::Csv if device.is_some_and(|device| device != 0) => {
                Err(OpenError::NoSuchDevice { file, device: device.unwrap_or_default() })
            }
            Format::Csv => Ok(Self::from_trace(Trace::read(path)?)),
            Format::Native => {
                // Named as the file read, and the recording it was converted from (`heapscope convert` keeps it).
                let mut trace = Trace::read(path)?;
                let file_name = path.file_name().map(|name| name.to_string_lossy());
                if !trace.name.is_empty() && file_name.as_deref() != Some(trace.name.as_str()) {
                    trace.name = format!("{file} (from {})", trace.name);
                } else {
                    trace.name = file;
                }
                Ok(Self::from_trace(trace))
            }
        }
    }

    /// Entry `entry` of the snapshot's trace of the device replayed (`None` for a plain trace, or past its end).
    pub fn trace_entry(&self, entry: u64) -> Option<&TraceEntry> {
        self.snapshot.as_ref()?.device_traces.get(self.device)?.get(usize::try_from(entry).ok()?)
    }

    /// The file's entry index for event `event` of the trace (0 for a start event: see [`Recording::moment_of`]).
    pub fn entry_of(&self, event: u64) -> u64 {
        entry_of(&self.entry_index, event)
    }

    /// The moment of event `event` of the trace: the start for the allocations live before the first entry, else
    /// the entry it came from.
    pub fn moment_of(&self, event: u64) -> Moment {
        moment_of(self.start_events, &self.entry_index, event)
    }

    /// Its name as the commands and the app show it: with the device, when the file records several (traces or
    /// segments of several devices) or the device is not the first.
    pub fn shown_name(&self) -> String {
        let several = self
            .snapshot
            .as_ref()
            .is_some_and(|snapshot| snapshot.device_traces.len() > 1 || self.device > 0 || present_devices(snapshot).len() > 1);
        if several { format!("{} (device {})", self.name, self.device) } else { self.name.clone() }
    }

    /// The CUDA streams the device's trace uses (1 for a plain trace, which has none).
    pub fn streams(&self) -> usize {
        let entries = self.snapshot.as_ref().and_then(|snapshot| snapshot.device_traces.get(self.device));
        // A recording uses a few streams, mostly one entry after another on the same: a short list, looked up only
        // when the stream changes.
        let mut streams: Vec<u64> = Vec::new();
        let mut last = None;
        for entry in entries.into_iter().flatten() {
            if last != Some(entry.stream) {
                last = Some(entry.stream);
                if !streams.contains(&entry.stream) {
                    streams.push(entry.stream);
                }
            }
        }
        streams.len().max(1)
    }

    /// The first out-of-memory entry of its device's trace, and its index; `None` for a plain trace or a device
    /// that refused nothing.
    pub fn first_oom(&self) -> Option<(u64, &TraceEntry)> {
        let entries = self.snapshot.as_ref()?.device_traces.get(self.device)?;
        (0..).zip(entries).find(|(_, entry)| entry.action == Action::Oom)
    }

    /// The file's devices, besides its own, whose trace has an out-of-memory entry (none for a plain trace).
    pub fn other_devices_with_oom(&self) -> Vec<usize> {
        self.snapshot.as_ref().map_or_else(Vec::new, |snapshot| {
            devices_with_oom(snapshot).into_iter().filter(|&device| device != self.device).collect()
        })
    }

    /// For each start event, what the entry of its allocation would have said (the trace began after it; `None` for a
    /// plain trace). One freed during the recording: the stream and memory pool of its free, and the free's stack (its
    /// `free_requested`, or its `free_completed` for one freed by its caller before the start) where the file's frees
    /// carry the stack of what they free ([`frees_carry_allocation_stacks`]), else none (its final
    /// block, if its address has one, is a later allocation's). One live to the end, its free requested and never
    /// completed included: its final block's stack, on its segment's stream. No category (that of the entry's moment,
    /// which the trace did not see) and no time.
    pub fn start_origins(&self) -> Vec<Option<TraceEntry>> {
        let Some(snapshot) = &self.snapshot else { return vec![None; self.start_addresses.len()] };
        let entries = snapshot.device_traces.get(self.device).map_or(&[][..], Vec::as_slice);
        let mut wanted: heapscope_core::hash::FastMap<u64, usize> =
            self.start_addresses.iter().enumerate().map(|(start, &address)| (address, start)).collect();
        let mut origins = vec![None; self.start_addresses.len()];
        let mut free_stacks = None;
        for entry in entries {
            if wanted.is_empty() {
                break;
            }
            match entry.action {
                // Allocated anew: the one live at the start went without a free of its own.
                Action::Alloc => {
                    wanted.remove(&entry.addr);
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    if let Some(&start) = wanted.get(&entry.addr) {
                        let stacks = *free_stacks.get_or_insert_with(|| frees_carry_allocation_stacks(entries));
                        let frames = if stacks { entry.frames } else { StackId::NONE };
                        origins[start].get_or_insert(
                            TraceEntry::new(Action::Alloc, entry.addr, entry.size)
                                .with_stream(entry.stream)
                                .with_pool_id(entry.pool_id)
                                .with_frames(frames),
                        );
                        // Where frees carry the freeing code's stack, a free requested and never completed leaves the
                        // allocation's block in the final segments (pending free), with its own frames: looked up below.
                        if stacks || entry.action == Action::FreeCompleted {
                            wanted.remove(&entry.addr);
                        }
                    }
                }
                _ => {}
            }
        }
        for segment in snapshot.segments.iter().filter(|segment| segment.device as usize == self.device) {
            for block in segment.blocks.iter().filter(|block| block.state != BlockState::Inactive) {
                if let Some(start) = wanted.remove(&block.address) {
                    origins[start] = Some(
                        TraceEntry::new(Action::Alloc, block.address, block.requested_size)
                            .with_stream(segment.stream)
                            .with_frames(block.frames),
                    );
                }
            }
        }
        origins
    }

    /// Bytes requested by the allocations live at the start.
    pub fn start_bytes(&self) -> u64 {
        self.trace.events()[..self.start_events]
            .iter()
            .map(|event| match *event {
                heapscope_core::trace::Event::Alloc { size_bytes, .. } => size_bytes,
                heapscope_core::trace::Event::Free { .. } | heapscope_core::trace::Event::EmptyCache => 0,
            })
            .sum()
    }
}

/// The entry of event `event`, by `entry_index` (one entry per event); past its end, event `N` is entry `N` (a
/// plain trace's numbering).
pub(crate) fn entry_of(entry_index: &[u64], event: u64) -> u64 {
    usize::try_from(event).ok().and_then(|event| entry_index.get(event)).copied().unwrap_or(event)
}

/// A device's stream, built from its entries (see [`Recording::from_snapshot`]).
struct Built {
    builder: TraceBuilder,
    entry_index: Vec<u64>,
    start_addresses: Vec<u64>,
    unknown_frees: u64,
}

impl Built {
    /// The stream of `entries` after the allocations `start` (by address, with their bytes). `guess_empty`: `start` is
    /// a guess that nothing was live, given up (`Ok(None)`) at anything that contradicts it — a free of an address
    /// not allocated before it, which the start then held — or that the guess's proof does not cover (an entry of 0
    /// bytes, an entry the builder refuses, whose error the walk with the real start reports).
    fn forward(
        name: &str,
        device: usize,
        entries: &[TraceEntry],
        start: &[(u64, u64)],
        guess_empty: bool,
        empty_caches: &[usize],
    ) -> Result<Option<Self>> {
        let mut builder = TraceBuilder::new(format!("{name} (device {device})"));
        let mut entry_index = Vec::with_capacity(start.len() + entries.len());
        for &(address, size_bytes) in start {
            builder.alloc(address, size_bytes).map_err(|what| Error::Trace {
                file: name.to_owned(),
                line: 0,
                what: format!("device {device}: the allocation at {address:#x} live at the start: {what}"),
            })?;
            entry_index.push(0);
        }
        let mut unknown_frees = 0;
        // Ids for refused requests, clear of any address.
        let mut probe_id = u64::MAX;
        let mut empty_caches = empty_caches.iter().copied().peekable();
        for (index, entry) in (0..).zip(entries) {
            // Each call before this entry (two in a row are two).
            while empty_caches.next_if(|&at| at as u64 == index).is_some() {
                builder.empty_cache();
                entry_index.push(index);
            }
            let fail = |what: &dyn fmt::Display| Error::Trace {
                file: name.to_owned(),
                line: 0,
                what: format!("device_traces[{device}][{index}]: {what}"),
            };
            match entry.action {
                // PyTorch records none: a request of 0 bytes never reaches its allocator, and a free carries its
                // block's request. Refused as the emulation refuses it, so that no contender replays a stream of its own.
                Action::Alloc | Action::FreeRequested | Action::FreeCompleted | Action::Oom if entry.size == 0 => {
                    let what = format!(
                        "{} of 0 bytes at {:#x} (PyTorch records no request of 0 bytes)",
                        entry.action.as_str(),
                        entry.addr
                    );
                    return Err(fail(&what));
                }
                // An address range no device has (the emulation refuses it too): refused, naming the entry; the ids of
                // the `oom` entries' probes, counting down from 2^64 - 1, stay clear of every address.
                Action::Alloc | Action::FreeRequested | Action::FreeCompleted
                    if entry.addr.checked_add(entry.size).is_none_or(|end| end > ADDRESS_LIMIT) =>
                {
                    let what = format!(
                        "{} of {} bytes at {:#x} ends past {ADDRESS_LIMIT:#x}, beyond any device's addresses",
                        entry.action.as_str(),
                        entry.size,
                        entry.addr
                    );
                    return Err(fail(&what));
                }
                Action::Alloc => match builder.alloc(entry.addr, entry.size) {
                    Ok(()) => entry_index.push(index),
                    Err(_) if guess_empty => return Ok(None),
                    Err(what) => return Err(fail(&what)),
                },
                // The builder knows what is live (what started live or was allocated since, the refused requests'
                // probes freed at once): a free of anything else is a free the recording does not know.
                Action::FreeCompleted => match builder.free(entry.addr) {
                    Ok(()) => entry_index.push(index),
                    Err(_) if guess_empty => return Ok(None),
                    Err(_) => unknown_frees += 1,
                },
                Action::Oom => {
                    builder.alloc(probe_id, entry.size).map_err(|what| fail(&what))?;
                    builder.free(probe_id).map_err(|what| fail(&what))?;
                    entry_index.extend([index, index]);
                    probe_id -= 1;
                }
                _ => {}
            }
        }
        // Calls after the last entry: events of its moment (a trace of no entries has no moment for them).
        if let Some(last) = (entries.len() as u64).checked_sub(1) {
            for _ in empty_caches.filter(|&at| at == entries.len()) {
                builder.empty_cache();
                entry_index.push(last);
            }
        }
        let start_addresses = start.iter().map(|&(address, _)| address).collect();
        Ok(Some(Self { builder, entry_index, start_addresses, unknown_frees }))
    }

    /// Whether every block of `device`'s final segments that was not free is live in the stream at its end: built on
    /// the guess that nothing was live at the start, the guess then holds. (Every address the entries touch was first
    /// allocated, or the guess was given up at its free; an address they never touch would be one of these blocks,
    /// live since before the first entry.) This is what [`live_at_start`] finds empty, without its walk back.
    fn accounts_for_the_final_blocks(&self, snapshot: &Snapshot, device: usize) -> bool {
        final_live_blocks(snapshot, device).all(|block| self.builder.is_live(block.address))
    }
}

/// Whether the frees of `entries` carry the stack of the allocation they free rather than their own: PyTorch records
/// a `free_requested` with the stack of its caller under `_record_memory_history(context="all")` (the default), with
/// the allocation's under `context="alloc"`. Told from the file: every pair allocated and freed within it, with frames
/// recorded, has the same frames at both ends, and such pairs come from at least [`AGREEING_STACKS`] stacks. (A
/// temporary allocated and freed on one line agrees under `context="all"` too: a few such pairs tell nothing.)
pub fn frees_carry_allocation_stacks(entries: &[TraceEntry]) -> bool {
    let mut allocated: heapscope_core::hash::FastMap<u64, StackId> = heapscope_core::hash::FastMap::default();
    let mut agreeing: heapscope_core::hash::FastSet<StackId> = heapscope_core::hash::FastSet::default();
    for entry in entries {
        match entry.action {
            Action::Alloc => {
                allocated.insert(entry.addr, entry.frames);
            }
            Action::FreeRequested => match allocated.remove(&entry.addr) {
                Some(StackId::NONE) | None => {}
                Some(frames) if frames == entry.frames => {
                    agreeing.insert(frames);
                }
                Some(_) => return false,
            },
            _ => {}
        }
    }
    agreeing.len() >= AGREEING_STACKS
}

/// How many different stacks the pairs that agree must come from before frees are taken to carry the allocation's
/// stack ([`frees_carry_allocation_stacks`]).
pub const AGREEING_STACKS: usize = 3;

/// The blocks of device `device`'s final segments that were not free when the snapshot was taken (allocated, or
/// freed but not yet completed).
pub(crate) fn final_live_blocks(snapshot: &Snapshot, device: usize) -> impl Iterator<Item = &heapscope_pytorch::Block> {
    live_blocks(snapshot.segments.iter().filter(move |segment| segment.device as usize == device))
}

/// The blocks of `segments` that are not free (allocated, or freed but not yet completed).
pub(crate) fn live_blocks<'s>(
    segments: impl IntoIterator<Item = &'s heapscope_pytorch::Segment>,
) -> impl Iterator<Item = &'s heapscope_pytorch::Block> {
    segments.into_iter().flat_map(|segment| &segment.blocks).filter(|block| block.state != BlockState::Inactive)
}

/// The moment of event `event` of a stream whose first `start_events` events are the start state.
pub(crate) fn moment_of(start_events: usize, entry_index: &[u64], event: u64) -> Moment {
    if usize::try_from(event).is_ok_and(|event| event < start_events) {
        Moment::Start
    } else {
        Moment::Entry(entry_of(entry_index, event))
    }
}

/// The allocations of device `device` live before its first entry, by address, with their requested bytes: the
/// final segments' live blocks (allocated, or freed but not yet completed), then `entries` walked backwards —
/// an `alloc` was not live before it, a `free_completed` was (the rule of MemoryViz and of the emulation's
/// start state, `pytorch::caching`'s `initial`). Zero-byte ones are left out: nothing replays them.
fn live_at_start(snapshot: &Snapshot, device: usize, entries: &[TraceEntry]) -> Vec<(u64, u64)> {
    // A hash map while walking (a 400,000-entry trace inserts and removes for most entries; an ordered map cost a
    // fifth of `replay`), sorted by address once at the end.
    let mut live: heapscope_core::hash::FastMap<u64, u64> =
        final_live_blocks(snapshot, device).map(|block| (block.address, block.requested_size)).collect();
    for entry in entries.iter().rev() {
        match entry.action {
            Action::Alloc => {
                live.remove(&entry.addr);
            }
            Action::FreeCompleted => {
                live.insert(entry.addr, entry.size);
            }
            _ => {}
        }
    }
    let mut live: Vec<(u64, u64)> = live.into_iter().filter(|&(_, size_bytes)| size_bytes > 0).collect();
    live.sort_unstable();
    live
}

/// The device of `snapshot` with the most trace entries (the lowest of equals; 0 when it records none): where a
/// multi-device snapshot's activity is, when no device is named.
pub fn busiest_device(snapshot: &Snapshot) -> usize {
    let mut busiest = 0;
    for (device, entries) in snapshot.device_traces.iter().enumerate() {
        if entries.len() > snapshot.device_traces[busiest].len() {
            busiest = device;
        }
    }
    busiest
}

/// One device of a snapshot, as the overview of a file of several devices shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceOverview {
    /// The device.
    pub device: usize,
    /// Its trace entries.
    pub entries: u64,
    /// Its segments when the snapshot was taken.
    pub segments: u64,
    /// The most memory it held reserved, as recorded: what was reserved at the start (its final segments less the
    /// trace's segment events, at least what the trace frees before reserving) plus the segment events' highest
    /// running sum.
    pub peak_reserved_bytes: u64,
    /// Its `oom` entries: the out-of-memory errors PyTorch recorded.
    pub ooms: u64,
}

impl DeviceOverview {
    /// The device's line in an overview: `device 1: 45 entries, peak reserved 3.00 GiB, 1 OOM`.
    pub fn line(&self) -> String {
        let entries = match self.entries {
            0 => format!("no trace entries ({}: a state with no trace)", counted(self.segments, "segment", "segments")),
            entries => counted(entries, "entry", "entries"),
        };
        let ooms = match self.ooms {
            0 => "no OOM".to_owned(),
            ooms => counted(ooms, "OOM", "OOMs"),
        };
        format!(
            "device {}: {entries}, peak reserved {}, {ooms}",
            self.device,
            heapscope_core::units::Bytes(self.peak_reserved_bytes)
        )
    }
}

/// Every device of `snapshot` that records something (trace entries or segments), in order.
pub fn device_overview(snapshot: &Snapshot) -> Vec<DeviceOverview> {
    present_devices(snapshot)
        .into_iter()
        .map(|device| {
            let entries = snapshot.device_traces.get(device).map_or(&[][..], Vec::as_slice);
            let peak_reserved_bytes = recorded_peak_reserved(snapshot, device);
            DeviceOverview {
                device,
                entries: entries.len() as u64,
                segments: snapshot.segments.iter().filter(|segment| segment.device as usize == device).count() as u64,
                peak_reserved_bytes,
                ooms: entries.iter().filter(|entry| entry.action == Action::Oom).count() as u64,
            }
        })
        .collect()
}

/// The devices `snapshot` records something on (a trace with entries, a segment), in order: the devices named, not every
/// number up to the highest (a damaged file may name device 4,000,000,000).
pub fn present_devices(snapshot: &Snapshot) -> std::collections::BTreeSet<usize> {
    let mut devices: std::collections::BTreeSet<usize> =
        snapshot.device_traces.iter().enumerate().filter(|(_, entries)| !entries.is_empty()).map(|(device, _)| device).collect();
    devices.extend(snapshot.segments.iter().map(|segment| segment.device as usize));
    devices
}

/// What device `device`'s first `oom` entry tells of the device ([`crate::capacity::recorded_capacity`] words it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OomDevice {
    /// The entry.
    pub entry: u64,
    /// Bytes PyTorch held reserved there (the final segments, less what the trace reserved and plus what it returned,
    /// walked up to the entry).
    pub reserved_bytes: u64,
    /// The driver's free bytes it recorded.
    pub device_free_bytes: Option<u64>,
    /// The most PyTorch held reserved up to it.
    pub most_reserved_bytes: u64,
}

impl OomDevice {
    /// The device's bytes: what was reserved plus the driver's free bytes, or (none recorded) the most reserved, at
    /// most the largest device heapscope models.
    pub fn capacity_bytes(&self) -> u64 {
        let bytes = match self.device_free_bytes {
            Some(free) => self.reserved_bytes.saturating_add(free),
            None => self.most_reserved_bytes,
        };
        bytes.min(heapscope_core::LARGEST_DEVICE_BYTES)
    }
}

/// What device `device`'s first `oom` entry of `snapshot` tells of the device; `None` without one.
pub(crate) fn first_oom_device(snapshot: &Snapshot, device: usize) -> Option<OomDevice> {
    let entries = snapshot.device_traces.get(device)?;
    // The first oom, found before the reserved bytes are walked: most recordings have none, and then nothing more is
    // read.
    let oom = entries.iter().position(|entry| entry.action == Action::Oom)?;
    let mut reserved = i128::from(reserved_at_start(snapshot, device));
    let mut most = reserved;
    for entry in &entries[..oom] {
        reserved = (reserved + entry.reserved_change()).max(0);
        most = most.max(reserved);
    }
    let bytes = |value: i128| u64::try_from(value).unwrap_or(u64::MAX);
    Some(OomDevice {
        entry: oom as u64,
        reserved_bytes: bytes(reserved),
        device_free_bytes: entries[oom].device_free(),
        most_reserved_bytes: bytes(most),
    })
}

/// Device `device`'s bytes reserved before its first entry, and the highest the segment events' running sum reaches
/// above that: the start is the final segments less the sum of the events, never less than what the trace frees
/// before it reserves.
fn reserved_walk(snapshot: &Snapshot, device: usize) -> (i128, i128) {
    let entries = snapshot.device_traces.get(device).map_or(&[][..], Vec::as_slice);
    let (mut sum, mut lowest, mut highest) = (0i128, 0i128, 0i128);
    for entry in entries {
        let change = entry.reserved_change();
        if change != 0 {
            sum += change;
            (lowest, highest) = (lowest.min(sum), highest.max(sum));
        }
    }
    let last: i128 = snapshot
        .segments
        .iter()
        .filter(|segment| segment.device as usize == device)
        .map(|segment| i128::from(segment.total_size))
        .sum();
    ((last - sum).max(-lowest), highest)
}

/// The bytes PyTorch held reserved on device `device` of `snapshot` before its first entry (see `device_overview`).
pub fn reserved_at_start(snapshot: &Snapshot, device: usize) -> u64 {
    u64::try_from(reserved_walk(snapshot, device).0).unwrap_or(u64::MAX)
}

/// The most bytes PyTorch held reserved on device `device` of `snapshot` over its recording (see `device_overview`).
pub fn recorded_peak_reserved(snapshot: &Snapshot, device: usize) -> u64 {
    let (start, highest) = reserved_walk(snapshot, device);
    u64::try_from(start + highest).unwrap_or(u64::MAX)
}

/// Why `device` of `snapshot` cannot be replayed — the file has no such device, or records nothing on it (no
/// trace entry, no segment) — with the devices it does record and their entries; `None` when it can. A snapshot
/// that records nothing at all replays (as an empty recording) on any device it lists.
pub fn missing_device(snapshot: &Snapshot, device: usize) -> Option<String> {
    // Present as `device_overview` counts it (a trace with entries, or a segment), told without its walk of every entry.
    let has_entries = snapshot.device_traces.get(device).is_some_and(|entries| !entries.is_empty());
    if has_entries || snapshot.segments.iter().any(|segment| segment.device as usize == device) {
        return None;
    }
    let overview = device_overview(snapshot);
    if overview.is_empty() {
        return (device >= snapshot.device_traces.len()).then(|| {
            format!(
                "no device {device}: the snapshot records no device ({} empty trace(s), no segment)",
                snapshot.device_traces.len()
            )
        });
    }
    let listed: Vec<String> = overview
        .iter()
        .map(|present| {
            let oom = if present.ooms > 0 { ", ran out of memory" } else { "" };
            match present.entries {
                0 => format!(
                    "device {} (no trace entries, {}{oom})",
                    present.device,
                    counted(present.segments, "segment", "segments")
                ),
                entries => format!("device {} ({}{oom})", present.device, counted(entries, "entry", "entries")),
            }
        })
        .collect();
    let what = if device < snapshot.device_traces.len() {
        format!("device {device} records nothing (no trace entries, no segments)")
    } else {
        format!("no device {device}")
    };
    Some(format!("{what}; the file records {}: choose one with --device N", listed.join(", ")))
}

/// `count` and what it counts, `one` or `many`: "1 segment", "154 segments".
pub fn counted(count: u64, one: &str, many: &str) -> String {
    if count == 1 { format!("1 {one}") } else { format!("{count} {many}") }
}

/// The device a snapshot opens on when none is named, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DefaultDevice {
    /// The device.
    pub device: usize,
    /// Why it: `"it ran out of memory"`, `"the most trace entries"`, `"the first device with segments"` (a state
    /// with no trace) or `"the only device"`.
    pub why: &'static str,
}

/// The devices of `snapshot` whose trace has an out-of-memory entry, in order.
pub fn devices_with_oom(snapshot: &Snapshot) -> Vec<usize> {
    (0..snapshot.device_traces.len())
        .filter(|&device| snapshot.device_traces[device].iter().any(|entry| entry.action == Action::Oom))
        .collect()
}

/// The device `snapshot` opens on when none is named: the first with an `oom` entry (where the story is), else the
/// busiest ([`busiest_device`]).
pub fn default_device(snapshot: &Snapshot) -> DefaultDevice {
    // Without the overview's walk of every entry for the reserved bytes: the entries' count and the first oom.
    if let Some(&device) = devices_with_oom(snapshot).first() {
        return DefaultDevice { device, why: "it ran out of memory" };
    }
    let devices = present_devices(snapshot);
    let entries = |device: usize| snapshot.device_traces.get(device).map_or(&[][..], Vec::as_slice);
    // The most entries, the lowest of equals: a state with no trace opens on its first device with segments.
    let busiest = devices.iter().copied().max_by_key(|&device| (entries(device).len(), std::cmp::Reverse(device)));
    let why = match busiest {
        _ if devices.len() < 2 => "the only device",
        Some(busiest) if entries(busiest).is_empty() => "the first device with segments",
        _ => "the most trace entries",
    };
    DefaultDevice { device: busiest.unwrap_or(0), why }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_core::trace::Event;
    use heapscope_pytorch::TraceEntry;

    fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
        TraceEntry::new(action, addr, size)
    }

    /// A large-pool segment of `device` at `address`, `total_size` bytes, holding `blocks`.
    fn segment(device: u32, address: u64, total_size: u64, blocks: Vec<heapscope_pytorch::Block>) -> heapscope_pytorch::Segment {
        heapscope_pytorch::Segment::from_blocks(device, address, total_size, heapscope_pytorch::Pool::Large, blocks)
    }

    /// A snapshot records no `empty_cache()` call: one the emulation of the recorded run tells apart from the
    /// allocator's own releases is an event of every contender's stream, at its first segment entry (the heaps kept
    /// their cache and ran out where `pytorch` did not); a release the allocator made for its next request is none.
    #[test]
    fn the_users_empty_cache_calls_are_events_of_every_contender() {
        const MIB: u64 = 1 << 20;
        let (a, b) = (0x7f00_0000_0000, 0x7f10_0000_0000);
        let trace = |device_free: Option<u64>| {
            let mut entries = vec![
                entry(Action::SegmentAlloc, a, 150 * MIB),
                entry(Action::Alloc, a, 150 * MIB),
                entry(Action::FreeRequested, a, 150 * MIB),
                entry(Action::FreeCompleted, a, 150 * MIB),
                entry(Action::SegmentFree, a, 150 * MIB),
                entry(Action::SegmentAlloc, b, 200 * MIB),
                entry(Action::Alloc, b, 200 * MIB),
            ];
            if let Some(free) = device_free {
                // A device of 200 MiB + `free`: 150 MiB cached beside 200 MiB more passes 300 MiB, not 400 MiB.
                let mut oom = entry(Action::Oom, 0, 1 << 30);
                oom.set_device_free(Some(free));
                entries.push(oom);
            }
            let blocks = vec![heapscope_pytorch::Block::new(b, 200 * MIB, 200 * MIB, BlockState::ActiveAllocated)];
            Snapshot { segments: vec![segment(0, b, 200 * MIB, blocks)], device_traces: vec![entries], ..Snapshot::default() }
        };
        // (the device's free bytes at the oom, the user's calls)
        let cases: [(Option<u64>, &[usize]); 3] = [(None, &[4]), (Some(200 * MIB), &[4]), (Some(100 * MIB), &[])];
        for (device_free, calls) in cases {
            let recording = Recording::from_snapshot("t.pickle", trace(device_free), 0).unwrap();
            assert_eq!(&recording.empty_caches[..], calls, "{device_free:?}");
            let events = recording.trace.events();
            let made: Vec<u64> = (0..events.len())
                .filter(|&event| events[event] == Event::EmptyCache)
                .map(|event| recording.entry_of(event as u64))
                .collect();
            assert_eq!(made, calls.iter().map(|&entry| entry as u64).collect::<Vec<_>>(), "{device_free:?}");
            // On 300 MiB the user's call makes room for every contender; without one, a heap whose rule keeps its cache
            // runs out where PyTorch's allocator gives its cache back for the request (its own rule) and paged unmapped
            // at the free.
            let config = crate::compare::CompareConfig {
                capacity_bytes: Some(300 * MIB),
                heap: heapscope_core::HeapConfig {
                    release: heapscope_core::ReleaseRule::Never,
                    ..heapscope_core::HeapConfig::new(heapscope_core::PolicyKind::Tlsf)
                },
                ..crate::compare::CompareConfig::default()
            };
            let contenders = [
                crate::contender::Contender::Pytorch { expandable: false },
                crate::contender::Contender::Pytorch { expandable: true },
                crate::contender::Contender::Heap(heapscope_core::PolicyKind::Tlsf),
                crate::contender::Contender::Paged,
            ];
            for contender in contenders {
                let crate::outcome::Outcome::Ran(figures) = crate::compare::replay(&recording, contender, &config).unwrap()
                else {
                    panic!("{contender:?} ran");
                };
                let refused = figures.ooms - u64::from(device_free.is_some());
                let heap = matches!(contender, crate::contender::Contender::Heap(_));
                assert_eq!(refused, u64::from(calls.is_empty() && heap), "{device_free:?}, {contender:?}: {figures:?}");
            }
        }
    }

    #[test]
    fn sniff_table() {
        let cases: [(&[u8], Format); 6] = [
            (&[0x1f, 0x8b, 8, 0], Format::PytorchSnapshot),
            (&[0x80, 4, 0x95], Format::PytorchSnapshot),
            (&[0x80, 2, b'}'], Format::PytorchSnapshot),
            (b"HSTRACE\0", Format::Native),
            (b"a,1,10\n", Format::Csv),
            (&[], Format::Csv),
        ];
        for (head, format) in cases {
            assert_eq!(sniff(head), format, "{head:?}");
        }
        // Formats it recognises and does not read, named.
        let foreign: [(&[u8], &str); 6] = [
            (b"PK\x03\x04\x14\0\0\0", "a zip archive, as `torch.save` writes"),
            (&[0x28, 0xb5, 0x2f, 0xfd, 0], "zstd-compressed"),
            (&[0xfd, b'7', b'z', b'X', b'Z', 0], "xz-compressed"),
            (b"BZh91AY&", "bzip2-compressed"),
            (b"{\"segments", "JSON"),
            (b"\n  [{\"a", "JSON"),
        ];
        for (head, named) in foreign {
            assert!(matches!(sniff(head), Format::Foreign { what, .. } if what == named), "{head:?}: {:?}", sniff(head));
        }
    }

    #[test]
    fn open_names_the_file_and_the_problem() {
        let dir = std::env::temp_dir().join(format!("heapscope-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.csv");
        std::fs::write(&empty, "").unwrap();
        let csv = dir.join("t.csv");
        std::fs::write(&csv, "a,1,100\nf,1\n").unwrap();
        assert!(matches!(Recording::open(&empty, 0), Err(OpenError::Empty { .. })));
        assert!(matches!(Recording::open(&csv, 1), Err(OpenError::NoSuchDevice { device: 1, .. })));
        assert_eq!(Recording::open_device(&csv, None).unwrap().device, 0, "a trace has one device");
        assert!(Recording::open(&dir.join("missing.csv"), 0).unwrap_err().to_string().contains("missing.csv"));
        assert_eq!(Recording::open(&csv, 0).unwrap().trace.events().len(), 2);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn pytorch_entries_become_events() {
        let snapshot = Snapshot {
            device_traces: vec![vec![
                entry(Action::SegmentAlloc, 4096, 2 << 20),
                entry(Action::Alloc, 4096, 100),
                entry(Action::FreeCompleted, 1 << 40, 7), // allocated before the recording
                entry(Action::FreeRequested, 4096, 100),
                entry(Action::FreeCompleted, 4096, 100),
                entry(Action::SegmentFree, 4096, 2 << 20),
                entry(Action::Snapshot, 0, 0),
                entry(Action::Oom, 0, 1 << 30),
            ]],
            ..Snapshot::default()
        };
        // Requests and frees of 0 bytes (PyTorch records none) are refused, naming the entry: every contender replays
        // the same stream (the heaps skipped what the emulation served).
        for (action, at) in [(Action::Alloc, 64), (Action::FreeRequested, 4096), (Action::FreeCompleted, 4096), (Action::Oom, 0)]
        {
            let mut zero = snapshot.clone();
            zero.device_traces[0].insert(4, entry(action, at, 0));
            let error = Recording::from_snapshot("t.pickle", zero.clone(), 0).unwrap_err().to_string();
            let said = format!("t.pickle: device_traces[0][4]: {} of 0 bytes at {at:#x}", action.as_str());
            assert!(error.contains(&said), "{error}");
            let emulated = heapscope_pytorch::caching::emulate(&zero, 0, &Default::default(), None).unwrap_err().to_string();
            assert!(emulated.contains(&format!("{} of 0 bytes", action.as_str())), "{emulated}");
        }
        // An address range past any device's (the emulation's limit, 2^62) is refused as the emulation refuses it; an
        // `oom` entry's probe id (from 2^64 - 1 down) cannot meet an address then.
        for (action, at, size) in
            [(Action::Alloc, (1 << 62) - 512, 1024), (Action::Alloc, u64::MAX, 1), (Action::FreeCompleted, 1 << 63, 7)]
        {
            let mut far = snapshot.clone();
            far.device_traces[0].insert(4, entry(action, at, size));
            let error = Recording::from_snapshot("t.pickle", far, 0).unwrap_err().to_string();
            let said =
                format!("device_traces[0][4]: {} of {size} bytes at {at:#x} ends past 0x4000000000000000", action.as_str());
            assert!(error.contains(&said), "{error}");
        }
        // A final segment past the limit too: its blocks would be the start's allocations.
        let mut far = snapshot.clone();
        far.segments = vec![segment(
            0,
            u64::MAX - 511,
            512,
            vec![heapscope_pytorch::Block::new(u64::MAX - 511, 512, 1, BlockState::ActiveAllocated)],
        )];
        let error = Recording::from_snapshot("t.pickle", far, 0).unwrap_err().to_string();
        assert!(error.contains("segments[0]") && error.contains("ranges must end by 0x4000000000000000"), "{error}");
        let recording = Recording::from_snapshot("t.pickle", snapshot, 0).unwrap();
        assert_eq!(
            recording.trace.events(),
            [
                Event::Alloc { slot: 0, size_bytes: 7 }, // live at the start: freed at entry 2
                Event::Alloc { slot: 1, size_bytes: 100 },
                Event::Free { slot: 0 },
                Event::Free { slot: 1 },
                Event::Alloc { slot: 2, size_bytes: 1 << 30 },
                Event::Free { slot: 2 },
            ]
        );
        assert_eq!(recording.entry_index, [0, 1, 2, 4, 7, 7]);
        assert_eq!((recording.start_events, recording.entries, recording.unknown_frees), (1, 8, 0));
        assert_eq!(recording.start_bytes(), 7);
        assert_eq!(recording.entry_of(4), 7);
        let moments: Vec<Moment> = (0..6).map(|event| recording.moment_of(event)).collect();
        assert_eq!(moments[..3], [Moment::Start, Moment::Entry(1), Moment::Entry(2)]);
    }

    #[test]
    fn the_start_state_is_the_final_blocks_and_the_trace_walked_backwards() {
        use heapscope_pytorch::Block;
        let block = Block::new;
        let segment = |device: u32, address: u64, blocks: Vec<Block>| segment(device, address, 2 << 20, blocks);
        let snapshot = Snapshot {
            segments: vec![
                segment(
                    0,
                    0,
                    vec![
                        block(0, 1024, 1000, BlockState::ActiveAllocated),  // live throughout
                        block(1024, 512, 512, BlockState::ActiveAllocated), // allocated by entry 1: not at the start
                        block(2048, 1024, 0, BlockState::Inactive),
                        block(4096, 512, 300, BlockState::ActivePendingFree), // live: its free is not completed
                    ],
                ),
                segment(1, 0, vec![block(0, 512, 512, BlockState::ActiveAllocated)]), // another device
            ],
            device_traces: vec![vec![
                entry(Action::FreeCompleted, 8192, 2000), // live at the start, freed here
                entry(Action::Alloc, 1024, 512),
                entry(Action::Alloc, 9000, 64),
                entry(Action::FreeCompleted, 9000, 64), // allocated in the recording: not at the start
            ]],
            ..Snapshot::default()
        };
        let recording = Recording::from_snapshot("t.pickle", snapshot, 0).unwrap();
        assert_eq!(recording.start_events, 3);
        assert_eq!(
            recording.trace.events()[..3],
            [
                Event::Alloc { slot: 0, size_bytes: 1000 },
                Event::Alloc { slot: 1, size_bytes: 300 },
                Event::Alloc { slot: 2, size_bytes: 2000 },
            ]
        );
        assert_eq!(recording.start_bytes(), 3300);
        assert_eq!(recording.trace.events()[3], Event::Free { slot: 2 }, "entry 0 frees a start allocation");
        assert_eq!(recording.moment_of(3), Moment::Entry(0));
        assert!(recording.final_mismatch.is_none(), "{:?}", recording.final_mismatch);
    }

    /// A start allocation's origin where frees carry the freeing code's stack (PyTorch's default): one whose free was
    /// requested and never completed keeps its final (pending-free) block's frames, one freed whole has none.
    #[test]
    fn a_start_allocation_pending_free_at_the_end_keeps_its_blocks_frames() {
        use heapscope_pytorch::Block;
        const MIB: u64 = 1 << 20;
        let (own, freeing, later) = (StackId(1), StackId(2), StackId(3));
        let block = |address, size, state, frames| Block { frames, ..Block::new(address, size, size, state) };
        // (the start allocation's end: its free's entries, its final block's state; the frames its origin has)
        let cases = [
            (vec![Action::FreeRequested], BlockState::ActivePendingFree, own),
            (vec![Action::FreeRequested, Action::FreeCompleted], BlockState::Inactive, StackId::NONE),
            (vec![Action::FreeCompleted], BlockState::Inactive, StackId::NONE),
        ];
        for (frees, state, expected) in cases {
            let mut entries: Vec<TraceEntry> =
                frees.iter().map(|&action| entry(action, 0, 8 * MIB).with_frames(freeing)).collect();
            entries.push(entry(Action::Alloc, 8 * MIB, 2 * MIB).with_frames(later));
            let blocks = vec![
                block(0, 8 * MIB, state, own),
                block(8 * MIB, 2 * MIB, BlockState::ActiveAllocated, later),
                Block::new(10 * MIB, 10 * MIB, 0, BlockState::Inactive),
            ];
            let snapshot =
                Snapshot { segments: vec![segment(0, 0, 20 * MIB, blocks)], device_traces: vec![entries], ..Snapshot::default() };
            let recording = Recording::from_snapshot("t", snapshot, 0).unwrap();
            let origins = recording.start_origins();
            assert_eq!(origins.len(), 1, "{frees:?}");
            let origin = origins[0].as_ref().unwrap();
            assert_eq!((origin.addr, origin.frames), (0, expected), "{frees:?}");
        }
    }

    /// What the trace leaves live is what the final segments show allocated; where not, the file contradicts itself.
    #[test]
    fn final_segments_that_disagree_with_the_end_of_the_trace_are_counted() {
        use heapscope_pytorch::Block;
        let live = |address| Block::new(address, 512, 512, BlockState::ActiveAllocated);
        let pending = |address| Block::new(address, 512, 512, BlockState::ActivePendingFree);
        let cases: Vec<(&str, Vec<Block>, Vec<TraceEntry>, FinalMismatch)> = vec![
            ("agree", vec![live(0), pending(512)], vec![entry(Action::Alloc, 0, 512)], FinalMismatch::default()),
            (
                "the segments emptied",
                vec![],
                vec![entry(Action::Alloc, 1024, 512), entry(Action::Alloc, 0, 512)],
                FinalMismatch { live_not_in_segments: 2, freed_but_allocated: 0, first_address: Some(0) },
            ),
            (
                "a block the trace freed still allocated",
                vec![live(0), live(1024)],
                vec![entry(Action::Alloc, 1024, 512), entry(Action::FreeCompleted, 1024, 512)],
                FinalMismatch { live_not_in_segments: 0, freed_but_allocated: 1, first_address: Some(1024) },
            ),
            (
                "both, on a recording that starts mid-run",
                vec![live(2048)],
                vec![entry(Action::FreeCompleted, 2048, 512), entry(Action::Alloc, 4096, 512)],
                FinalMismatch { live_not_in_segments: 1, freed_but_allocated: 1, first_address: Some(2048) },
            ),
        ];
        for (case, blocks, entries, expected) in cases {
            let snapshot =
                Snapshot { segments: vec![segment(0, 0, 2 << 20, blocks)], device_traces: vec![entries], ..Snapshot::default() };
            let recording = Recording::from_snapshot("t", snapshot, 0).unwrap();
            assert_eq!(recording.final_mismatch, expected, "{case}");
            assert_eq!(recording.final_mismatch.is_none(), expected == FinalMismatch::default(), "{case}");
        }
    }

    /// The stream built on the guess that nothing was live at the start is the one built after the walk back, whenever
    /// the guess is kept: hand-made cases (each way the guess fails, and one where it holds), and the shared snapshots
    /// whole (they start from an empty allocator) and cut at several entries (they then start mid-run).
    #[test]
    fn the_guess_of_an_empty_start_builds_what_the_walk_back_builds() {
        use heapscope_pytorch::Block;
        let walked_back = |snapshot: &Snapshot| {
            let entries = &snapshot.device_traces[0];
            let start = live_at_start(snapshot, 0, entries);
            let empty_caches = heapscope_pytorch::caching::user_empty_caches(snapshot, 0, None).unwrap_or_default();
            let built = Built::forward("t", 0, entries, &start, false, &empty_caches).unwrap().unwrap();
            (built.builder.finish(), built.entry_index, built.start_addresses, built.unknown_frees)
        };
        let check = |snapshot: Snapshot, starts_empty: bool| {
            let expected = walked_back(&snapshot);
            let recording = Recording::from_snapshot("t", snapshot, 0).unwrap();
            assert_eq!((recording.start_events == 0), starts_empty);
            assert_eq!((recording.trace, recording.entry_index, recording.start_addresses, recording.unknown_frees), expected);
        };
        let live = |address, size| segment(0, 0, 2 << 20, vec![Block::new(address, size, size, BlockState::ActiveAllocated)]);
        let snapshot = |segments: Vec<heapscope_pytorch::Segment>, entries: Vec<TraceEntry>| Snapshot {
            segments,
            device_traces: vec![entries],
            ..Snapshot::default()
        };
        let (alloc, free) = (Action::Alloc, Action::FreeCompleted);
        // (segments, entries, starts empty)
        let cases = [
            // Holds: every address allocated first, the final live block allocated in the trace.
            (vec![live(64, 32)], vec![entry(alloc, 0, 64), entry(alloc, 64, 32), entry(free, 0, 64)], true),
            // A free first: its allocation was live at the start.
            (Vec::new(), vec![entry(free, 0, 64), entry(alloc, 0, 64)], false),
            // A final block the trace never touches.
            (vec![live(4096, 100)], vec![entry(alloc, 0, 64)], false),
            // A final live block the trace freed (a contradiction the walk back settles).
            (vec![live(0, 64)], vec![entry(alloc, 0, 64), entry(free, 0, 64)], true),
            // An OOM's probe.
            (Vec::new(), vec![entry(alloc, 0, 64), entry(Action::Oom, 0, 1 << 40)], true),
        ];
        for (segments, entries, starts_empty) in cases {
            check(snapshot(segments, entries), starts_empty);
        }
        for name in ["frag_oom-default.pickle.gz", "gpt2_train_fixed-expandable.pickle.gz"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch").join(name);
            let whole = read_snapshot(&path).unwrap();
            check(whole.clone(), true);
            let len = whole.device_traces[0].len();
            for cut in [1, len / 3, len / 2, len - 1] {
                let mut mid_run = whole.clone();
                mid_run.device_traces[0].drain(..cut);
                let expected_empty = live_at_start(&mid_run, 0, &mid_run.device_traces[0]).is_empty();
                check(mid_run, expected_empty);
            }
        }
    }

    #[test]
    fn moments_parse_print_and_map_to_positions() {
        // (text, moment, position)
        let cases = [("start", Moment::Start, 0), ("0", Moment::Entry(0), 1), ("421", Moment::Entry(421), 422)];
        for (text, moment, position) in cases {
            assert_eq!(text.parse::<Moment>(), Ok(moment));
            assert_eq!((moment.position(), Moment::at_position(position)), (position, moment));
        }
        assert_eq!(Moment::Entry(60).to_string(), "entry 60");
        assert_eq!(Moment::Start.to_string(), "start");
        assert!("-1".parse::<Moment>().unwrap_err().to_string().contains("expected `start` or an entry number"));
    }

    #[test]
    fn the_busiest_device_has_the_most_entries() {
        let entries = |count: u64| (0..count).map(|addr| entry(Action::Alloc, addr * 512, 512)).collect::<Vec<_>>();
        // (entries per device, the busiest)
        let cases: [(&[u64], usize); 5] = [(&[], 0), (&[0], 0), (&[3, 5], 1), (&[0, 4, 4], 1), (&[7, 2, 6], 0)];
        for (counts, busiest) in cases {
            let snapshot =
                Snapshot { device_traces: counts.iter().map(|&count| entries(count)).collect(), ..Snapshot::default() };
            assert_eq!(busiest_device(&snapshot), busiest, "{counts:?}");
        }
    }

    /// A snapshot of three devices (issue 14, part 4): 0 busy, 1 out of memory, 2 a state with no trace (a
    /// segment only), 3 listed with nothing.
    fn three_devices() -> Snapshot {
        let segment = |device: u32, total_size: u64| segment(device, 1 << 32, total_size, Vec::new());
        Snapshot {
            segments: vec![segment(0, 20 << 20), segment(2, 2 << 20)],
            device_traces: vec![
                vec![
                    entry(Action::SegmentAlloc, 1 << 30, 40 << 20),
                    entry(Action::Alloc, 1 << 30, 1000),
                    entry(Action::FreeCompleted, 1 << 30, 1000),
                    entry(Action::SegmentFree, 1 << 30, 40 << 20),
                    entry(Action::SegmentAlloc, 1 << 32, 20 << 20),
                ],
                vec![entry(Action::SegmentAlloc, 1 << 30, 2 << 20), entry(Action::Oom, 0, 1 << 30)],
                Vec::new(),
                Vec::new(),
            ],
            ..Snapshot::default()
        }
    }

    #[test]
    fn the_overview_lists_every_device_that_records_something() {
        let overview = device_overview(&three_devices());
        // (device, entries, segments, peak reserved, OOMs, its line)
        let cases = [
            (0, 5, 1, 40 << 20, 0, "device 0: 5 entries, peak reserved 40.00 MiB, no OOM"),
            (1, 2, 0, 2 << 20, 1, "device 1: 2 entries, peak reserved 2.00 MiB, 1 OOM"),
            (
                2,
                0,
                1,
                2 << 20,
                0,
                "device 2: no trace entries (1 segment: a state with no trace), peak reserved 2.00 MiB, no OOM",
            ),
        ];
        assert_eq!(overview.len(), cases.len(), "device 3 records nothing: {overview:?}");
        for (got, (device, entries, segments, peak_reserved_bytes, ooms, line)) in overview.iter().zip(cases) {
            assert_eq!(*got, DeviceOverview { device, entries, segments, peak_reserved_bytes, ooms });
            assert_eq!(got.line(), line);
        }
        // A damaged file naming device 4,000,000,000, with segments whose sizes sum past 2^64: that one device.
        let mut damaged = three_devices();
        damaged.device_traces.clear();
        damaged.segments.iter_mut().for_each(|segment| (segment.device, segment.total_size) = (4_000_000_000, u64::MAX));
        let overview = device_overview(&damaged);
        assert_eq!(overview.iter().map(|device| (device.device, device.segments)).collect::<Vec<_>>(), [(4_000_000_000, 2)]);
        assert_eq!(overview[0].peak_reserved_bytes, u64::MAX);
    }

    /// A file whose traces list device 0 alone but whose segments name device 1 (its traces cut to the first) names
    /// the device either way; a file of one device does not.
    #[test]
    fn the_shown_name_names_the_device_where_the_file_has_several() {
        use heapscope_pytorch::{Pool, Segment};
        let segment = |device: u32| Segment::from_blocks(device, u64::from(device + 1) << 40, 2 << 20, Pool::Large, Vec::new());
        let trace = vec![vec![TraceEntry::new(Action::Alloc, 1 << 20, 512)]];
        let cut = Snapshot { device_traces: trace.clone(), segments: vec![segment(0), segment(1)], ..Snapshot::default() };
        for device in [0, 1] {
            let recording = Recording::from_snapshot("cut.pickle", cut.clone(), device).unwrap();
            assert_eq!(recording.shown_name(), format!("cut.pickle (device {device})"));
        }
        let one = Snapshot { device_traces: trace, segments: vec![segment(0)], ..Snapshot::default() };
        assert_eq!(Recording::from_snapshot("one.pickle", one, 0).unwrap().shown_name(), "one.pickle");
    }

    #[test]
    fn devices_a_file_lacks_are_errors_that_list_the_ones_it_has() {
        let listed = "the file records device 0 (5 entries), device 1 (2 entries, ran out of memory), device 2 (no trace \
                      entries, 1 segment): choose one with --device N";
        // (device asked, the error, or None when it replays)
        let cases = [
            (0, None),
            (1, None),
            (2, None),
            (3, Some(format!("t.pickle: device 3 records nothing (no trace entries, no segments); {listed}"))),
            (7, Some(format!("t.pickle: no device 7; {listed}"))),
        ];
        for (device, error) in cases {
            let opened = Recording::from_snapshot("t.pickle", three_devices(), device);
            assert_eq!(opened.as_ref().err().map(ToString::to_string), error, "device {device}");
            if let Ok(recording) = opened {
                assert_eq!(recording.shown_name(), format!("t.pickle (device {device})"));
            }
        }
        // A snapshot that records nothing replays, empty, on a device it lists.
        let empty = Snapshot { device_traces: vec![Vec::new()], ..Snapshot::default() };
        assert_eq!(Recording::from_snapshot("t.pickle", empty, 0).unwrap().shown_name(), "t.pickle");
    }

    #[test]
    fn the_default_device_ran_out_of_memory_else_is_the_busiest() {
        let alloc = |count: u64| (0..count).map(|addr| entry(Action::Alloc, addr * 512, 512)).collect::<Vec<_>>();
        let oom = |count: u64| {
            let mut entries = alloc(count);
            entries.push(entry(Action::Oom, 0, 1 << 30));
            entries
        };
        // (traces, the default device, why)
        let cases: Vec<(Vec<Vec<TraceEntry>>, usize, &str)> = vec![
            (vec![alloc(9), oom(1), alloc(3)], 1, "it ran out of memory"),
            (vec![oom(0), oom(5)], 0, "it ran out of memory"),
            (vec![alloc(3), alloc(5), alloc(5)], 1, "the most trace entries"),
            (vec![alloc(2)], 0, "the only device"),
            (vec![Vec::new(), alloc(2)], 1, "the only device"),
            (vec![], 0, "the only device"),
        ];
        for (traces, device, why) in cases {
            let snapshot = Snapshot { device_traces: traces, ..Snapshot::default() };
            assert_eq!(default_device(&snapshot), DefaultDevice { device, why }, "{:?}", snapshot.device_traces);
        }
        // A state with no trace opens on its first device with segments.
        assert_eq!(default_device(&three_devices()).device, 1);
        let mut state = three_devices();
        state.device_traces.iter_mut().for_each(Vec::clear);
        assert_eq!(default_device(&state), DefaultDevice { device: 0, why: "the first device with segments" });
        state.segments.remove(0);
        assert_eq!(default_device(&state), DefaultDevice { device: 2, why: "the only device" });
    }

    #[test]
    fn contradictions_and_missing_devices_are_named() {
        let twice =
            Snapshot { device_traces: vec![vec![entry(Action::Alloc, 8, 1), entry(Action::Alloc, 8, 1)]], ..Snapshot::default() };
        let message = Recording::from_snapshot("t.pickle", twice, 0).unwrap_err().to_string();
        assert!(message.contains("device_traces[0][1]") && message.contains("already live"), "{message}");
        let message = Recording::from_snapshot("t.pickle", Snapshot::default(), 1).unwrap_err().to_string();
        assert!(message.contains("no device 1"), "{message}");
    }
}
