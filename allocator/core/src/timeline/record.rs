//! Recording a timeline: every contender of `compare` replays a recording and says, step by step, what it
//! did to its layout.

use std::fmt;
use std::str::FromStr;

use super::explain::Rules;
use super::{Change, Refusal, RegionKind, Span, Timeline};
use crate::compare::{CompareConfig, FirstOom, alloc_conf, pytorch_first_oom};
use crate::pytorch::caching::CachingAllocator;
use crate::pytorch::{Action, AllocConf};
use crate::recording::Recording;
use crate::trace::Event;
use crate::{DeviceEvent, DeviceHeap, Error, OomVerdict, PolicyKind, Request, Result};

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
/// The PyTorch contenders replay the recording's trace from an empty allocator, on the stream each
/// allocation was recorded on, with the recorded address as the hint for a new segment, and a request
/// PyTorch refused (an `oom` entry) with the driver's free bytes recorded then (without a capacity); what
/// the full emulation of `compare` adds (the state when a recording started mid-run, `empty_cache()` calls)
/// is left out.
///
/// # Errors
/// Invalid settings, or a contender bug (a change that contradicts the layout).
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

fn device_change(event: DeviceEvent) -> Change {
    match event {
        DeviceEvent::Reserved { address, size_bytes } => Change::RegionAdded { address, size_bytes, kind: RegionKind::Block },
        DeviceEvent::Released { address, .. } => Change::RegionRemoved { address },
        DeviceEvent::Mapped { address, size_bytes } => Change::PagesMapped { address, size_bytes },
        DeviceEvent::Unmapped { address, size_bytes } => Change::PagesUnmapped { address, size_bytes },
    }
}

fn refusal_of(verdict: &OomVerdict) -> Refusal {
    Refusal {
        requested_bytes: verdict.requested_bytes,
        cause: verdict.cause,
        reserved_bytes: verdict.reserved_bytes,
        free_bytes: verdict.free_in_blocks_bytes,
        largest_free_bytes: verdict.largest_free_run_bytes,
        message: verdict.describe(),
    }
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
    for (step, event) in (0..).zip(recording.trace.events()) {
        let mut refusal = None;
        match *event {
            Event::Alloc { slot, size_bytes } => {
                let served = match Request::new(size_bytes, align_bytes) {
                    Ok(request) => match heap.allocate_request(request) {
                        Ok(handle) => Some(handle),
                        Err(Error::OutOfMemory(verdict)) => {
                            refusal = Some(refusal_of(&verdict));
                            None
                        }
                        Err(other) => return Err(other),
                    },
                    Err(_) => {
                        refusal = Some(refusal_of(&heap.oversized_verdict(size_bytes, align_bytes)));
                        None
                    }
                };
                changes.extend(heap.take_device_events().into_iter().map(device_change));
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
                    changes.extend(heap.take_device_events().into_iter().map(device_change));
                }
            }
        }
        timeline.push(&changes, refusal).map_err(|error| inconsistent(recording, step, &error))?;
        changes.clear();
    }
    Ok(timeline)
}

/// The segment events of the caching allocator as changes; an expandable segment becomes a virtual region
/// the first time pages are mapped in it.
fn pytorch_changes(allocator: &mut CachingAllocator, known_virtual: &mut Vec<(u64, u64)>, changes: &mut Vec<Change>) {
    for event in allocator.take_events() {
        let (address, size_bytes) = (event.addr, event.size_bytes);
        let change = match event.action {
            Action::SegmentAlloc => Change::RegionAdded { address, size_bytes, kind: RegionKind::Block },
            Action::SegmentFree => Change::RegionRemoved { address },
            Action::SegmentMap => {
                let inside = |&(base, bytes): &(u64, u64)| base <= address && address < base + bytes;
                if !known_virtual.iter().any(inside)
                    && let Some(range) = allocator.expandable_segments().into_iter().find(inside)
                {
                    known_virtual.push(range);
                    changes.push(Change::RegionAdded { address: range.0, size_bytes: range.1, kind: RegionKind::Virtual });
                }
                Change::PagesMapped { address, size_bytes }
            }
            _ => Change::PagesUnmapped { address, size_bytes },
        };
        changes.push(change);
    }
}

fn record_pytorch(recording: &Recording, conf: AllocConf, capacity_bytes: Option<u64>) -> Result<Timeline> {
    let mut allocator = CachingAllocator::new(conf.clone(), capacity_bytes);
    let mut timeline = Timeline::new("pytorch");
    timeline.rules = Some(Rules::Pytorch(conf));
    let entries = recording.snapshot.as_ref().and_then(|snapshot| snapshot.device_traces.get(recording.device));
    let mut addresses: Vec<Option<u64>> = vec![None; recording.trace.slots() as usize];
    let mut known_virtual = Vec::new();
    let mut changes = Vec::new();
    for (step, event) in (0..).zip(recording.trace.events()) {
        let mut refusal = None;
        match *event {
            Event::Alloc { slot, size_bytes } => {
                let entry = entries
                    .and_then(|entries| usize::try_from(recording.entry_of(step)).ok().and_then(|index| entries.get(index)));
                let (stream, hint) = entry.map_or((0, None), |entry| (entry.stream, (entry.addr != 0).then_some(entry.addr)));
                // A request PyTorch refused is tried with the room the driver reported then (as `emulate` does),
                // unless a capacity is given.
                let recorded_free = entry.filter(|entry| entry.action == Action::Oom).and_then(|entry| entry.device_free);
                if capacity_bytes.is_none()
                    && let Some(free) = recorded_free
                {
                    allocator.request_limit_bytes = Some(allocator.reserved_bytes().saturating_add(free));
                }
                let result = allocator.malloc(size_bytes, stream, hint);
                allocator.request_limit_bytes = None;
                pytorch_changes(&mut allocator, &mut known_virtual, &mut changes);
                match result {
                    Ok(address) => {
                        let footprint_bytes = allocator.live_block(address).map_or(size_bytes, |block| block.size_bytes);
                        changes.push(Change::Allocated(Span {
                            address,
                            footprint_bytes,
                            lead_bytes: 0,
                            requested_bytes: size_bytes,
                            slot,
                            born: step,
                        }));
                        addresses[slot as usize] = Some(address);
                    }
                    Err(report) => {
                        let unreserved =
                            capacity_bytes.map(|capacity| capacity.saturating_sub(report.reserved_bytes)).or(recorded_free);
                        let FirstOom { request_bytes, reserved_bytes, free_bytes, largest_free_bytes, verdict, message, .. } =
                            pytorch_first_oom(recording.entry_of(step), &report, unreserved);
                        refusal = Some(Refusal {
                            requested_bytes: request_bytes,
                            cause: verdict,
                            reserved_bytes,
                            free_bytes,
                            largest_free_bytes,
                            message,
                        });
                    }
                }
            }
            Event::Free { slot } => {
                if let Some(address) = addresses[slot as usize].take() {
                    allocator.free(address);
                    changes.push(Change::Freed { address });
                    pytorch_changes(&mut allocator, &mut known_virtual, &mut changes);
                }
            }
        }
        timeline.push(&changes, refusal).map_err(|error| inconsistent(recording, step, &error))?;
        changes.clear();
    }
    Ok(timeline)
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
