//! Replaying a snapshot's trace through the emulated allocator, and comparing its decisions with the
//! recorded ones.
//!
//! Only `alloc`, `free_requested`, `free_completed` and `oom` entries drive the emulation; recorded
//! segment events are used as inputs in two places only, for facts that are not allocator decisions:
//! the address a new segment or expandable segment's reservation gets (the recorded `alloc` that opens it
//! sits at its base, so that alloc's `addr` is passed as a hint; a reservation made by a recorded `oom`, which
//! has no address, takes the base of the first `alloc` that lands in it), and user `empty_cache()` calls,
//! which show only as `segment_free`
//! / `segment_unmap` entries that the emulated allocator would not have produced for the next request.
//! At a recorded `oom` the request is attempted with the driver's free bytes the entry recorded (or the
//! given capacity).

use super::backing::{BackingRefused, EntryEffect, SegmentBacking, Unbacked, device_event, held_now};
use super::initial::{LiveMap, reallocate_start_state, rebuild_start_state};
use super::validate::{EmulationError, validate};
use super::{CachingAllocator, DeviceEvent, LiveBlock, OomReport, RequestPools};
use crate::alloc_conf::AllocConf;
use crate::memory_stats::MemoryStats;
use crate::snapshot::{Action, Segment, Snapshot, TraceEntry};

/// A segment event (`segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`) and the trace entry
/// that caused it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SegmentEvent {
    /// Action.
    pub action: Action,
    /// Address.
    pub addr: u64,
    /// Bytes.
    pub size_bytes: u64,
    /// Index of the trace entry that caused it: the first entry after it that is neither a segment event nor a mark
    /// (the request that needed the memory, or what followed an `empty_cache()`).
    pub cause: usize,
}

impl SegmentEvent {
    fn same_decision(&self, other: &SegmentEvent) -> bool {
        self.action == other.action && self.size_bytes == other.size_bytes && self.cause == other.cause
    }
}

/// Current all-pool values after one trace entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct EventStats {
    /// `allocated_bytes.all.current`.
    pub allocated_bytes: i64,
    /// `reserved_bytes.all.current`.
    pub reserved_bytes: i64,
    /// `active_bytes.all.current`.
    pub active_bytes: i64,
    /// `requested_bytes.all.current`.
    pub requested_bytes: i64,
    /// `num_device_alloc` so far.
    pub num_device_alloc: i64,
    /// `num_device_free` so far.
    pub num_device_free: i64,
    /// `num_ooms` so far.
    pub num_ooms: i64,
}

/// An out-of-memory error of the emulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct OomEvent {
    /// Index of the trace entry (`alloc` or `oom`) whose request failed.
    pub event_index: usize,
    /// The verdict.
    pub report: OomReport,
}

/// The first place where the emulated segment events differ from the recorded ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Mismatch {
    /// Position in both segment event lists.
    pub position: usize,
    /// What PyTorch recorded there (`None`: the recording ended).
    pub recorded: Option<SegmentEvent>,
    /// What the emulation did there (`None`: the emulation did no more).
    pub emulated: Option<SegmentEvent>,
}

/// The first allocation placed at another address than PyTorch placed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Misplacement {
    /// Index of the `alloc` entry.
    pub event_index: usize,
    /// Recorded address.
    pub recorded_addr: u64,
    /// Emulated address (`None`: the emulation ran out of memory).
    pub emulated_addr: Option<u64>,
}

/// How closely the emulation reproduced the recording.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Fidelity {
    /// Recorded segment events.
    pub recorded: usize,
    /// Positions where the emulated segment event equals the recorded one (action, size, cause).
    pub matched: usize,
    /// Of those, the ones at the recorded address too.
    pub addresses_matched: usize,
    /// How well the driver's rule foretold the recorded `cudaMalloc` bases (see [`super::AddressSource`]); nothing
    /// placed when the emulation used the rule itself.
    pub driver_rule: super::DriverRuleScore,
    /// The first difference.
    pub first_mismatch: Option<Mismatch>,
    /// Recorded allocations.
    pub allocs: usize,
    /// Allocations placed at the recorded address.
    pub placement_matched: usize,
    /// The first misplaced allocation.
    pub first_misplacement: Option<Misplacement>,
    /// Allocations live at the start of the recording that lie in no segment it shows (its final segments, and the
    /// segments and pages its trace reserves and returns): PyTorch could not have held them, and the emulation
    /// leaves them out.
    pub start_left_out: usize,
}

impl Fidelity {
    /// Every segment event and every placement matched, and every allocation live at the start held.
    pub fn is_exact(&self) -> bool {
        self.first_mismatch.is_none() && self.placement_matched == self.allocs && self.start_left_out == 0
    }
}

/// The result of [`emulate`].
#[derive(Clone, Debug, Default)]
pub struct Emulation {
    /// Emulated segment events in order.
    pub segment_events: Vec<SegmentEvent>,
    /// Current values after each trace entry.
    pub timeline: Vec<EventStats>,
    /// `memory_stats()` at the end.
    pub stats: MemoryStats,
    /// The first out-of-memory error.
    pub first_oom: Option<OomEvent>,
    /// Comparison with the recording.
    pub fidelity: Fidelity,
    /// Segments at the end, in the snapshot's layout.
    pub final_segments: Vec<Segment>,
    /// Where the emulation placed each `alloc` entry, and each recorded `oom` request it served after all
    /// (given back at once), by entry index; `None` for other entries and refused requests.
    pub placements: Vec<Option<u64>>,
    /// The entries where it called `empty_cache()` for the recording's user: the first entry of each run of segment
    /// frees of the allocator's own pools that the allocator would not have made there for a request of its own (a
    /// private pool's memory given back alone, `emptyCache(id)`, is none).
    pub empty_caches: Vec<usize>,
}

fn is_segment_action(a: Action) -> bool {
    matches!(a, Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap)
}

/// The recorded segment events with their causes (marks, `snapshot` and `user_defined`, cause none).
pub(super) fn recorded_segment_events(trace: &[TraceEntry]) -> Vec<SegmentEvent> {
    let mut out = Vec::new();
    let mut cause = trace.len();
    for (i, e) in trace.iter().enumerate().rev() {
        if is_segment_action(e.action) {
            out.push(SegmentEvent { action: e.action, addr: e.addr, size_bytes: e.size, cause });
        } else if !e.action.is_mark() {
            cause = i;
        }
    }
    out.reverse();
    out
}

/// Replays device `device`'s trace of `snapshot` through the emulated caching allocator with settings
/// `conf` and `capacity_bytes` of device memory (`None` = unlimited; recorded `oom` entries then use the
/// driver's free bytes they recorded), starting from the state at the start of the recording.
///
/// # Errors
///
/// [`EmulationError`] naming the segment, block or trace entry the emulation cannot replay (see the
/// `validate` module for what it relies on); entries that are merely odd (frees of unknown addresses, an
/// address allocated twice) replay.
pub fn emulate(
    snapshot: &Snapshot,
    device: usize,
    conf: &AllocConf,
    capacity_bytes: Option<u64>,
) -> Result<Emulation, EmulationError> {
    emulate_backed(snapshot, device, conf, capacity_bytes, &mut Unbacked)
}

/// The entries of device `device`'s trace where the recording's user called `empty_cache()`: the first entry of each
/// run of segment frees of the allocator's own pools that the emulation of the recorded run (its settings, a device of
/// `capacity_bytes`) finds the allocator would not have made for the request after it. A snapshot records no such
/// call; these are the places every contender replaying it makes one. The emulation stops after the last segment
/// free; where the trace frees no segment, nothing is emulated.
///
/// # Errors
/// [`EmulationError`] where the recording cannot be emulated (the `pytorch` contender says the same).
pub fn user_empty_caches(snapshot: &Snapshot, device: usize, capacity_bytes: Option<u64>) -> Result<Vec<usize>, EmulationError> {
    let trace = snapshot.device_traces.get(device).map_or(&[][..], Vec::as_slice);
    let Some(last) = trace.iter().rposition(|entry| matches!(entry.action, Action::SegmentFree | Action::SegmentUnmap)) else {
        return Ok(Vec::new());
    };
    let mut emulator = Emulator::new(snapshot, device, &AllocConf::of_snapshot(snapshot), capacity_bytes)?.lean();
    while emulator.entries_done() <= last && emulator.step().is_some() {}
    Ok(emulator.out.empty_caches)
}

/// [`emulate`] with memory under the allocator: `backing` first receives what the allocator holds at the start
/// of the recording (a `Reserved` per segment, a `Mapped` per mapped expandable range), then every segment
/// operation as the emulation makes it, and after each entry what it did to the blocks
/// ([`SegmentBacking::replayed`]). See [`SegmentBacking`]. The [`Emulator`] stepped through every entry; the lab's
/// replay driver steps it the same way, moment by moment, with its observers.
///
/// # Errors
///
/// What [`emulate`] returns; [`EmulationError::Backing`] naming the trace entry whose segment operation the
/// backing refused (the replay stops there).
pub fn emulate_backed(
    snapshot: &Snapshot,
    device: usize,
    conf: &AllocConf,
    capacity_bytes: Option<u64>,
    backing: &mut dyn SegmentBacking,
) -> Result<Emulation, EmulationError> {
    let mut emulator = Emulator::new(snapshot, device, conf, capacity_bytes)?;
    let refused = |entry: usize| move |what: BackingRefused| EmulationError::Backing { device, entry, what: what.0 };
    let start = emulator.start_events();
    if !start.is_empty() {
        backing.apply(&start, emulator.allocator()).map_err(refused(0))?;
    }
    backing.started(emulator.allocator(), &emulator.moved_live());
    while let Some((entry, stepped)) = emulator.step() {
        if !stepped.device_events.is_empty() {
            backing.apply(&stepped.device_events, emulator.allocator()).map_err(refused(entry))?;
        }
        backing.replayed(entry, stepped.effect, emulator.allocator());
    }
    Ok(emulator.finish())
}

/// What one trace entry did to the emulated allocator (see [`Emulator::step`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stepped {
    /// What it did to the blocks.
    pub effect: EntryEffect,
    /// The block that served its request (an `alloc`; a recorded `oom` served after all, as it was before it
    /// was given back).
    pub served: Option<LiveBlock>,
    /// The segment operations it made, in order, as core device events (at the allocator's addresses).
    pub device_events: Vec<heapscope_core::DeviceEvent>,
}

/// PyTorch's caching allocator replaying one device's trace of a snapshot, one entry per [`Emulator::step`],
/// from the state at the start of the recording; [`Emulator::finish`] gives the [`Emulation`] (counters,
/// timeline, fidelity). [`emulate`] steps it through every entry; a replay driver steps it moment by moment,
/// telling its observers what each entry did.
#[derive(Clone, Debug)]
pub struct Emulator<'s> {
    trace: &'s [TraceEntry],
    /// The recording (what its entries' memory pool ids name).
    snapshot: &'s Snapshot,
    /// The memory pool each entry's request went to.
    pools: std::sync::Arc<RequestPools>,
    /// Keeps the per-entry record (placements, timeline, segment events, fidelity); off for a yes / no replay.
    record: bool,
    /// Keeps [`Emulation::timeline`] and [`Emulation::placements`] (72 bytes an entry: a gigabyte for a 1 GB file), on
    /// unless [`Emulator::without_entry_stats`].
    entry_stats: bool,
    capacity_bytes: Option<u64>,
    alloc: CachingAllocator,
    /// Live allocations: recorded address -> emulated address.
    live: LiveMap,
    out: Emulation,
    fidelity: Fidelity,
    /// The end of the last run of segment entries checked for an `empty_cache()` call.
    empty_cache_checked_until: usize,
    /// The entries where the recording's user called `empty_cache()` (by their first segment entry), when given
    /// ([`Emulator::with_empty_caches`]): taken as they are instead of told from this run's state.
    given_empty_caches: Option<std::sync::Arc<[usize]>>,
    next: usize,
    /// The most a request tried on a copy of the allocator reserved (the check for an `empty_cache()` call): the
    /// capacity was read up to there, beside the allocator's own peak.
    capacity_read_up_to: u64,
    /// What the recording held reserved before the next entry: its start's, and each segment entry since. A recorded
    /// `oom` on no capacity given is on a device of that plus the driver's free bytes it recorded (both measured after
    /// PyTorch released its cache for it).
    recorded_reserved_bytes: u64,
}

/// `reserved` after `entries`.
fn reserved_after(reserved: u64, entries: &[TraceEntry]) -> u64 {
    let after = entries.iter().fold(i128::from(reserved), |bytes, entry| (bytes + entry.reserved_change()).max(0));
    u64::try_from(after).unwrap_or(u64::MAX)
}

/// Where the driver's rule starts ([`Emulator::hide_addresses`]): the top of the trace's first `cudaMalloc` range and
/// the trace's first mapped page.
fn driver_anchors(trace: &[TraceEntry]) -> (Option<u64>, Option<u64>) {
    let first = |action: Action| trace.iter().find(|e| e.action == action);
    let cuda_malloc_top = first(Action::SegmentAlloc)
        .and_then(|e| e.addr.checked_add(e.size)?.checked_next_multiple_of(super::DRIVER_GRANULE_BYTES));
    (cuda_malloc_top, first(Action::SegmentMap).map(|e| e.addr))
}

/// Whether a recording made with expandable segments shows PyTorch's rule before 2.5, private pools served from whole
/// `cudaMalloc` segments: a final segment of a private pool that is not expandable, or a `segment_alloc` of one
/// (`pools`: the pool of each entry). From 2.5 on, private pools map pages as the default pools do.
fn private_pools_whole(snapshot: &Snapshot, device: usize, trace: &[TraceEntry], pools: &RequestPools) -> bool {
    let private = |id: (i64, i64)| id != (0, 0);
    let whole_final = snapshot
        .segments
        .iter()
        .any(|segment| segment.device as usize == device && private(segment.segment_pool_id) && !segment.is_expandable);
    whole_final
        || trace
            .iter()
            .enumerate()
            .any(|(k, entry)| entry.action == Action::SegmentAlloc && private(pools.pool_id(snapshot, k, entry.pool_id)))
}

impl<'s> Emulator<'s> {
    /// The allocator at the start of device `device`'s recording in `snapshot` (settings `conf`, a device of
    /// `capacity_bytes`), ready for its first entry. With expandable segments turned on or off against the recording,
    /// new segments are placed by the driver's rule ([`Emulator::hide_addresses`]): the recorded addresses are of the
    /// other kind of memory; and what was live at the start of a recording begun mid-run is allocated afresh, in
    /// address order, in segments of this run's kind (the `initial` module's `reallocate_start_state`). Other what-ifs
    /// keep the recorded addresses and layout, the driver's own answers to this program.
    ///
    /// # Errors
    /// [`EmulationError`] naming the segment, block or trace entry the emulation cannot replay.
    pub fn new(
        snapshot: &'s Snapshot,
        device: usize,
        conf: &AllocConf,
        capacity_bytes: Option<u64>,
    ) -> Result<Self, EmulationError> {
        validate(snapshot, device)?;
        let trace = snapshot.device_traces.get(device).map_or(&[][..], Vec::as_slice);
        // With expandable segments turned on or off, the recorded addresses come from the other kind of memory
        // (reservations rise, cudaMalloc's bases fall): they cannot say where this run's segments go, nor the recorded
        // segments hold what was live at the start.
        let other_kind = conf.expandable_segments != AllocConf::of_snapshot(snapshot).expandable_segments;
        let pools = RequestPools::of(snapshot, device);
        let (mut alloc, mut live, mut start_left_out) = rebuild_start_state(snapshot, device, conf, capacity_bytes, &pools)?;
        let recorded_reserved_bytes = alloc.reserved_bytes();
        if !other_kind && conf.expandable_segments && private_pools_whole(snapshot, device, trace, &pools) {
            alloc.set_private_pools_whole();
        }
        if other_kind {
            let (cuda_malloc_top, reserve_bottom) = driver_anchors(trace);
            alloc.use_driver_addresses(cuda_malloc_top, reserve_bottom);
            // A state with no trace replays nothing: it stays as recorded.
            if !live.is_empty() && !trace.is_empty() {
                // Held from the start whatever the device, as the recorded layout is (a device too small for what
                // PyTorch held at the start is the caller's to refuse): the capacity applies from the first entry.
                let mut fresh = CachingAllocator::new(conf.clone(), None);
                fresh.use_driver_addresses(cuda_malloc_top, reserve_bottom);
                let refused;
                (alloc, live, refused) = reallocate_start_state(&alloc, &live, fresh);
                start_left_out += refused;
                alloc.set_capacity(capacity_bytes);
            }
        }
        let out =
            Emulation { placements: vec![None; trace.len()], timeline: Vec::with_capacity(trace.len()), ..Emulation::default() };
        let emulator = Self {
            trace,
            snapshot,
            pools: std::sync::Arc::new(pools),
            record: true,
            entry_stats: true,
            capacity_bytes,
            alloc,
            live,
            out,
            fidelity: Fidelity { start_left_out, ..Fidelity::default() },
            empty_cache_checked_until: 0,
            given_empty_caches: None,
            next: 0,
            capacity_read_up_to: 0,
            recorded_reserved_bytes,
        };
        Ok(emulator)
    }

    /// The memory pool entry `entry`'s request went to ([`RequestPools`]).
    fn pool_id(&self, entry: usize) -> (i64, i64) {
        let pool_id = self.trace.get(entry).map_or(crate::snapshot::PoolId::DEFAULT, |e| e.pool_id);
        self.pools.pool_id(self.snapshot, entry, pool_id)
    }

    /// The allocator now.
    pub fn allocator(&self) -> &CachingAllocator {
        &self.alloc
    }

    /// The same emulator placing new segments and reservations by the driver's rule instead of at the addresses the
    /// trace gives ([`super::AddressSource::Driver`]): what a run with expandable segments turned on or off against
    /// the recording does (the recording cannot say where the driver would have put memory of the other kind), and a
    /// measure of the rule on a recording's own run. The first `cudaMalloc` range ends where the recording's first ended and the
    /// first reservation starts where the recording's first mapped page is (the one address a process's layout
    /// gives; the rest is the rule's).
    pub fn hide_addresses(mut self) -> Self {
        let (cuda_malloc_top, reserve_bottom) = driver_anchors(self.trace);
        self.alloc.use_driver_addresses(cuda_malloc_top, reserve_bottom);
        self
    }

    /// The same emulator keeping no per-entry record (placements, timeline, segment events, fidelity) and telling only
    /// each entry's effect ([`Stepped::served`] and [`Stepped::device_events`] stay empty): for a replay that asks only
    /// what the allocator does — whether a request is refused — and for cheap clones of its state.
    pub fn lean(mut self) -> Self {
        self.record = false;
        self.out.placements = Vec::new();
        self
    }

    /// The same emulator keeping the segment events and the fidelity but not each entry's statistics and placement
    /// ([`Emulation::timeline`] and [`Emulation::placements`] stay empty): a replay whose caller follows the entries
    /// itself (the lab's driver) and would otherwise hold 72 bytes an entry it never reads.
    pub fn without_entry_stats(mut self) -> Self {
        self.entry_stats = false;
        self.out.placements = Vec::new();
        self.out.timeline = Vec::new();
        self
    }

    /// A lean copy of this emulator's state ([`Emulator::lean`]) that leaves its per-entry record behind instead of
    /// copying it: a checkpoint of a recording run to resume later.
    pub fn lean_copy(&self) -> Self {
        Self {
            trace: self.trace,
            snapshot: self.snapshot,
            pools: std::sync::Arc::clone(&self.pools),
            record: false,
            entry_stats: false,
            capacity_bytes: self.capacity_bytes,
            alloc: self.alloc.clone(),
            live: self.live.clone(),
            out: Emulation { first_oom: self.out.first_oom, ..Emulation::default() },
            fidelity: self.fidelity,
            empty_cache_checked_until: self.empty_cache_checked_until,
            given_empty_caches: self.given_empty_caches.clone(),
            next: self.next,
            capacity_read_up_to: self.capacity_read_up_to,
            recorded_reserved_bytes: self.recorded_reserved_bytes,
        }
    }

    /// The same emulator taking the recording's user `empty_cache()` calls at `entries` (each the first entry of its
    /// run of segment frees, as [`user_empty_caches`] finds them on the recorded run, or any entry, as heapscope's export
    /// of another contender lists them: [`crate::ContenderExport`]; sorted) instead of telling them
    /// from this run's state: a what-if makes the user's calls where they were made, as the heaps replaying the same
    /// recording do, and none where the recording's allocator gave memory back for a request of its own (the same
    /// entries on the recorded run).
    pub fn with_empty_caches(mut self, entries: std::sync::Arc<[usize]>) -> Self {
        self.given_empty_caches = Some(entries);
        self
    }

    /// From now on, a device of `capacity_bytes`. Resuming a copy of a run on a larger device is the same run up to
    /// the first request that would exceed the new capacity, as long as nothing read the capacity before (garbage
    /// collection's threshold does): what `advise`'s capacity search relies on.
    pub fn set_capacity(&mut self, capacity_bytes: Option<u64>) {
        self.capacity_bytes = capacity_bytes;
        self.alloc.set_capacity(capacity_bytes);
    }

    /// The most reserved bytes this run has asked the capacity about so far: the allocator's peak, and what a request
    /// tried on a copy of it reserved. A run on a device at least that large decided alike up to here.
    pub fn capacity_read_up_to(&self) -> u64 {
        let peak = u64::try_from(self.alloc.stats().reserved_bytes.all().peak).unwrap_or(u64::MAX);
        peak.max(self.capacity_read_up_to)
    }

    /// Replays the entries left until a request is refused: that entry and PyTorch's report of it, or `None` when the
    /// recording ends first.
    pub fn run_to_refusal(&mut self) -> Option<(usize, OomReport)> {
        while let Some((entry, stepped)) = self.step() {
            if let EntryEffect::Refused(report) = stepped.effect {
                return Some((entry, report));
            }
        }
        None
    }

    /// What the allocator holds now as the device events that would have made it: a `Reserved` per segment, a
    /// `Mapped` per mapped range of an expandable segment (before the first step: the state at the start of the
    /// recording).
    pub fn start_events(&self) -> Vec<heapscope_core::DeviceEvent> {
        held_now(&self.alloc)
    }

    /// Where the emulation holds the allocation PyTorch recorded at `recorded_addr`, while it is live.
    pub fn live_address(&self, recorded_addr: u64) -> Option<u64> {
        self.live.get(&recorded_addr).copied()
    }

    /// The live allocations the emulation holds elsewhere than the recording did, as (recorded address, emulated
    /// address) in recorded address order: before the first entry, those of the start state a what-if of the other
    /// kind of memory allocated afresh.
    pub fn moved_live(&self) -> Vec<(u64, u64)> {
        let mut moved: Vec<(u64, u64)> =
            self.live.iter().filter(|&(recorded, emulated)| recorded != emulated).map(|(&r, &e)| (r, e)).collect();
        moved.sort_unstable();
        moved
    }

    /// The trace entry replayed so far.
    pub fn entries_done(&self) -> usize {
        self.next
    }

    /// Replays the next trace entry: its index and what it did (`None` after the last).
    pub fn step(&mut self) -> Option<(usize, Stepped)> {
        let i = self.next;
        let e = self.trace.get(i)?;
        self.next += 1;
        let mut effect = EntryEffect::Unchanged;
        let mut served = None;
        let mut cause = i;
        let pool_id = self.pool_id(i);
        // A call given at an entry where no run of segment frees starts, which the run below would take: heapscope's
        // export of another contender lists the calls where that contender released nothing (or in the middle of its
        // own releases), and PyTorch's allocator makes them all the same.
        let run_start = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap) && i >= self.empty_cache_checked_until;
        if !run_start && self.given_empty_caches.as_ref().is_some_and(|given| given.binary_search(&i).is_ok()) {
            self.out.empty_caches.push(i);
            self.alloc.empty_cache();
        }
        match e.action {
            Action::Alloc => {
                self.fidelity.allocs += 1;
                match self.alloc.malloc_in(pool_id, e.size, e.stream, Some(e.addr)) {
                    Ok(addr) => {
                        if let Some(placement) = self.out.placements.get_mut(i) {
                            *placement = Some(addr);
                        }
                        effect = EntryEffect::Placed { address: addr };
                        if self.record {
                            served = self.alloc.live_block(addr);
                        }
                        if addr == e.addr {
                            self.fidelity.placement_matched += 1;
                        } else {
                            self.fidelity.first_misplacement.get_or_insert(Misplacement {
                                event_index: i,
                                recorded_addr: e.addr,
                                emulated_addr: Some(addr),
                            });
                        }
                        self.live.insert(e.addr, addr);
                    }
                    Err(report) => {
                        self.fidelity.first_misplacement.get_or_insert(Misplacement {
                            event_index: i,
                            recorded_addr: e.addr,
                            emulated_addr: None,
                        });
                        effect = EntryEffect::Refused(report);
                        self.out.first_oom.get_or_insert(OomEvent { event_index: i, report });
                    }
                }
            }
            Action::FreeRequested => {
                if let Some(&addr) = self.live.get(&e.addr) {
                    self.alloc.free_requested(addr);
                }
            }
            Action::FreeCompleted => {
                if let Some(addr) = self.live.remove(&e.addr)
                    && self.alloc.free_completed(addr)
                {
                    effect = EntryEffect::Freed { address: addr };
                }
            }
            Action::Oom => {
                match attempt_recorded_oom(&mut self.alloc, pool_id, e, self.capacity_bytes, self.recorded_reserved_bytes) {
                    Ok(block) => {
                        if let Some(placement) = self.out.placements.get_mut(i) {
                            *placement = Some(block.address);
                        }
                        effect = EntryEffect::ServedAndReturned { address: block.address, size_bytes: block.size_bytes };
                        served = Some(block);
                    }
                    Err(report) => {
                        effect = EntryEffect::Refused(report);
                        self.out.first_oom.get_or_insert(OomEvent { event_index: i, report });
                    }
                }
            }
            Action::SegmentFree | Action::SegmentUnmap if i >= self.empty_cache_checked_until => {
                let next = self.trace[i..]
                    .iter()
                    .position(|t| !is_segment_action(t.action) && !t.action.is_mark())
                    .map_or(self.trace.len(), |p| i + p);
                self.empty_cache_checked_until = next;
                // The memory the recording gives back here: of which private pools (as the emulation holds it), and
                // whether of the allocator's own pools too.
                let mut private: Vec<((i64, i64), u64)> = Vec::new();
                let mut own_too = false;
                for t in self.trace[i..next].iter().filter(|t| matches!(t.action, Action::SegmentFree | Action::SegmentUnmap)) {
                    match self.alloc.pool_id_at(t.addr) {
                        Some(pool_id) if pool_id != (0, 0) => private.push((pool_id, t.addr)),
                        _ => own_too = true,
                    }
                }
                // The user's calls, where given, are for the allocator's own pools; a run of private pools alone is
                // told from this run's state as ever.
                let given = self.given_empty_caches.as_ref().filter(|_| own_too || private.is_empty());
                // The next entry's request, on the device the recording tells there (after the run's segment entries).
                let next_entry = self
                    .trace
                    .get(next)
                    .map(|entry| (entry, self.pool_id(next), reserved_after(self.recorded_reserved_bytes, &self.trace[i..next])));
                let mut freed = Vec::new();
                if given.is_none() {
                    let (would, tried) = allocator_would_release(&self.alloc, next_entry, self.capacity_bytes);
                    self.capacity_read_up_to = self.capacity_read_up_to.max(tried);
                    freed = would;
                }
                // A private pool's memory the next request would not release itself: the pool is gone (its graph or
                // `MemPool` freed, PyTorch's `graph_pools_freeable`), released from now on. (Its own request may
                // release its oversize blocks: that pool lives on.)
                if private.iter().any(|(_, addr)| !freed.contains(addr)) {
                    for &(pool_id, _) in &private {
                        self.alloc.set_freeable(pool_id);
                    }
                    let (again, tried) = allocator_would_release(&self.alloc, next_entry, self.capacity_bytes);
                    self.capacity_read_up_to = self.capacity_read_up_to.max(tried);
                    freed = again;
                }
                let user_call = match given {
                    Some(given) => given.binary_search(&i).is_ok(),
                    None => freed.is_empty(),
                };
                if user_call {
                    if own_too || private.is_empty() {
                        // The user's `empty_cache()`: the one every contender makes.
                        self.out.empty_caches.push(i);
                        self.alloc.empty_cache();
                    } else {
                        // Only private pools give memory back: `emptyCache(id)` of each (a `MemPool` deleted), which
                        // leaves the allocator's own cached segments alone.
                        let mut pools: Vec<(i64, i64)> = private.iter().map(|&(pool_id, _)| pool_id).collect();
                        pools.dedup();
                        for pool_id in pools {
                            self.alloc.release_pool(pool_id);
                        }
                    }
                    // The emulated events are caused by the entry after the run, as the recorded ones are.
                    cause = next;
                }
            }
            _ => {}
        }
        self.recorded_reserved_bytes = reserved_after(self.recorded_reserved_bytes, std::slice::from_ref(e));
        if !self.record {
            self.alloc.clear_events();
            return Some((i, Stepped { effect, served, device_events: Vec::new() }));
        }
        let events = self.alloc.take_events();
        let device_events = events.iter().filter_map(device_event).collect();
        push_events(&mut self.out.segment_events, events, cause);
        if !self.entry_stats {
            return Some((i, Stepped { effect, served, device_events }));
        }
        let s = self.alloc.stats();
        self.out.timeline.push(EventStats {
            allocated_bytes: s.allocated_bytes.all().current,
            reserved_bytes: s.reserved_bytes.all().current,
            active_bytes: s.active_bytes.all().current,
            requested_bytes: s.requested_bytes.all().current,
            num_device_alloc: s.num_device_alloc,
            num_device_free: s.num_device_free,
            num_ooms: s.num_ooms,
        });
        Some((i, Stepped { effect, served, device_events }))
    }

    /// The emulation of the entries replayed, compared with the whole recording.
    pub fn finish(self) -> Emulation {
        let Self { trace, alloc, mut out, mut fidelity, .. } = self;
        // The events one entry caused are compared as a set, in address order: PyTorch releases several freed
        // private pools in its hash map's order.
        let by_cause = |events: &mut Vec<SegmentEvent>| events.sort_by_key(|event| (event.cause, event.addr));
        let mut recorded = recorded_segment_events(trace);
        by_cause(&mut recorded);
        let mut emulated = out.segment_events.clone();
        by_cause(&mut emulated);
        fidelity.recorded = recorded.len();
        for (k, r) in recorded.iter().enumerate() {
            match emulated.get(k) {
                Some(m) if m.same_decision(r) => {
                    fidelity.matched += 1;
                    fidelity.addresses_matched += usize::from(m.addr == r.addr);
                }
                emulated => {
                    fidelity.first_mismatch.get_or_insert(Mismatch {
                        position: k,
                        recorded: Some(*r),
                        emulated: emulated.copied(),
                    });
                }
            }
        }
        if fidelity.first_mismatch.is_none() && emulated.len() > recorded.len() {
            fidelity.first_mismatch =
                Some(Mismatch { position: recorded.len(), recorded: None, emulated: emulated.get(recorded.len()).copied() });
        }
        fidelity.driver_rule = alloc.driver_rule_score();
        out.fidelity = fidelity;
        out.stats = alloc.stats().clone();
        out.final_segments = alloc.report();
        out
    }
}

fn push_events(out: &mut Vec<SegmentEvent>, events: Vec<DeviceEvent>, cause: usize) {
    out.extend(events.into_iter().map(|d| SegmentEvent { action: d.action, addr: d.addr, size_bytes: d.size_bytes, cause }));
}

/// A recorded `oom`: PyTorch refused `e.size` bytes with `device_free` bytes left on the device. The
/// request is attempted with that much room (or the capacity, when one is given); were it served, it is
/// given back at once (the program never received it): the block that served it.
fn attempt_recorded_oom(
    alloc: &mut CachingAllocator,
    pool_id: (i64, i64),
    e: &TraceEntry,
    capacity_bytes: Option<u64>,
    recorded_reserved_bytes: u64,
) -> Result<LiveBlock, OomReport> {
    if capacity_bytes.is_none() {
        // The device the recording tells: what it held reserved there (its cache already released for the request)
        // and the driver's free bytes (the same device for a what-if, which may hold more or less).
        let device = recorded_reserved_bytes.saturating_add(e.device_free().unwrap_or(0));
        alloc.request_limit_bytes = Some(device);
    }
    let result = alloc.malloc_in(pool_id, e.size, e.stream, None);
    alloc.request_limit_bytes = None;
    match result {
        Ok(address) => {
            let block = alloc.live_block(address).unwrap_or(LiveBlock {
                address,
                size_bytes: e.size,
                requested_bytes: e.size,
                segment_base: address,
            });
            alloc.free(address);
            Ok(block)
        }
        Err(report) => Err(report),
    }
}

/// What the allocator itself would release (the addresses it frees or unmaps) while serving `next` (the entry after a
/// run of recorded `segment_free` / `segment_unmap`, in its memory pool)? Tried on a copy.
/// Also the most the copy reserved while trying: the capacity was read up to there.
fn allocator_would_release(
    alloc: &CachingAllocator,
    next: Option<(&TraceEntry, (i64, i64), u64)>,
    capacity_bytes: Option<u64>,
) -> (Vec<u64>, u64) {
    let Some((next, pool_id, recorded_reserved_bytes)) = next else { return (Vec::new(), 0) };
    let mut copy = alloc.clone();
    match next.action {
        Action::Alloc => {
            let _ = copy.malloc_in(pool_id, next.size, next.stream, Some(next.addr));
        }
        Action::Oom => {
            let _ = attempt_recorded_oom(&mut copy, pool_id, next, capacity_bytes, recorded_reserved_bytes);
        }
        _ => return (Vec::new(), 0),
    }
    let tried = u64::try_from(copy.stats().reserved_bytes.all().peak).unwrap_or(u64::MAX);
    let events = copy.take_events();
    (events.iter().filter(|d| matches!(d.action, Action::SegmentFree | Action::SegmentUnmap)).map(|d| d.addr).collect(), tried)
}
