//! The in-memory model of a PyTorch memory snapshot (`torch.cuda.memory._snapshot()`), as plain data.
//!
//! Field names follow PyTorch's keys so the schema reads alike on both sides; sizes and addresses are
//! `u64` bytes. Stack frames are interned: every distinct frame list is stored once in
//! [`Snapshot::frame_stacks`] and referred to by a [`StackId`] (a 1 GB file shares its frame lists through
//! the pickle memo; expanding them would explode in memory).

use std::fmt;
use std::sync::Arc;

/// Index of an interned frame list in [`Snapshot::frame_stacks`]. `StackId::NONE` (index 0, always the
/// empty list) for "no frames".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StackId(pub u32);

impl StackId {
    /// The empty frame list.
    pub const NONE: StackId = StackId(0);
}

/// Index of an interned category in [`Snapshot::categories`]. `CategoryId::NONE` (index 0, always
/// [`Category::none`]) for an entry that names none. 16 bits keep a trace entry at 48 bytes (a 1 GB file holds
/// millions); a file naming more distinct categories than that shares the last id among the rest
/// ([`Category::MORE`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CategoryId(pub u16);

impl CategoryId {
    /// No category.
    pub const NONE: CategoryId = CategoryId(0);
}

/// Index of a memory pool's id in [`Snapshot::pool_ids`]: what a trace entry's `pool_id` (PyTorch 2.12 and later) was.
/// `PoolId::DEFAULT` (index 0, always `(0, 0)`) for the allocator's own pools; the others are private pools, each a
/// CUDA graph's or a `torch.cuda.MemPool`'s. 8 bits keep a trace entry at 48 bytes; a file naming more private pools
/// than that shares the last id among the rest ([`PoolId::MORE`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PoolId(pub u8);

impl PoolId {
    /// The allocator's own pools: `(0, 0)`.
    pub const DEFAULT: PoolId = PoolId(0);
    /// The id shared by the private pools past the 254th distinct one ([`Snapshot::pool_ids`] holds the first of them
    /// there).
    pub const MORE: PoolId = PoolId(u8::MAX);
}

/// The key of a trace entry a category was read from. An entry naming several takes the first of this order: the
/// profiler path's `category`, then `user_metadata` (what `torch.cuda.memory._set_memory_metadata` labels the
/// entries after it with), then `compile_context` (the `torch.compile` region). PyTorch's defaults (`""` and
/// `"N/A"`) name no category.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum CategoryKey {
    /// `category`.
    #[default]
    Category,
    /// `user_metadata`.
    UserMetadata,
    /// `compile_context`.
    CompileContext,
}

impl CategoryKey {
    /// Every key, first to last in precedence.
    pub const ALL: [CategoryKey; 3] = [CategoryKey::Category, CategoryKey::UserMetadata, CategoryKey::CompileContext];

    /// The entry's key.
    pub fn as_str(self) -> &'static str {
        match self {
            CategoryKey::Category => "category",
            CategoryKey::UserMetadata => "user_metadata",
            CategoryKey::CompileContext => "compile_context",
        }
    }

    /// Whether `text` under any of the keys names a category: not empty and not PyTorch's `"N/A"`.
    pub fn names_one(text: &str) -> bool {
        !text.is_empty() && text != "N/A"
    }
}

/// What a trace entry is labelled with: where the program was (a phase it named, a compiled region), for colouring
/// and grouping alongside the stack frames.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Category {
    /// The entry's key it came from.
    pub key: CategoryKey,
    /// Its text.
    pub name: Arc<str>,
}

impl Category {
    /// The name of the id shared by the categories past the 65,534th distinct one (ids are 16 bits, 0 is none). It
    /// keeps the key of the first of them; its display names none (the rest may come from every key).
    pub const MORE: &'static str = "(categories past the 65,534th distinct one)";

    /// [`Snapshot::categories`]`[0]`: no category.
    pub fn none() -> Self {
        Self::default()
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if &*self.name == Self::MORE {
            return f.write_str(Self::MORE);
        }
        write!(f, "{}: {}", self.key.as_str(), self.name)
    }
}

/// One Python stack frame. Its strings are shared: the import holds each distinct str of the file once, however many
/// frames and frame lists refer to it (a file name shared through the pickle memo by every frame of a 1 GB file).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Frame {
    /// Source file.
    pub filename: Arc<str>,
    /// Line number; -1 when Python knew none (PyTorch writes that as 2^64 - 1, its C++ `uint64_t` of -1; the
    /// import reads it back as -1, see `import`).
    pub line: i64,
    /// Function name.
    pub name: Arc<str>,
}

/// The pool a segment or block belongs to (`segment_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Pool {
    /// Requests of at most 1 MiB (`kSmallSize`), served from 2 MiB segments.
    Small,
    /// Everything else.
    Large,
}

/// State of a block in a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum BlockState {
    /// `active_allocated`: handed out.
    ActiveAllocated,
    /// `active_pending_free`: freed by the caller, waiting for stream events.
    ActivePendingFree,
    /// `inactive`: free, cached.
    Inactive,
}

/// A block (an allocation or a cached free range) inside a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Block {
    /// Device address.
    pub address: u64,
    /// Bytes (rounded).
    pub size: u64,
    /// Bytes the caller asked for (`size` when the file does not say).
    pub requested_size: u64,
    /// State.
    pub state: BlockState,
    /// Where it was allocated.
    pub frames: StackId,
}

/// A segment (one `cudaMalloc`, or the mapped part of an expandable segment) at the end of the recording.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Segment {
    /// CUDA device index.
    pub device: u32,
    /// Base address.
    pub address: u64,
    /// Bytes reserved (mapped, for an expandable segment).
    pub total_size: u64,
    /// Bytes in `active_allocated` blocks.
    pub allocated_size: u64,
    /// Bytes in active blocks.
    pub active_size: u64,
    /// Bytes requested by the active blocks' callers.
    pub requested_size: u64,
    /// CUDA stream (the pointer value, 0 for the default stream).
    pub stream: u64,
    /// Pool.
    pub segment_type: Pool,
    /// Memory pool id (`(0, 0)` for the default pool; CUDA graphs use others).
    pub segment_pool_id: (i64, i64),
    /// Part of an expandable segment.
    pub is_expandable: bool,
    /// Where the segment was allocated.
    pub frames: StackId,
    /// Blocks in address order, tiling the segment.
    pub blocks: Vec<Block>,
}

/// What a trace entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Action {
    /// A block was handed out at `addr`; `size` is the requested (unrounded) size.
    Alloc,
    /// The caller freed the block; the memory is not reusable yet.
    FreeRequested,
    /// The block went back to the pool.
    FreeCompleted,
    /// `cudaMalloc` of a segment.
    SegmentAlloc,
    /// `cudaFree` of a segment.
    SegmentFree,
    /// Pages mapped into an expandable segment.
    SegmentMap,
    /// Pages unmapped from an expandable segment.
    SegmentUnmap,
    /// `_snapshot()` was called.
    Snapshot,
    /// An annotation from the program (`record_function`'s name in the entry's frames), as PyTorch versions that
    /// record annotations in the trace write them (later ones keep them in `external_annotations`): no memory changes.
    UserDefined,
    /// An out-of-memory error; `size` is the request, `device_free` the driver's free bytes.
    Oom,
    /// An action this version of heapscope does not know (a later PyTorch's), read as a mark: nothing allocated or
    /// freed. Its name is kept in [`Snapshot::unknown_actions`], and said wherever the replay could depart there.
    Unknown,
}

impl Action {
    /// Every action PyTorch names (not [`Action::Unknown`]).
    pub const ALL: [Action; 10] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Snapshot,
        Action::UserDefined,
        Action::Oom,
    ];

    /// PyTorch's name of the action.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::UserDefined => "user_defined",
            Action::Oom => "oom",
            Action::Unknown => "unknown",
        }
    }

    /// Whether the entry only marks a moment (`snapshot`, `user_defined`, an action heapscope does not know): nothing
    /// is allocated or freed, and no segment event is its doing.
    pub fn is_mark(self) -> bool {
        matches!(self, Action::Snapshot | Action::UserDefined | Action::Unknown)
    }

    /// The action PyTorch calls `name`.
    pub fn from_name(name: &str) -> Option<Action> {
        Some(match name {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "user_defined" => Action::UserDefined,
            "oom" => Action::Oom,
            _ => return None,
        })
    }
}

/// One entry of a device's trace, in 48 bytes (a 1 GB file holds 14 million of them): its two optional numbers, the
/// time and the driver's free bytes, are read and set through [`TraceEntry::time_us`] and
/// [`TraceEntry::device_free`] (an `Option` of a 64-bit number takes 16 bytes; here each is absent as a value no
/// file holds: `i64::MIN` microseconds, 292,000 years before 1970, and `u64::MAX` bytes, past PyTorch's `int64_t`).
#[derive(Clone, PartialEq)]
pub struct TraceEntry {
    /// Address (0 for `oom` and `snapshot`).
    pub addr: u64,
    /// Bytes: requested size for alloc and free entries, segment bytes for segment entries, the request for
    /// `oom`.
    pub size: u64,
    /// CUDA stream.
    pub stream: u64,
    /// The time, [`NO_TIME_US`] when there is none.
    time_us: i64,
    /// The driver's free bytes, [`NO_DEVICE_FREE`] when there are none.
    device_free: u64,
    /// Where it happened.
    pub frames: StackId,
    /// What it was labelled with (see [`CategoryKey`]).
    pub category: CategoryId,
    /// What happened.
    pub action: Action,
    /// The memory pool it happened in (PyTorch 2.12's `pool_id`): [`PoolId::DEFAULT`], or a private pool of a CUDA
    /// graph or a `torch.cuda.MemPool`.
    pub pool_id: PoolId,
}

/// [`TraceEntry`]'s stored time when it has none.
const NO_TIME_US: i64 = i64::MIN;
/// [`TraceEntry`]'s stored driver's free bytes when it has none.
const NO_DEVICE_FREE: u64 = u64::MAX;

impl fmt::Debug for TraceEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceEntry")
            .field("action", &self.action)
            .field("addr", &self.addr)
            .field("size", &self.size)
            .field("stream", &self.stream)
            .field("time_us", &self.time_us())
            .field("device_free", &self.device_free())
            .field("frames", &self.frames)
            .field("category", &self.category)
            .field("pool_id", &self.pool_id)
            .finish()
    }
}

/// The fields as before the compact layout: `time_us` and `device_free` are `null` where absent.
#[cfg(feature = "serde")]
impl serde::Serialize for TraceEntry {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut entry = serializer.serialize_struct("TraceEntry", 9)?;
        entry.serialize_field("action", &self.action)?;
        entry.serialize_field("addr", &self.addr)?;
        entry.serialize_field("size", &self.size)?;
        entry.serialize_field("stream", &self.stream)?;
        entry.serialize_field("time_us", &self.time_us())?;
        entry.serialize_field("device_free", &self.device_free())?;
        entry.serialize_field("frames", &self.frames)?;
        entry.serialize_field("category", &self.category)?;
        entry.serialize_field("pool_id", &self.pool_id)?;
        entry.end()
    }
}

impl Block {
    /// A block at `address` of `size` bytes, `requested_size` of them asked for, in `state`, with no frames.
    pub fn new(address: u64, size: u64, requested_size: u64, state: BlockState) -> Self {
        Self { address, size, requested_size, state, frames: StackId::NONE }
    }
}

impl Segment {
    /// A segment of `device` at `address`, `total_size` bytes of `segment_type`'s pool on stream 0, tiled by `blocks`,
    /// its sizes summed from them as PyTorch sums them: allocated the blocks handed out, active those not yet back
    /// in the pool (pending frees too), requested what the active blocks' callers asked for. No frames, pool id 0.
    pub fn from_blocks(device: u32, address: u64, total_size: u64, segment_type: Pool, blocks: Vec<Block>) -> Self {
        let sum = |pick: &dyn Fn(&Block) -> Option<u64>| blocks.iter().filter_map(pick).sum();
        let allocated_size = sum(&|block| (block.state == BlockState::ActiveAllocated).then_some(block.size));
        let active_size = sum(&|block| (block.state != BlockState::Inactive).then_some(block.size));
        let requested_size = sum(&|block| (block.state != BlockState::Inactive).then_some(block.requested_size));
        Self {
            device,
            address,
            total_size,
            allocated_size,
            active_size,
            requested_size,
            stream: 0,
            segment_type,
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: StackId::NONE,
            blocks,
        }
    }
}

impl TraceEntry {
    /// An entry `action` at `addr` of `size` bytes on the default stream, with no time, driver free bytes or frames
    /// (what a trace without PyTorch's extras makes).
    pub fn new(action: Action, addr: u64, size: u64) -> Self {
        Self {
            addr,
            size,
            stream: 0,
            time_us: NO_TIME_US,
            device_free: NO_DEVICE_FREE,
            frames: StackId::NONE,
            category: CategoryId::NONE,
            action,
            pool_id: PoolId::DEFAULT,
        }
    }

    /// What it does to the bytes PyTorch holds reserved: a segment (or a mapped range) more or less, nothing for any
    /// other action.
    pub fn reserved_change(&self) -> i128 {
        match self.action {
            Action::SegmentAlloc | Action::SegmentMap => i128::from(self.size),
            Action::SegmentFree | Action::SegmentUnmap => -i128::from(self.size),
            _ => 0,
        }
    }

    /// Microseconds since the epoch (absent before PyTorch 2.1).
    pub fn time_us(&self) -> Option<i64> {
        (self.time_us != NO_TIME_US).then_some(self.time_us)
    }

    /// The driver's free bytes, for `oom`.
    pub fn device_free(&self) -> Option<u64> {
        (self.device_free != NO_DEVICE_FREE).then_some(self.device_free)
    }

    /// Sets the time (`None`, or `i64::MIN`, which no clock gives: none).
    pub fn set_time_us(&mut self, time_us: Option<i64>) {
        self.time_us = time_us.unwrap_or(NO_TIME_US);
    }

    /// Sets the driver's free bytes (`None`, or `u64::MAX`, past PyTorch's `int64_t`: none).
    pub fn set_device_free(&mut self, device_free: Option<u64>) {
        self.device_free = device_free.unwrap_or(NO_DEVICE_FREE);
    }

    /// The entry, as `action` at `addr` of `size` bytes (its stream, time, driver free bytes, frames and category kept).
    #[must_use]
    pub fn with(mut self, action: Action, addr: u64, size: u64) -> Self {
        (self.action, self.addr, self.size) = (action, addr, size);
        self
    }

    /// The entry on stream `stream`.
    #[must_use]
    pub fn with_stream(mut self, stream: u64) -> Self {
        self.stream = stream;
        self
    }

    /// The entry with the frames `frames`.
    #[must_use]
    pub fn with_frames(mut self, frames: StackId) -> Self {
        self.frames = frames;
        self
    }

    /// The entry labelled `category`.
    #[must_use]
    pub fn with_category(mut self, category: CategoryId) -> Self {
        self.category = category;
        self
    }

    /// The entry in the memory pool `pool_id`.
    #[must_use]
    pub fn with_pool_id(mut self, pool_id: PoolId) -> Self {
        self.pool_id = pool_id;
        self
    }

    /// The entry with the time `time_us`.
    #[must_use]
    pub fn with_time_us(mut self, time_us: Option<i64>) -> Self {
        self.set_time_us(time_us);
        self
    }

    /// The entry with the driver's free bytes `device_free`.
    #[must_use]
    pub fn with_device_free(mut self, device_free: Option<u64>) -> Self {
        self.set_device_free(device_free);
        self
    }
}

/// The allocator settings recorded in the file (`allocator_settings`).
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RecordedSettings {
    /// `PYTORCH_CUDA_ALLOC_CONF` as the process saw it.
    pub alloc_conf: String,
    /// `max_split_size` in bytes; `None` for unlimited (-1 or `SIZE_MAX` in the file).
    pub max_split_size: Option<u64>,
    /// `garbage_collection_threshold` (0 = off).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `roundup_power2_divisions`: (interval start in MiB, divisions), in the file's order; 0 = off.
    pub roundup_power2_divisions: Vec<(u64, u64)>,
}

/// A whole snapshot.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Snapshot {
    /// Segments at the end of the recording.
    pub segments: Vec<Segment>,
    /// One trace per device (outer index = device).
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// Allocator settings; `None` in files that predate them.
    pub settings: Option<RecordedSettings>,
    /// Interned frame lists; index 0 is the empty list.
    pub frame_stacks: Vec<Vec<Frame>>,
    /// Interned categories of the trace entries; index 0 is [`Category::none`] (empty when nothing names one).
    pub categories: Vec<Category>,
    /// The memory pools the trace entries name ([`TraceEntry::pool_id`]); index 0 is `(0, 0)`. Empty when the entries
    /// name none (every file before PyTorch 2.12): then every entry's is [`PoolId::DEFAULT`] as read, not as known.
    pub pool_ids: Vec<(i64, i64)>,
    /// The entries of actions heapscope does not know ([`Action::Unknown`]), with their names, by device and entry.
    pub unknown_actions: Vec<UnknownAction>,
    /// Set in a snapshot heapscope wrote of another contender's replay (`heapscope export --policy tlsf`): see
    /// [`ContenderExport`].
    pub contender_export: Option<ContenderExport>,
}

/// What a snapshot heapscope wrote of a contender other than PyTorch's caching allocator says of itself (the key
/// `heapscope_contender_export`): its segment events are that contender's blocks and pages, not PyTorch's, so the
/// user's `empty_cache()` calls cannot be told from them by emulating PyTorch (which took the contender's own releases
/// for such calls), and are listed instead.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ContenderExport {
    /// The contender replayed (`tlsf`, `paged`).
    pub contender: Arc<str>,
    /// By device, the entries of its trace before which the user called `empty_cache()`, in order (an entry twice for two
    /// calls in a row; the trace's length for a call after its last entry).
    pub empty_cache_entries: Vec<Vec<usize>>,
}

impl ContenderExport {
    /// The snapshot's top-level key that holds it.
    pub const KEY: &str = "heapscope_contender_export";
}

/// A trace entry of an action heapscope does not know: where it is and what the file calls it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct UnknownAction {
    /// The device whose trace holds it.
    pub device: usize,
    /// Its index in that trace.
    pub entry: usize,
    /// The action's name in the file.
    pub name: Arc<str>,
}

impl Snapshot {
    /// The name of `entry`, element `index` of device `device`'s trace, as the file wrote it: an action heapscope does
    /// not know keeps its own.
    pub fn action_name(&self, device: usize, index: usize, entry: &TraceEntry) -> &str {
        match entry.action {
            Action::Unknown => self
                .unknown_actions
                .binary_search_by_key(&(device, index), |unknown| (unknown.device, unknown.entry))
                .map_or("unknown", |found| &self.unknown_actions[found].name),
            action => action.as_str(),
        }
    }

    /// The same snapshot with its frame stacks numbered in order of first use (each segment, then its blocks,
    /// then the traces, device by device) and unused ones left out: snapshots that differ only in how their frame
    /// lists were interned (a snapshot read, written and read again) are equal in this form. Categories
    /// and memory pools are renumbered the same way (by first use in the traces).
    pub fn with_stacks_in_use_order(&self) -> Snapshot {
        let mut snapshot = self.clone();
        let mut order: Vec<Vec<Frame>> = vec![Vec::new()];
        let mut renumbered: std::collections::HashMap<StackId, StackId> = std::collections::HashMap::new();
        renumbered.insert(StackId::NONE, StackId::NONE);
        let mut renumber = |id: &mut StackId| {
            *id = *renumbered.entry(*id).or_insert_with(|| {
                order.push(self.frame_stacks.get(id.0 as usize).cloned().unwrap_or_default());
                StackId(u32::try_from(order.len() - 1).unwrap_or(u32::MAX))
            });
        };
        for segment in &mut snapshot.segments {
            renumber(&mut segment.frames);
            segment.blocks.iter_mut().for_each(|block| renumber(&mut block.frames));
        }
        snapshot.device_traces.iter_mut().flatten().for_each(|entry| renumber(&mut entry.frames));
        snapshot.frame_stacks = order;
        let mut order: Vec<Category> = vec![Category::none()];
        let mut renumbered: std::collections::HashMap<CategoryId, CategoryId> = std::collections::HashMap::new();
        renumbered.insert(CategoryId::NONE, CategoryId::NONE);
        for entry in snapshot.device_traces.iter_mut().flatten() {
            entry.category = *renumbered.entry(entry.category).or_insert_with(|| {
                order.push(self.categories.get(usize::from(entry.category.0)).cloned().unwrap_or_default());
                CategoryId(u16::try_from(order.len() - 1).unwrap_or(u16::MAX))
            });
        }
        snapshot.categories = if order.len() > 1 { order } else { Vec::new() };
        let mut order: Vec<(i64, i64)> = vec![(0, 0)];
        let mut renumbered: std::collections::HashMap<PoolId, PoolId> = std::collections::HashMap::new();
        renumbered.insert(PoolId::DEFAULT, PoolId::DEFAULT);
        for entry in snapshot.device_traces.iter_mut().flatten() {
            entry.pool_id = *renumbered.entry(entry.pool_id).or_insert_with(|| {
                order.push(self.pool_id(entry.pool_id));
                PoolId(u8::try_from(order.len() - 1).unwrap_or(u8::MAX))
            });
        }
        snapshot.pool_ids = if self.pool_ids.is_empty() { Vec::new() } else { order };
        snapshot
    }

    /// Whether the file itself shows expandable segments: a segment marked `is_expandable`, or a trace entry that
    /// maps or unmaps pages (`segment_map`, `segment_unmap`), which only expandable segments write. Files of
    /// PyTorch before 2.5 record no `allocator_settings`, so this is how their setting is known.
    pub fn shows_expandable_segments(&self) -> bool {
        self.segments.iter().any(|segment| segment.is_expandable)
            || self.device_traces.iter().flatten().any(|entry| matches!(entry.action, Action::SegmentMap | Action::SegmentUnmap))
    }

    /// The memory pool `id` names (`(0, 0)` for an id past the list).
    pub fn pool_id(&self, id: PoolId) -> (i64, i64) {
        self.pool_ids.get(usize::from(id.0)).copied().unwrap_or((0, 0))
    }

    /// The category `id` names ([`Category::none`]'s empty name for an id past the list).
    pub fn category(&self, id: CategoryId) -> Option<&Category> {
        (id != CategoryId::NONE).then(|| self.categories.get(usize::from(id.0))).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 1 GB file holds millions of entries: the category's 16-bit id fits the padding of the other fields.
    #[test]
    fn a_trace_entry_stays_at_64_bytes() {
        assert_eq!(size_of::<TraceEntry>(), 48);
    }

    #[test]
    fn categories_name_their_key_and_renumber_by_first_use() {
        let category = |key, name: &str| Category { key, name: name.into() };
        let snapshot = Snapshot {
            device_traces: vec![vec![
                TraceEntry { category: CategoryId(2), ..TraceEntry::new(Action::Alloc, 0, 1) },
                TraceEntry { category: CategoryId(1), ..TraceEntry::new(Action::Alloc, 8, 1) },
            ]],
            categories: vec![
                Category::none(),
                category(CategoryKey::CompileContext, "Torch-Compiled Region: 0/1"),
                category(CategoryKey::UserMetadata, "forward"),
                category(CategoryKey::Category, "unused"),
            ],
            ..Snapshot::default()
        };
        assert_eq!(snapshot.category(CategoryId(2)).map(ToString::to_string).as_deref(), Some("user_metadata: forward"));
        assert_eq!(snapshot.category(CategoryId::NONE), None);
        assert_eq!(snapshot.category(CategoryId(9)), None);
        let renumbered = snapshot.with_stacks_in_use_order();
        let names: Vec<&str> = renumbered.categories.iter().map(|category| &*category.name).collect();
        assert_eq!(names, ["", "forward", "Torch-Compiled Region: 0/1"], "by first use, the unused one left out");
        assert_eq!(renumbered.device_traces[0][0].category, CategoryId(1));
        for (text, names) in [("", false), ("N/A", false), ("forward", true)] {
            assert_eq!(CategoryKey::names_one(text), names, "{text:?}");
        }
    }
}
