//! Recording a timeline: a contender replays a recording and says, moment by moment, what it did to its layout.
//!
//! A timeline has one step per entry of the recording (an entry that changes nothing is an empty step), and a
//! start (position 0) with what was live before the first entry — the same for every contender: heap and paged
//! contenders are written down by an [`Observer`] of the one replay driver ([`drive`]), PyTorch's by a
//! [`SegmentBacking`] following `compare`'s own run of the emulation.

use super::explain::Rules;
use super::{Change, Refusal, RegionKind, RegionTracker, Span, Timeline};
use crate::compare::{CompareConfig, FirstOom, emulate_pytorch, pytorch_first_oom, unreserved_bytes};
use crate::contender::Contender;
use crate::driver::{HeapTarget, Observer, Step, Stream, drive};
use crate::recording::{Moment, Recording};
use heapscope_core::hash::{FastMap, FastSet};
use heapscope_core::trace::Event;
use heapscope_core::{DeviceEvent, DeviceHeap, Error, Result};
use heapscope_pytorch::caching::{BackingRefused, CachingAllocator, EntryEffect, OomReport, SegmentBacking};
use heapscope_pytorch::{AllocConf, BlockState, TraceEntry};

/// Replays `recording` through `contender` with `config` (capacity, alignment, heap rules, page size, PyTorch's
/// settings in place of the recording's own) into a timeline of one step per entry, from the state at the start of the
/// recording (position 0: its live allocations, as spans [`Span::before_recording`]; for `pytorch` its segments
/// too).
///
/// The PyTorch contenders are `compare`'s own run of the emulation ([`emulate_pytorch`]), written down as it
/// goes: with stream-ordered frees, user `empty_cache()` calls and recorded `oom` requests tried with the
/// driver's free bytes (without a capacity). Refusals carry the numbers of `compare`'s first OOM; footprints are
/// the blocks the allocator holds. A device-only contender (gpu-allocator, VMA) has no simulated timeline.
///
/// # Errors
/// Invalid settings, a snapshot the emulation cannot replay (as `compare` reports it), a device-only contender,
/// or a contender bug (a change that contradicts the layout).
pub fn record(recording: &Recording, contender: Contender, config: &CompareConfig) -> Result<Timeline> {
    let mut timeline = match contender {
        Contender::Pytorch { expandable } => {
            let conf = config.pytorch_conf(recording, expandable)?;
            if let Some(why) = crate::compare::start_exceeds(recording, &conf, config.capacity_bytes) {
                return Err(Error::InvalidConfig { what: format!("{}: {why}", recording.name) });
            }
            record_pytorch(recording, conf, config.capacity_bytes)?
        }
        Contender::Heap(kind) => {
            let mut heap = config.heap(kind)?;
            let rules = Rules::Heap(heap.config().clone());
            record_device_heap(recording, &mut heap, config, &[], rules)?
        }
        Contender::Paged => {
            let mut heap = config.paged_heap()?;
            let range = Change::RegionAdded { address: 0, size_bytes: heap.config().virtual_bytes, kind: RegionKind::Virtual };
            let rules = Rules::Paged(heap.config().clone());
            record_device_heap(recording, &mut heap, config, &[range], rules)?
        }
        Contender::GpuAllocator | Contender::Vma => {
            return Err(Error::InvalidConfig {
                what: format!("{contender} runs on a Vulkan device only: it has no simulated timeline"),
            });
        }
    };
    timeline.contender = match contender {
        // A pane run with settings other than the recording's says them (a lesson's `max_split_size_mb:128`).
        Contender::Pytorch { expandable } => match config.alloc_conf.as_deref().map(str::trim).filter(|conf| !conf.is_empty()) {
            Some(conf) => format!("{} ({conf})", config.pytorch_name(recording, expandable)),
            None => config.pytorch_name(recording, expandable),
        },
        other => other.name().to_owned(),
    };
    Ok(timeline)
}

/// A contender's change that contradicts its own layout: a bug, reported as an error of the recording.
fn inconsistent(recording_name: &str, moment: Moment, error: &super::LayoutError) -> Error {
    Error::Trace { file: recording_name.to_owned(), line: 0, what: format!("timeline at {moment}: {error}") }
}

/// Writes a heap contender's replay down as a timeline: an [`Observer`] of the driver.
#[derive(Debug)]
pub struct TimelineObserver {
    name: String,
    timeline: Timeline,
    regions: RegionTracker,
    /// Changes of the moment being replayed.
    changes: Vec<Change>,
    refusal: Option<Refusal>,
}

impl TimelineObserver {
    /// A timeline for `contender` named `recording_name` in errors, whose layout starts with `initial` changes (a
    /// paged heap's virtual range).
    pub fn new(recording_name: &str, contender: &str, initial: &[Change]) -> Self {
        Self {
            name: recording_name.to_owned(),
            timeline: Timeline::new(contender),
            regions: RegionTracker::default(),
            changes: initial.to_vec(),
            refusal: None,
        }
    }

    /// The timeline written.
    pub fn finish(self) -> Timeline {
        self.timeline
    }
}

/// Where the footprint of the allocation behind `handle` starts.
fn footprint_address<H: DeviceHeap>(handle: &H::Handle) -> u64 {
    H::block_base(handle) + H::allocation(handle).footprint_offset()
}

/// The span of the allocation behind `handle`: `requested_bytes` asked for, trace slot `slot`, born at entry `born`.
fn span<H: DeviceHeap>(handle: &H::Handle, requested_bytes: u64, slot: u32, born: u64) -> Span {
    let allocation = H::allocation(handle);
    Span {
        address: footprint_address::<H>(handle),
        footprint_bytes: allocation.footprint_bytes(),
        lead_bytes: allocation.offset() - allocation.footprint_offset(),
        requested_bytes,
        slot,
        before_recording: false,
        born,
    }
}

impl<H: DeviceHeap> Observer<HeapTarget<'_, H>> for TimelineObserver {
    fn step(
        &mut self,
        _event: u64,
        moment: Moment,
        step: Step<'_, H::Handle>,
        device_events: &[DeviceEvent],
        _target: &HeapTarget<'_, H>,
    ) -> Result<()> {
        let born = match moment {
            Moment::Start => 0,
            Moment::Entry(entry) => entry,
        };
        match step {
            Step::Placed { slot, size_bytes, handle } => {
                self.regions.changes(device_events, &[], &mut self.changes);
                let span = span::<H>(handle, size_bytes, slot, born);
                self.changes.push(Change::Allocated(Span { before_recording: moment == Moment::Start, ..span }));
            }
            Step::Freed { handle, .. } => {
                self.changes.push(Change::Freed { address: footprint_address::<H>(handle) });
                self.regions.changes(device_events, &[], &mut self.changes);
            }
            Step::Refused { verdict, .. } => {
                self.regions.changes(device_events, &[], &mut self.changes);
                self.refusal = verdict.map(Refusal::from);
            }
            Step::Unserved { .. } | Step::CacheEmptied => self.regions.changes(device_events, &[], &mut self.changes),
            // The allocation slides: gone from where it was, there where it is, born when it was (at the start, for
            // one live before the recording).
            Step::Moved { slot, from, to, .. } => {
                let address = footprint_address::<H>(from);
                // Where it was: placed by a move earlier in this step (a pass may move one allocation twice), else
                // in the layout before the step.
                let is_it = |span: &Span| span.address == address && span.slot == slot;
                let was = self
                    .changes
                    .iter()
                    .rev()
                    .find_map(|change| match change {
                        Change::Allocated(span) if is_it(span) => Some(*span),
                        _ => None,
                    })
                    .or_else(|| self.timeline.head().span_at(address).filter(|span| is_it(span)).copied());
                let (before_recording, born) = was.map_or((false, born), |span| (span.before_recording, span.born));
                self.changes.push(Change::Freed { address });
                let span = span::<H>(to, H::allocation(from).size_bytes(), slot, born);
                self.changes.push(Change::Allocated(Span { before_recording, ..span }));
            }
        }
        Ok(())
    }

    fn moment_done(&mut self, moment: Moment, device_events: &[DeviceEvent], _target: &HeapTarget<'_, H>) -> Result<()> {
        self.regions.changes(device_events, &[], &mut self.changes);
        let result = match moment {
            // A start allocation the contender cannot hold (a capacity below the start state) has no step of its
            // own: the outcome's first OOM says "at start"; the layout shows the start without it.
            Moment::Start => {
                self.refusal = None;
                self.timeline.start(&self.changes)
            }
            Moment::Entry(_) => self.timeline.push(&self.changes, self.refusal.take()),
        };
        self.changes.clear();
        result.map_err(|error| inconsistent(&self.name, moment, &error))
    }
}

/// A heap of blocks or a paged heap, whose layout starts with `initial` changes (a paged heap's virtual range).
fn record_device_heap<H: DeviceHeap>(
    recording: &Recording,
    heap: &mut H,
    config: &CompareConfig,
    initial: &[Change],
    rules: Rules,
) -> Result<Timeline> {
    heap.record_device_events(true);
    let mut observer = TimelineObserver::new(&recording.name, heap.policy_name(), initial);
    let mut target = HeapTarget::compacting(heap, config.compact);
    drive(Stream::of(recording), &mut target, config.align_bytes, &mut [&mut observer])?;
    let mut timeline = observer.finish();
    timeline.rules = Some(rules);
    Ok(timeline)
}

/// PyTorch's caching allocator: `compare`'s own replay ([`emulate_pytorch`]), written down as it runs by a
/// [`PytorchRecorder`] following it.
fn record_pytorch(recording: &Recording, conf: AllocConf, capacity_bytes: Option<u64>) -> Result<Timeline> {
    // A refusal's bytes left are counted against what the allocator may reserve (its share of the device).
    let mut recorder = PytorchRecorder::new(recording, conf.allowed_bytes(capacity_bytes));
    emulate_pytorch(recording, &conf, capacity_bytes, &mut recorder)?;
    let mut timeline = recorder.finish()?;
    timeline.rules = Some(Rules::Pytorch(conf));
    Ok(timeline)
}

/// Follows the emulation of PyTorch's caching allocator (as its [`SegmentBacking`], holding no memory) and writes
/// it down as a timeline of one step per entry.
///
/// A step holds what its entry did: segment operations (as region and page changes), the allocation placed,
/// freed or refused. The state at the start of the recording is the timeline's start: segments as regions,
/// live blocks as spans [`Span::before_recording`].
struct PytorchRecorder<'a> {
    recording: &'a Recording,
    /// The device's trace entries, for a PyTorch recording (`None`: a plain trace, whose entries are its events).
    entries: Option<&'a [TraceEntry]>,
    capacity_bytes: Option<u64>,
    timeline: Timeline,
    regions: RegionTracker,
    /// The first event of the trace not yet replayed (the start events are the emulation's start state).
    next_event: u64,
    /// Changes of the entry being replayed.
    pending: Vec<Change>,
    /// Addresses of the spans in the layout (a block whose entry is no event has none).
    shown: FastSet<u64>,
    /// The first change that contradicted the layout.
    error: Option<Error>,
}

impl<'a> PytorchRecorder<'a> {
    fn new(recording: &'a Recording, capacity_bytes: Option<u64>) -> Self {
        let entries = recording
            .snapshot
            .as_ref()
            .map(|snapshot| snapshot.device_traces.get(recording.device).map_or(&[][..], Vec::as_slice));
        Self {
            recording,
            entries,
            capacity_bytes,
            timeline: Timeline::new("pytorch"),
            regions: RegionTracker::default(),
            next_event: recording.start_events as u64,
            pending: Vec::new(),
            shown: FastSet::default(),
            error: None,
        }
    }

    /// Keeps the first error.
    fn check(&mut self, moment: Moment, result: Result<(), super::LayoutError>) {
        if let Err(error) = result
            && self.error.is_none()
        {
            self.error = Some(inconsistent(&self.recording.name, moment, &error));
        }
    }

    /// The refusal of `report` at `entry`, with the numbers of `compare`'s first OOM.
    fn refusal(&self, entry: usize, report: &OomReport) -> Refusal {
        let trace_entry = self.entries.and_then(|entries| entries.get(entry));
        let unreserved = unreserved_bytes(self.capacity_bytes, report, trace_entry);
        let FirstOom {
            request_bytes,
            needed_bytes,
            reserved_bytes,
            free_bytes,
            largest_free_bytes,
            unusable_free_bytes,
            verdict,
            message,
            ..
        } = pytorch_first_oom(entry as u64, report, unreserved);
        Refusal {
            requested_bytes: request_bytes,
            needed_bytes,
            cause: verdict,
            reserved_bytes,
            free_bytes,
            largest_free_bytes,
            unusable_free_bytes,
            waste_bytes: {
                let totals = self.timeline.head().totals();
                totals.footprint_bytes.saturating_sub(totals.live_bytes)
            },
            unreserved_bytes: unreserved,
            message,
        }
    }

    /// The timeline, once the emulation has replayed every entry.
    fn finish(self) -> Result<Timeline> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let events = self.recording.trace.events().len() as u64;
        if self.next_event != events || self.timeline.steps() != self.recording.entries {
            return Err(Error::Trace {
                file: self.recording.name.clone(),
                line: 0,
                what: format!(
                    "the emulation replayed {} of {events} events, {} of {} entries",
                    self.next_event,
                    self.timeline.steps(),
                    self.recording.entries
                ),
            });
        }
        Ok(self.timeline)
    }
}

impl SegmentBacking for PytorchRecorder<'_> {
    fn apply(&mut self, events: &[DeviceEvent], allocator: &CachingAllocator) -> Result<(), BackingRefused> {
        self.regions.changes(events, &allocator.expandable_segments(), &mut self.pending);
        Ok(())
    }

    fn started(&mut self, allocator: &CachingAllocator, _moved: &[(u64, u64)]) {
        // The start events' slots by their recorded addresses, where the emulation places them.
        let events = self.recording.trace.events();
        let slot_at: FastMap<u64, u32> = (self.recording.start_addresses.iter().zip(events))
            .filter_map(|(&address, event)| match *event {
                Event::Alloc { slot, .. } => Some((address, slot)),
                _ => None,
            })
            .collect();
        for segment in allocator.report() {
            for block in segment.blocks.iter().filter(|block| block.state != BlockState::Inactive) {
                // A block known only from its free entry may record more requested bytes than it holds.
                let requested_bytes = block.requested_size.min(block.size);
                let slot = slot_at.get(&block.address).copied().unwrap_or(Span::BEFORE_RECORDING);
                let span = Span::before_recording(block.address, block.size, requested_bytes, slot);
                self.pending.push(Change::Allocated(span));
                self.shown.insert(block.address);
            }
        }
        let result = self.timeline.start(&self.pending);
        self.pending.clear();
        self.check(Moment::Start, result);
    }

    fn replayed(&mut self, entry: usize, effect: EntryEffect, allocator: &CachingAllocator) {
        let events = self.recording.trace.events();
        let moment = Moment::Entry(entry as u64);
        let first = self.next_event;
        while (self.next_event as usize) < events.len() && self.recording.moment_of(self.next_event) == moment {
            self.next_event += 1;
        }
        let alloc_event = match events.get(first as usize) {
            Some(&Event::Alloc { slot, size_bytes }) if self.next_event > first => Some((slot, size_bytes)),
            _ => None,
        };
        let span = |address: u64, footprint_bytes: u64, (slot, requested_bytes): (u32, u64)| {
            Change::Allocated(Span {
                address,
                footprint_bytes,
                lead_bytes: 0,
                requested_bytes,
                slot,
                before_recording: false,
                born: entry as u64,
            })
        };
        let mut refusal = None;
        match effect {
            EntryEffect::Unchanged => {}
            EntryEffect::Placed { address } => {
                if let Some(event) = alloc_event {
                    let footprint_bytes = allocator.live_block(address).map_or(event.1, |block| block.size_bytes);
                    self.pending.push(span(address, footprint_bytes, event));
                    self.shown.insert(address);
                }
            }
            EntryEffect::ServedAndReturned { address, size_bytes } => {
                if let Some(event) = alloc_event {
                    self.pending.push(span(address, size_bytes, event));
                    self.pending.push(Change::Freed { address });
                }
            }
            EntryEffect::Freed { address } => {
                if self.shown.remove(&address) {
                    self.pending.push(Change::Freed { address });
                }
            }
            EntryEffect::Refused(report) => {
                if alloc_event.is_some() {
                    refusal = Some(self.refusal(entry, &report));
                }
            }
        }
        let result = self.timeline.push(&self.pending, refusal);
        self.pending.clear();
        self.check(moment, result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::story::frag_oom;
    use heapscope_core::units::MIB;
    use heapscope_core::{HeapConfig, OomCause, PolicyKind, ReleaseRule};
    use heapscope_pytorch::{Action, Snapshot};

    fn story_config() -> (Recording, CompareConfig) {
        let story = frag_oom();
        let config = CompareConfig {
            capacity_bytes: Some(story.device_bytes),
            heap: HeapConfig { release: ReleaseRule::OnPressure, ..HeapConfig::new(PolicyKind::BestFit) },
            ..CompareConfig::default()
        };
        (Recording::from_trace(story.trace), config)
    }

    /// An allocation a compaction moves keeps the entry that made it (hover: its lifetime; colour by age).
    #[test]
    fn a_moved_allocation_keeps_its_birth() {
        let story = crate::story::compaction();
        let config = story.config();
        let recording = Recording::from_trace(story.trace);
        let mut born_at = vec![u64::MAX; recording.trace.slots() as usize];
        for (index, event) in (0..).zip(recording.trace.events()) {
            if let Event::Alloc { slot, .. } = *event {
                born_at[slot as usize] = recording.moment_of(index).position().saturating_sub(1);
            }
        }
        let timeline = record(&recording, Contender::Heap(PolicyKind::Tlsf), &config).unwrap();
        let last = timeline.steps();
        let (before, after) = (timeline.layout_at(last - 1), timeline.layout_at(last));
        let moved: Vec<&Span> =
            after.spans().filter(|span| before.span_at(span.address).is_none_or(|was| was.slot != span.slot)).collect();
        assert!(moved.len() > 1, "the compaction moved some and served the request");
        for span in moved {
            assert_eq!(span.born, born_at[span.slot as usize], "slot {}", span.slot);
        }
    }

    /// frag_oom through every side-by-side contender: who refuses the last request, and the layout then,
    /// against `compare`'s numbers.
    #[test]
    fn frag_oom_timelines_agree_with_compare() {
        let (recording, config) = story_config();
        // (contender, refusals, reserved at the end in MiB, free at the end in MiB, largest free run in MiB)
        let cases = [
            (Contender::Pytorch { expandable: false }, 1, 3000, 1000, 50),
            (Contender::Pytorch { expandable: true }, 0, 3040, 16, 16),
            (Contender::Heap(PolicyKind::BestFit), 1, 3000, 1000, 50),
            (Contender::Paged, 0, 3024, 0, 0),
        ];
        for (contender, refusals, reserved_mib, free_mib, largest_mib) in cases {
            let timeline = record(&recording, contender, &config).unwrap();
            assert_eq!(timeline.steps(), 61, "{contender}");
            assert_eq!(timeline.refusals().len(), refusals, "{contender}");
            let totals = timeline.head().totals();
            assert_eq!(
                (totals.reserved_bytes / MIB, totals.free_bytes / MIB, totals.largest_free_bytes / MIB),
                (reserved_mib, free_mib, largest_mib),
                "{contender}"
            );
            let last = timeline.samples().last().unwrap();
            assert_eq!(last.reserved_bytes, totals.reserved_bytes);
            if refusals > 0 {
                let refusal = timeline.refusal_at(60).unwrap();
                assert_eq!((refusal.requested_bytes, refusal.cause), (1024 * MIB, OomCause::Fragmentation), "{contender}");
                assert_eq!(refusal.free_bytes, 1000 * MIB, "{contender}");
            }
        }
    }

    #[test]
    fn every_step_replays_onto_the_layout_before_it() {
        let (recording, config) = story_config();
        for contender in Contender::all().into_iter().filter(|contender| !contender.needs_device()) {
            let timeline = record(&recording, contender, &config).unwrap();
            let mut layout = timeline.layout_at(0);
            for step in 0..timeline.steps() {
                for change in timeline.changes(step) {
                    layout.apply(change).unwrap_or_else(|error| panic!("{contender} step {step}: {error}"));
                }
            }
            assert_eq!(&layout, timeline.head(), "{contender}");
        }
    }

    #[test]
    fn bad_settings_are_errors() {
        let (recording, mut config) = story_config();
        config.align_bytes = 3;
        assert!(record(&recording, Contender::Heap(PolicyKind::Tlsf), &config).is_err());
        config.align_bytes = 512;
        let config = CompareConfig { alloc_conf: Some("bogus:1".into()), ..config };
        let error = record(&recording, Contender::Pytorch { expandable: false }, &config).unwrap_err();
        assert!(error.to_string().contains("--alloc-conf"), "{error}");
    }

    /// Seeks through checkpoints equal replays from the start, for every contender on the stories long
    /// enough to have checkpoints (virtual regions included).
    #[test]
    fn seeks_equal_replays_on_every_story() {
        for story in crate::story::all() {
            let config = CompareConfig { capacity_bytes: Some(story.device_bytes), ..CompareConfig::default() };
            let recording = Recording::from_trace(story.trace);
            for contender in Contender::SIDE_BY_SIDE {
                let timeline = record(&recording, contender, &config).unwrap();
                let mut layout = timeline.layout_at(0);
                let mut at = 0;
                let steps = timeline.steps();
                assert!(steps > 0, "{}", story.name);
                for position in [steps / 3, steps / 2, steps - 1, steps] {
                    timeline.advance(&mut layout, at, position);
                    at = position;
                    assert_eq!(layout, timeline.layout_at(position), "{} {contender} at {position}", story.name);
                }
            }
        }
    }

    /// The real frag_oom snapshot: on an unlimited device the recorded `oom` is tried with the room the
    /// driver had, so the timeline refuses it where PyTorch did, with PyTorch's numbers.
    #[test]
    fn a_recorded_oom_is_refused_where_pytorch_refused_it() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch/frag_oom-default.pickle.gz");
        let recording = Recording::open(&path, 0).unwrap();
        let timeline = record(&recording, Contender::Pytorch { expandable: false }, &CompareConfig::default()).unwrap();
        let [(step, refusal)] = timeline.refusals() else { panic!("one refusal: {:?}", timeline.refusals()) };
        assert_eq!(*step, 100, "the recorded oom entry");
        assert_eq!((refusal.requested_bytes, refusal.free_bytes, refusal.reserved_bytes), (1024 * MIB, 1000 * MIB, 3000 * MIB));
        assert_eq!(refusal.cause, OomCause::Fragmentation);
        let paged = record(&recording, Contender::Paged, &CompareConfig::default()).unwrap();
        assert!(paged.refusals().is_empty());
    }

    /// Replays every step's changes onto the layout before it, and seeks to a few positions, against replays
    /// from the start.
    fn assert_steps_and_seeks_replay(timeline: &Timeline, context: &str) {
        let mut layout = timeline.layout_at(0);
        for step in 0..timeline.steps() {
            for change in timeline.changes(step) {
                layout.apply(change).unwrap_or_else(|error| panic!("{context} step {step}: {error}"));
            }
        }
        assert_eq!(&layout, timeline.head(), "{context}");
        let steps = timeline.steps();
        let mut layout = timeline.layout_at(0);
        let mut at = 0;
        for position in [1, steps / 3, steps / 2, steps - 1, steps] {
            timeline.advance(&mut layout, at, position);
            at = position;
            assert_eq!(layout, timeline.layout_at(position), "{context} at {position}");
        }
    }

    fn snapshot_recording(name: &str, cut: usize) -> Recording {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
        let mut snapshot = heapscope_pytorch::read_snapshot(&dir.join(format!("{name}.pickle.gz"))).unwrap();
        let trace = &mut snapshot.device_traces[0];
        trace.drain(..cut * trace.len() / 2);
        Recording::from_snapshot(name, snapshot, 0).unwrap()
    }

    /// The real snapshots, whole and cut half-way (a recording begun mid-run: segments and live blocks at the
    /// start), through both PyTorch modes, unlimited and on the 3.5 GiB frag_oom had: the timeline is the
    /// emulation's run, so its last sample holds the emulation's final reserved and requested bytes, its
    /// refusals are the emulation's OOMs (the first with `compare`'s numbers), and it starts with what the
    /// allocator held at the start.
    #[test]
    fn pytorch_timelines_are_the_emulation_of_compare() {
        let names = ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"];
        for name in names {
            for cut in [0, 1] {
                let recording = snapshot_recording(name, cut);
                let snapshot = recording.snapshot.as_ref().unwrap();
                for expandable in [false, true] {
                    for capacity_bytes in [None, Some(3584 * MIB)] {
                        let context = format!("{name} cut {cut} expandable {expandable} capacity {capacity_bytes:?}");
                        let config = CompareConfig { capacity_bytes, ..CompareConfig::default() };
                        let recorded = record(&recording, Contender::Pytorch { expandable }, &config);
                        let conf = config.pytorch_conf(&recording, expandable).unwrap();
                        if crate::compare::start_exceeds(&recording, &conf, capacity_bytes).is_some() {
                            // GPT-2 cut mid-run held more than 3.5 GiB at its start: it never ran on such a device.
                            let error = recorded.unwrap_err().to_string();
                            assert!(error.contains("no device of that size ran it"), "{context}: {error}");
                            continue;
                        }
                        let timeline = recorded.unwrap_or_else(|e| panic!("{context}: {e}"));
                        // `pytorch-expandable` is the other setting than the recording's.
                        let conf = config.pytorch_conf(&recording, expandable).unwrap();
                        let emulation = heapscope_pytorch::emulate(snapshot, 0, &conf, capacity_bytes).unwrap();
                        assert_eq!(timeline.steps(), recording.entries, "{context}: a step per entry");
                        let last = timeline.samples().last().unwrap();
                        let stats = &emulation.stats;
                        assert_eq!(last.reserved_bytes as i64, stats.reserved_bytes.all().current, "{context}");
                        assert_eq!(last.live_bytes as i64, stats.requested_bytes.all().current, "{context}");
                        assert_eq!(timeline.refusals().len() as i64, stats.num_ooms, "{context}");
                        let compared =
                            emulate_pytorch(&recording, &conf, capacity_bytes, &mut heapscope_pytorch::Unbacked).unwrap();
                        match (timeline.refusals().first(), compared.first_oom) {
                            (None, None) => {}
                            (Some((step, refusal)), Some(oom)) => {
                                assert_eq!(*step, oom.event_index, "{context}: the step is the entry");
                                let numbers = (refusal.requested_bytes, refusal.reserved_bytes, refusal.free_bytes);
                                assert_eq!(numbers, (oom.request_bytes, oom.reserved_bytes, oom.free_bytes), "{context}");
                                assert_eq!((refusal.largest_free_bytes, refusal.cause), (oom.largest_free_bytes, oom.verdict));
                                assert_eq!(refusal.message, oom.message, "{context}");
                            }
                            (timeline, compare) => panic!("{context}: timeline refused {timeline:?}, compare {compare:?}"),
                        }
                        // The start (position 0): every block live then is a span with no trace slot, one per start
                        // event of the recording, which every other contender allocates first.
                        let start = CachingAllocator::at_recording_start(snapshot, 0, &conf, capacity_bytes).unwrap().report();
                        let live_at_start =
                            start.iter().flat_map(|segment| &segment.blocks).filter(|block| block.state != BlockState::Inactive);
                        let layout = timeline.layout_at(0);
                        let before: Vec<&Span> = layout.spans().filter(|span| span.is_before_recording()).collect();
                        assert_eq!(before.len(), live_at_start.count(), "{context}");
                        assert_eq!(before.len(), recording.start_events, "{context}");
                        assert_eq!(before.is_empty(), cut == 0, "{context}: blocks live at the start of a cut recording");
                        assert_eq!(timeline.start_sample().live_bytes, recording.start_bytes(), "{context}");
                        assert_steps_and_seeks_replay(&timeline, &context);
                    }
                }
            }
        }
    }

    fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
        TraceEntry::new(action, addr, size)
    }

    /// A step per entry: a block live before the recording (a span of the start, freed at its entry), and a user
    /// `empty_cache()` call (its segment released at its `segment_free` entry, before the next request opens a new
    /// one; replaying the allocations alone would reuse it).
    #[test]
    fn every_entry_is_a_step_and_the_start_holds_what_was_live() {
        const BASE: u64 = 0x7f00_0000_0000;
        let small = 2 * MIB;
        let later = BASE + (1 << 30);
        let block = heapscope_pytorch::Block::new;
        // The segment at the end: the second request's.
        let blocks = vec![
            block(later, 1024, 1000, BlockState::ActiveAllocated),
            block(later + 1024, small - 1024, 0, BlockState::Inactive),
        ];
        let segment = heapscope_pytorch::Segment::from_blocks(0, later, small, heapscope_pytorch::Pool::Small, blocks);
        let trace = vec![
            entry(Action::Alloc, BASE + 2048, 1000),         // event 0
            entry(Action::FreeRequested, BASE, 2048),        // the block from before the recording ...
            entry(Action::FreeCompleted, BASE, 2048),        // ... freed: no event
            entry(Action::FreeRequested, BASE + 2048, 1000), //
            entry(Action::FreeCompleted, BASE + 2048, 1000), // event 1
            entry(Action::SegmentFree, BASE, small),         // empty_cache(): an event of every contender's stream
            entry(Action::SegmentAlloc, later, small),       //
            entry(Action::Alloc, later, 1000),               // event 2
        ];
        let snapshot = Snapshot {
            segments: vec![segment],
            device_traces: vec![trace],
            settings: None,
            frame_stacks: vec![Vec::new()],
            categories: Vec::new(),
            pool_ids: Vec::new(),
            unknown_actions: Vec::new(),
            contender_export: None,
        };
        let recording = Recording::from_snapshot("t.pickle", snapshot, 0).unwrap();
        assert_eq!((recording.start_events, recording.entries), (1, 8), "the block from before the recording");
        assert_eq!(recording.entry_index, [0, 0, 2, 4, 5, 7]);
        assert_eq!(&recording.empty_caches[..], [5]);
        let timeline = record(&recording, Contender::Pytorch { expandable: false }, &CompareConfig::default()).unwrap();
        let region = |address| Change::RegionAdded { address, size_bytes: small, kind: RegionKind::Block };
        // Its rounded request: the small pool splits off any remainder (the next request takes the front of it).
        let before = Span::before_recording(BASE, 2048, 2048, 0);
        let served = |address, slot, born| {
            Change::Allocated(Span {
                address,
                footprint_bytes: 1024,
                lead_bytes: 0,
                requested_bytes: 1000,
                slot,
                before_recording: false,
                born,
            })
        };
        let start = timeline.layout_at(0);
        assert_eq!((start.regions().len(), start.spans().copied().collect::<Vec<_>>()), (1, vec![before]));
        let expected: [&[Change]; 8] = [
            &[served(BASE + 2048, 1, 0)],
            &[],
            &[Change::Freed { address: BASE }],
            &[],
            &[Change::Freed { address: BASE + 2048 }],
            &[Change::RegionRemoved { address: BASE }],
            &[],
            &[region(later), served(later, 2, 7)],
        ];
        for (step, changes) in (0..).zip(expected) {
            assert_eq!(timeline.changes(step), changes, "step {step}");
        }
        assert_steps_and_seeks_replay(&timeline, "t.pickle");
    }
}

/// The promise of every comparison: all contenders serve the same stream. On the shared snapshots, whole and cut
/// mid-run (segments and live blocks at the start), every contender holds the same live bytes at the start and
/// after every entry until the first refusal of any of them, in its outcome (`compare`) and in its timeline (the
/// app); with no refusal the peaks are equal.
#[cfg(test)]
mod same_stream {
    use super::*;
    use crate::compare::replay;

    #[test]
    fn every_contender_serves_the_same_stream_from_the_same_start() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
        let contenders: Vec<Contender> = Contender::all().into_iter().filter(|contender| !contender.needs_device()).collect();
        for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
            let whole = heapscope_pytorch::read_snapshot(&dir.join(format!("{name}.pickle.gz"))).unwrap();
            for quarter in [0, 1, 2, 3] {
                let mut snapshot = whole.clone();
                let trace = &mut snapshot.device_traces[0];
                trace.drain(..quarter * trace.len() / 4);
                let recording = Recording::from_snapshot(name, snapshot, 0).unwrap();
                let context = format!("{name} cut at {quarter}/4");
                assert_eq!(recording.start_events == 0, quarter == 0, "{context}");
                let config = CompareConfig::default();
                let runs: Vec<(Contender, Timeline, crate::compare::Figures)> = contenders
                    .iter()
                    .map(|&contender| {
                        let timeline = record(&recording, contender, &config).unwrap();
                        let figures = replay(&recording, contender, &config).unwrap().figures().cloned().unwrap();
                        (contender, timeline, figures)
                    })
                    .collect();
                let first_refusal =
                    runs.iter().filter_map(|(_, timeline, _)| timeline.refusals().first().map(|(step, _)| step + 1)).min();
                let (_, reference, reference_outcome) = &runs[0];
                assert_eq!(reference.start_sample().live_bytes, recording.start_bytes(), "{context}");
                for (contender, timeline, outcome) in &runs {
                    assert_eq!(timeline.steps(), recording.entries, "{context} {contender}");
                    for position in 0..=first_refusal.unwrap_or(timeline.steps()).min(timeline.steps()) {
                        assert_eq!(
                            timeline.sample_at(position).live_bytes,
                            reference.sample_at(position).live_bytes,
                            "{context} {contender} at {}",
                            Moment::at_position(position)
                        );
                    }
                    if first_refusal.is_none() {
                        assert_eq!(outcome.peak_live_bytes, reference_outcome.peak_live_bytes, "{context} {contender}");
                        let timeline_peak = timeline.samples().iter().map(|sample| sample.live_bytes).max();
                        assert_eq!(timeline_peak.unwrap_or(0).max(timeline.start_sample().live_bytes), outcome.peak_live_bytes);
                    }
                }
            }
        }
    }

    /// Issue 14: the shared GPT-2 expandable recording with the small pool's reservation moved to 90 GiB above the
    /// large pool's (where an 80 GiB device's driver puts it). The large reservation, 128 GiB when reserved, is
    /// cut where the small one starts: the timeline shows two regions, side by side, at the end and at every
    /// checkpoint, as the allocator holds them.
    #[test]
    fn issue_14_reservations_90_gib_apart_are_two_regions() {
        use heapscope_pytorch::Pool;
        use heapscope_pytorch::caching::EXPANDABLE_VIRTUAL_BYTES;
        const GIB: u64 = 1 << 30;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
        let mut snapshot = heapscope_pytorch::read_snapshot(&dir.join("gpt2_train_fixed-expandable.pickle.gz")).unwrap();
        let large = snapshot.segments.iter().find(|s| s.segment_type == Pool::Large).unwrap().address;
        let small = snapshot.segments.iter().find(|s| s.segment_type == Pool::Small).unwrap().address;
        let moved = large + 90 * GIB;
        let shift = |addr: &mut u64| {
            if *addr >= small {
                *addr = *addr - small + moved;
            }
        };
        snapshot.device_traces[0].iter_mut().for_each(|entry| shift(&mut entry.addr));
        for segment in &mut snapshot.segments {
            shift(&mut segment.address);
            segment.blocks.iter_mut().for_each(|block| shift(&mut block.address));
        }
        let recording = Recording::from_snapshot("moved", snapshot, 0).unwrap();
        let timeline = record(&recording, Contender::Pytorch { expandable: false }, &CompareConfig::default()).unwrap();
        assert_eq!(timeline.steps(), recording.entries);
        let end = timeline.layout_at(timeline.steps());
        let regions: Vec<(u64, u64, RegionKind)> =
            end.regions().map(|region| (region.address, region.size_bytes, region.kind)).collect();
        assert_eq!(
            regions,
            [(large, 90 * GIB, RegionKind::Virtual), (moved, EXPANDABLE_VIRTUAL_BYTES, RegionKind::Virtual)],
            "the large reservation ends where the small one starts"
        );
        let changes: Vec<&Change> = (0..timeline.steps()).flat_map(|step| timeline.changes(step)).collect();
        assert!(changes.contains(&&Change::RegionResized { address: large, size_bytes: 90 * GIB }), "cut once reserved");
    }

    /// A device smaller than what was live at the start: a heap contender cannot hold the start state, its first
    /// OOM is "at start" (not entry 0), and its timeline still opens, without the refused allocations.
    #[test]
    fn a_start_state_larger_than_the_device_is_refused_at_the_start() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
        let mut snapshot = heapscope_pytorch::read_snapshot(&dir.join("gpt2_train_fixed-default.pickle.gz")).unwrap();
        let entries = snapshot.device_traces[0].len();
        snapshot.device_traces[0].drain(..entries / 2);
        let recording = Recording::from_snapshot("mid-run", snapshot, 0).unwrap();
        let config = CompareConfig { capacity_bytes: Some(recording.start_bytes() / 2), ..CompareConfig::default() };
        let outcome = replay(&recording, Contender::Heap(heapscope_core::PolicyKind::Tlsf), &config).unwrap();
        let oom = outcome.figures().and_then(|figures| figures.first_oom.clone()).expect("the start state does not fit");
        assert_eq!((oom.moment, oom.before_recording, oom.event_index), (Moment::Start, true, 0));
        let timeline = record(&recording, Contender::Heap(heapscope_core::PolicyKind::Tlsf), &config).unwrap();
        assert!(timeline.start_sample().live_bytes < recording.start_bytes(), "only what fitted");
    }

    /// Issue 14: a recording with expandable segments from a device above 114 GiB, where PyTorch reserves more than the
    /// 128 GiB the emulation takes: 130 GiB mapped, then 30 GiB more at its end. The emulation grows the reservation to
    /// the 160 GiB the request needs (9/8 of the 130 GiB reserved before it is less), and the timeline shows one region,
    /// resized before the run shows.
    #[test]
    fn issue_14_a_reservation_mapped_past_128_gib_is_one_region() {
        use heapscope_pytorch::{Action, Block, BlockState, Pool, RecordedSettings, Segment, Snapshot, StackId, TraceEntry};
        const GIB: u64 = 1 << 30;
        const A: u64 = 0x3_0200_0000;
        let entry = |action, addr, size| TraceEntry::new(action, addr, size);
        let trace = vec![
            entry(Action::SegmentMap, A, 130 * GIB),
            entry(Action::Alloc, A, 130 * GIB),
            entry(Action::SegmentMap, A + 130 * GIB, 30 * GIB),
            entry(Action::Alloc, A + 130 * GIB, 30 * GIB),
        ];
        let block = |address, size| Block {
            address,
            size,
            requested_size: size,
            state: BlockState::ActiveAllocated,
            frames: StackId::NONE,
        };
        let blocks = vec![block(A, 130 * GIB), block(A + 130 * GIB, 30 * GIB)];
        let segment = Segment { is_expandable: true, ..Segment::from_blocks(0, A, 160 * GIB, Pool::Large, blocks) };
        let snapshot = Snapshot {
            categories: Vec::new(),
            pool_ids: Vec::new(),
            unknown_actions: Vec::new(),
            contender_export: None,
            segments: vec![segment],
            device_traces: vec![trace],
            settings: Some(RecordedSettings { expandable_segments: true, ..RecordedSettings::default() }),
            frame_stacks: vec![Vec::new()],
        };
        let recording = Recording::from_snapshot("b200", snapshot, 0).unwrap();
        let timeline = record(&recording, Contender::Pytorch { expandable: false }, &CompareConfig::default()).unwrap();
        let end = timeline.layout_at(timeline.steps());
        let regions: Vec<(u64, u64, RegionKind)> =
            end.regions().map(|region| (region.address, region.size_bytes, region.kind)).collect();
        assert_eq!(regions, [(A, 160 * GIB, RegionKind::Virtual)]);
        let changes: Vec<&Change> = (0..timeline.steps()).flat_map(|step| timeline.changes(step)).collect();
        let added = changes.iter().filter(|change| matches!(change, Change::RegionAdded { .. })).count();
        assert_eq!(added, 1, "{changes:?}");
        assert!(changes.contains(&&Change::RegionResized { address: A, size_bytes: 160 * GIB }), "{changes:?}");
    }
}
