//! The snapshot a replay would have recorded: a recording replayed through a heap or a paged heap,
//! written down in PyTorch's schema so PyTorch's own viewer (memory_viz) shows how that contender lays out
//! the same run.
//!
//! Every allocation becomes an `alloc` entry at its address, every free a `free_requested` and
//! `free_completed` pair, every block the heap reserves or releases a `segment_alloc` / `segment_free`
//! (pages a paged heap maps or unmaps: `segment_map` / `segment_unmap`), and a refused request an `oom`
//! entry. Stream, time and stack frames come from the recording's own entry where it has one (an allocation live
//! when a recording begun mid-run started is written first, with the stream and stack of its free or final block and
//! no time), except that the heap's memory, which serves every stream, is on one: its segments and segment events
//! take the stream of the recording's first allocation. The final segments list the heap's blocks (a paged heap's mapped runs, marked
//! expandable) tiled by their blocks.

use std::collections::BTreeMap;

use crate::compare::CompareConfig;
use crate::contender::Contender;
use crate::driver::{HeapTarget, Observer, Step, Stream, drive};
use crate::recording::{Moment, Recording};
use heapscope_core::RangeReport;
use heapscope_core::hash::FastMap;
use heapscope_core::trace::Event;
use heapscope_core::{DeviceEvent, DeviceHeap, Error, RangeState, Result};
use heapscope_pytorch::caching::{SMALL_BUFFER_BYTES, SMALL_SIZE_BYTES};
use heapscope_pytorch::{
    Action, AllocConf, BackingRefused, Block, BlockState, CachingAllocator, ContenderExport, EntryEffect, MemoryStats, Pool,
    PoolId, RecordedSettings, Segment, SegmentBacking, Snapshot, StackId, StatArray, TraceEntry, UnknownAction,
};

/// Where a paged heap's virtual range starts in exported addresses.
pub const PAGED_BASE_ADDRESS: u64 = 0x7e00_0000_0000;

/// Writes entries in PyTorch's schema, borrowing stream, time and frames from the recording.
struct Writer<'a> {
    recording: &'a Recording,
    entries: Vec<TraceEntry>,
    /// The stream the contender's blocks or pages are written on ([`heap_stream`]).
    heap_stream: u64,
    /// What each allocation live at the start would have been recorded with ([`Recording::start_origins`]).
    start_origins: Vec<Option<TraceEntry>>,
    /// The entries written before which the recording's user called `empty_cache()` ([`ContenderExport`]).
    empty_caches: Vec<usize>,
    /// The recording's entries of actions heapscope does not know, as written (with their names).
    unknown_actions: Vec<UnknownAction>,
}

/// The stream a heap or paged contender's memory is written on: one heap serves every stream, while PyTorch keeps each
/// segment (and each expandable reservation) to one; its segments, and the segment events that make them, all take
/// the stream of the recording's first allocation, so that a reader grouping memory by stream sees one heap.
fn heap_stream(recording: &Recording) -> u64 {
    recording
        .snapshot
        .as_ref()
        .and_then(|snapshot| snapshot.device_traces.get(recording.device))
        .and_then(|entries| entries.iter().find(|entry| entry.action == Action::Alloc))
        .map_or(0, |entry| entry.stream)
}

impl<'a> Writer<'a> {
    fn new(recording: &'a Recording) -> Self {
        Self {
            recording,
            entries: Vec::with_capacity(recording.trace.events().len() * 2),
            heap_stream: heap_stream(recording),
            start_origins: recording.start_origins(),
            empty_caches: Vec::new(),
            unknown_actions: Vec::new(),
        }
    }

    /// Writes entry `index` of the recording as it is when heapscope does not know its action (with its name): it is
    /// no event of the stream, and a reader of the file may know it.
    fn unknown(&mut self, index: u64) {
        let (Some(snapshot), Some(entry)) = (&self.recording.snapshot, self.recording.trace_entry(index)) else { return };
        if entry.action == Action::Unknown {
            let device = self.recording.device;
            let name = snapshot.action_name(device, index as usize, entry);
            self.unknown_actions.push(UnknownAction { device, entry: self.entries.len(), name: name.into() });
            self.entries.push(entry.clone());
        }
    }

    fn push(&mut self, action: Action, addr: u64, size: u64, event: usize, device_free: Option<u64>) {
        let original = match self.recording.moment_of(event as u64) {
            Moment::Entry(index) => self.recording.trace_entry(index),
            // An allocation live at the start comes from no entry: what its free or final block says of it.
            Moment::Start => self.start_origins.get(event).and_then(Option::as_ref),
        };
        let entry = TraceEntry::new(action, addr, size).with_device_free(device_free);
        self.entries.push(match original {
            Some(original) => entry
                .with_stream(original.stream)
                .with_time_us(original.time_us())
                .with_frames(original.frames)
                .with_category(original.category),
            None => entry,
        });
    }

    fn device_events(&mut self, events: &[DeviceEvent], offset: u64, event: usize) {
        for &device_event in events {
            let (action, address, size_bytes) = segment_entry(device_event);
            self.push(action, address + offset, size_bytes, event, None);
            if let Some(entry) = self.entries.last_mut() {
                entry.stream = self.heap_stream;
            }
        }
    }
}

/// A device event as the segment entry PyTorch records for it: action, address, bytes.
fn segment_entry(event: DeviceEvent) -> (Action, u64, u64) {
    match event {
        DeviceEvent::Reserved { address, size_bytes } => (Action::SegmentAlloc, address, size_bytes),
        DeviceEvent::Released { address, size_bytes } => (Action::SegmentFree, address, size_bytes),
        DeviceEvent::Mapped { address, size_bytes } => (Action::SegmentMap, address, size_bytes),
        DeviceEvent::Unmapped { address, size_bytes } => (Action::SegmentUnmap, address, size_bytes),
    }
}

/// Blocks tiling the `window` `[start, end)` of a layout (offsets in the layout's own range), at addresses
/// shifted by `address_base`.
fn blocks_of(ranges: &[RangeReport], window: (u64, u64), address_base: u64) -> Vec<Block> {
    let (start, end) = window;
    let mut blocks: Vec<Block> = Vec::new();
    let mut previous_allocation = None;
    for range in ranges.iter().filter(|range| range.end() > start && range.offset < end) {
        let offset = range.offset.max(start);
        let size = range.end().min(end) - offset;
        let live = matches!(range.state, RangeState::Live | RangeState::Padding);
        match blocks.last_mut() {
            // The padding after a live range, or the live range after its leading padding.
            Some(block) if live && range.allocation.is_some() && range.allocation == previous_allocation => {
                block.size += size;
                if range.state == RangeState::Live {
                    block.requested_size = size;
                    block.state = BlockState::ActiveAllocated;
                }
            }
            _ => blocks.push(Block {
                address: address_base + offset,
                size,
                requested_size: if range.state == RangeState::Live { size } else { 0 },
                state: if live { BlockState::ActiveAllocated } else { BlockState::Inactive },
                frames: StackId::NONE,
            }),
        }
        previous_allocation = range.allocation;
    }
    blocks
}

fn segment(address: u64, total_size: u64, blocks: Vec<Block>, is_expandable: bool, device: usize, stream: u64) -> Segment {
    let allocated_size = blocks.iter().filter(|block| block.state == BlockState::ActiveAllocated).map(|block| block.size).sum();
    let requested_size = blocks.iter().map(|block| block.requested_size).sum();
    Segment {
        device: u32::try_from(device).unwrap_or(u32::MAX),
        address,
        total_size,
        allocated_size,
        active_size: allocated_size,
        requested_size,
        stream,
        segment_type: if total_size <= SMALL_BUFFER_BYTES && !is_expandable { Pool::Small } else { Pool::Large },
        segment_pool_id: (0, 0),
        is_expandable,
        frames: StackId::NONE,
        blocks,
    }
}

/// `torch.cuda.memory_stats()` counters kept along a heap or paged replay. Pools follow PyTorch's rules:
/// requests up to 1 MiB (`kSmallSize`) are small-pool, blocks up to 2 MiB (`kSmallBuffer`) small-pool
/// segments, a paged heap's mapped pages one large-pool block. "Non-releasable" (`inactive_split`) is the
/// free memory inside blocks that hold a live allocation, counted once per such block with free bytes.
///
/// The device events of a step and its allocation or free change the blocks together (counted at
/// [`StatsRecorder::settle`], once the step is done): pages mapped for a request are never counted free before the
/// request takes them.
#[derive(Default)]
struct StatsRecorder {
    stats: MemoryStats,
    /// Block base -> its use.
    blocks: FastMap<u64, BlockUse>,
    /// The blocks the step being recorded changed: base, non-releasable bytes and count before it, small-pool.
    changed: Vec<(u64, (u64, u64), bool)>,
}

/// One block's size and what lives in it.
#[derive(Clone, Copy, Default)]
struct BlockUse {
    size_bytes: u64,
    footprint_bytes: u64,
    /// Free bytes of it held only as a cache ([`DeviceHeap::cached_bytes`]): releasable.
    cached_bytes: u64,
    live: u64,
    /// Its pool, fixed when it is reserved.
    small: bool,
}

impl BlockUse {
    /// Non-releasable bytes and count.
    fn non_releasable(self) -> (u64, u64) {
        let free = self.size_bytes.saturating_sub(self.footprint_bytes).saturating_sub(self.cached_bytes);
        if self.live > 0 && free > 0 { (free, 1) } else { (0, 0) }
    }
}

/// Moves `stat` from `before` to `after`, so its totals count the change once.
fn step_to(stat: &mut StatArray, small: bool, before: u64, after: u64) {
    if after > before {
        stat.increase(small, after - before);
    } else if before > after {
        stat.decrease(small, before - after);
    }
}

impl StatsRecorder {
    /// Applies `change` to block `base`; the non-releasable counters follow at [`StatsRecorder::settle`].
    fn update_block(&mut self, base: u64, change: impl FnOnce(&mut BlockUse)) {
        let block = self.blocks.entry(base).or_default();
        let before = block.non_releasable();
        change(block);
        let small = block.small;
        // A step changes a block or two (a free and the unmap it causes): a short list.
        if !self.changed.iter().any(|&(changed, ..)| changed == base) {
            self.changed.push((base, before, small));
        }
    }

    /// The paged heap's block (base 0) now holds `cached_bytes` of free pages as a cache: releasable, so not counted
    /// non-releasable. A heap's is always 0, and changes nothing.
    fn cached(&mut self, cached_bytes: u64) {
        if self.blocks.get(&0).map_or(0, |block| block.cached_bytes) != cached_bytes {
            self.update_block(0, |block| block.cached_bytes = cached_bytes);
        }
    }

    /// Counts the net change of every block the step changed in the non-releasable counters: decreases first, so
    /// that no peak is reached only between two changes of one step.
    fn settle(&mut self) {
        let after = |blocks: &FastMap<u64, BlockUse>, base: u64| blocks.get(&base).map_or((0, 0), |block| block.non_releasable());
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable_by_key(|&(base, before, _)| (after(&self.blocks, base).0 > before.0, base));
        for &(base, (before_bytes, before_count), small) in &changed {
            let (after_bytes, after_count) = after(&self.blocks, base);
            step_to(&mut self.stats.inactive_split_bytes, small, before_bytes, after_bytes);
            step_to(&mut self.stats.inactive_split, small, before_count, after_count);
        }
        changed.clear();
        self.changed = changed;
    }

    /// An allocation of `requested_bytes` (`footprint_bytes` set aside) in block `base` (`served`), or
    /// its free.
    fn allocation(&mut self, base: u64, footprint_bytes: u64, requested_bytes: u64, served: bool) {
        // The pool of its block, as PyTorch's small requests live in its small segments: reserved and allocated bytes
        // then agree (a heap's blocks are all larger than a small segment, and a small pool of allocations above an
        // empty small pool of reserved memory read as impossible). A block not seen reserved: by the request's size.
        let small = self.blocks.get(&base).map_or(requested_bytes <= SMALL_SIZE_BYTES, |block| block.small);
        let stats = &mut self.stats;
        let arrays = [
            (&mut stats.allocation, 1),
            (&mut stats.active, 1),
            (&mut stats.allocated_bytes, footprint_bytes),
            (&mut stats.active_bytes, footprint_bytes),
            (&mut stats.requested_bytes, requested_bytes),
        ];
        for (array, amount) in arrays {
            if served { array.increase(small, amount) } else { array.decrease(small, amount) }
        }
        self.update_block(base, |block| {
            if served {
                block.footprint_bytes += footprint_bytes;
                block.live += 1;
            } else {
                block.footprint_bytes -= footprint_bytes;
                block.live -= 1;
            }
        });
    }

    /// The counters of allocations and their bytes, whose totals a move leaves as they were.
    fn allocation_counters(&mut self) -> [&mut StatArray; 5] {
        let stats = &mut self.stats;
        [
            &mut stats.allocation,
            &mut stats.active,
            &mut stats.allocated_bytes,
            &mut stats.active_bytes,
            &mut stats.requested_bytes,
        ]
    }

    /// The totals (`Tot Alloc`, `Tot Freed`) of the allocation counters, for [`StatsRecorder::restore_totals`].
    fn totals(&mut self) -> [[(i64, i64); 3]; 5] {
        self.allocation_counters().map(|array| array.0.map(|stat| (stat.allocated, stat.freed)))
    }

    /// Puts back `totals` after a move, written as the free of an allocation and its allocation elsewhere: the current
    /// and peak counters follow it, the totals do not, as the move serves no request.
    fn restore_totals(&mut self, totals: [[(i64, i64); 3]; 5]) {
        for (array, kept) in self.allocation_counters().into_iter().zip(totals) {
            for (stat, (allocated, freed)) in array.0.iter_mut().zip(kept) {
                (stat.allocated, stat.freed) = (allocated, freed);
            }
        }
    }

    /// A device event: blocks change their own entry, page runs the one block of a paged heap (base 0).
    fn device(&mut self, event: DeviceEvent) {
        let stats = &mut self.stats;
        match event {
            DeviceEvent::Reserved { address, size_bytes } => {
                let small = size_bytes <= SMALL_BUFFER_BYTES;
                stats.segment.increase(small, 1);
                stats.reserved_bytes.increase(small, size_bytes);
                stats.num_device_alloc += 1;
                self.update_block(address, |block| *block = BlockUse { size_bytes, small, ..*block });
            }
            DeviceEvent::Released { address, size_bytes } => {
                let small = size_bytes <= SMALL_BUFFER_BYTES;
                stats.segment.decrease(small, 1);
                stats.reserved_bytes.decrease(small, size_bytes);
                stats.num_device_free += 1;
                self.update_block(address, |block| block.size_bytes = 0);
                self.blocks.remove(&address);
            }
            // A paged heap's range is one segment while anything is mapped in it, as an expandable segment is.
            DeviceEvent::Mapped { size_bytes, .. } => {
                stats.reserved_bytes.increase(false, size_bytes);
                stats.num_device_alloc += 1;
                if self.blocks.get(&0).is_none_or(|block| block.size_bytes == 0) {
                    self.stats.segment.increase(false, 1);
                }
                self.update_block(0, |block| block.size_bytes += size_bytes);
            }
            DeviceEvent::Unmapped { size_bytes, .. } => {
                stats.reserved_bytes.decrease(false, size_bytes);
                stats.num_device_free += 1;
                self.update_block(0, |block| block.size_bytes -= size_bytes);
                if self.blocks.get(&0).is_some_and(|block| block.size_bytes == 0) {
                    self.stats.segment.decrease(false, 1);
                }
            }
        }
    }
}

/// A replay written down: the snapshot it would have recorded and PyTorch's counters for it.
#[derive(Clone, Debug)]
pub struct Replayed {
    /// The snapshot, in PyTorch's schema.
    pub snapshot: Snapshot,
    /// `torch.cuda.memory_stats()` at the end of the replay.
    pub stats: MemoryStats,
    /// A heap contender's final layout, from the same run (what `--vma-json` writes); `None` for the others.
    pub heap_report: Option<heapscope_core::HeapReport>,
    /// PyTorch's emulation under the recorded settings: how its decisions compare with the recorded ones (`None` for a
    /// what-if and the other contenders).
    pub fidelity: Option<heapscope_pytorch::Fidelity>,
}

/// Replays `recording` through a heap or paged contender and returns the snapshot it would have
/// recorded (device `recording.device`, frames shared with the recording's snapshot).
///
/// # Errors
/// [`Error::InvalidConfig`] for the `pytorch` contender (its own emulation exports itself) or invalid
/// settings; a contender bug on free.
pub fn replayed_snapshot(recording: &Recording, contender: Contender, config: &CompareConfig) -> Result<Replayed> {
    let mut writer = Writer::new(recording);
    let stream = writer.heap_stream;
    let mut recorder = StatsRecorder::default();
    let frame_stacks = recording.snapshot.as_ref().map_or_else(|| vec![Vec::new()], |snapshot| snapshot.frame_stacks.clone());
    let device = recording.device;
    let mut heap_report = None;
    let (mut segments, stacks): (Vec<Segment>, _) = match contender {
        Contender::Heap(kind) => {
            let mut heap = config.heap(kind)?;
            let stacks = replay_device_heap(&mut heap, 0, recording, config, &mut writer, &mut recorder)?;
            let report = heap_report.insert(heap.report());
            let segments = report
                .blocks
                .iter()
                .map(|block| {
                    let blocks = blocks_of(&block.layout.ranges, (0, block.size_bytes), block.base_address);
                    segment(block.base_address, block.size_bytes, blocks, false, device, stream)
                })
                .collect();
            (segments, stacks)
        }
        Contender::Paged => {
            let mut heap = config.paged_heap()?;
            let stacks = replay_device_heap(&mut heap, PAGED_BASE_ADDRESS, recording, config, &mut writer, &mut recorder)?;
            let layout = heap.report();
            let segments = heap
                .mapped_runs()
                .into_iter()
                .map(|(offset, size)| {
                    let blocks = blocks_of(&layout.ranges, (offset, offset + size), PAGED_BASE_ADDRESS);
                    segment(PAGED_BASE_ADDRESS + offset, size, blocks, true, device, stream)
                })
                .collect();
            (segments, stacks)
        }
        Contender::Pytorch { .. } | Contender::GpuAllocator | Contender::Vma => {
            return Err(Error::InvalidConfig {
                what: format!(
                    "{contender}: the pytorch emulation writes its own snapshot (emulated_snapshot), and a device-only allocator has no simulated one"
                ),
            });
        }
    };
    give_stacks(&mut segments, &stacks, recording);
    let mut device_traces = vec![Vec::new(); device + 1];
    device_traces[device] = writer.entries;
    let mut empty_cache_entries = vec![Vec::new(); device + 1];
    empty_cache_entries[device] = writer.empty_caches;
    // The recording's own settings, which a `pytorch` replay of the file runs with, as of the recording (without them a
    // `paged` export's page maps read as PyTorch's expandable segments).
    let settings = match recording.snapshot.as_ref().and_then(|snapshot| snapshot.settings.clone()) {
        Some(settings) => settings,
        None => {
            let conf = crate::compare::alloc_conf(recording, None)?;
            recorded_settings(&conf, &conf.overrides())
        }
    };
    Ok(Replayed {
        snapshot: Snapshot {
            segments,
            device_traces,
            settings: Some(settings),
            frame_stacks,
            categories: categories(recording),
            pool_ids: pool_ids(recording),
            unknown_actions: writer.unknown_actions,
            contender_export: Some(ContenderExport { contender: contender.name().into(), empty_cache_entries }),
        },
        stats: recorder.stats,
        heap_report,
        fidelity: None,
    })
}

/// Replays the recording through `heap` with the driver, writing its entries (addresses shifted by
/// `address_base`) and keeping its counters ([`Exporter`]); returns the stack of each allocation live at the end, by
/// exported address.
fn replay_device_heap<H: DeviceHeap>(
    heap: &mut H,
    address_base: u64,
    recording: &Recording,
    config: &CompareConfig,
    writer: &mut Writer<'_>,
    recorder: &mut StatsRecorder,
) -> Result<FastMap<u64, StackId>> {
    heap.record_device_events(true);
    let mut exporter = Exporter { writer, recorder, address_base, compaction: None, last_event: 0, stacks: FastMap::default() };
    drive(Stream::of(recording), &mut HeapTarget::compacting(heap, config.compact), config.align_bytes, &mut [&mut exporter])?;
    exporter.moves_done();
    Ok(exporter.stacks)
}

/// Writes a heap contender's replay down in PyTorch's schema, with PyTorch's counters: an [`Observer`] of the
/// driver. A segment is reserved before the allocation placed in it and released after the free that emptied it.
/// A compaction is written as the free of every allocation it moves, then what it asked of the device in its own
/// order (the driver hands it all with the first move: blocks reserved and emptied ones released, pages remapped),
/// then each allocation at its new place: memory is never released under a live allocation nor counted twice.
struct Exporter<'w, 'r> {
    writer: &'w mut Writer<'r>,
    recorder: &'w mut StatsRecorder,
    address_base: u64,
    /// The compaction under way: its frees are written, the rest once its last move is.
    compaction: Option<Compaction>,
    /// The last event stepped, whose entry lends its stream, time and frames to the moment's other device events.
    last_event: usize,
    /// The stack each live allocation was written with, by exported address: a move writes it where the allocation goes
    /// (it took the stack of the entry the compaction came before, and the final block's stack with it).
    stacks: FastMap<u64, StackId>,
}

/// Where an allocation is, as the export writes and counts it: its block's base, footprint, address (exported) and
/// requested bytes; and, for one a compaction moved, the stack it was allocated with.
#[derive(Clone, Copy)]
struct Placement {
    block_base: u64,
    footprint_bytes: u64,
    address: u64,
    size_bytes: u64,
    moved_stack: Option<StackId>,
}

/// What a compaction still has to write once its last move is known ([`Exporter`]).
struct Compaction {
    /// The event it came before.
    index: usize,
    /// What it asked of the device.
    device_events: Vec<DeviceEvent>,
    /// The moved allocations at their new places.
    placed: Vec<Placement>,
    /// The allocation counters' totals before it, which its moves leave as they were (no request is served).
    totals: [[(i64, i64); 3]; 5],
}

impl Exporter<'_, '_> {
    /// Writes and counts `events`.
    fn device(&mut self, events: &[DeviceEvent], index: usize) {
        events.iter().for_each(|&event| self.recorder.device(event));
        self.writer.device_events(events, self.address_base, index);
    }

    /// Writes the rest of the compaction just ended: its device events, then the moved allocations.
    fn moves_done(&mut self) {
        let Some(compaction) = self.compaction.take() else { return };
        self.device(&compaction.device_events, compaction.index);
        for placement in compaction.placed {
            self.allocated(placement, compaction.index);
        }
        self.recorder.restore_totals(compaction.totals);
        self.recorder.settle();
    }
}

impl<H: DeviceHeap> Observer<HeapTarget<'_, H>> for Exporter<'_, '_> {
    fn step(
        &mut self,
        event: u64,
        _moment: Moment,
        step: Step<'_, H::Handle>,
        device_events: &[DeviceEvent],
        target: &HeapTarget<'_, H>,
    ) -> Result<()> {
        let index = usize::try_from(event).unwrap_or(usize::MAX);
        self.last_event = index;
        if !matches!(step, Step::Moved { .. }) {
            self.moves_done();
        }
        self.recorder.cached(target.heap.cached_bytes());
        match step {
            Step::Placed { size_bytes, handle, .. } => {
                self.device(device_events, index);
                self.allocated(self.placement::<H>(handle, size_bytes), index);
            }
            Step::Refused { size_bytes, verdict, .. } => {
                self.device(device_events, index);
                self.recorder.stats.num_ooms += 1;
                let device_free = verdict.map_or(0, |verdict| verdict.unreserved_bytes);
                self.writer.push(Action::Oom, 0, size_bytes, index, Some(device_free));
            }
            Step::Freed { handle, .. } => {
                self.freed::<H>(handle, index);
                self.device(device_events, index);
            }
            Step::Unserved { .. } => self.device(device_events, index),
            Step::CacheEmptied => {
                // Before the first release it makes (or the next entry written, where it releases nothing).
                self.writer.empty_caches.push(self.writer.entries.len());
                self.device(device_events, index);
            }
            // A move is a free where it was now, and an allocation where it is once the compaction is done.
            Step::Moved { from, to, .. } => {
                let from_address = self.address_base + H::address(from);
                let placed = Placement {
                    moved_stack: self.stacks.get(&from_address).copied(),
                    ..self.placement::<H>(to, H::allocation(from).size_bytes())
                };
                let compaction = self.compaction.get_or_insert_with(|| Compaction {
                    index,
                    device_events: Vec::new(),
                    placed: Vec::new(),
                    totals: self.recorder.totals(),
                });
                compaction.device_events.extend_from_slice(device_events);
                // Moved again in the same compaction: it is still to be placed, now here; its free is written.
                match compaction.placed.iter_mut().find(|placement| placement.address == from_address) {
                    Some(again) => *again = Placement { moved_stack: again.moved_stack, ..placed },
                    None => {
                        compaction.placed.push(placed);
                        self.freed::<H>(from, index);
                        // The free a move writes is the moved allocation's, with its stack.
                        if let Some(frames) = placed.moved_stack {
                            let written = self.writer.entries.len();
                            self.writer.entries[written.saturating_sub(2)..].iter_mut().for_each(|entry| entry.frames = frames);
                        }
                    }
                }
            }
        }
        self.recorder.settle();
        Ok(())
    }

    fn moment_done(&mut self, moment: Moment, device_events: &[DeviceEvent], _target: &HeapTarget<'_, H>) -> Result<()> {
        self.moves_done();
        if !device_events.is_empty() {
            self.device(device_events, self.last_event);
            self.recorder.settle();
        }
        if let Moment::Entry(index) = moment {
            self.writer.unknown(index);
        }
        Ok(())
    }
}

impl Exporter<'_, '_> {
    /// Where the allocation behind `handle` is, `size_bytes` asked for.
    fn placement<H: DeviceHeap>(&self, handle: &H::Handle, size_bytes: u64) -> Placement {
        Placement {
            block_base: H::block_base(handle),
            footprint_bytes: H::allocation(handle).footprint_bytes(),
            address: self.address_base + H::address(handle),
            size_bytes,
            moved_stack: None,
        }
    }

    /// Writes the allocation at `placement` at entry `index`, and counts it.
    fn allocated(&mut self, placement: Placement, index: usize) {
        self.recorder.allocation(placement.block_base, placement.footprint_bytes, placement.size_bytes, true);
        self.writer.push(Action::Alloc, placement.address, placement.size_bytes, index, None);
        if let Some(entry) = self.writer.entries.last_mut() {
            if let Some(frames) = placement.moved_stack {
                entry.frames = frames;
            }
            self.stacks.insert(placement.address, entry.frames);
        }
    }

    /// Writes the free of the allocation behind `handle` at entry `index` (requested, then completed), and counts it.
    fn freed<H: DeviceHeap>(&mut self, handle: &H::Handle, index: usize) {
        let allocation = H::allocation(handle);
        let size_bytes = allocation.size_bytes();
        self.recorder.allocation(H::block_base(handle), allocation.footprint_bytes(), size_bytes, false);
        let address = self.address_base + H::address(handle);
        self.stacks.remove(&address);
        self.writer.push(Action::FreeRequested, address, size_bytes, index, None);
        self.writer.push(Action::FreeCompleted, address, size_bytes, index, None);
    }
}

/// Writes the emulation of PyTorch's allocator down as snapshot entries as it runs (its [`SegmentBacking`], holding
/// no memory). For a PyTorch recording: its own entries with the emulation's addresses, its own segment events in
/// place of the recorded ones (each before the entry that caused it), a request it refused an `oom` entry (whose
/// frees never happen). For a plain trace: an entry per event, a segment reserved before the allocation placed in
/// it and released after the free that emptied it.
struct EmulationWriter<'a> {
    recording: &'a Recording,
    /// The device's trace entries, for a PyTorch recording.
    original: Option<&'a [TraceEntry]>,
    capacity_bytes: Option<u64>,
    entries: Vec<TraceEntry>,
    /// Segment events of the entry being replayed, not yet written.
    held: Vec<DeviceEvent>,
    /// The final segments, once the last entry is replayed.
    segments: Vec<Segment>,
    /// Live allocations: recorded (or emulated, for a plain trace) address -> emulated address and requested bytes.
    live: FastMap<u64, (u64, u64)>,
    /// Recorded addresses of refused requests, whose frees never happen in the emulated run.
    refused: heapscope_core::hash::FastSet<u64>,
    /// Addresses of the blocks live at the start (kept where they were recorded) not freed yet: with `live`, what a
    /// free may name. A free of anything else (an edited file's) is left out, as the replay skips it: written, it freed
    /// what the file never allocated, and memory_viz refused the file.
    start_live: heapscope_core::hash::FastSet<u64>,
    /// The memory pool and stream of each range reserved or mapped so far (start -> end, pool and stream), for the
    /// release or unmap of it, which `empty_cache()` or an out-of-memory retry may make under another pool's or
    /// stream's entry: PyTorch records it with the segment's stream (`block->stream`).
    range_owners: BTreeMap<u64, (u64, PoolId, u64)>,
    /// The written snapshot's memory pools ([`Snapshot::pool_ids`]): the recording's, and those only its segments name.
    pool_ids: Vec<(i64, i64)>,
    /// The written entries of actions heapscope does not know, with their names ([`Snapshot::unknown_actions`]).
    unknown_actions: Vec<UnknownAction>,
}

impl EmulationWriter<'_> {
    /// Writes the held segment events, with `template`'s stream, time and frames; each in the memory pool and on the
    /// stream of the request that reserved or mapped it (`template`'s, for a new one).
    fn flush(&mut self, template: Option<&TraceEntry>) {
        for event in std::mem::take(&mut self.held) {
            let (action, addr, size) = segment_entry(event);
            let mut entry = match template {
                Some(template) => template.clone().with(action, addr, size).with_device_free(None),
                None => TraceEntry::new(action, addr, size),
            };
            if matches!(action, Action::SegmentAlloc | Action::SegmentMap) {
                self.range_owners.insert(addr, (addr.saturating_add(size), entry.pool_id, entry.stream));
            } else if let Some((&start, &(end, pool_id, stream))) = self.range_owners.range(..=addr).next_back()
                && addr < end
            {
                entry.pool_id = pool_id;
                entry.stream = stream;
                if action == Action::SegmentFree {
                    self.range_owners.remove(&start);
                }
            }
            self.entries.push(entry);
        }
    }

    /// The written snapshot's id of the memory pool `pool_id`.
    fn pool_index(&mut self, pool_id: (i64, i64)) -> PoolId {
        if pool_id == (0, 0) {
            return PoolId::DEFAULT;
        }
        if self.pool_ids.is_empty() {
            self.pool_ids.push((0, 0));
        }
        let index = self.pool_ids.iter().position(|&known| known == pool_id).unwrap_or_else(|| {
            self.pool_ids.push(pool_id);
            self.pool_ids.len() - 1
        });
        u8::try_from(index).map_or(PoolId::MORE, PoolId)
    }

    /// What the device had left after a refusal: the capacity less what is reserved, or what the driver recorded.
    fn device_free(&self, entry: Option<&TraceEntry>, reserved_bytes: u64) -> u64 {
        match self.capacity_bytes {
            Some(capacity) => capacity.saturating_sub(reserved_bytes),
            None => entry.and_then(TraceEntry::device_free).unwrap_or(0),
        }
    }

    /// Entry `index` of a PyTorch recording, replayed with `effect`.
    fn recorded(&mut self, original: &[TraceEntry], index: usize, effect: EntryEffect, allocator: &CachingAllocator) {
        let Some(entry) = original.get(index) else { return };
        self.flush(Some(entry));
        let write = |writer: &mut Self, action: Action, addr: u64| {
            writer.entries.push(entry.clone().with(action, addr, entry.size).with_device_free(None));
        };
        match (entry.action, effect) {
            (Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap, _) => {}
            (Action::Alloc, EntryEffect::Placed { address }) => {
                self.live.insert(entry.addr, (address, entry.size));
                write(self, Action::Alloc, address);
            }
            (Action::Alloc, _) => {
                // Refused: PyTorch would have recorded an out-of-memory error instead.
                self.refused.insert(entry.addr);
                let device_free = self.device_free(Some(entry), allocator.reserved_bytes());
                self.entries.push(entry.clone().with(Action::Oom, 0, entry.size).with_device_free(Some(device_free)));
            }
            (Action::FreeRequested | Action::FreeCompleted, _) if self.refused.contains(&entry.addr) => {
                if entry.action == Action::FreeCompleted {
                    self.refused.remove(&entry.addr);
                }
            }
            // Of nothing live: left out, as the replay skips it.
            (Action::FreeRequested | Action::FreeCompleted, _)
                if !self.live.contains_key(&entry.addr) && !self.start_live.contains(&entry.addr) => {}
            (Action::FreeRequested, _) => {
                let address = self.live.get(&entry.addr).map_or(entry.addr, |&(address, _)| address);
                write(self, Action::FreeRequested, address);
            }
            (Action::FreeCompleted, _) => {
                let address = match self.live.remove(&entry.addr) {
                    Some((address, _)) => address,
                    None => {
                        self.start_live.remove(&entry.addr);
                        entry.addr
                    }
                };
                write(self, Action::FreeCompleted, address);
            }
            (Action::Oom, EntryEffect::ServedAndReturned { address, .. }) => {
                // Served after all (and given back at once: the program never had it).
                for action in [Action::Alloc, Action::FreeRequested, Action::FreeCompleted] {
                    write(self, action, address);
                }
            }
            (Action::Oom, _) => {
                let device_free = self.device_free(Some(entry), allocator.reserved_bytes());
                self.entries.push(entry.clone().with_device_free(Some(device_free)));
            }
            (Action::Unknown, _) => {
                // Written with its own name.
                if let Some(snapshot) = &self.recording.snapshot {
                    let name = snapshot.action_name(self.recording.device, index, entry);
                    let device = self.recording.device;
                    self.unknown_actions.push(UnknownAction { device, entry: self.entries.len(), name: name.into() });
                }
                self.entries.push(entry.clone());
            }
            _ => self.entries.push(entry.clone()),
        }
    }

    /// Event `index` of a plain trace, replayed with `effect`.
    fn plain(&mut self, index: usize, effect: EntryEffect) {
        let size_bytes = match self.recording.trace.events().get(index) {
            Some(&Event::Alloc { size_bytes, .. }) => size_bytes,
            _ => 0,
        };
        match effect {
            EntryEffect::Placed { address } => {
                self.flush(None);
                self.live.insert(address, (address, size_bytes));
                self.entries.push(TraceEntry::new(Action::Alloc, address, size_bytes));
            }
            EntryEffect::Refused(report) => {
                self.flush(None);
                let device_free = self.device_free(None, report.reserved_bytes);
                self.entries.push(TraceEntry::new(Action::Oom, 0, size_bytes).with_device_free(Some(device_free)));
            }
            EntryEffect::Freed { address } => {
                let size_bytes = self.live.remove(&address).map_or(0, |(_, size_bytes)| size_bytes);
                self.entries.push(TraceEntry::new(Action::FreeRequested, address, size_bytes));
                self.entries.push(TraceEntry::new(Action::FreeCompleted, address, size_bytes));
                self.flush(None);
            }
            EntryEffect::Unchanged | EntryEffect::ServedAndReturned { .. } => self.flush(None),
        }
    }
}

impl SegmentBacking for EmulationWriter<'_> {
    fn apply(&mut self, events: &[DeviceEvent], _allocator: &CachingAllocator) -> std::result::Result<(), BackingRefused> {
        self.held.extend_from_slice(events);
        Ok(())
    }

    fn started(&mut self, allocator: &CachingAllocator, moved: &[(u64, u64)]) {
        // What the allocator held at the start is in the final segments' history, not the trace.
        self.held.clear();
        // The trace frees what a what-if allocated afresh at its recorded address: written at the emulated one.
        for &(recorded, emulated) in moved {
            let requested_bytes = allocator.active_block(emulated).map_or(0, |block| block.requested_bytes);
            self.live.insert(recorded, (emulated, requested_bytes));
        }
        // The segments so far: all there is of a state with no trace (no entry to replace them at the last one).
        self.segments = allocator.report();
        self.start_live = crate::recording::live_blocks(&self.segments).map(|block| block.address).collect();
        for index in 0..self.segments.len() {
            let (address, total_size, pool_id, stream) = {
                let segment = &self.segments[index];
                (segment.address, segment.total_size, segment.segment_pool_id, segment.stream)
            };
            let pool_id = self.pool_index(pool_id);
            self.range_owners.insert(address, (address.saturating_add(total_size), pool_id, stream));
        }
    }

    fn replayed(&mut self, entry: usize, effect: EntryEffect, allocator: &CachingAllocator) {
        let last = match self.original {
            Some(original) => {
                self.recorded(original, entry, effect, allocator);
                entry + 1 == original.len()
            }
            None => {
                self.plain(entry, effect);
                entry + 1 == self.recording.trace.events().len()
            }
        };
        if last {
            // Segment events after the last entry (none today), with its stream, time and frames.
            let template = self.original.and_then(<[TraceEntry]>::last).cloned();
            self.flush(template.as_ref());
            self.segments = allocator.report();
        }
    }
}

/// The settings as a snapshot records them.
fn recorded_settings(conf: &AllocConf, alloc_conf: &str) -> RecordedSettings {
    RecordedSettings {
        alloc_conf: alloc_conf.to_owned(),
        max_split_size: conf.max_split_size,
        garbage_collection_threshold: conf.garbage_collection_threshold,
        expandable_segments: conf.expandable_segments,
        roundup_power2_divisions: (0..)
            .zip(conf.roundup_power2_divisions)
            .map(|(log, divisions)| (1u64 << log, divisions))
            .collect(),
    }
}

/// The snapshot the emulation of PyTorch's caching allocator would have recorded for `recording` with
/// `conf` on a device of `capacity_bytes`: the recording's entries with the emulation's addresses, its
/// own segment events in place of the recorded ones, and its final segments. `alloc_conf` is the
/// settings string to record.
///
/// # Errors
///
/// [`Error::Trace`] naming the recording and the segment, block or trace entry of its snapshot that the
/// emulation cannot replay.
pub fn emulated_snapshot(
    recording: &Recording,
    conf: &AllocConf,
    alloc_conf: &str,
    capacity_bytes: Option<u64>,
) -> Result<Replayed> {
    let device = recording.device;
    // `compare`'s own run of the emulation, written down as it goes.
    let mut writer = EmulationWriter {
        recording,
        original: recording.snapshot.as_ref().and_then(|snapshot| snapshot.device_traces.get(device)).map(Vec::as_slice),
        capacity_bytes,
        entries: Vec::new(),
        held: Vec::new(),
        segments: Vec::new(),
        live: FastMap::default(),
        refused: heapscope_core::hash::FastSet::default(),
        start_live: heapscope_core::hash::FastSet::default(),
        range_owners: BTreeMap::new(),
        pool_ids: pool_ids(recording),
        unknown_actions: Vec::new(),
    };
    let replay = crate::compare::emulate_pytorch(recording, conf, capacity_bytes, &mut writer)?;
    let frame_stacks = recording.snapshot.as_ref().map_or_else(|| vec![Vec::new()], |snapshot| snapshot.frame_stacks.clone());
    let fidelity = replay.fidelity.filter(|_| !replay.what_if);
    let (entries, mut segments, stats, pool_ids, unknown_actions) =
        (writer.entries, writer.segments, replay.stats, writer.pool_ids, writer.unknown_actions);
    // The allocator knows no device: its segments are the device replayed's.
    let device_id = u32::try_from(device).unwrap_or(u32::MAX);
    segments.iter_mut().for_each(|segment| segment.device = device_id);
    give_stacks(&mut segments, &live_stacks(&entries), recording);
    let mut device_traces = vec![Vec::new(); device + 1];
    device_traces[device] = entries;
    Ok(Replayed {
        snapshot: Snapshot {
            segments,
            device_traces,
            settings: Some(recorded_settings(conf, alloc_conf)),
            frame_stacks,
            categories: categories(recording),
            pool_ids,
            unknown_actions,
            contender_export: None,
        },
        stats,
        heap_report: None,
        fidelity,
    })
}

/// The stack each allocation live at the end of `entries` was written with, by address.
fn live_stacks(entries: &[TraceEntry]) -> FastMap<u64, StackId> {
    let mut allocated = FastMap::default();
    for entry in entries {
        match entry.action {
            Action::Alloc => {
                allocated.insert(entry.addr, entry.frames);
            }
            Action::FreeCompleted => {
                allocated.remove(&entry.addr);
            }
            _ => {}
        }
    }
    allocated
}

/// Gives each live block of the written final `segments` the stack of the allocation it holds, as PyTorch's snapshot
/// does (memory_viz's segment view names every block without one "allocated before _record_history was enabled"): the
/// stack it was written with (`allocated`, by address: the heaps' export keeps it as it writes, the emulation's from
/// its entries, [`live_stacks`]), else, for an allocation live since before the first entry and never written (the
/// emulation keeps the recorded start), the recording's own final block there of the same size.
fn give_stacks(segments: &mut [Segment], allocated: &FastMap<u64, StackId>, recording: &Recording) {
    let recorded: FastMap<(u64, u64), StackId> = recording
        .snapshot
        .iter()
        .flat_map(|snapshot| crate::recording::final_live_blocks(snapshot, recording.device))
        .map(|block| ((block.address, block.size), block.frames))
        .collect();
    for block in segments.iter_mut().flat_map(|segment| &mut segment.blocks).filter(|block| block.state != BlockState::Inactive) {
        if let Some(&frames) = allocated.get(&block.address).or_else(|| recorded.get(&(block.address, block.size))) {
            block.frames = frames;
        }
    }
}

/// The recording's categories, which the written entries keep (by id).
fn categories(recording: &Recording) -> Vec<heapscope_pytorch::Category> {
    recording.snapshot.as_ref().map(|snapshot| snapshot.categories.clone()).unwrap_or_default()
}

/// The recording's memory pools, which the written entries keep (by id) as well.
fn pool_ids(recording: &Recording) -> Vec<(i64, i64)> {
    recording.snapshot.as_ref().map(|snapshot| snapshot.pool_ids.clone()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::story::frag_oom;
    use heapscope_core::units::MIB;
    use heapscope_core::{HeapConfig, PolicyKind, ReleaseRule, TraceBuilder};

    fn count(snapshot: &Snapshot, action: Action) -> usize {
        snapshot.device_traces[0].iter().filter(|entry| entry.action == action).count()
    }

    #[test]
    fn heap_replay_records_its_segments_and_oom() {
        let story = frag_oom();
        let recording = Recording::from_trace(story.trace);
        let config = CompareConfig {
            capacity_bytes: Some(story.device_bytes),
            heap: HeapConfig { release: ReleaseRule::OnPressure, ..HeapConfig::new(PolicyKind::BestFit) },
            ..CompareConfig::default()
        };
        let replayed = replayed_snapshot(&recording, Contender::Heap(PolicyKind::BestFit), &config).unwrap();
        let snapshot = &replayed.snapshot;
        assert_eq!((count(snapshot, Action::Alloc), count(snapshot, Action::Oom)), (40, 1));
        assert_eq!(count(snapshot, Action::FreeCompleted), 20);
        let reserved = count(snapshot, Action::SegmentAlloc) - count(snapshot, Action::SegmentFree);
        assert_eq!(reserved, snapshot.segments.len());
        for segment in &snapshot.segments {
            // Blocks tile the segment, and what is allocated sums up.
            assert_eq!(segment.blocks.iter().map(|block| block.size).sum::<u64>(), segment.total_size);
            assert_eq!(segment.blocks[0].address, segment.address);
        }
        let allocated: u64 = snapshot.segments.iter().map(|segment| segment.requested_size).sum();
        assert_eq!(allocated, 20 * 100 * MIB, "the 100 MiB tensors are still live");
        // The counters agree with the layout and with the plain replay.
        let stats = &replayed.stats;
        let outcome = crate::compare::replay(&recording, Contender::Heap(PolicyKind::BestFit), &config)
            .unwrap()
            .figures()
            .cloned()
            .unwrap();
        assert_eq!(stats.reserved_bytes.all().peak as u64, outcome.peak_reserved_bytes);
        assert_eq!((stats.num_device_alloc as u64, stats.num_ooms), (outcome.device_allocs, 1));
        assert_eq!((stats.allocation.all().current, stats.requested_bytes.all().current as u64), (20, allocated));
        let reserved: u64 = snapshot.segments.iter().map(|segment| segment.total_size).sum();
        assert_eq!(stats.reserved_bytes.all().current as u64, reserved);
        let non_releasable: u64 = snapshot
            .segments
            .iter()
            .filter(|segment| segment.allocated_size > 0)
            .map(|segment| segment.total_size - segment.allocated_size)
            .sum();
        assert_eq!(stats.inactive_split_bytes.all().current as u64, non_releasable);
        // Every alloc sits inside a segment that was reserved before it.
        let mut open = Vec::new();
        for entry in &snapshot.device_traces[0] {
            match entry.action {
                Action::SegmentAlloc => open.push((entry.addr, entry.addr + entry.size)),
                Action::SegmentFree => open.retain(|&(start, _)| start != entry.addr),
                Action::Alloc => assert!(open.iter().any(|&(start, end)| (start..end).contains(&entry.addr)), "{entry:?}"),
                _ => {}
            }
        }
    }

    /// heapscope's export of a heap contender reads back as the stream it replayed: the contender's own block releases
    /// are no `empty_cache()` calls (the emulation of PyTorch took them for the user's, and the export replayed as
    /// another stream: no OOM on frag_oom), the user's calls are kept where they were, and an entry of an action
    /// heapscope does not know is written with its name, as PyTorch's export writes it.
    #[test]
    fn a_heap_export_reads_back_as_the_stream_it_replayed() {
        use heapscope_pytorch::{parse_snapshot, write_snapshot};
        let mut builder = TraceBuilder::new("t");
        for id in 0..6 {
            builder.alloc(id, 300 * MIB).unwrap();
        }
        for id in 0..6 {
            builder.free(id).unwrap();
        }
        builder.empty_cache();
        builder.alloc(6, 100 * MIB).unwrap();
        builder.free(6).unwrap();
        // Two calls in a row, the second releasing nothing; and two after the last entry.
        builder.empty_cache();
        builder.empty_cache();
        builder.alloc(7, 700 * MIB).unwrap();
        builder.free(7).unwrap();
        builder.empty_cache();
        builder.empty_cache();
        let recording = Recording::from_trace(builder.finish());
        for (kind, release) in [(PolicyKind::Tlsf, ReleaseRule::Immediately), (PolicyKind::BestFit, ReleaseRule::KeepOne)] {
            let config = CompareConfig {
                heap: HeapConfig { release, block_size_bytes: 256 * MIB, ..HeapConfig::new(kind) },
                ..CompareConfig::default()
            };
            let replayed = replayed_snapshot(&recording, Contender::Heap(kind), &config).unwrap();
            assert!(count(&replayed.snapshot, Action::SegmentFree) > 2, "{kind}: the heap releases blocks of its own");
            let mut bytes = Vec::new();
            write_snapshot(&replayed.snapshot, &mut bytes).unwrap();
            let again = parse_snapshot(bytes.as_slice(), "export.pickle").unwrap();
            assert_eq!(again.contender_export, replayed.snapshot.contender_export, "{kind}");
            let read_back = Recording::from_snapshot("export.pickle", again, 0).unwrap();
            assert_eq!(read_back.trace.events(), recording.trace.events(), "{kind}: the same stream");
            assert_eq!(read_back.empty_caches.len(), 5, "{kind}");
        }
        // `pytorch` replays the file read back as the recording: a call where the heap released nothing (its block
        // still holds the 1 MiB) is made all the same (PyTorch gives its 100 MiB segment back there: 302 MiB, not 402).
        let mut builder = TraceBuilder::new("t");
        builder.alloc(0, 100 * MIB).unwrap();
        builder.alloc(1, MIB).unwrap();
        builder.free(0).unwrap();
        builder.empty_cache();
        builder.alloc(2, 300 * MIB).unwrap();
        let recording = Recording::from_trace(builder.finish());
        let replayed = replayed_snapshot(&recording, Contender::Heap(PolicyKind::Tlsf), &CompareConfig::default()).unwrap();
        assert_eq!(count(&replayed.snapshot, Action::SegmentFree), 0);
        let read_back = Recording::from_snapshot("export.pickle", replayed.snapshot, 0).unwrap();
        let pytorch = |recording: &Recording| {
            let outcome = crate::compare::replay(recording, Contender::Pytorch { expandable: false }, &CompareConfig::default());
            outcome.unwrap().figures().unwrap().peak_reserved_bytes
        };
        assert_eq!((pytorch(&recording), pytorch(&read_back)), (302 * MIB, 302 * MIB));
        // An action heapscope does not know, kept with its name.
        let mut snapshot = Snapshot {
            device_traces: vec![vec![
                TraceEntry::new(Action::Alloc, 1 << 30, MIB),
                TraceEntry::new(Action::Unknown, 7, 8),
                TraceEntry::new(Action::FreeCompleted, 1 << 30, MIB),
            ]],
            ..Snapshot::default()
        };
        snapshot.unknown_actions.push(UnknownAction { device: 0, entry: 1, name: "weird_future".into() });
        let recording = Recording::from_snapshot("weird.pickle", snapshot, 0).unwrap();
        let replayed = replayed_snapshot(&recording, Contender::Heap(PolicyKind::Tlsf), &CompareConfig::default()).unwrap();
        let trace = &replayed.snapshot.device_traces[0];
        let written = trace.iter().position(|entry| entry.action == Action::Unknown).expect("written");
        assert_eq!(replayed.snapshot.action_name(0, written, &trace[written]), "weird_future");
        assert_eq!((trace[written].addr, trace[written].size), (7, 8));
        assert_eq!(trace[written - 1].action, Action::Alloc, "after its entry's allocation: {trace:?}");
    }

    #[test]
    fn emulated_snapshot_of_a_plain_trace_records_segments() {
        let story = frag_oom();
        let recording = Recording::from_trace(story.trace);
        let replayed = emulated_snapshot(&recording, &AllocConf::default(), "", Some(story.device_bytes)).unwrap();
        let snapshot = &replayed.snapshot;
        assert_eq!(replayed.stats.num_ooms, 1);
        // 20 segments of 150 MiB, the 100 MiB tensors reuse them, the 1 GiB request is refused.
        assert_eq!((count(snapshot, Action::SegmentAlloc), count(snapshot, Action::Oom)), (20, 1));
        assert_eq!(snapshot.segments.len(), 20);
        assert!(snapshot.segments.iter().all(|segment| segment.total_size == 150 * MIB));
    }

    #[test]
    fn paged_counters_stay_in_their_pool() {
        // 1 MiB then 3 MiB: the mapped pages grow past 2 MiB and shrink again; every counter ends at 0.
        let mut builder = TraceBuilder::new("pool");
        builder.alloc(1, MIB).unwrap();
        builder.alloc(2, 3 * MIB).unwrap();
        builder.free(2).unwrap();
        builder.free(1).unwrap();
        let recording = Recording::from_trace(builder.finish());
        let stats = replayed_snapshot(&recording, Contender::Paged, &CompareConfig::default()).unwrap().stats;
        for array in
            [&stats.inactive_split_bytes, &stats.inactive_split, &stats.reserved_bytes, &stats.allocated_bytes, &stats.segment]
        {
            assert!(array.0.iter().all(|stat| stat.current == 0), "{array:?}");
        }
        // The range is one segment while anything is mapped in it.
        assert_eq!((stats.segment.all().peak, stats.segment.all().allocated), (1, 1));
        assert_eq!(stats.inactive_split_bytes.get(heapscope_pytorch::memory_stats::StatType::SmallPool).allocated, 0);
        // Whole pages only: nothing is ever free inside what is mapped, not even while a request's pages are mapped
        // for it (they used to count free for a moment: `summary --policy paged` showed a peak of the request's size).
        let mut builder = TraceBuilder::new("pages");
        builder.alloc(1, 4 * MIB).unwrap();
        builder.alloc(2, 1024 * MIB).unwrap();
        builder.free(2).unwrap();
        builder.alloc(3, 2 * MIB).unwrap();
        builder.free(3).unwrap();
        builder.free(1).unwrap();
        let recording = Recording::from_trace(builder.finish());
        // Pages unmapped as soon as they are free, or kept as a cache until memory runs short (releasable either way:
        // `summary --policy paged --paged-unmap pressure` counted them non-releasable, 14 GiB on gpt2).
        for paged_unmap in [heapscope_core::UnmapRule::Eager, heapscope_core::UnmapRule::UnderPressure] {
            let config = CompareConfig { paged_unmap, ..CompareConfig::default() };
            let stats = replayed_snapshot(&recording, Contender::Paged, &config).unwrap().stats;
            for array in [&stats.inactive_split_bytes, &stats.inactive_split] {
                assert!(array.0.iter().all(|stat| stat.peak == 0 && stat.allocated == 0), "{paged_unmap:?}: {array:?}");
            }
        }
    }

    #[test]
    fn refused_requests_leave_no_frees_and_say_what_was_left() {
        let story = frag_oom();
        let recording = Recording::from_trace(story.trace);
        // A device of 1 GiB: six 150 MiB tensors fit, the rest are refused and their frees vanish.
        let replayed = emulated_snapshot(&recording, &AllocConf::default(), "", Some(1 << 30)).unwrap();
        let entries = &replayed.snapshot.device_traces[0];
        let allocated: std::collections::HashSet<u64> =
            entries.iter().filter(|entry| entry.action == Action::Alloc).map(|entry| entry.addr).collect();
        assert!(
            entries.iter().filter(|entry| entry.action == Action::FreeCompleted).all(|entry| allocated.contains(&entry.addr))
        );
        let ooms: Vec<_> = entries.iter().filter(|entry| entry.action == Action::Oom).collect();
        assert_eq!(ooms.len() as i64, replayed.stats.num_ooms);
        assert!(ooms.iter().all(|entry| entry.device_free().is_some_and(|free| free < 150 * MIB)), "{ooms:?}");
        // An oversized request counts as an out-of-memory error in the summary as in the replay.
        let mut builder = TraceBuilder::new("huge");
        builder.alloc(1, u64::MAX).unwrap();
        let recording = Recording::from_trace(builder.finish());
        let stats = replayed_snapshot(&recording, Contender::Heap(PolicyKind::Tlsf), &CompareConfig::default()).unwrap().stats;
        assert_eq!(stats.num_ooms, 1);
    }

    #[test]
    fn paged_replay_maps_and_unmaps() {
        let story = frag_oom();
        let recording = Recording::from_trace(story.trace);
        let config = CompareConfig { capacity_bytes: Some(story.device_bytes), ..CompareConfig::default() };
        let replayed = replayed_snapshot(&recording, Contender::Paged, &config).unwrap();
        let snapshot = &replayed.snapshot;
        assert_eq!((count(snapshot, Action::Alloc), count(snapshot, Action::Oom)), (41, 0));
        assert!(count(snapshot, Action::SegmentUnmap) > 0);
        let mapped: u64 = snapshot.segments.iter().map(|segment| segment.total_size).sum();
        assert_eq!(mapped, 3024 * MIB);
        assert!(snapshot.segments.iter().all(|segment| segment.is_expandable));
        assert!(replayed_snapshot(&recording, Contender::Pytorch { expandable: false }, &config).is_err());
    }

    /// Every alloc of `snapshot`'s trace lies in memory reserved or mapped at that moment, and what the trace leaves
    /// reserved or mapped at the end is its final segments: the memory a reader of the file sees under each allocation.
    fn assert_allocations_in_memory_held(snapshot: &Snapshot, what: &str) {
        let mut held: BTreeMap<u64, u64> = BTreeMap::new();
        for (index, entry) in snapshot.device_traces[0].iter().enumerate() {
            let (start, end) = (entry.addr, entry.addr + entry.size);
            match entry.action {
                Action::SegmentAlloc | Action::SegmentMap => {
                    assert!(held.range(..end).next_back().is_none_or(|(_, &e)| e <= start), "{what}: [{index}] overlaps");
                    // Adjacent ranges are one (pages mapped by two calls hold an allocation across them).
                    heapscope_pytorch::caching::add_range(&mut held, start, end);
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    // An unmap may take part of a mapped range, or several: all of it was held.
                    let before: u64 = held.iter().map(|(s, e)| e - s).sum();
                    heapscope_pytorch::caching::remove_range(&mut held, start, end);
                    assert_eq!(before - held.iter().map(|(s, e)| e - s).sum::<u64>(), entry.size, "{what}: [{index}]");
                }
                Action::Alloc => {
                    let inside = held.range(..=start).next_back().is_some_and(|(_, &e)| end <= e);
                    assert!(inside, "{what}: [{index}] alloc at {start:#x} in no memory held");
                }
                _ => {}
            }
        }
        let held_bytes: u64 = held.iter().map(|(s, e)| e - s).sum();
        assert_eq!(held_bytes, snapshot.segments.iter().map(|segment| segment.total_size).sum::<u64>(), "{what}");
    }

    /// A contender that compacts moves allocations: each move is written as the allocation freed and placed anew, with
    /// the blocks the compaction reserves and releases (a paged heap's remapped pages) between, so every allocation
    /// lies in memory held; the counters are the replay's (a move serves no request: allocations counted once).
    #[test]
    fn a_compacting_contender_exports_its_moves_in_memory_it_holds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
        // The last tenth of a training run: begun mid-run, many allocations live throughout.
        let mut snapshot = heapscope_pytorch::read_snapshot(&dir.join("gpt2_train_fixed-default.pickle.gz")).unwrap();
        let trace = &mut snapshot.device_traces[0];
        trace.drain(..trace.len() * 9 / 10);
        let recording = Recording::from_snapshot("mid-run", snapshot, 0).unwrap();
        for contender in [Contender::Heap(PolicyKind::Tlsf), Contender::Heap(PolicyKind::FirstFit), Contender::Paged] {
            let config = CompareConfig { compact: crate::compaction::CompactRule::Every(25), ..CompareConfig::default() };
            let replayed = replayed_snapshot(&recording, contender, &config).unwrap();
            let figures = crate::compare::replay(&recording, contender, &config).unwrap().figures().cloned().unwrap();
            assert!(figures.compaction.as_ref().is_some_and(|compaction| compaction.moves > 0), "{contender}: moves");
            assert_allocations_in_memory_held(&replayed.snapshot, &contender.to_string());
            let stats = &replayed.stats;
            assert_eq!(stats.allocation.all().allocated as u64, figures.allocs, "{contender}");
            assert_eq!(stats.reserved_bytes.all().peak as u64, figures.peak_reserved_bytes, "{contender}");
        }
    }

    /// A CUDA graph's private pool in the written emulation: its segment events name the graph's pool, also the release
    /// `empty_cache()` makes under another entry, and the snapshot written replays exactly again.
    #[test]
    fn the_emulation_written_keeps_each_segments_memory_pool() {
        let (d, p) = (0x7000_0000_0000_u64, 0x7000_0020_0000_u64);
        let graph = PoolId(1);
        // (action, address, bytes, in the graph's pool)
        let steps = [
            (Action::SegmentAlloc, d, 2 * MIB, false),
            (Action::Alloc, d, 1000, false),
            (Action::SegmentAlloc, p, 2 * MIB, true),
            (Action::Alloc, p, 1000, true),
            (Action::FreeRequested, p, 1000, true),
            (Action::FreeCompleted, p, 1000, true),
            (Action::SegmentFree, p, 2 * MIB, true),
            (Action::Alloc, d + 1024, 1000, false),
        ];
        let trace = steps
            .iter()
            .map(|&(action, addr, size, in_graph)| {
                TraceEntry::new(action, addr, size).with_pool_id(if in_graph { graph } else { PoolId::DEFAULT })
            })
            .collect();
        let snapshot = Snapshot { device_traces: vec![trace], pool_ids: vec![(0, 0), (0, 9)], ..Snapshot::default() };
        let recording = Recording::from_snapshot("graph.pickle", snapshot, 0).unwrap();
        let written = emulated_snapshot(&recording, &AllocConf::default(), "", None).unwrap().snapshot;
        let segment_events: Vec<(Action, (i64, i64))> = written.device_traces[0]
            .iter()
            .filter(|entry| matches!(entry.action, Action::SegmentAlloc | Action::SegmentFree))
            .map(|entry| (entry.action, written.pool_id(entry.pool_id)))
            .collect();
        // The release is written before the entry after the run of frees, a request of the default pool.
        assert_eq!(
            segment_events,
            [(Action::SegmentAlloc, (0, 0)), (Action::SegmentAlloc, (0, 9)), (Action::SegmentFree, (0, 9))]
        );
        let again = heapscope_pytorch::caching::emulate(&written, 0, &AllocConf::default(), None).unwrap();
        assert!(again.fidelity.is_exact(), "{:?}", again.fidelity);
    }

    /// Pages a request on another stream has unmapped (its out-of-memory retry frees the cache of every stream) are
    /// written on the stream of their reservation, as PyTorch records them (`block->stream`), not the request's: the
    /// snapshot written replays exactly again, its start state rebuilt from every cut (a reader that takes the unmap to
    /// be the other stream's rebuilt the pages as mapped at the start).
    #[test]
    fn pages_unmapped_for_another_stream_keep_their_stream() {
        let (a, b) = (0x7000_0000_0000_u64, 0x7100_0000_0000_u64);
        // (action, address, bytes, stream)
        let steps = [
            (Action::SegmentMap, a, 40 * MIB, 0),
            (Action::Alloc, a, 40 * MIB, 0),
            (Action::FreeRequested, a, 40 * MIB, 0),
            (Action::FreeCompleted, a, 40 * MIB, 0),
            (Action::SegmentUnmap, a, 40 * MIB, 0),
            (Action::SegmentMap, b, 60 * MIB, 7),
            (Action::Alloc, b, 60 * MIB, 7),
        ];
        let trace =
            steps.iter().map(|&(action, addr, size, stream)| TraceEntry::new(action, addr, size).with_stream(stream)).collect();
        let settings = RecordedSettings { expandable_segments: true, ..Default::default() };
        let snapshot = Snapshot { device_traces: vec![trace], settings: Some(settings), ..Snapshot::default() };
        let recording = Recording::from_snapshot("streams.pickle", snapshot, 0).unwrap();
        let conf = AllocConf::from_recorded(recording.snapshot.as_ref().and_then(|s| s.settings.as_ref()).unwrap());
        let capacity = Some(80 * MIB);
        let written = emulated_snapshot(&recording, &conf, "", capacity).unwrap().snapshot;
        let unmaps: Vec<(u64, u64)> = written.device_traces[0]
            .iter()
            .filter(|entry| entry.action == Action::SegmentUnmap)
            .map(|entry| (entry.addr, entry.stream))
            .collect();
        assert_eq!(unmaps, [(a, 0)], "made for stream 7's request, on stream 0's reservation");
        for cut in 0..written.device_traces[0].len() {
            let mut part = written.clone();
            part.device_traces[0].drain(..cut);
            let again = heapscope_pytorch::caching::emulate(&part, 0, &conf, capacity).unwrap();
            assert!(again.fidelity.is_exact(), "cut at {cut}: {:?}", again.fidelity);
        }
    }

    /// One heap serves every stream, PyTorch one stream per segment and per expandable reservation: a heap or paged
    /// export of a recording on two streams writes its segments and their events on one, so that PyTorch's emulation
    /// reads the written file back (it refused a paged export's pages mapped on two streams as overlapping reservations).
    #[test]
    fn a_two_stream_recording_exports_its_heap_on_one_stream() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
        let mut snapshot = heapscope_pytorch::read_snapshot(&dir.join("gpt2_train_fixed-default.pickle.gz")).unwrap();
        // Every other allocation, its frees with it, on a second stream.
        let side_stream = 0x5555_0000_1000;
        let mut on_side = FastMap::default();
        for (index, entry) in snapshot.device_traces[0].iter_mut().enumerate() {
            match entry.action {
                Action::Alloc => {
                    on_side.insert(entry.addr, index % 2 == 1);
                }
                Action::FreeRequested | Action::FreeCompleted => {}
                _ => continue,
            }
            if on_side.get(&entry.addr) == Some(&true) {
                entry.stream = side_stream;
            }
        }
        let recording = Recording::from_snapshot("two-stream", snapshot, 0).unwrap();
        for contender in [Contender::Paged, Contender::Heap(PolicyKind::Tlsf)] {
            let written = replayed_snapshot(&recording, contender, &CompareConfig::default()).unwrap().snapshot;
            let streams: std::collections::BTreeSet<u64> = written.device_traces[0]
                .iter()
                .filter(|entry| !matches!(entry.action, Action::Alloc | Action::FreeRequested | Action::FreeCompleted))
                .map(|entry| entry.stream)
                .chain(written.segments.iter().map(|segment| segment.stream))
                .collect();
            assert_eq!(streams.len(), 1, "{contender}: {streams:?}");
            let again = heapscope_pytorch::caching::emulate(&written, 0, &AllocConf::default(), None);
            assert!(again.is_ok(), "{contender}: {again:?}");
        }
    }

    /// A what-if of the other kind of memory on a recording begun mid-run allocates what was live at the start afresh;
    /// the written trace frees those allocations where the emulation holds them, not at their recorded addresses
    /// (which lie in no segment of the written snapshot): replayed with its own settings, it is reproduced exactly.
    #[test]
    fn a_what_if_from_mid_run_frees_the_start_allocations_where_it_holds_them() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
        for name in ["frag_oom-default", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
            let mut snapshot = heapscope_pytorch::read_snapshot(&dir.join(format!("{name}.pickle.gz"))).unwrap();
            // History switched on half way through.
            let trace = &mut snapshot.device_traces[0];
            trace.drain(..trace.len() / 2);
            let recorded = AllocConf::from_recorded(snapshot.settings.as_ref().unwrap());
            let recording = Recording::from_snapshot(name, snapshot, 0).unwrap();
            assert!(recording.start_events > 0, "{name}: begins mid-run");
            let conf = AllocConf { expandable_segments: !recorded.expandable_segments, ..recorded };
            let written = emulated_snapshot(&recording, &conf, "", None).unwrap().snapshot;
            let mut ranges: Vec<(u64, u64)> =
                written.segments.iter().map(|segment| (segment.address, segment.address + segment.total_size)).collect();
            let entries = &written.device_traces[0];
            ranges.extend(
                entries
                    .iter()
                    .filter(|entry| matches!(entry.action, Action::SegmentAlloc | Action::SegmentMap))
                    .map(|entry| (entry.addr, entry.addr + entry.size)),
            );
            let astray = entries
                .iter()
                .filter(|entry| matches!(entry.action, Action::FreeRequested | Action::FreeCompleted))
                .filter(|entry| !ranges.iter().any(|&(start, end)| (start..end).contains(&entry.addr)))
                .count();
            assert_eq!(astray, 0, "{name}: frees outside every segment of the written snapshot");
            let again = heapscope_pytorch::caching::emulate(&written, 0, &conf, None).unwrap();
            assert!(again.fidelity.is_exact(), "{name}: {:?}", again.fidelity);
        }
    }

    /// A heap or paged export holds no PyTorch run's layout (a paged heap maps pages of its own size, small and large
    /// requests in one range), yet PyTorch's emulation reads it back with room on the device and no out-of-memory, and
    /// never places an allocation over one still live: the paged export of a recording begun mid-run was refused 874
    /// times on an unlimited device (a range left unmapped between two mapped ones, narrower than the emulation's
    /// pages), reservations guessed for runs of mixed requests overlapped, their pages mapped over live blocks, and an
    /// export cut mid-run was refused (a page guessed into both pools, held twice at the start).
    #[test]
    fn a_heap_or_paged_export_replays_through_pytorch_in_memory_of_its_own() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
        for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
            let whole = heapscope_pytorch::read_snapshot(&dir.join(format!("{name}.pickle.gz"))).unwrap();
            for begun in [0, 4, 2] {
                let mut snapshot = whole.clone();
                // History switched on at the start, or a quarter or half of the way through.
                let trace = &mut snapshot.device_traces[0];
                let first = trace.len().checked_div(begun).unwrap_or(0);
                trace.drain(..first);
                let recording = Recording::from_snapshot(name, snapshot, 0).unwrap();
                for contender in [Contender::Paged, Contender::Heap(PolicyKind::Tlsf)] {
                    let whole = replayed_snapshot(&recording, contender, &CompareConfig::default()).unwrap().snapshot;
                    // The export itself cut too (its runs of pages mix small and large requests).
                    for cut in [0, 4, 2] {
                        let mut written = whole.clone();
                        let trace = &mut written.device_traces[0];
                        let export_first = trace.len().checked_div(cut).unwrap_or(0);
                        trace.drain(..export_first);
                        for expandable_segments in [false, true] {
                            let what = format!(
                                "{name} from entry {first}, {contender} from entry {export_first}, expandable {expandable_segments}"
                            );
                            let conf = AllocConf { expandable_segments, ..AllocConf::default() };
                            let emulation = heapscope_pytorch::caching::emulate(&written, 0, &conf, None)
                                .unwrap_or_else(|error| panic!("{what}: {error}"));
                            assert_eq!(emulation.stats.num_ooms, 0, "{what}: {:?}", emulation.first_oom);
                            assert_eq!(overlaps(&written.device_traces[0], &emulation.placements), None, "{what}");
                        }
                    }
                }
            }
        }
    }

    /// The first allocation of `entries` placed (`placements`, by entry) over one still live: its entry's index.
    fn overlaps(entries: &[TraceEntry], placements: &[Option<u64>]) -> Option<usize> {
        // Placed start -> end, and recorded address -> placed start, of the live allocations.
        let (mut placed, mut live) = (BTreeMap::new(), FastMap::default());
        for (index, entry) in entries.iter().enumerate() {
            match (entry.action, placements.get(index).copied().flatten()) {
                (Action::Alloc, Some(start)) => {
                    let end = start + entry.size.max(1);
                    let below = placed.range(..end).next_back().is_some_and(|(_, &other_end)| other_end > start);
                    if below {
                        return Some(index);
                    }
                    placed.insert(start, end);
                    live.insert(entry.addr, start);
                }
                (Action::FreeRequested, _) => {
                    if let Some(start) = live.remove(&entry.addr) {
                        placed.remove(&start);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// Every live block of an export's final segments has the stack of the allocation it holds, as PyTorch writes them:
    /// they had none (memory_viz's segment view said of each "allocated before _record_history was enabled", and `top`
    /// of the export lost the stacks of what lived to the end). Three allocations at two stacks, the middle one freed;
    /// whole, and begun after the first (live since the start, its stack only in its final block: the emulation keeps
    /// the recorded start, never written as entries).
    #[test]
    fn final_blocks_keep_their_allocations_stacks() {
        let base = 0x7f00_0000_0000u64;
        let frame = |name: &str| vec![heapscope_pytorch::Frame { filename: "model.py".into(), line: 1, name: name.into() }];
        let (first, second) = (StackId(1), StackId(2));
        let block = |offset: u64, size: u64, frames: StackId| Block {
            frames,
            ..Block::new(
                base + offset,
                size,
                size,
                if frames == StackId::NONE { BlockState::Inactive } else { BlockState::ActiveAllocated },
            )
        };
        let blocks = vec![
            block(0, MIB, first),
            block(MIB, 2 * MIB, StackId::NONE),
            block(3 * MIB, 3 * MIB, second),
            block(6 * MIB, 14 * MIB, StackId::NONE),
        ];
        let segment = Segment::from_blocks(0, base, 20 * MIB, Pool::Large, blocks);
        let entry = |action, offset: u64, size: u64, frames| TraceEntry::new(action, base + offset, size).with_frames(frames);
        let trace = [
            TraceEntry::new(Action::SegmentAlloc, base, 20 * MIB),
            entry(Action::Alloc, 0, MIB, first),
            entry(Action::Alloc, MIB, 2 * MIB, second),
            entry(Action::Alloc, 3 * MIB, 3 * MIB, second),
            entry(Action::FreeRequested, MIB, 2 * MIB, second),
            entry(Action::FreeCompleted, MIB, 2 * MIB, second),
        ];
        for begun in [0, 2] {
            let snapshot = Snapshot {
                segments: vec![segment.clone()],
                device_traces: vec![trace[begun..].to_vec()],
                frame_stacks: vec![Vec::new(), frame("first"), frame("second")],
                ..Snapshot::default()
            };
            let recording = Recording::from_snapshot("stacks", snapshot, 0).unwrap();
            let config = CompareConfig::default();
            let exports = [
                ("tlsf", replayed_snapshot(&recording, Contender::Heap(PolicyKind::Tlsf), &config).unwrap()),
                ("paged", replayed_snapshot(&recording, Contender::Paged, &config).unwrap()),
                ("pytorch", emulated_snapshot(&recording, &AllocConf::default(), "", None).unwrap()),
            ];
            for (name, export) in exports {
                let mut stacks: Vec<StackId> =
                    crate::recording::live_blocks(&export.snapshot.segments).map(|block| block.frames).collect();
                stacks.sort_unstable();
                assert_eq!(stacks, [first, second], "{name} from entry {begun}");
            }
        }
    }

    /// An allocation a compaction moves keeps its own stack where it goes, in its move's entries and in its final block:
    /// it took the stack of the entry the compaction came before (here the next allocation's). Three 30 MiB allocations
    /// take a block each; the first is freed; the pass before the fourth allocation empties a block into the empty one.
    #[test]
    fn a_moved_allocation_keeps_its_stack() {
        let base = 0x7f00_0000_0000u64;
        let frame = |name: &str| vec![heapscope_pytorch::Frame { filename: "model.py".into(), line: 1, name: name.into() }];
        let stack = StackId;
        let block = |offset: u64, size: u64, frames: u32| Block {
            frames: stack(frames),
            ..Block::new(base + offset, size, size, if frames == 0 { BlockState::Inactive } else { BlockState::ActiveAllocated })
        };
        let blocks = vec![
            block(0, 30 * MIB, 0),
            block(30 * MIB, 30 * MIB, 2),
            block(60 * MIB, 30 * MIB, 3),
            block(90 * MIB, 4 * MIB, 4),
            block(94 * MIB, 6 * MIB, 0),
        ];
        let entry =
            |action, offset: u64, size: u64, frames| TraceEntry::new(action, base + offset, size).with_frames(stack(frames));
        let trace = vec![
            TraceEntry::new(Action::SegmentAlloc, base, 100 * MIB),
            entry(Action::Alloc, 0, 30 * MIB, 1),
            entry(Action::Alloc, 30 * MIB, 30 * MIB, 2),
            entry(Action::Alloc, 60 * MIB, 30 * MIB, 3),
            entry(Action::FreeRequested, 0, 30 * MIB, 1),
            entry(Action::FreeCompleted, 0, 30 * MIB, 1),
            entry(Action::Alloc, 90 * MIB, 4 * MIB, 4),
        ];
        let snapshot = Snapshot {
            segments: vec![Segment::from_blocks(0, base, 100 * MIB, Pool::Large, blocks)],
            device_traces: vec![trace],
            frame_stacks: ["", "first", "second", "third", "fourth"]
                .map(|name| if name.is_empty() { Vec::new() } else { frame(name) })
                .to_vec(),
            ..Snapshot::default()
        };
        let recording = Recording::from_snapshot("moved.pickle", snapshot, 0).unwrap();
        let config = CompareConfig { compact: crate::compaction::CompactRule::Every(4), ..CompareConfig::default() };
        let export = replayed_snapshot(&recording, Contender::Heap(PolicyKind::Tlsf), &config).unwrap();
        let moves = crate::compare::replay(&recording, Contender::Heap(PolicyKind::Tlsf), &config)
            .unwrap()
            .figures()
            .and_then(|figures| figures.compaction)
            .map(|compaction| compaction.moves);
        assert!(moves > Some(0), "the pass moves something: {moves:?}");
        let mut stacks: Vec<StackId> =
            crate::recording::live_blocks(&export.snapshot.segments).map(|block| block.frames).collect();
        stacks.sort_unstable();
        assert_eq!(stacks, [stack(2), stack(3), stack(4)]);
        // Each entry of a 30 MiB allocation past the first's free (a move's free and placement) has its own stack.
        let moved: Vec<(Action, StackId)> = export.snapshot.device_traces[0]
            .iter()
            .filter(|entry| entry.size == 30 * MIB && matches!(entry.action, Action::Alloc | Action::FreeRequested))
            .skip(4)
            .map(|entry| (entry.action, entry.frames))
            .collect();
        assert!(!moved.is_empty() && moved.iter().all(|&(_, frames)| frames == stack(2) || frames == stack(3)), "{moved:?}");
    }

    /// A free of something the recording never shows (an edited file) is left out of the emulation's export, as the
    /// replay skips it: written as it was, it freed what the file never allocated and memory_viz refused the file. A
    /// free of a block live since the start stays.
    #[test]
    fn the_emulations_export_leaves_out_frees_of_nothing_live() {
        let base = 0x7f00_0000_0000u64;
        let stray = 0x7f10_0000_0000u64;
        let segment = Segment::from_blocks(
            0,
            base,
            20 * MIB,
            Pool::Large,
            vec![
                Block::new(base, 4 * MIB, 4 * MIB, BlockState::Inactive),
                Block::new(base + 4 * MIB, 16 * MIB, 0, BlockState::Inactive),
            ],
        );
        let trace = vec![
            TraceEntry::new(Action::Alloc, base + 4 * MIB, MIB),
            TraceEntry::new(Action::FreeRequested, stray, MIB),
            TraceEntry::new(Action::FreeCompleted, stray, MIB),
            TraceEntry::new(Action::FreeRequested, base, 4 * MIB),
            TraceEntry::new(Action::FreeCompleted, base, 4 * MIB),
            TraceEntry::new(Action::FreeRequested, base + 4 * MIB, MIB),
            TraceEntry::new(Action::FreeCompleted, base + 4 * MIB, MIB),
        ];
        let snapshot = Snapshot { segments: vec![segment], device_traces: vec![trace], ..Snapshot::default() };
        let recording = Recording::from_snapshot("stray.pickle", snapshot, 0).unwrap();
        let export = emulated_snapshot(&recording, &AllocConf::default(), "", None).unwrap();
        let written: Vec<(Action, u64)> = export.snapshot.device_traces[0]
            .iter()
            .filter(|entry| matches!(entry.action, Action::Alloc | Action::FreeRequested | Action::FreeCompleted))
            .map(|entry| (entry.action, entry.addr))
            .collect();
        // The 1 MiB request goes to the small pool, wherever the emulation places it.
        let placed = written[0].1;
        assert_eq!(
            written,
            [
                (Action::Alloc, placed),
                (Action::FreeRequested, base),
                (Action::FreeCompleted, base),
                (Action::FreeRequested, placed),
                (Action::FreeCompleted, placed),
            ]
        );
        assert_ne!(placed, stray);
    }

    /// An allocation live when the recording began comes from no entry; written as an allocation of the heap, it
    /// takes what its free or final block says of it ([`Recording::start_origins`]), with no time: the trace began
    /// after it. frag_oom's frees carry their callers' stacks, so a start allocation it frees says nothing; recorded with
    /// `context="alloc"` (each free with the stack of what it frees) it has its free's.
    #[test]
    fn a_start_allocation_is_written_with_what_its_free_or_final_block_says() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
        let mut snapshot = heapscope_pytorch::read_snapshot(&dir.join("frag_oom-default.pickle.gz")).unwrap();
        let trace = &mut snapshot.device_traces[0];
        assert!(trace.iter().all(|entry| entry.frames != StackId::NONE), "every entry of frag_oom has its stack");
        // Each allocation made at one of the file's stacks in turn, so that the pairs left after the cut come from
        // several (frees agreeing on one or two stacks tell nothing).
        let mut stacks: Vec<StackId> = trace.iter().map(|entry| entry.frames).collect();
        stacks.sort_unstable();
        stacks.dedup();
        let mut allocated = FastMap::default();
        for (k, entry) in trace.iter_mut().enumerate() {
            match entry.action {
                Action::Alloc => {
                    entry.frames = stacks[k % stacks.len()];
                    allocated.insert(entry.addr, entry.frames);
                }
                Action::FreeRequested | Action::FreeCompleted => entry.frames = allocated[&entry.addr],
                _ => {}
            }
        }
        trace.drain(..trace.len() / 2);
        let recording = Recording::from_snapshot("frag_oom-default", snapshot, 0).unwrap();
        let origins = recording.start_origins();
        let stacks = |origins: &[Option<TraceEntry>]| -> Vec<StackId> {
            origins.iter().map(|origin| origin.as_ref().map_or(StackId::NONE, |origin| origin.frames)).collect()
        };
        assert!(stacks(&origins).iter().all(|&stack| stack != StackId::NONE), "{origins:?}");
        for contender in [Contender::Heap(PolicyKind::Tlsf), Contender::Paged] {
            let written = replayed_snapshot(&recording, contender, &CompareConfig::default()).unwrap().snapshot;
            let allocs: Vec<&TraceEntry> =
                written.device_traces[0].iter().filter(|entry| entry.action == Action::Alloc).collect();
            let (start, recorded) = allocs.split_at(recording.start_events);
            let written_stacks: Vec<StackId> = start.iter().map(|entry| entry.frames).collect();
            assert_eq!(written_stacks, stacks(&origins), "{contender}");
            assert!(start.iter().all(|entry| entry.time_us().is_none()), "{contender}");
            assert!(recorded.iter().all(|entry| entry.frames != StackId::NONE && entry.time_us().is_some()), "{contender}");
        }
    }

    /// A state with no trace (`torch.cuda.memory_snapshot()`'s list: segments, empty traces) exports its segments
    /// through the emulation and every contender: the start state is the whole story.
    #[test]
    fn a_state_with_no_trace_exports_its_segments() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
        for name in ["frag_oom-default", "gpt2_train_fixed-expandable"] {
            let whole = heapscope_pytorch::read_snapshot(&dir.join(format!("{name}.pickle.gz"))).unwrap();
            let state = Snapshot { device_traces: vec![Vec::new()], settings: None, ..whole.clone() };
            let recording = Recording::from_snapshot(name, state, 0).unwrap();
            let conf = AllocConf::from_recorded(whole.settings.as_ref().unwrap());
            let emulated = emulated_snapshot(&recording, &conf, "", None).unwrap();
            let (got, want): (Vec<_>, Vec<_>) = (
                emulated.snapshot.segments.iter().map(|segment| (segment.address, segment.total_size)).collect(),
                whole.segments.iter().map(|segment| (segment.address, segment.total_size)).collect(),
            );
            assert_eq!(got, want, "{name}: the segments listed");
            assert!(emulated.snapshot.device_traces[0].is_empty(), "{name}");
            let tlsf = replayed_snapshot(&recording, Contender::Heap(PolicyKind::Tlsf), &CompareConfig::default()).unwrap();
            let live = |snapshot: &Snapshot| crate::recording::live_blocks(&snapshot.segments).count();
            assert_eq!(live(&tlsf.snapshot), recording.start_events, "{name}");
            assert_eq!(tlsf.heap_report.map(|report| report.stats.allocations), Some(recording.start_events as u64), "{name}");
        }
    }
}
