//! The snapshot a replay would have recorded: a recording replayed through a heap or a paged heap,
//! written down in PyTorch's schema so PyTorch's own viewer (memory_viz) shows how that contender lays out
//! the same run.
//!
//! Every allocation becomes an `alloc` entry at its address, every free a `free_requested` and
//! `free_completed` pair, every block the heap reserves or releases a `segment_alloc` / `segment_free`
//! (pages a paged heap maps or unmaps: `segment_map` / `segment_unmap`), and a refused request an `oom`
//! entry. Stream, time and stack frames come from the recording's own entry where it has one. The final
//! segments list the heap's blocks (a paged heap's mapped runs, marked expandable) tiled by their blocks.

use crate::compare::{CompareConfig, Contender};
use crate::pytorch::{
    Action, AllocConf, Block, BlockState, CachingAllocator, MemoryStats, Pool, RecordedSettings, Segment, Snapshot, StackId,
    TraceEntry, emulate,
};
use crate::recording::Recording;
use crate::report::RangeReport;
use crate::trace::Event;
use crate::{
    DeviceEvent, DeviceHeap, Error, Heap, HeapConfig, PagedConfig, PagedHeap, RangeState, Request, Result, SimulatedSource,
};

/// Where a paged heap's virtual range starts in exported addresses.
pub const PAGED_BASE_ADDRESS: u64 = 0x7e00_0000_0000;

/// PyTorch's small-pool bound (`kSmallSize`): segments up to this size are reported in the small pool.
const SMALL_SEGMENT_BYTES: u64 = 2 << 20;

/// Writes entries in PyTorch's schema, borrowing stream, time and frames from the recording.
struct Writer<'a> {
    recording: &'a Recording,
    entries: Vec<TraceEntry>,
}

impl Writer<'_> {
    fn push(&mut self, action: Action, addr: u64, size: u64, event: usize, device_free: Option<u64>) {
        let original = self.recording.snapshot.as_ref().and_then(|snapshot| {
            let index = usize::try_from(self.recording.entry_of(event as u64)).ok()?;
            snapshot.device_traces.get(self.recording.device)?.get(index)
        });
        self.entries.push(TraceEntry {
            action,
            addr,
            size,
            stream: original.map_or(0, |entry| entry.stream),
            time_us: original.and_then(|entry| entry.time_us),
            device_free,
            frames: original.map_or(StackId::NONE, |entry| entry.frames),
        });
    }

    fn device_events(&mut self, events: Vec<DeviceEvent>, offset: u64, event: usize) {
        for device_event in events {
            let (action, address, size_bytes) = match device_event {
                DeviceEvent::Reserved { address, size_bytes } => (Action::SegmentAlloc, address, size_bytes),
                DeviceEvent::Released { address, size_bytes } => (Action::SegmentFree, address, size_bytes),
                DeviceEvent::Mapped { address, size_bytes } => (Action::SegmentMap, address, size_bytes),
                DeviceEvent::Unmapped { address, size_bytes } => (Action::SegmentUnmap, address, size_bytes),
            };
            self.push(action, address + offset, size_bytes, event, None);
        }
    }
}

/// Blocks tiling `[segment_offset, segment_offset + size)` from a layout whose offsets are relative to
/// `layout_base`, addresses shifted by `address_base`.
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

fn segment(address: u64, total_size: u64, blocks: Vec<Block>, is_expandable: bool, device: usize) -> Segment {
    let allocated_size = blocks.iter().filter(|block| block.state == BlockState::ActiveAllocated).map(|block| block.size).sum();
    let requested_size = blocks.iter().map(|block| block.requested_size).sum();
    Segment {
        device: u32::try_from(device).unwrap_or(u32::MAX),
        address,
        total_size,
        allocated_size,
        active_size: allocated_size,
        requested_size,
        stream: 0,
        segment_type: if total_size <= SMALL_SEGMENT_BYTES && !is_expandable { Pool::Small } else { Pool::Large },
        segment_pool_id: (0, 0),
        is_expandable,
        frames: StackId::NONE,
        blocks,
    }
}

/// `torch.cuda.memory_stats()` counters kept along a heap or paged replay. Pools follow PyTorch's rule
/// (requests up to 1 MiB are small-pool); blocks (a paged heap: its mapped pages, as one block) up to
/// 2 MiB count as small-pool segments. "Non-releasable" (`inactive_split`) is the free memory inside
/// blocks that hold a live allocation, counted once per such block with free bytes.
#[derive(Default)]
struct StatsRecorder {
    stats: MemoryStats,
    /// Block base -> (size, live footprint bytes, live allocations).
    blocks: std::collections::HashMap<u64, (u64, u64, u64)>,
}

const SMALL_REQUEST_BYTES: u64 = 1 << 20;

impl StatsRecorder {
    fn non_releasable(block: (u64, u64, u64)) -> (u64, u64) {
        let (size, footprint, live) = block;
        let free = size.saturating_sub(footprint);
        if live > 0 && free > 0 { (free, 1) } else { (0, 0) }
    }

    /// Applies `change` to block `base`, keeping the non-releasable counters in step.
    fn update_block(&mut self, base: u64, change: impl FnOnce(&mut (u64, u64, u64))) {
        let block = self.blocks.entry(base).or_default();
        let (before_bytes, before_count) = Self::non_releasable(*block);
        change(block);
        let (after_bytes, after_count) = Self::non_releasable(*block);
        let small = block.0 <= SMALL_SEGMENT_BYTES;
        let stats = &mut self.stats;
        if after_bytes > before_bytes {
            stats.inactive_split_bytes.increase(small, after_bytes - before_bytes);
        } else if before_bytes > after_bytes {
            stats.inactive_split_bytes.decrease(small, before_bytes - after_bytes);
        }
        if before_count != after_count {
            if after_count > before_count {
                stats.inactive_split.increase(small, 1);
            } else {
                stats.inactive_split.decrease(small, 1);
            }
        }
    }

    fn allocated(&mut self, base: u64, footprint_bytes: u64, requested_bytes: u64) {
        let small = requested_bytes <= SMALL_REQUEST_BYTES;
        let stats = &mut self.stats;
        stats.allocation.increase(small, 1);
        stats.active.increase(small, 1);
        stats.allocated_bytes.increase(small, footprint_bytes);
        stats.active_bytes.increase(small, footprint_bytes);
        stats.requested_bytes.increase(small, requested_bytes);
        self.update_block(base, |block| {
            block.1 += footprint_bytes;
            block.2 += 1;
        });
    }

    fn freed(&mut self, base: u64, footprint_bytes: u64, requested_bytes: u64) {
        let small = requested_bytes <= SMALL_REQUEST_BYTES;
        let stats = &mut self.stats;
        stats.allocation.decrease(small, 1);
        stats.active.decrease(small, 1);
        stats.allocated_bytes.decrease(small, footprint_bytes);
        stats.active_bytes.decrease(small, footprint_bytes);
        stats.requested_bytes.decrease(small, requested_bytes);
        self.update_block(base, |block| {
            block.1 -= footprint_bytes;
            block.2 -= 1;
        });
    }

    /// A device event: blocks change their own entry, page runs the one block of a paged heap (base 0).
    fn device(&mut self, event: DeviceEvent) {
        let stats = &mut self.stats;
        match event {
            DeviceEvent::Reserved { address, size_bytes } => {
                let small = size_bytes <= SMALL_SEGMENT_BYTES;
                stats.segment.increase(small, 1);
                stats.reserved_bytes.increase(small, size_bytes);
                stats.num_device_alloc += 1;
                self.update_block(address, |block| block.0 = size_bytes);
            }
            DeviceEvent::Released { address, size_bytes } => {
                let small = size_bytes <= SMALL_SEGMENT_BYTES;
                stats.segment.decrease(small, 1);
                stats.reserved_bytes.decrease(small, size_bytes);
                stats.num_device_free += 1;
                self.update_block(address, |block| block.0 = 0);
                self.blocks.remove(&address);
            }
            DeviceEvent::Mapped { size_bytes, .. } => {
                stats.reserved_bytes.increase(false, size_bytes);
                stats.num_device_alloc += 1;
                self.update_block(0, |block| block.0 += size_bytes);
            }
            DeviceEvent::Unmapped { size_bytes, .. } => {
                stats.reserved_bytes.decrease(false, size_bytes);
                stats.num_device_free += 1;
                self.update_block(0, |block| block.0 -= size_bytes);
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
}

/// The contender's side of one allocation attempt.
enum Served {
    Yes { address: u64 },
    No { device_free: u64 },
}

/// Replays `recording` through a heap or paged contender and returns the snapshot it would have
/// recorded (device `recording.device`, frames shared with the recording's snapshot).
///
/// # Errors
/// [`Error::InvalidConfig`] for the `pytorch` contender (its own emulation exports itself) or invalid
/// settings; a contender bug on free.
pub fn replayed_snapshot(recording: &Recording, contender: Contender, config: &CompareConfig) -> Result<Replayed> {
    let mut writer = Writer { recording, entries: Vec::with_capacity(recording.trace.events().len() * 2) };
    let mut recorder = StatsRecorder::default();
    let frame_stacks = recording.snapshot.as_ref().map_or_else(|| vec![Vec::new()], |snapshot| snapshot.frame_stacks.clone());
    let device = recording.device;
    let segments = match contender {
        Contender::Heap(kind) => {
            let source = SimulatedSource::new(config.capacity_bytes.unwrap_or(1 << 56), SimulatedSource::DEFAULT_ALIGNMENT_BYTES);
            let mut heap = Heap::new(HeapConfig { policy: kind, ..config.heap.clone() }, source)?;
            replay_device_heap(&mut heap, 0, recording, config, &mut writer, &mut recorder)?;
            heap.report()
                .blocks
                .iter()
                .map(|block| {
                    let blocks = blocks_of(&block.layout.ranges, (0, block.size_bytes), block.base_address);
                    segment(block.base_address, block.size_bytes, blocks, false, device)
                })
                .collect()
        }
        Contender::Paged => {
            let paged = PagedConfig { page_bytes: config.page_bytes, ..PagedConfig::new(config.capacity_bytes) };
            let mut heap = PagedHeap::new(paged)?;
            replay_device_heap(&mut heap, PAGED_BASE_ADDRESS, recording, config, &mut writer, &mut recorder)?;
            let layout = heap.report();
            heap.mapped_runs()
                .into_iter()
                .map(|(offset, size)| {
                    let blocks = blocks_of(&layout.ranges, (offset, offset + size), PAGED_BASE_ADDRESS);
                    segment(PAGED_BASE_ADDRESS + offset, size, blocks, true, device)
                })
                .collect()
        }
        Contender::Pytorch => {
            return Err(Error::InvalidConfig { what: "the pytorch emulation writes its own snapshot".into() });
        }
    };
    let mut device_traces = vec![Vec::new(); device + 1];
    device_traces[device] = writer.entries;
    Ok(Replayed { snapshot: Snapshot { segments, device_traces, settings: None, frame_stacks }, stats: recorder.stats })
}

/// Replays the recording through `heap`, writing its entries (addresses shifted by `address_base`) and
/// keeping its counters.
fn replay_device_heap<H: DeviceHeap>(
    heap: &mut H,
    address_base: u64,
    recording: &Recording,
    config: &CompareConfig,
    writer: &mut Writer<'_>,
    recorder: &mut StatsRecorder,
) -> Result<()> {
    heap.record_device_events(true);
    let mut handles: Vec<Option<H::Handle>> = vec![None; recording.trace.slots() as usize];
    replay_events(recording, config, writer, |writer, index, operation| {
        let served = match operation {
            Operation::Alloc(request, slot) => match heap.allocate_request(request) {
                Ok(handle) => {
                    recorder.allocated(H::block_base(&handle), H::allocation(&handle).footprint_bytes(), request.size_bytes());
                    handles[slot as usize] = Some(handle);
                    Served::Yes { address: address_base + H::address(&handle) }
                }
                Err(Error::OutOfMemory(verdict)) => {
                    recorder.stats.num_ooms += 1;
                    Served::No { device_free: verdict.unreserved_bytes }
                }
                Err(other) => return Err(other),
            },
            Operation::Free(slot) => {
                if let Some(handle) = handles[slot as usize].take() {
                    heap.free_handle(handle)?;
                    let size_bytes = H::allocation(&handle).size_bytes();
                    recorder.freed(H::block_base(&handle), H::allocation(&handle).footprint_bytes(), size_bytes);
                    let address = address_base + H::address(&handle);
                    writer.push(Action::FreeRequested, address, size_bytes, index, None);
                    writer.push(Action::FreeCompleted, address, size_bytes, index, None);
                }
                Served::Yes { address: 0 }
            }
        };
        // After the frees written above, before the alloc entry `replay_events` writes: a segment is
        // reserved before the allocation placed in it and released after the free that emptied it.
        let events = heap.take_device_events();
        events.iter().for_each(|&event| recorder.device(event));
        writer.device_events(events, address_base, index);
        Ok(served)
    })
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
    let mut entries = Vec::new();
    let (segments, frame_stacks, stats) = match &recording.snapshot {
        Some(snapshot) => {
            let emulation =
                emulate(snapshot, device, conf, capacity_bytes).map_err(|e| crate::compare::emulation_error(recording, &e))?;
            let original = snapshot.device_traces.get(device).map_or(&[][..], Vec::as_slice);
            let mut events = emulation.segment_events.iter().peekable();
            // Recorded address -> emulated address, for the frees.
            let mut live = std::collections::HashMap::new();
            for (index, entry) in original.iter().enumerate() {
                while let Some(event) = events.next_if(|event| event.cause <= index) {
                    entries.push(TraceEntry {
                        action: event.action,
                        addr: event.addr,
                        size: event.size_bytes,
                        device_free: None,
                        ..entry.clone()
                    });
                }
                let addr = match entry.action {
                    Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap => continue,
                    Action::Alloc => match emulation.placements.get(index).copied().flatten() {
                        Some(addr) => {
                            live.insert(entry.addr, addr);
                            addr
                        }
                        None => {
                            // Refused: PyTorch would have recorded an out-of-memory error instead.
                            entries.push(TraceEntry { action: Action::Oom, addr: 0, device_free: Some(0), ..entry.clone() });
                            continue;
                        }
                    },
                    Action::FreeRequested => live.get(&entry.addr).copied().unwrap_or(entry.addr),
                    Action::FreeCompleted => live.remove(&entry.addr).unwrap_or(entry.addr),
                    _ => entry.addr,
                };
                entries.push(TraceEntry { addr, ..entry.clone() });
            }
            let last = original.last().cloned();
            for event in events {
                let template = last.clone().unwrap_or(TraceEntry {
                    action: event.action,
                    addr: 0,
                    size: 0,
                    stream: 0,
                    time_us: None,
                    device_free: None,
                    frames: StackId::NONE,
                });
                entries.push(TraceEntry {
                    action: event.action,
                    addr: event.addr,
                    size: event.size_bytes,
                    device_free: None,
                    ..template
                });
            }
            (emulation.final_segments, snapshot.frame_stacks.clone(), emulation.stats)
        }
        None => {
            let mut allocator = CachingAllocator::new(conf.clone(), capacity_bytes);
            let mut addresses = vec![None; recording.trace.slots() as usize];
            let entry = |action, addr, size| TraceEntry {
                action,
                addr,
                size,
                stream: 0,
                time_us: None,
                device_free: None,
                frames: StackId::NONE,
            };
            for event in recording.trace.events() {
                match *event {
                    Event::Alloc { slot, size_bytes } => {
                        let result = allocator.malloc(size_bytes, 0, None);
                        entries.extend(
                            allocator
                                .take_events()
                                .into_iter()
                                .map(|device| entry(device.action, device.addr, device.size_bytes)),
                        );
                        match result {
                            Ok(addr) => {
                                addresses[slot as usize] = Some((addr, size_bytes));
                                entries.push(entry(Action::Alloc, addr, size_bytes));
                            }
                            Err(_) => entries.push(TraceEntry { device_free: Some(0), ..entry(Action::Oom, 0, size_bytes) }),
                        }
                    }
                    Event::Free { slot } => {
                        if let Some((addr, size_bytes)) = addresses[slot as usize].take() {
                            allocator.free(addr);
                            entries.push(entry(Action::FreeRequested, addr, size_bytes));
                            entries.push(entry(Action::FreeCompleted, addr, size_bytes));
                            entries.extend(
                                allocator
                                    .take_events()
                                    .into_iter()
                                    .map(|device| entry(device.action, device.addr, device.size_bytes)),
                            );
                        }
                    }
                }
            }
            (allocator.report(), vec![Vec::new()], allocator.stats().clone())
        }
    };
    let mut device_traces = vec![Vec::new(); device + 1];
    device_traces[device] = entries;
    Ok(Replayed {
        snapshot: Snapshot { segments, device_traces, settings: Some(recorded_settings(conf, alloc_conf)), frame_stacks },
        stats,
    })
}

/// One step for a contender.
enum Operation {
    Alloc(Request, u32),
    Free(u32),
}

/// Feeds the recording's events to `step`, writing `alloc` and `oom` entries from what it answers.
fn replay_events(
    recording: &Recording,
    config: &CompareConfig,
    writer: &mut Writer<'_>,
    mut step: impl FnMut(&mut Writer<'_>, usize, Operation) -> Result<Served>,
) -> Result<()> {
    Request::new(1, config.align_bytes)?;
    for (index, event) in recording.trace.events().iter().enumerate() {
        match *event {
            Event::Alloc { slot, size_bytes } => {
                let served = match Request::new(size_bytes, config.align_bytes) {
                    Ok(request) => step(writer, index, Operation::Alloc(request, slot))?,
                    Err(_) => Served::No { device_free: 0 },
                };
                match served {
                    Served::Yes { address } => writer.push(Action::Alloc, address, size_bytes, index, None),
                    Served::No { device_free } => writer.push(Action::Oom, 0, size_bytes, index, Some(device_free)),
                }
            }
            Event::Free { slot } => {
                step(writer, index, Operation::Free(slot))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::story::frag_oom;
    use crate::units::MIB;
    use crate::{PolicyKind, ReleaseRule};

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
        let outcome =
            crate::compare::replay_contender(&recording.trace, Contender::Heap(PolicyKind::BestFit), &config, &|index| index)
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
        assert!(replayed_snapshot(&recording, Contender::Pytorch, &config).is_err());
    }
}
