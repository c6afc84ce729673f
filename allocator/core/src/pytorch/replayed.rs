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
use crate::pytorch::{Action, Block, BlockState, Pool, Segment, Snapshot, StackId, TraceEntry};
use crate::recording::Recording;
use crate::report::RangeReport;
use crate::trace::Event;
use crate::{DeviceEvent, Error, Heap, HeapConfig, PagedConfig, PagedHeap, RangeState, Request, Result, SimulatedSource};

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
pub fn replayed_snapshot(recording: &Recording, contender: Contender, config: &CompareConfig) -> Result<Snapshot> {
    let mut writer = Writer { recording, entries: Vec::with_capacity(recording.trace.events().len() * 2) };
    let frame_stacks = recording.snapshot.as_ref().map_or_else(|| vec![Vec::new()], |snapshot| snapshot.frame_stacks.clone());
    let device = recording.device;
    let segments = match contender {
        Contender::Heap(kind) => {
            let source = SimulatedSource::new(config.capacity_bytes.unwrap_or(1 << 56), SimulatedSource::DEFAULT_ALIGNMENT_BYTES);
            let mut heap = Heap::new(HeapConfig { policy: kind, ..config.heap.clone() }, source)?;
            heap.record_device_events(true);
            let mut handles = vec![None; recording.trace.slots() as usize];
            replay_events(recording, config, &mut writer, |writer, index, event| match event {
                Operation::Alloc(request, slot) => {
                    let served = match heap.allocate(request, None) {
                        Ok(allocation) => {
                            let address = allocation.address();
                            handles[slot as usize] = Some(allocation);
                            Served::Yes { address }
                        }
                        Err(Error::OutOfMemory(verdict)) => Served::No { device_free: verdict.unreserved_bytes },
                        Err(other) => return Err(other),
                    };
                    writer.device_events(heap.take_device_events(), 0, index);
                    Ok(served)
                }
                Operation::Free(slot) => {
                    if let Some(allocation) = handles[slot as usize].take() {
                        heap.free(allocation)?;
                        writer.push(Action::FreeRequested, allocation.address(), allocation.size_bytes(), index, None);
                        writer.push(Action::FreeCompleted, allocation.address(), allocation.size_bytes(), index, None);
                    }
                    writer.device_events(heap.take_device_events(), 0, index);
                    Ok(Served::Yes { address: 0 })
                }
            })?;
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
            heap.record_device_events(true);
            let mut handles = vec![None; recording.trace.slots() as usize];
            replay_events(recording, config, &mut writer, |writer, index, event| match event {
                Operation::Alloc(request, slot) => {
                    let served = match heap.allocate(request) {
                        Ok(allocation) => {
                            handles[slot as usize] = Some(allocation);
                            Served::Yes { address: PAGED_BASE_ADDRESS + allocation.offset() }
                        }
                        Err(Error::OutOfMemory(verdict)) => Served::No { device_free: verdict.unreserved_bytes },
                        Err(other) => return Err(other),
                    };
                    writer.device_events(heap.take_device_events(), PAGED_BASE_ADDRESS, index);
                    Ok(served)
                }
                Operation::Free(slot) => {
                    if let Some(allocation) = handles[slot as usize].take() {
                        heap.free(allocation)?;
                        let address = PAGED_BASE_ADDRESS + allocation.offset();
                        writer.push(Action::FreeRequested, address, allocation.size_bytes(), index, None);
                        writer.push(Action::FreeCompleted, address, allocation.size_bytes(), index, None);
                    }
                    writer.device_events(heap.take_device_events(), PAGED_BASE_ADDRESS, index);
                    Ok(Served::Yes { address: 0 })
                }
            })?;
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
    Ok(Snapshot { segments, device_traces, settings: None, frame_stacks })
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
        let snapshot = replayed_snapshot(&recording, Contender::Heap(PolicyKind::BestFit), &config).unwrap();
        assert_eq!((count(&snapshot, Action::Alloc), count(&snapshot, Action::Oom)), (40, 1));
        assert_eq!(count(&snapshot, Action::FreeCompleted), 20);
        let reserved = count(&snapshot, Action::SegmentAlloc) - count(&snapshot, Action::SegmentFree);
        assert_eq!(reserved, snapshot.segments.len());
        for segment in &snapshot.segments {
            // Blocks tile the segment, and what is allocated sums up.
            assert_eq!(segment.blocks.iter().map(|block| block.size).sum::<u64>(), segment.total_size);
            assert_eq!(segment.blocks[0].address, segment.address);
        }
        let allocated: u64 = snapshot.segments.iter().map(|segment| segment.requested_size).sum();
        assert_eq!(allocated, 20 * 100 * MIB, "the 100 MiB tensors are still live");
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
    fn paged_replay_maps_and_unmaps() {
        let story = frag_oom();
        let recording = Recording::from_trace(story.trace);
        let config = CompareConfig { capacity_bytes: Some(story.device_bytes), ..CompareConfig::default() };
        let snapshot = replayed_snapshot(&recording, Contender::Paged, &config).unwrap();
        assert_eq!((count(&snapshot, Action::Alloc), count(&snapshot, Action::Oom)), (41, 0));
        assert!(count(&snapshot, Action::SegmentUnmap) > 0);
        let mapped: u64 = snapshot.segments.iter().map(|segment| segment.total_size).sum();
        assert_eq!(mapped, 3024 * MIB);
        assert!(snapshot.segments.iter().all(|segment| segment.is_expandable));
        assert!(replayed_snapshot(&recording, Contender::Pytorch, &config).is_err());
    }
}
