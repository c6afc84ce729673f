//! PyTorch's caching allocator (emulated) as a target of the one replay driver, in its two forms.
//!
//! - A plain trace: a [`CachingHeap`], a heap like any other ([`HeapTarget`]): each allocation and free goes to the
//!   allocator as the driver replays it (stream 0, segments at increasing addresses).
//! - A PyTorch snapshot: a [`SnapshotTarget`], the emulation of the recording entry by entry ([`Emulator`]). PyTorch's
//!   rules need every entry — `free_requested`, `oom`, the segment entries of an `empty_cache()` call — and the
//!   recorded addresses and streams, so the target replays each whole entry when its moment begins
//!   ([`Target::begin_moment`]), from the state at the start of the recording; the moment's allocations and frees
//!   then answer with what the entry did. The driver, its moments and its observers are the same as for every other
//!   contender.
//!
//! Both are a [`CachingTarget`]: what an observer that follows the allocator's blocks and segments needs (the
//! `pytorch` contender's timeline, its snapshot export, memory under it on a device; see
//! `compare::emulate_pytorch`).

use crate::driver::{HeapTarget, Target};
use crate::recording::{Moment, Recording};
use heapscope_core::{Allocation, AllocationId, DeviceEvent, Error, OomVerdict, OwnerId, Request, Result};
use heapscope_pytorch::caching::{CachingAllocation, CachingAllocator, CachingHeap, EntryEffect, LiveBlock, OomReport};
use heapscope_pytorch::{AllocConf, Emulation, EmulationError, Emulator, Snapshot};

/// A target that is PyTorch's caching allocator: what a follower of its blocks and segments reads.
pub trait CachingTarget: Target<Handle = CachingAllocation> {
    /// The allocator now.
    fn allocator(&self) -> &CachingAllocator;

    /// What the allocator holds before the first moment, as the device events that would have made it.
    fn held_at_start(&self) -> Vec<DeviceEvent>;

    /// The allocations live at the start held elsewhere than recorded, as (recorded address, emulated address)
    /// ([`heapscope_pytorch::caching::SegmentBacking::started`]).
    fn moved_at_start(&self) -> Vec<(u64, u64)>;

    /// PyTorch's report of the request refused last.
    fn last_refusal(&self) -> Option<&OomReport>;

    /// What the moment just replayed did to the blocks, given what its last step did (`step_effect`; `Unchanged`
    /// for a moment without events).
    fn moment_effect(&self, step_effect: EntryEffect) -> EntryEffect;
}

impl CachingTarget for HeapTarget<'_, CachingHeap> {
    fn allocator(&self) -> &CachingAllocator {
        self.heap.allocator()
    }

    fn held_at_start(&self) -> Vec<DeviceEvent> {
        Vec::new()
    }

    /// A plain trace starts empty.
    fn moved_at_start(&self) -> Vec<(u64, u64)> {
        Vec::new()
    }

    fn last_refusal(&self) -> Option<&OomReport> {
        self.heap.last_refusal()
    }

    /// A plain trace's moment is one event: its step says it all.
    fn moment_effect(&self, step_effect: EntryEffect) -> EntryEffect {
        step_effect
    }
}

/// The emulation of a PyTorch snapshot's trace as the driver's target. See the module documentation.
#[derive(Debug)]
pub struct SnapshotTarget<'r> {
    emulator: Emulator<'r>,
    /// The recorded address of each start event.
    start_addresses: &'r [u64],
    next_start: usize,
    owner: OwnerId,
    next_id: u64,
    /// What the entry of the current moment did.
    effect: EntryEffect,
    served: Option<LiveBlock>,
    device_events: Vec<DeviceEvent>,
    /// Lean copies of the emulation kept along the run ([`SnapshotTarget::keep_copies`]).
    copies: Option<Copies<'r>>,
}

/// Lean copies of an emulation, each with the most it had asked the capacity about
/// ([`Emulator::capacity_read_up_to`]): the start state, then one after every `every` entries.
#[derive(Debug)]
pub struct Copies<'r> {
    every: usize,
    /// The copies, in the run's order.
    pub saved: Vec<(u64, Emulator<'r>)>,
}

impl<'r> SnapshotTarget<'r> {
    /// The emulation of `recording`, whose snapshot is `snapshot`, with `conf` on a device of `capacity_bytes`
    /// (`None`: unlimited; a recorded `oom` is then refused as the device refused it), at the start of the recording.
    ///
    /// # Errors
    /// [`EmulationError`] naming the segment, block or trace entry the emulation cannot replay.
    pub fn new(
        recording: &'r Recording,
        snapshot: &'r Snapshot,
        conf: &AllocConf,
        capacity_bytes: Option<u64>,
    ) -> std::result::Result<Self, EmulationError> {
        Ok(Self {
            // The driver follows the entries itself: no per-entry statistics (72 bytes an entry) kept.
            // The user's `empty_cache()` calls where the recording's stream has them, as every contender makes them.
            emulator: Emulator::new(snapshot, recording.device, conf, capacity_bytes)?
                .without_entry_stats()
                .with_empty_caches(std::sync::Arc::clone(&recording.empty_caches)),
            start_addresses: &recording.start_addresses,
            next_start: 0,
            owner: OwnerId::fresh(),
            next_id: 0,
            effect: EntryEffect::Unchanged,
            served: None,
            device_events: Vec::new(),
            copies: None,
        })
    }

    /// From here on, keep a lean copy of the emulation every `every` entries, and one now: checkpoints to resume
    /// from without replaying from the start (`advise`'s capacity search), taken on a run that is replayed anyway.
    pub fn keep_copies(&mut self, every: usize) {
        let now = (self.emulator.capacity_read_up_to(), self.emulator.lean_copy());
        self.copies = Some(Copies { every: every.max(1), saved: vec![now] });
    }

    /// The copies kept ([`SnapshotTarget::keep_copies`]); `None` when none were asked for.
    pub fn take_copies(&mut self) -> Option<Copies<'r>> {
        self.copies.take()
    }

    /// The emulation of the entries replayed: PyTorch's counters, the timeline of its current values, and how its
    /// decisions compare with the recorded ones.
    pub fn finish(self) -> Emulation {
        self.emulator.finish()
    }

    /// The handle of `block`, for the bytes its caller asked for (as the emulation holds them: a file that
    /// contradicts itself may record more than the block; the handle never claims more than the block).
    fn handle(&mut self, block: &LiveBlock) -> CachingAllocation {
        let id = AllocationId(self.next_id);
        self.next_id += 1;
        CachingAllocation::of_block(block, block.requested_bytes.min(block.size_bytes), self.owner, id)
    }
}

impl Target for SnapshotTarget<'_> {
    type Handle = CachingAllocation;

    fn begin_moment(&mut self, moment: Moment) -> Result<()> {
        self.effect = EntryEffect::Unchanged;
        self.served = None;
        let Moment::Entry(entry) = moment else { return Ok(()) };
        if let Some(copies) = &mut self.copies
            && entry > 0
            && entry % copies.every as u64 == 0
        {
            copies.saved.push((self.emulator.capacity_read_up_to(), self.emulator.lean_copy()));
        }
        let Some((stepped_entry, stepped)) = self.emulator.step() else {
            return Err(Error::InvalidConfig {
                what: format!("entry {entry} is past the emulated trace's end: a recording bug"),
            });
        };
        debug_assert_eq!(stepped_entry as u64, entry, "the driver's moments are the trace's entries, in order");
        self.effect = stepped.effect;
        self.served = stepped.served;
        self.device_events.extend(stepped.device_events);
        Ok(())
    }

    /// The start state's allocations are the blocks the emulation rebuilt at their recorded addresses, or allocated
    /// afresh for a what-if of the other kind of memory (one it could not place, in a file whose blocks lie outside
    /// its segments, is refused); an entry's request (an `alloc`, or the
    /// probe of a recorded `oom`) is served as the entry was.
    fn allocate(&mut self, request: Request) -> Result<Result<CachingAllocation, Option<OomVerdict>>> {
        if let Some(&address) = self.start_addresses.get(self.next_start)
            && self.emulator.entries_done() == 0
        {
            self.next_start += 1;
            // A file that contradicts itself (a block live at the start in none of its segments) leaves the
            // emulation without it: held by no one, as a request refused at the start.
            // Where the emulation holds it: the recorded address, or a new one where the start state was allocated
            // afresh (a what-if of the other kind of memory).
            let held = self.emulator.live_address(address).unwrap_or(address);
            return Ok(match self.emulator.allocator().active_block(held) {
                Some(block) => Ok(self.handle(&block)),
                None => Err(None),
            });
        }
        match (self.served, self.effect) {
            (Some(block), EntryEffect::Placed { .. } | EntryEffect::ServedAndReturned { .. }) => Ok(Ok(self.handle(&block))),
            (_, EntryEffect::Refused(report)) => Ok(Err(Some(self.emulator.allocator().verdict(&report)))),
            _ => Err(Error::InvalidConfig {
                what: format!("a request of {} B where the entry served none: a recording bug", request.size_bytes()),
            }),
        }
    }

    /// The entry freed it already (a `free_completed`; a recorded `oom` request served after all gave it back).
    fn free(&mut self, _handle: CachingAllocation) -> Result<()> {
        Ok(())
    }

    fn allocation(handle: &CachingAllocation) -> &Allocation {
        handle.allocation()
    }

    /// Offsets are per segment: no single range end means anything (as for a heap).
    fn footprint_end(_handle: &CachingAllocation) -> u64 {
        0
    }

    fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        std::mem::take(&mut self.device_events)
    }
}

impl CachingTarget for SnapshotTarget<'_> {
    fn allocator(&self) -> &CachingAllocator {
        self.emulator.allocator()
    }

    fn held_at_start(&self) -> Vec<DeviceEvent> {
        self.emulator.start_events()
    }

    fn moved_at_start(&self) -> Vec<(u64, u64)> {
        self.emulator.moved_live()
    }

    /// The current entry's refusal: a refused step is always the current entry's.
    fn last_refusal(&self) -> Option<&OomReport> {
        match &self.effect {
            EntryEffect::Refused(report) => Some(report),
            _ => None,
        }
    }

    /// The entry's own effect: it says what entries without events did too (a free of a block the start state
    /// holds for a zero-byte request, a recorded `oom` served after all).
    fn moment_effect(&self, _step_effect: EntryEffect) -> EntryEffect {
        self.effect
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{Statistics, Stream, drive};
    use heapscope_pytorch::Action;

    /// The shared snapshots, whole and cut mid-run, through the driver with the emulation as the target and the
    /// statistics every heap contender reports: the driver's count of requested bytes is PyTorch's own
    /// (`requested_bytes`) at the end and at the peak, each `alloc` entry is one allocation, the emulation's
    /// device events come out of the target, and the emulation run this way is `emulate`'s run.
    #[test]
    fn the_emulation_of_a_snapshot_is_a_target_like_any_other() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
        for name in ["frag_oom-default", "gpt2_train_fixed-expandable"] {
            let whole = heapscope_pytorch::read_snapshot(&dir.join(format!("{name}.pickle.gz"))).unwrap();
            for cut in [0, 1, 2] {
                let context = format!("{name} cut at {cut}/3");
                let mut snapshot = whole.clone();
                let trace = &mut snapshot.device_traces[0];
                trace.drain(..cut * trace.len() / 3);
                let recording = Recording::from_snapshot(name, snapshot, 0).unwrap();
                let snapshot = recording.snapshot.as_ref().unwrap();
                let conf = AllocConf::default();
                let mut target = SnapshotTarget::new(&recording, snapshot, &conf, None).unwrap();
                let start_reserved: u64 = target
                    .held_at_start()
                    .iter()
                    .map(|event| match *event {
                        DeviceEvent::Reserved { size_bytes, .. } | DeviceEvent::Mapped { size_bytes, .. } => size_bytes,
                        _ => 0,
                    })
                    .sum();
                assert_eq!(start_reserved, target.allocator().reserved_bytes(), "{context}");
                // This test compares every entry's statistics: an emulator that keeps them.
                target.emulator = Emulator::new(snapshot, 0, &conf, None).unwrap();
                let mut statistics = Statistics::default();
                drive(Stream::of(&recording), &mut target, 1, &mut [&mut statistics]).unwrap();
                let emulation = target.finish();
                let alone = heapscope_pytorch::emulate(snapshot, 0, &conf, None).unwrap();
                assert_eq!(emulation.timeline, alone.timeline, "{context}");
                assert_eq!((emulation.fidelity, &emulation.stats), (alone.fidelity, &alone.stats), "{context}");
                let requested = emulation.stats.requested_bytes.all();
                let stats = &statistics.stats;
                assert_eq!(stats.live_bytes as i64, requested.current, "{context}");
                assert_eq!(stats.peak_live_bytes as i64, requested.peak, "{context}");
                // Refused: the requests PyTorch refused (a recorded `oom` is one too, replayed as a probe).
                assert_eq!(stats.failed_allocations as i64, emulation.stats.num_ooms, "{context}");
                let requests = snapshot.device_traces[0]
                    .iter()
                    .filter(|entry| matches!(entry.action, Action::Alloc | Action::Oom) && entry.size > 0)
                    .count();
                assert_eq!(stats.allocations + stats.failed_allocations, (requests + recording.start_events) as u64, "{context}");
            }
        }
    }
}
