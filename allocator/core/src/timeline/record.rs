//! Recording a timeline: every contender of `compare` replays a recording and says, step by step, what it
//! did to its layout.

use std::fmt;
use std::str::FromStr;

use super::explain::Rules;
use super::{Change, Refusal, RegionKind, RegionTracker, Span, Timeline};
use crate::compare::{CompareConfig, FirstOom, alloc_conf, emulate_pytorch, pytorch_first_oom, unreserved_bytes};
use crate::hash::FastSet;
use crate::pytorch::caching::{CachingAllocator, EntryEffect, OomReport, SegmentBacking};
use crate::pytorch::{AllocConf, BlockState, TraceEntry};
use crate::recording::Recording;
use crate::trace::Event;
use crate::{DeviceEvent, DeviceHeap, Error, PolicyKind, Request, Result};

/// Who replays a recording into a timeline: the contenders of `compare`, with PyTorch's caching allocator in
/// both of its modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Contender {
    /// The emulation of PyTorch's caching allocator; `expandable`: with `expandable_segments:True`.
    Pytorch {
        /// Expandable segments on.
        expandable: bool,
    },
    /// A heap of blocks with this policy inside each.
    Heap(PolicyKind),
    /// A virtual range backed by pages mapped on demand.
    Paged,
}

impl Contender {
    /// The four that show the most side by side: PyTorch's default and expandable modes, TLSF in blocks,
    /// and paging.
    pub const SIDE_BY_SIDE: [Contender; 4] = [
        Contender::Pytorch { expandable: false },
        Contender::Pytorch { expandable: true },
        Contender::Heap(PolicyKind::Tlsf),
        Contender::Paged,
    ];

    /// The name in menus and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Pytorch { expandable: false } => "pytorch",
            Contender::Pytorch { expandable: true } => "pytorch-expandable",
            Contender::Heap(kind) => kind.name(),
            Contender::Paged => "paged",
        }
    }

    /// Every contender: both PyTorch modes, each core policy in a heap, paging.
    pub fn all() -> Vec<Contender> {
        let mut all = vec![Contender::Pytorch { expandable: false }, Contender::Pytorch { expandable: true }];
        all.extend(PolicyKind::ALL.map(Contender::Heap));
        all.push(Contender::Paged);
        all
    }
}

impl fmt::Display for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Contender {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Contender::all().into_iter().find(|contender| contender.name() == text).ok_or_else(|| {
            let names: Vec<&str> = Contender::all().into_iter().map(Contender::name).collect();
            format!("unknown policy {text:?}: expected one of {}", names.join(", "))
        })
    }
}

/// Replays `recording` through `contender` with `config` (capacity, alignment, heap rules, page size;
/// `alloc_conf` overrides PyTorch's settings in `PYTORCH_CUDA_ALLOC_CONF` syntax) into a timeline of one
/// step per trace event.
///
/// The PyTorch contenders are `compare`'s own run of the emulation ([`emulate_pytorch`]), written down as it
/// goes: for a PyTorch recording, from the state when the recording started (its segments as regions, its live
/// blocks as spans [`Span::before_recording`], all in step 0), with stream-ordered frees, user `empty_cache()`
/// calls and recorded `oom` requests tried with the driver's free bytes (without a capacity); for a plain trace,
/// from an empty allocator on one stream. What entries that are no trace event change (segment entries, an
/// `empty_cache()`, the free of a block from before the recording) joins the next event's step, or the last
/// step. Refusals carry the numbers of `compare`'s first OOM; footprints are the blocks the allocator holds.
///
/// # Errors
/// Invalid settings, a snapshot the emulation cannot replay (as `compare` reports it), or a contender bug (a
/// change that contradicts the layout).
pub fn record(recording: &Recording, contender: Contender, config: &CompareConfig, overrides: Option<&str>) -> Result<Timeline> {
    let mut timeline = match contender {
        Contender::Pytorch { expandable } => {
            let mut conf = alloc_conf(recording, overrides)?;
            conf.expandable_segments |= expandable;
            record_pytorch(recording, conf, config.capacity_bytes)?
        }
        Contender::Heap(kind) => {
            let mut heap = config.heap(kind)?;
            let rules = Rules::Heap(heap.config().clone());
            record_device_heap(recording, &mut heap, config.align_bytes, &[], rules)?
        }
        Contender::Paged => {
            let mut heap = config.paged_heap()?;
            let range = Change::RegionAdded { address: 0, size_bytes: heap.config().virtual_bytes, kind: RegionKind::Virtual };
            let rules = Rules::Paged(heap.config().clone());
            record_device_heap(recording, &mut heap, config.align_bytes, &[range], rules)?
        }
    };
    timeline.contender = contender.name().to_owned();
    Ok(timeline)
}

/// A contender's change that contradicts its own layout: a bug, reported as an error of the recording.
fn inconsistent(recording: &Recording, step: u64, error: &super::LayoutError) -> Error {
    Error::Trace { file: recording.name.clone(), line: 0, what: format!("timeline step {step}: {error}") }
}

/// A heap of blocks or a paged heap, whose layout starts with `initial` changes (a paged heap's virtual range).
fn record_device_heap<H: DeviceHeap>(
    recording: &Recording,
    heap: &mut H,
    align_bytes: u64,
    initial: &[Change],
    rules: Rules,
) -> Result<Timeline> {
    Request::new(1, align_bytes)?;
    heap.record_device_events(true);
    let mut timeline = Timeline::new(heap.policy_name());
    timeline.rules = Some(rules);
    let mut handles: Vec<Option<H::Handle>> = vec![None; recording.trace.slots() as usize];
    let mut changes = initial.to_vec();
    // The heap's virtual range, if any, is in `initial`: its events are blocks and page runs.
    let mut regions = RegionTracker::default();
    for (step, event) in (0..).zip(recording.trace.events()) {
        let mut refusal = None;
        match *event {
            Event::Alloc { slot, size_bytes } => {
                let served = match Request::new(size_bytes, align_bytes) {
                    Ok(request) => match heap.allocate_request(request) {
                        Ok(handle) => Some(handle),
                        Err(Error::OutOfMemory(verdict)) => {
                            refusal = Some(Refusal::from(&*verdict));
                            None
                        }
                        Err(other) => return Err(other),
                    },
                    Err(_) => {
                        refusal = Some(Refusal::from(&heap.oversized_verdict(size_bytes, align_bytes)));
                        None
                    }
                };
                regions.changes(&heap.take_device_events(), &[], &mut changes);
                if let Some(handle) = served {
                    let allocation = H::allocation(&handle);
                    let base = H::block_base(&handle);
                    changes.push(Change::Allocated(Span {
                        address: base + allocation.footprint_offset(),
                        footprint_bytes: allocation.footprint_bytes(),
                        lead_bytes: allocation.offset() - allocation.footprint_offset(),
                        requested_bytes: size_bytes,
                        slot,
                        born: step,
                    }));
                    handles[slot as usize] = Some(handle);
                }
            }
            Event::Free { slot } => {
                if let Some(handle) = handles[slot as usize].take() {
                    let allocation = H::allocation(&handle);
                    let address = H::block_base(&handle) + allocation.footprint_offset();
                    heap.free_handle(handle)?;
                    changes.push(Change::Freed { address });
                    regions.changes(&heap.take_device_events(), &[], &mut changes);
                }
            }
        }
        timeline.push(&changes, refusal).map_err(|error| inconsistent(recording, step, &error))?;
        changes.clear();
    }
    Ok(timeline)
}

/// PyTorch's caching allocator: `compare`'s own replay ([`emulate_pytorch`]), written down as it runs by a
/// [`PytorchRecorder`] following it.
fn record_pytorch(recording: &Recording, conf: AllocConf, capacity_bytes: Option<u64>) -> Result<Timeline> {
    let mut recorder = PytorchRecorder::new(recording, capacity_bytes);
    emulate_pytorch(recording, &conf, capacity_bytes, &mut recorder)?;
    let mut timeline = recorder.finish()?;
    timeline.rules = Some(Rules::Pytorch(conf));
    Ok(timeline)
}

/// Follows the emulation of PyTorch's caching allocator (as its [`SegmentBacking`], holding no memory) and writes
/// it down as a timeline of one step per trace event.
///
/// A step gathers what happened since the step before: segment operations (as region and page changes), the
/// allocation placed, freed or refused by its event, and the changes of entries that are no events (segment
/// entries, a `free_requested`, an `empty_cache()` call, the free of an allocation made before the recording),
/// which join the next event's step, or the last step at the end. The state at the start of the recording goes
/// in first: segments as regions, live blocks as spans [`Span::before_recording`].
struct PytorchRecorder<'a> {
    recording: &'a Recording,
    /// The device's trace entries, for a PyTorch recording (`None`: a plain trace, whose entries are its events).
    entries: Option<&'a [TraceEntry]>,
    capacity_bytes: Option<u64>,
    timeline: Timeline,
    regions: RegionTracker,
    /// The first event that has no step yet.
    next_step: u64,
    /// Changes for the next step.
    pending: Vec<Change>,
    /// The last step, held back until no later change can join it.
    held: Option<(Vec<Change>, Option<Refusal>)>,
    /// Addresses of the spans in the layout (a block whose entry is no event, a zero-byte request, has none).
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
            next_step: 0,
            pending: Vec::new(),
            held: None,
            shown: FastSet::default(),
            error: None,
        }
    }

    /// The entry event `step` came from.
    fn entry_of(&self, step: u64) -> u64 {
        if self.entries.is_some() { self.recording.entry_of(step) } else { step }
    }

    /// Appends the held step to the timeline.
    fn push_held(&mut self) {
        let Some((changes, refusal)) = self.held.take() else { return };
        let step = self.timeline.steps();
        if let Err(error) = self.timeline.push(&changes, refusal)
            && self.error.is_none()
        {
            self.error = Some(inconsistent(self.recording, step, &error));
        }
    }

    /// The refusal of `report` at `entry`, with the numbers of `compare`'s first OOM.
    fn refusal(&self, entry: usize, report: &OomReport) -> Refusal {
        let trace_entry = self.entries.and_then(|entries| entries.get(entry));
        let unreserved = unreserved_bytes(self.capacity_bytes, report, trace_entry);
        let FirstOom { request_bytes, reserved_bytes, free_bytes, largest_free_bytes, verdict, message, .. } =
            pytorch_first_oom(entry as u64, report, unreserved);
        Refusal { requested_bytes: request_bytes, cause: verdict, reserved_bytes, free_bytes, largest_free_bytes, message }
    }

    /// The timeline, once the emulation has replayed every entry.
    fn finish(mut self) -> Result<Timeline> {
        if let Some((changes, _)) = &mut self.held {
            changes.append(&mut self.pending);
        }
        self.push_held();
        if let Some(error) = self.error {
            return Err(error);
        }
        let events = self.recording.trace.events().len() as u64;
        if self.next_step != events {
            return Err(Error::Trace {
                file: self.recording.name.clone(),
                line: 0,
                what: format!("the emulation replayed {} of {events} events", self.next_step),
            });
        }
        Ok(self.timeline)
    }
}

impl SegmentBacking for PytorchRecorder<'_> {
    fn apply(&mut self, events: &[DeviceEvent], allocator: &CachingAllocator) -> Result<(), String> {
        self.regions.changes(events, &allocator.expandable_segments(), &mut self.pending);
        Ok(())
    }

    fn started(&mut self, allocator: &CachingAllocator) {
        for segment in allocator.report() {
            for block in segment.blocks.iter().filter(|block| block.state != BlockState::Inactive) {
                // A block known only from its free entry may record more requested bytes than it holds.
                let requested_bytes = block.requested_size.min(block.size);
                self.pending.push(Change::Allocated(Span::before_recording(block.address, block.size, requested_bytes)));
                self.shown.insert(block.address);
            }
        }
    }

    fn replayed(&mut self, entry: usize, effect: EntryEffect, allocator: &CachingAllocator) {
        let events = self.recording.trace.events();
        let first = self.next_step;
        let mut steps = 0;
        while let Some(step) = first.checked_add(steps).filter(|&step| step < events.len() as u64)
            && self.entry_of(step) == entry as u64
        {
            steps += 1;
        }
        self.next_step += steps;
        let alloc_event = match events.get(first as usize) {
            Some(&Event::Alloc { slot, size_bytes }) if steps > 0 => Some((slot, size_bytes)),
            _ => None,
        };
        let span = |address: u64, footprint_bytes: u64, (slot, requested_bytes): (u32, u64)| {
            Change::Allocated(Span { address, footprint_bytes, lead_bytes: 0, requested_bytes, slot, born: first })
        };
        let mut refusal = None;
        // A change for the entry's second step (a recorded `oom` served and given back: its free).
        let mut then = None;
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
                    then = Some(Change::Freed { address });
                }
            }
            EntryEffect::Freed { address } => {
                if self.shown.remove(&address) {
                    self.pending.push(Change::Freed { address });
                }
            }
            EntryEffect::Refused(report) => {
                if steps > 0 {
                    refusal = Some(self.refusal(entry, &report));
                }
            }
        }
        for step in 0..steps {
            self.push_held();
            self.held = Some(if step == 0 {
                (std::mem::take(&mut self.pending), refusal.take())
            } else {
                (then.take().into_iter().collect(), None)
            });
        }
        if let (Some(change), Some((changes, _))) = (then, &mut self.held) {
            changes.push(change);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pytorch::{Action, Snapshot};
    use crate::story::frag_oom;
    use crate::units::MIB;
    use crate::{HeapConfig, OomCause, ReleaseRule};

    fn story_config() -> (Recording, CompareConfig) {
        let story = frag_oom();
        let config = CompareConfig {
            capacity_bytes: Some(story.device_bytes),
            heap: HeapConfig { release: ReleaseRule::OnPressure, ..HeapConfig::new(PolicyKind::BestFit) },
            ..CompareConfig::default()
        };
        (Recording::from_trace(story.trace), config)
    }

    #[test]
    fn names_round_trip() {
        for contender in Contender::all() {
            assert_eq!(contender.name().parse::<Contender>(), Ok(contender));
        }
        assert!("tlfs".parse::<Contender>().unwrap_err().contains("pytorch-expandable"));
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
            let timeline = record(&recording, contender, &config, None).unwrap();
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
        for contender in Contender::all() {
            let timeline = record(&recording, contender, &config, None).unwrap();
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
        assert!(record(&recording, Contender::Heap(PolicyKind::Tlsf), &config, None).is_err());
        config.align_bytes = 512;
        let error = record(&recording, Contender::Pytorch { expandable: false }, &config, Some("bogus:1")).unwrap_err();
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
                let timeline = record(&recording, contender, &config, None).unwrap();
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
        let timeline = record(&recording, Contender::Pytorch { expandable: false }, &CompareConfig::default(), None).unwrap();
        let [(step, refusal)] = timeline.refusals() else { panic!("one refusal: {:?}", timeline.refusals()) };
        assert_eq!(recording.entry_of(*step), 100, "the recorded oom entry");
        assert_eq!((refusal.requested_bytes, refusal.free_bytes, refusal.reserved_bytes), (1024 * MIB, 1000 * MIB, 3000 * MIB));
        assert_eq!(refusal.cause, OomCause::Fragmentation);
        let paged = record(&recording, Contender::Paged, &CompareConfig::default(), None).unwrap();
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
        let mut snapshot = crate::pytorch::read_snapshot(&dir.join(format!("{name}.pickle.gz"))).unwrap();
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
                        let timeline = record(&recording, Contender::Pytorch { expandable }, &config, None).unwrap();
                        let mut conf = alloc_conf(&recording, None).unwrap();
                        conf.expandable_segments |= expandable;
                        let emulation = crate::pytorch::emulate(snapshot, 0, &conf, capacity_bytes).unwrap();
                        assert_eq!(timeline.steps(), recording.trace.events().len() as u64, "{context}");
                        let last = timeline.samples().last().unwrap();
                        let stats = &emulation.stats;
                        assert_eq!(last.reserved_bytes as i64, stats.reserved_bytes.all().current, "{context}");
                        assert_eq!(last.live_bytes as i64, stats.requested_bytes.all().current, "{context}");
                        assert_eq!(timeline.refusals().len() as i64, stats.num_ooms, "{context}");
                        let compared = emulate_pytorch(&recording, &conf, capacity_bytes, &mut crate::pytorch::Unbacked).unwrap();
                        match (timeline.refusals().first(), compared.first_oom) {
                            (None, None) => {}
                            (Some((step, refusal)), Some(oom)) => {
                                assert_eq!(recording.entry_of(*step), oom.event_index, "{context}");
                                let numbers = (refusal.requested_bytes, refusal.reserved_bytes, refusal.free_bytes);
                                assert_eq!(numbers, (oom.request_bytes, oom.reserved_bytes, oom.free_bytes), "{context}");
                                assert_eq!((refusal.largest_free_bytes, refusal.cause), (oom.largest_free_bytes, oom.verdict));
                                assert_eq!(refusal.message, oom.message, "{context}");
                            }
                            (timeline, compare) => panic!("{context}: timeline refused {timeline:?}, compare {compare:?}"),
                        }
                        // The start: every block live then is a span of step 0 with no trace slot.
                        let start = CachingAllocator::at_recording_start(snapshot, 0, &conf, capacity_bytes).unwrap().report();
                        let live_at_start =
                            start.iter().flat_map(|segment| &segment.blocks).filter(|block| block.state != BlockState::Inactive);
                        let before: Vec<&Span> = timeline
                            .changes(0)
                            .iter()
                            .filter_map(|change| match change {
                                Change::Allocated(span) if span.is_before_recording() => Some(span),
                                _ => None,
                            })
                            .collect();
                        assert_eq!(before.len(), live_at_start.count(), "{context}");
                        assert_eq!(before.is_empty(), cut == 0, "{context}: blocks live at the start of a cut recording");
                        assert_steps_and_seeks_replay(&timeline, &context);
                    }
                }
            }
        }
    }

    fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
        TraceEntry { action, addr, size, stream: 0, time_us: None, device_free: None, frames: crate::pytorch::StackId::NONE }
    }

    /// What no trace event shows still reaches the layout, at the next event's step: a block live before the
    /// recording (a span from step 0 on, freed by an entry that is no event), and a user `empty_cache()` call
    /// (its segment released before the next request opens a new one; replaying the trace alone would reuse it).
    #[test]
    fn entries_that_are_no_events_join_the_next_step() {
        const BASE: u64 = 0x7f00_0000_0000;
        let small = 2 * MIB;
        let later = BASE + (1 << 30);
        let block = |address, size, requested_size, state| crate::pytorch::Block {
            address,
            size,
            requested_size,
            state,
            frames: crate::pytorch::StackId::NONE,
        };
        // The segment at the end: the second request's.
        let segment = crate::pytorch::Segment {
            device: 0,
            address: later,
            total_size: small,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: crate::pytorch::Pool::Small,
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: crate::pytorch::StackId::NONE,
            blocks: vec![
                block(later, 1024, 1000, BlockState::ActiveAllocated),
                block(later + 1024, small - 1024, 0, BlockState::Inactive),
            ],
        };
        let trace = vec![
            entry(Action::Alloc, BASE + 4096, 1000),         // event 0
            entry(Action::FreeRequested, BASE, 2048),        // the block from before the recording ...
            entry(Action::FreeCompleted, BASE, 2048),        // ... freed: no event
            entry(Action::FreeRequested, BASE + 4096, 1000), //
            entry(Action::FreeCompleted, BASE + 4096, 1000), // event 1
            entry(Action::SegmentFree, BASE, small),         // empty_cache(): no event
            entry(Action::SegmentAlloc, later, small),       //
            entry(Action::Alloc, later, 1000),               // event 2
        ];
        let snapshot =
            Snapshot { segments: vec![segment], device_traces: vec![trace], settings: None, frame_stacks: vec![Vec::new()] };
        let recording = Recording::from_snapshot("t.pickle", snapshot, 0).unwrap();
        assert_eq!(recording.entry_index, [0, 4, 7]);
        let timeline = record(&recording, Contender::Pytorch { expandable: false }, &CompareConfig::default(), None).unwrap();
        let region = |address| Change::RegionAdded { address, size_bytes: small, kind: RegionKind::Block };
        let before = Span::before_recording(BASE, 4096, 2048);
        let served = |address, slot, born| {
            Change::Allocated(Span { address, footprint_bytes: 1024, lead_bytes: 0, requested_bytes: 1000, slot, born })
        };
        let expected: [&[Change]; 3] = [
            &[region(BASE), Change::Allocated(before), served(BASE + 4096, 0, 0)],
            &[Change::Freed { address: BASE }, Change::Freed { address: BASE + 4096 }],
            &[Change::RegionRemoved { address: BASE }, region(later), served(later, 1, 2)],
        ];
        for (step, changes) in (0..).zip(expected) {
            assert_eq!(timeline.changes(step), changes, "step {step}");
        }
        assert_steps_and_seeks_replay(&timeline, "t.pickle");
    }
}
