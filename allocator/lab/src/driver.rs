//! The one replay driver: a recording's allocations and frees, moment by moment, through one contender (a
//! [`Policy`] on one range, a [`Heap`] of blocks, a [`PagedHeap`], or any [`DeviceHeap`] of a backend crate),
//! with [`Observer`]s that write down what they need of each step — the statistics of a replay
//! ([`ReplayStats`], the verdicts), a timeline for the app, a snapshot for export. Every way heapscope replays a
//! heap contender goes through [`drive`], and so does the bench runner of the kernels crate (a workload's allocations
//! and frees are a stream; its kernels run in [`Target::before_event`]) and PyTorch's emulation: of a plain trace
//! its `CachingHeap` is a `DeviceHeap` like any other; of a PyTorch snapshot its target replays each whole entry
//! when the entry's moment begins ([`Target::begin_moment`]) — its rules need every entry, `free_requested`, `oom`
//! and segment entries included — and its allocations and frees answer with what the entry did
//! ([`crate::caching_target`]).
//!
//! The stream ([`Stream`]) is the recording's: its start events (what was live before the first entry, see
//! [`crate::recording`]) at [`Moment::Start`], then each entry's events at [`Moment::Entry`], every entry once
//! (an entry that is no allocation or free, a `segment_alloc`, is a moment with no event), so every contender
//! serves the same requests and every observer numbers moments alike.

use crate::compaction::{CompactRule, CompactionFigures};
use crate::recording::{Moment, Recording};
use heapscope_core::compaction::Budget;
use heapscope_core::source::MemorySource;
use heapscope_core::trace::{Event, Trace};
use heapscope_core::{Allocation, DeviceEvent, DeviceHeap, Error, Heap, PagedHeap, Policy, Request, Result};
use heapscope_core::{OomCause, OomVerdict};

/// A recording's events with their moments: what [`drive`] replays.
#[derive(Clone, Copy, Debug)]
pub struct Stream<'a> {
    /// The events, the start events first.
    pub trace: &'a Trace,
    /// How many events open the trace at the start.
    pub start_events: usize,
    /// The entry of each event (empty: event `N` is entry `N`).
    entry_index: &'a [u64],
    /// The recording's entries.
    pub entries: u64,
}

impl<'a> Stream<'a> {
    /// A plain trace: event `N` is entry `N`, nothing live at the start.
    pub fn of_trace(trace: &'a Trace) -> Self {
        Self { trace, start_events: 0, entry_index: &[], entries: trace.events().len() as u64 }
    }

    /// The stream of `recording`.
    pub fn of(recording: &'a Recording) -> Self {
        Self {
            trace: &recording.trace,
            start_events: recording.start_events,
            entry_index: &recording.entry_index,
            entries: recording.entries,
        }
    }

    /// The moment of event `event`.
    pub fn moment_of(&self, event: u64) -> Moment {
        crate::recording::moment_of(self.start_events, self.entry_index, event)
    }
}

/// What a contender did with one event.
#[derive(Clone, Copy, Debug)]
pub enum Step<'a, H> {
    /// Served the allocation of `slot`.
    Placed {
        /// The trace slot.
        slot: u32,
        /// Bytes requested.
        size_bytes: u64,
        /// Where.
        handle: &'a H,
    },
    /// Freed the allocation of `slot` (the handle it had).
    Freed {
        /// The trace slot.
        slot: u32,
        /// Its handle before the free.
        handle: &'a H,
    },
    /// The free of the allocation of `slot`, which was refused: nothing to free.
    Unserved {
        /// The trace slot.
        slot: u32,
    },
    /// Moved the allocation of `slot` to gather free space (a [`CompactRule`]): the bytes go from `from` to `to`.
    Moved {
        /// The trace slot.
        slot: u32,
        /// Its handle before.
        from: &'a H,
        /// Its handle now.
        to: &'a H,
        /// Moved to make room for the refused request of this event, which is tried again next.
        for_refused: bool,
    },
    /// Gave back the memory it held for reuse (an `empty_cache()` event): the device events say what went.
    CacheEmptied,
    /// Refused the allocation of `slot`; its free is [`Step::Unserved`].
    Refused {
        /// The trace slot.
        slot: u32,
        /// Bytes requested.
        size_bytes: u64,
        /// Why, for a contender that says (a heap; a bare policy does not).
        verdict: Option<&'a OomVerdict>,
    },
}

/// What a contender looks like to the driver: a policy or a heap.
pub trait Target {
    /// What a served allocation is known by.
    type Handle: Copy;

    /// Before event `event` of the stream is replayed: what a target that does more than allocate and free does
    /// first (the bench runner: the kernel ops of the workload's steps before it, the verifies of a run of frees).
    /// Default: nothing.
    ///
    /// # Errors
    /// What stops the replay.
    fn before_event(&mut self, event: u64) -> Result<()> {
        let _ = event;
        Ok(())
    }

    /// At the start of `moment`, before its events: what a target that takes the recording's decisions entry by
    /// entry does (PyTorch's emulation of a snapshot replays the whole entry here, `free_requested`, `oom` and
    /// segment entries included; its [`Target::allocate`] and [`Target::free`] then answer with what the entry
    /// did). Default: nothing.
    ///
    /// # Errors
    /// What stops the replay.
    fn begin_moment(&mut self, moment: Moment) -> Result<()> {
        let _ = moment;
        Ok(())
    }

    /// Serves `request`: `Ok(handle)`, or `Err` with the verdict when it does not fit (`None` for a contender
    /// that gives none).
    ///
    /// # Errors
    /// A failure other than out of memory.
    fn allocate(&mut self, request: Request) -> Result<Result<Self::Handle, Option<OomVerdict>>>;

    /// Frees `handle`.
    ///
    /// # Errors
    /// A contender bug (the stream frees only what it allocated).
    fn free(&mut self, handle: Self::Handle) -> Result<()>;

    /// `empty_cache()`: gives back what it holds for reuse. Default: nothing is held (a bare policy).
    ///
    /// # Errors
    /// The target's failure to give memory back.
    fn empty_cache(&mut self) -> Result<()> {
        Ok(())
    }

    /// The allocation it stands for.
    fn allocation(handle: &Self::Handle) -> &Allocation;

    /// One past the last byte set aside, in one address space across allocations (0 when there is none).
    fn footprint_end(handle: &Self::Handle) -> u64;

    /// The verdict on a request of `size_bytes` that overflows once aligned to `align_bytes`: no device holds it.
    fn oversized(&mut self, _size_bytes: u64, _align_bytes: u64) -> Option<OomVerdict> {
        None
    }

    /// What it asked of the device since the last call (empty unless it records: [`DeviceHeap`]'s
    /// `record_device_events`).
    fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        Vec::new()
    }

    /// When the driver asks it to compact ([`crate::compaction`]). Default: never.
    fn compact_rule(&self) -> CompactRule {
        CompactRule::Never
    }

    /// Moves live allocations to gather free space: `live` are the handles it holds with their requests; returns each
    /// move as the index in `live` and the new handle, in order. `for_refused`: to make room for a refused request.
    /// Default: moves nothing.
    ///
    /// # Errors
    /// A contender failure.
    fn compact(&mut self, live: &[(Self::Handle, Request)], for_refused: bool) -> Result<Vec<(usize, Self::Handle)>> {
        let _ = (live, for_refused);
        Ok(Vec::new())
    }

    /// Whether its moves remap pages (nothing copied) rather than copy bytes. Default: copies.
    fn moves_by_remap(&self) -> bool {
        false
    }
}

/// Hears every step of a replay. See the module documentation.
pub trait Observer<T: Target + ?Sized> {
    /// After event `event` of the stream, at `moment`: what the contender did (`device_events`: what it asked of
    /// the device for it).
    ///
    /// # Errors
    /// What the observer cannot write down (a change that contradicts its layout); the replay stops.
    fn step(
        &mut self,
        event: u64,
        moment: Moment,
        step: Step<'_, T::Handle>,
        device_events: &[DeviceEvent],
        target: &T,
    ) -> Result<()>;

    /// Before event `event` is replayed (before the target's own [`Target::before_event`]): an observer that can stop
    /// the replay (live mode's Stop) says so here, before anything more happens. Default: go on.
    ///
    /// # Errors
    /// Why the replay stops.
    fn before_event(&mut self, event: u64) -> Result<()> {
        let _ = event;
        Ok(())
    }

    /// Whether it reads the device events of each step. When no observer does, the driver leaves them in the heap
    /// for its owner to take ([`DeviceHeap`]'s `take_device_events`), as a bare replay did.
    fn wants_device_events(&self) -> bool {
        true
    }

    /// Once every event of `moment` is replayed: the start first (also when nothing was live), then every entry
    /// in order, entries without events included. `device_events`: what the target asked of the device in this
    /// moment outside its events' steps (a recorded `empty_cache()` call's releases; empty unless
    /// [`Observer::wants_device_events`]).
    ///
    /// # Errors
    /// As [`Observer::step`].
    fn moment_done(&mut self, moment: Moment, device_events: &[DeviceEvent], target: &T) -> Result<()> {
        let _ = (moment, device_events, target);
        Ok(())
    }
}

/// A bare policy on one range: refusals carry no verdict.
struct PolicyTarget<'a, P: Policy + ?Sized>(&'a mut P);

impl<P: Policy + ?Sized> Target for PolicyTarget<'_, P> {
    type Handle = Allocation;

    fn allocate(&mut self, request: Request) -> Result<Result<Allocation, Option<OomVerdict>>> {
        Ok(self.0.allocate(request).ok_or(None))
    }

    fn free(&mut self, handle: Allocation) -> Result<()> {
        self.0.free(handle)
    }

    fn allocation(handle: &Allocation) -> &Allocation {
        handle
    }

    fn footprint_end(handle: &Allocation) -> u64 {
        handle.footprint_end()
    }
}

/// A heap of blocks, a paged heap or a backend's heap: refusals are out-of-memory verdicts.
#[derive(Debug)]
pub struct HeapTarget<'a, H: DeviceHeap> {
    /// The heap.
    pub heap: &'a mut H,
    /// When it compacts.
    pub compact: CompactRule,
}

impl<'a, H: DeviceHeap> HeapTarget<'a, H> {
    /// `heap`, never compacting.
    pub fn new(heap: &'a mut H) -> Self {
        Self { heap, compact: CompactRule::Never }
    }

    /// `heap`, compacting by `rule`.
    pub fn compacting(heap: &'a mut H, rule: CompactRule) -> Self {
        Self { heap, compact: rule }
    }
}

impl<H: DeviceHeap> Target for HeapTarget<'_, H> {
    type Handle = H::Handle;

    fn allocate(&mut self, request: Request) -> Result<Result<H::Handle, Option<OomVerdict>>> {
        match self.heap.allocate_request(request) {
            Ok(handle) => Ok(Ok(handle)),
            Err(Error::OutOfMemory(verdict)) => Ok(Err(Some(*verdict))),
            Err(other) => Err(other),
        }
    }

    fn free(&mut self, handle: H::Handle) -> Result<()> {
        self.heap.free_handle(handle)
    }

    fn empty_cache(&mut self) -> Result<()> {
        self.heap.empty_cache()
    }

    fn allocation(handle: &H::Handle) -> &Allocation {
        H::allocation(handle)
    }

    /// Offsets are per block in a heap, and a paged heap's peak is its mapped bytes: no single range end
    /// means anything.
    fn footprint_end(_handle: &H::Handle) -> u64 {
        0
    }

    fn oversized(&mut self, size_bytes: u64, align_bytes: u64) -> Option<OomVerdict> {
        Some(self.heap.oversized_verdict(size_bytes, align_bytes))
    }

    fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        self.heap.take_device_events()
    }

    fn compact_rule(&self) -> CompactRule {
        self.compact
    }

    fn compact(&mut self, live: &[(H::Handle, Request)], for_refused: bool) -> Result<Vec<(usize, H::Handle)>> {
        self.heap.compact(live, CompactRule::algorithm(for_refused), Budget::UNLIMITED)
    }

    fn moves_by_remap(&self) -> bool {
        self.heap.moves_by_remap()
    }
}

/// Replays `stream` through `target`, every request aligned to `align_bytes`, telling `observers` each step and
/// each moment. A size that overflows once aligned fits nowhere: it is refused.
///
/// # Errors
/// [`Error::AlignmentNotPowerOfTwo`] for a bad alignment (before any event), the target's failures other than
/// out of memory, and the observers' errors; the replay stops at the first.
pub fn drive<T: Target>(
    stream: Stream<'_>,
    target: &mut T,
    align_bytes: u64,
    observers: &mut [&mut dyn Observer<T>],
) -> Result<()> {
    // Validates the alignment once, before any event.
    Request::new(1, align_bytes)?;
    let events = stream.trace.events();
    let mut handles: Vec<Option<T::Handle>> = vec![None; stream.trace.slots() as usize];
    let rule = target.compact_rule();
    // The request of each live slot, for a contender that compacts.
    let mut requests: Vec<Option<Request>> =
        if rule == CompactRule::Never { Vec::new() } else { vec![None; stream.trace.slots() as usize] };
    let mut next = 0u64;
    let device_events_wanted = observers.iter().any(|observer| observer.wants_device_events());
    let take_device_events = |target: &mut T| if device_events_wanted { target.take_device_events() } else { Vec::new() };
    // Whether the last pass made for a refusal moved nothing and the target has not changed since (no allocation served,
    // nothing freed or moved, no cache emptied): a pass depends on the target's state alone, so another would move
    // nothing again. Thousands of refusals on a fragmented heap each ran a whole pass for nothing (minutes).
    let mut fruitless = false;
    let moments = std::iter::once(Moment::Start).chain((0..stream.entries).map(Moment::Entry));
    for moment in moments {
        target.begin_moment(moment)?;
        while let Some(event) = events.get(next as usize)
            && stream.moment_of(next) <= moment
        {
            let index = next;
            next += 1;
            for observer in observers.iter_mut() {
                observer.before_event(index)?;
            }
            target.before_event(index)?;
            if let CompactRule::Every(every) = rule
                && index > 0
                && index.is_multiple_of(every)
                && compact(target, &mut handles, &requests, index, moment, observers, false)? > 0
            {
                fruitless = false;
            }
            match *event {
                Event::Alloc { slot, size_bytes } => {
                    let request = Request::new(size_bytes, align_bytes).ok();
                    let mut served = match request {
                        Some(request) => target.allocate(request)?,
                        None => Err(target.oversized(size_bytes, align_bytes)),
                    };
                    if rule != CompactRule::Never
                        && !fruitless
                        && let (Some(request), Err(Some(verdict))) = (request, &served)
                        && verdict.cause == OomCause::Fragmentation
                    {
                        let moves = compact(target, &mut handles, &requests, index, moment, observers, true)?;
                        fruitless = moves == 0;
                        if moves > 0 {
                            served = target.allocate(request)?;
                        }
                    }
                    fruitless &= served.is_err();
                    let device_events = take_device_events(target);
                    let step = match &served {
                        Ok(handle) => Step::Placed { slot, size_bytes, handle },
                        Err(verdict) => Step::Refused { slot, size_bytes, verdict: verdict.as_ref() },
                    };
                    for observer in observers.iter_mut() {
                        observer.step(index, moment, step, &device_events, target)?;
                    }
                    if let Ok(handle) = served {
                        handles[slot as usize] = Some(handle);
                        if let (Some(kept), Some(request)) = (requests.get_mut(slot as usize), request) {
                            *kept = Some(request);
                        }
                    }
                }
                Event::Free { slot } => {
                    let handle = handles[slot as usize].take();
                    if let Some(handle) = handle {
                        target.free(handle)?;
                        fruitless = false;
                    }
                    let device_events = take_device_events(target);
                    let step = match &handle {
                        Some(handle) => Step::Freed { slot, handle },
                        None => Step::Unserved { slot },
                    };
                    for observer in observers.iter_mut() {
                        observer.step(index, moment, step, &device_events, target)?;
                    }
                }
                Event::EmptyCache => {
                    target.empty_cache()?;
                    fruitless = false;
                    let device_events = take_device_events(target);
                    for observer in observers.iter_mut() {
                        observer.step(index, moment, Step::CacheEmptied, &device_events, target)?;
                    }
                }
            }
        }
        let device_events = take_device_events(target);
        for observer in observers.iter_mut() {
            observer.moment_done(moment, &device_events, target)?;
        }
    }
    if next != events.len() as u64 {
        return Err(Error::InvalidConfig {
            what: format!("the stream's event {next} comes after its last entry ({}): a recording bug", stream.entries),
        });
    }
    Ok(())
}

/// Asks `target` to compact with every live allocation it holds, tells `observers` each move, and keeps the new handles:
/// how many moves it made.
fn compact<T: Target>(
    target: &mut T,
    handles: &mut [Option<T::Handle>],
    requests: &[Option<Request>],
    event: u64,
    moment: Moment,
    observers: &mut [&mut dyn Observer<T>],
    for_refused: bool,
) -> Result<usize> {
    let (slots, live): (Vec<u32>, Vec<(T::Handle, Request)>) = (0..)
        .zip(handles.iter())
        .filter_map(|(slot, handle)| Some((slot, ((*handle)?, (*requests.get(slot as usize)?)?))))
        .unzip();
    let moves = target.compact(&live, for_refused)?;
    // What the moves asked of the device (a paged heap's remaps, blocks emptied) goes with the first move. A pass of no
    // move leaves what it asked (blocks it found empty and released) to the step that follows: taken here, it was lost
    // (an export then never freed those blocks).
    let mut device_events = if !moves.is_empty() && observers.iter().any(|observer| observer.wants_device_events()) {
        target.take_device_events()
    } else {
        Vec::new()
    };
    for &(index, to) in &moves {
        let slot = slots[index];
        let Some(from) = handles[slot as usize].replace(to) else { continue };
        let events = std::mem::take(&mut device_events);
        for observer in observers.iter_mut() {
            observer.step(event, moment, Step::Moved { slot, from: &from, to: &to, for_refused }, &events, target)?;
        }
    }
    Ok(moves.len())
}

/// The statistics of a replay, as an [`Observer`]: counts, peaks and the verdicts of its refusals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Statistics {
    /// Counts and peaks.
    pub stats: ReplayStats,
    /// The first out-of-memory verdict.
    pub first_oom: Option<OomVerdict>,
    /// The last out-of-memory verdict.
    pub last_oom: Option<OomVerdict>,
    footprint_now: u64,
    /// Moves were made for the refused request of the event being replayed.
    retrying: bool,
}

impl Statistics {
    /// What it measured, as a [`HeapReplay`].
    pub fn into_replay(self) -> HeapReplay {
        HeapReplay { stats: self.stats, first_oom: self.first_oom, last_oom: self.last_oom }
    }
}

impl<T: Target> Observer<T> for Statistics {
    fn wants_device_events(&self) -> bool {
        false
    }

    fn step(&mut self, event: u64, _moment: Moment, step: Step<'_, T::Handle>, _: &[DeviceEvent], target: &T) -> Result<()> {
        let stats = &mut self.stats;
        // A move is no event of the stream.
        stats.events += u64::from(!matches!(step, Step::Moved { .. }));
        match step {
            Step::Placed { size_bytes, handle, .. } => {
                let footprint_bytes = T::allocation(handle).footprint_bytes();
                stats.allocated(event, size_bytes, footprint_bytes, T::footprint_end(handle), &mut self.footprint_now);
                stats.last_event_ok = true;
                if std::mem::take(&mut self.retrying) {
                    stats.compaction.ooms_avoided += 1;
                }
            }
            Step::Moved { from, to, for_refused, .. } => {
                let (from, to_allocation) = (T::allocation(from), T::allocation(to));
                stats.compaction.moves += 1;
                if target.moves_by_remap() {
                    stats.compaction.bytes_remapped += from.size_bytes();
                } else {
                    stats.compaction.bytes_moved += from.size_bytes();
                }
                self.footprint_now = self.footprint_now - from.footprint_bytes() + to_allocation.footprint_bytes();
                stats.peak_footprint_bytes = stats.peak_footprint_bytes.max(self.footprint_now);
                stats.peak_end_bytes = stats.peak_end_bytes.max(T::footprint_end(to));
                self.retrying |= for_refused;
            }
            Step::Refused { verdict, .. } => {
                self.retrying = false;
                stats.failed(event);
                if let Some(verdict) = verdict {
                    self.first_oom.get_or_insert_with(|| verdict.clone());
                    self.last_oom = Some(verdict.clone());
                }
                stats.last_event_ok = false;
            }
            // Its releases show in the reserved bytes; the event itself neither serves nor refuses anything.
            Step::CacheEmptied => stats.last_event_ok = true,
            Step::Freed { handle, .. } => {
                stats.frees += 1;
                let allocation = T::allocation(handle);
                stats.live_bytes -= allocation.size_bytes();
                self.footprint_now -= allocation.footprint_bytes();
                stats.last_event_ok = true;
            }
            Step::Unserved { .. } => stats.last_event_ok = true,
        }
        Ok(())
    }
}

/// [`drive`] with [`Statistics`] alone.
fn replay<T: Target>(stream: Stream<'_>, target: &mut T, align_bytes: u64) -> Result<Statistics> {
    let mut statistics = Statistics::default();
    drive(stream, target, align_bytes, &mut [&mut statistics])?;
    Ok(statistics)
}

/// What a replay measured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ReplayStats {
    /// Events replayed.
    pub events: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Allocations that did not fit (their frees are skipped).
    pub failed_allocations: u64,
    /// Frees of served allocations.
    pub frees: u64,
    /// Index of the first event that failed.
    pub first_failure: Option<u64>,
    /// Whether the last event succeeded.
    pub last_event_ok: bool,
    /// Requested bytes live at the end.
    pub live_bytes: u64,
    /// The most requested bytes live at once.
    pub peak_live_bytes: u64,
    /// The event that first brought them to that peak.
    pub peak_live_event: Option<u64>,
    /// The most bytes set aside (footprints) at once.
    pub peak_footprint_bytes: u64,
    /// The highest footprint end ever used: the range a single-range policy needed (its peak reserved).
    pub peak_end_bytes: u64,
    /// What compacting did (all 0 without a [`CompactRule`]).
    pub compaction: CompactionFigures,
}

impl ReplayStats {
    fn allocated(&mut self, event: u64, size_bytes: u64, footprint_bytes: u64, footprint_end: u64, footprint_now: &mut u64) {
        self.allocations += 1;
        self.live_bytes += size_bytes;
        if self.live_bytes > self.peak_live_bytes {
            self.peak_live_bytes = self.live_bytes;
            self.peak_live_event = Some(event);
        }
        *footprint_now += footprint_bytes;
        self.peak_footprint_bytes = self.peak_footprint_bytes.max(*footprint_now);
        self.peak_end_bytes = self.peak_end_bytes.max(footprint_end);
    }

    fn failed(&mut self, index: u64) {
        self.failed_allocations += 1;
        self.first_failure.get_or_insert(index);
    }

    /// `peak_end_bytes / peak_live_bytes`: how much more range than live bytes a single-range policy needed.
    pub fn peak_end_over_peak_live(&self) -> f64 {
        self.peak_end_bytes as f64 / self.peak_live_bytes.max(1) as f64
    }
}

/// Replays `trace` through `policy`, every request aligned to `align_bytes`.
///
/// # Errors
/// [`Error::AlignmentNotPowerOfTwo`] for a bad alignment, or an error from the policy's `free` (a policy
/// bug: the trace frees only what it allocated).
pub fn replay_policy<P: Policy + ?Sized>(trace: &Trace, policy: &mut P, align_bytes: u64) -> Result<ReplayStats> {
    Ok(replay(Stream::of_trace(trace), &mut PolicyTarget(policy), align_bytes)?.stats)
}

/// What a heap replay measured, with the verdicts of its failures.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HeapReplay {
    /// Counts and peaks (`peak_end_bytes` stays 0: see the heap's own stats for reserved bytes).
    pub stats: ReplayStats,
    /// The first out-of-memory verdict.
    pub first_oom: Option<OomVerdict>,
    /// The last out-of-memory verdict.
    pub last_oom: Option<OomVerdict>,
}

/// Replays `trace` through `heap`, every request aligned to `align_bytes`.
///
/// # Errors
/// [`Error::AlignmentNotPowerOfTwo`] for a bad alignment, a source failure other than out of memory, or a heap
/// bug on free.
pub fn replay_heap<S: MemorySource>(trace: &Trace, heap: &mut Heap<S>, align_bytes: u64) -> Result<HeapReplay> {
    replay_device_heap(trace, heap, align_bytes)
}

/// Replays `trace` through a paged heap, every request aligned to `align_bytes`. The verdicts come back
/// in a [`HeapReplay`]; mapped bytes and map calls are in the heap's own stats.
///
/// # Errors
/// [`Error::AlignmentNotPowerOfTwo`] for a bad alignment, or a paged-heap bug on free.
pub fn replay_paged(trace: &Trace, heap: &mut PagedHeap, align_bytes: u64) -> Result<HeapReplay> {
    replay_device_heap(trace, heap, align_bytes)
}

/// Replays `trace` through any [`DeviceHeap`] (a heap of another crate, another allocator wrapped as one),
/// every request aligned to `align_bytes`; what [`replay_heap`] and [`replay_paged`] do for heapscope's own.
///
/// # Errors
/// [`Error::AlignmentNotPowerOfTwo`] for a bad alignment, a failure other than out of memory, or an error on
/// free.
pub fn replay_device_heap<H: DeviceHeap>(trace: &Trace, heap: &mut H, align_bytes: u64) -> Result<HeapReplay> {
    replay_device_heap_compacting(trace, heap, align_bytes, CompactRule::Never)
}

/// [`replay_device_heap`] with the heap compacting by `rule`.
///
/// # Errors
/// As [`replay_device_heap`].
pub fn replay_device_heap_compacting<H: DeviceHeap>(
    trace: &Trace,
    heap: &mut H,
    align_bytes: u64,
    rule: CompactRule,
) -> Result<HeapReplay> {
    Ok(replay(Stream::of_trace(trace), &mut HeapTarget::compacting(heap, rule), align_bytes)?.into_replay())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::story::frag_oom;
    use heapscope_core::units::MIB;
    use heapscope_core::{HeapConfig, PolicyKind, ReleaseRule, SimulatedSource, Tlsf};

    #[test]
    fn frag_oom_on_one_range_succeeds() {
        let story = frag_oom();
        let mut policy = Tlsf::new(story.device_bytes);
        let stats = replay_policy(&story.trace, &mut policy, 256).unwrap();
        assert_eq!((stats.allocations, stats.failed_allocations, stats.last_event_ok), (41, 0, true));
        assert_eq!(stats.peak_live_bytes, 3024 * MIB);
        assert_eq!(stats.peak_end_bytes, 3024 * MIB, "the 100 MiB blocks reuse the start of the range");
    }

    #[test]
    fn footprints_are_returned_on_free() {
        let mut builder = heapscope_core::TraceBuilder::new("churn");
        for id in 0..4 {
            builder.alloc(id, 1000).unwrap();
            builder.free(id).unwrap();
        }
        let trace = builder.finish();
        let stats = replay_policy(&trace, &mut Tlsf::new(1 << 20), 256).unwrap();
        assert_eq!((stats.peak_live_bytes, stats.peak_footprint_bytes), (1000, 1024), "one allocation at a time");
        let mut heap = Heap::new(HeapConfig::new(PolicyKind::Tlsf), SimulatedSource::new(1 << 30, 2 * MIB)).unwrap();
        let replay = replay_heap(&trace, &mut heap, 256).unwrap();
        assert_eq!(replay.stats.peak_footprint_bytes, 1024);
    }

    #[test]
    fn bad_alignment_is_an_error_and_huge_sizes_fail_alike() {
        let mut builder = heapscope_core::TraceBuilder::new("huge");
        builder.alloc(1, u64::MAX).unwrap();
        builder.alloc(2, 4096).unwrap();
        let trace = builder.finish();
        let mut policy = Tlsf::new(1 << 20);
        assert!(matches!(replay_policy(&trace, &mut policy, 3), Err(Error::AlignmentNotPowerOfTwo { align_bytes: 3 })));
        let stats = replay_policy(&trace, &mut policy, 256).unwrap();
        assert_eq!((stats.allocations, stats.failed_allocations, stats.first_failure), (1, 1, Some(0)));
        let mut heap = Heap::new(HeapConfig::new(PolicyKind::Tlsf), SimulatedSource::new(1 << 30, 2 * MIB)).unwrap();
        assert!(matches!(replay_heap(&trace, &mut heap, 0), Err(Error::AlignmentNotPowerOfTwo { align_bytes: 0 })));
        let replay = replay_heap(&trace, &mut heap, 256).unwrap();
        assert_eq!((replay.stats.allocations, replay.stats.failed_allocations), (1, 1));
    }

    #[test]
    fn frag_oom_through_paging_succeeds_and_unmaps() {
        let story = frag_oom();
        let mut heap = PagedHeap::new(heapscope_core::PagedConfig::new(Some(story.device_bytes))).unwrap();
        let replay = replay_paged(&story.trace, &mut heap, 256).unwrap();
        assert_eq!((replay.stats.failed_allocations, replay.stats.last_event_ok), (0, true));
        assert!(replay.first_oom.is_none());
        assert_eq!(heap.stats().peak_mapped_bytes, 3024 * MIB, "the freed 150 MiB pages were unmapped");
        assert!(heap.stats().unmap_calls > 0);
    }

    /// A target whose compaction never moves anything and whose requests past 1000 bytes are refused as fragmentation:
    /// it counts the passes the driver asks of it.
    struct FruitlessTarget {
        owner: heapscope_core::OwnerId,
        next_id: u64,
        passes: usize,
    }

    impl Target for FruitlessTarget {
        type Handle = Allocation;

        fn allocate(&mut self, request: Request) -> Result<Result<Allocation, Option<OomVerdict>>> {
            if request.size_bytes() > 1000 {
                let verdict = OomVerdict {
                    policy: "fruitless",
                    requested_bytes: request.size_bytes(),
                    needed_bytes: request.size_bytes(),
                    align_bytes: request.align_bytes(),
                    reserved_bytes: 4096,
                    live_bytes: 0,
                    padding_bytes: 0,
                    free_in_blocks_bytes: 4096,
                    largest_free_run_bytes: 1000,
                    retired_bytes: 0,
                    unreserved_bytes: 0,
                    capacity_bytes: None,
                    virtual_range_bytes: None,
                    new_block_bytes: None,
                    cause: OomCause::Fragmentation,
                };
                return Ok(Err(Some(verdict)));
            }
            self.next_id += 1;
            let id = heapscope_core::AllocationId(self.next_id);
            let size = request.size_bytes();
            Ok(Ok(Allocation::from_parts(self.owner, id, 0, size, (0, size), heapscope_core::ResourceKind::Linear)))
        }

        fn free(&mut self, _handle: Allocation) -> Result<()> {
            Ok(())
        }

        fn allocation(handle: &Allocation) -> &Allocation {
            handle
        }

        fn footprint_end(handle: &Allocation) -> u64 {
            handle.footprint_end()
        }

        fn compact_rule(&self) -> CompactRule {
            CompactRule::OnOom
        }

        fn compact(&mut self, _live: &[(Allocation, Request)], _for_refused: bool) -> Result<Vec<(usize, Allocation)>> {
            self.passes += 1;
            Ok(Vec::new())
        }
    }

    /// A pass made for a refusal that moved nothing is not made again until the target changes: ten refusals in a row
    /// ask one pass, a free between them one more (a fragmented heap ran a whole pass for each of thousands of refusals).
    #[test]
    fn a_fruitless_pass_is_not_repeated_until_the_target_changes() {
        let mut builder = heapscope_core::TraceBuilder::new("refusals");
        builder.alloc(0, 100).unwrap();
        for id in 1..=10 {
            builder.alloc(id, 1 << 20).unwrap();
        }
        builder.free(0).unwrap();
        for id in 11..=12 {
            builder.alloc(id, 1 << 20).unwrap();
        }
        builder.alloc(13, 100).unwrap();
        builder.alloc(14, 1 << 20).unwrap();
        let trace = builder.finish();
        let mut target = FruitlessTarget { owner: heapscope_core::OwnerId::fresh(), next_id: 0, passes: 0 };
        drive(Stream::of_trace(&trace), &mut target, 256, &mut []).unwrap();
        assert_eq!(target.passes, 3, "the first refusal, the first after the free, the first after an allocation served");
    }

    #[test]
    fn frag_oom_in_a_caching_heap_fails_with_fragmentation() {
        let story = frag_oom();
        let config = HeapConfig { release: ReleaseRule::OnPressure, ..HeapConfig::new(PolicyKind::BestFit) };
        let mut heap = Heap::new(config, SimulatedSource::new(story.device_bytes, 2 * MIB)).unwrap();
        let replay = replay_heap(&story.trace, &mut heap, 256).unwrap();
        assert!(!replay.stats.last_event_ok);
        assert_eq!(replay.stats.failed_allocations, 1);
        let verdict = replay.last_oom.unwrap();
        assert_eq!(verdict.cause, OomCause::Fragmentation);
        assert_eq!(verdict.free_in_blocks_bytes, 1000 * MIB);
    }
}
