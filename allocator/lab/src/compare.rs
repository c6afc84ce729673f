//! Side-by-side replays: one recording through several contenders, each summed up in the same
//! [`Outcome`]: its [`Figures`] (the numbers `heapscope replay --json` and `heapscope compare` print), or why it did
//! not run.
//!
//! A contender is PyTorch's caching allocator (emulated), a [`Heap`] of blocks with one of the core
//! policies inside, or a [`PagedHeap`]. Heaps draw blocks from a simulated device of the capacity given
//! (unlimited when none is), so every contender meets the same device limit. Timing covers the
//! contender's own allocate and free calls over events parsed beforehand.
//!
//! [`emulate_pytorch`] is the `pytorch` contender's replay with memory under the allocator (a
//! [`SegmentBacking`]: the Vulkan backend's device memory), the same decisions and numbers. A contender that
//! cannot run where it was asked to (a device limit) is an [`Outcome::NotRun`](crate::outcome::Outcome::NotRun) with
//! the reason, so a table or a comparison still shows the others.

use std::time::{Duration, Instant};

use crate::caching_target::{CachingTarget, Copies, SnapshotTarget};
use crate::compaction::{CompactRule, CompactionFigures};
use crate::contender::Contender;
use crate::driver::{HeapReplay, HeapTarget, Observer, Step, Stream, drive, replay_device_heap_compacting};
use crate::recording::{Moment, Recording};
use heapscope_core::units::{Bytes, ReservedOverLive};
use heapscope_core::{
    DeviceEvent, DeviceHeap, FreeMemory, Heap, HeapConfig, LARGEST_DEVICE_BYTES, OomCause, OomVerdict, PagedConfig, PagedHeap,
    PolicyKind, Result, SimulatedSource, UnmapRule,
};
use heapscope_pytorch::caching::{
    CachingAllocation, CachingAllocator, CachingHeap, EntryEffect, OomReport, SegmentBacking, Unbacked,
};
use heapscope_pytorch::{AllocConf, Emulator, Fidelity, FormatSize, MemoryStats, TraceEntry};

/// The first request a contender could not serve.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FirstOom {
    /// Index of the entry in the recording (for a PyTorch file: in the device's trace; 0 for a request of the
    /// start state, see `moment`).
    pub event_index: u64,
    /// When: the entry, or the start (an allocation live before the recording started that this contender
    /// could not hold).
    #[cfg_attr(feature = "serde", serde(skip))]
    pub moment: Moment,
    /// Whether the request was one of the start state's.
    pub before_recording: bool,
    /// Bytes requested.
    pub request_bytes: u64,
    /// What serving it needed: the request as the contender rounds it, and for PyTorch's allocator the rest of the
    /// segment or pages the device would have had to give.
    pub needed_bytes: u64,
    /// Bytes reserved from the device at that moment.
    pub reserved_bytes: u64,
    /// Free bytes inside reserved memory.
    pub free_bytes: u64,
    /// The largest free run inside reserved memory that the request could use.
    pub largest_free_bytes: u64,
    /// Of `free_bytes`, what the request could not use: PyTorch keeps cached blocks apart by memory pool, by size (small
    /// or large) and by stream (0 for the core's heaps, whose free bytes count only the blocks a request could use).
    pub unusable_free_bytes: u64,
    /// What the device (or the budget) still had beside the reserved memory, where known.
    pub unreserved_bytes: Option<u64>,
    /// `paged`'s virtual range where it decided the refusal: `free_bytes` are then what the range had free (mapped or
    /// not), and no device figure applies.
    pub virtual_range_bytes: Option<u64>,
    /// The new block the contender needed, where that is what did not fit (gpu-allocator's 256 MiB blocks):
    /// `needed_bytes` is then that block, not the request rounded.
    pub new_block_bytes: Option<u64>,
    /// `fragmentation`, `internal_waste` or `exhaustion`.
    pub verdict: OomCause,
    /// The verdict in words.
    pub message: String,
}

impl FirstOom {
    /// What was free, in words: in reserved memory, and on the device beside it where known (with the sum):
    /// `1000.00 MiB free in reserved memory and 584.00 MiB more on the device, 1.55 GiB in all`.
    pub fn free_words(&self) -> String {
        match self.virtual_range_bytes {
            Some(range) => format!("{} free in its {} virtual range", Bytes(self.free_bytes), Bytes(range)),
            None => self.free_memory().to_string(),
        }
    }

    /// Whether the request is larger than any device heapscope models ([`LARGEST_DEVICE_BYTES`]).
    pub fn fits_no_device(&self) -> bool {
        self.request_bytes.max(self.needed_bytes) > LARGEST_DEVICE_BYTES
    }

    /// What was free: in reserved memory, and on the device beside it where known.
    pub fn free_memory(&self) -> FreeMemory {
        FreeMemory { reserved_free_bytes: self.free_bytes, unreserved_bytes: self.unreserved_bytes }
    }

    /// From a core verdict at `moment`.
    pub fn from_verdict(moment: Moment, verdict: &OomVerdict) -> Self {
        Self {
            event_index: match moment {
                Moment::Start => 0,
                Moment::Entry(entry) => entry,
            },
            moment,
            before_recording: moment == Moment::Start,
            request_bytes: verdict.requested_bytes,
            needed_bytes: verdict.needed_bytes,
            reserved_bytes: verdict.reserved_bytes,
            // Where the virtual range decided, all it had free; beside it no device figure means anything.
            free_bytes: match verdict.virtual_range_bytes {
                Some(_) => verdict.free_in_blocks_bytes.saturating_add(verdict.unreserved_bytes),
                None => verdict.free_in_blocks_bytes,
            },
            largest_free_bytes: verdict.largest_free_run_bytes,
            unusable_free_bytes: 0,
            unreserved_bytes: verdict.virtual_range_bytes.is_none().then_some(verdict.unreserved_bytes),
            virtual_range_bytes: verdict.virtual_range_bytes,
            new_block_bytes: verdict.new_block_bytes,
            verdict: verdict.cause,
            message: verdict.describe(),
        }
    }
}

/// A replay summed up: what a contender that ran measured.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Figures {
    /// The contender's name.
    pub policy: String,
    /// Events replayed (allocations and frees, the start state's included).
    pub events: u64,
    /// The recording's entries, the numbering of `first_oom.event_index` (the device's trace entries of a snapshot,
    /// the events of a trace).
    pub entries: u64,
    /// Allocations served.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// The most requested bytes live at once.
    pub peak_live_bytes: u64,
    /// When they were first live: the moment of the recording (`None` for a replay that allocated nothing).
    #[cfg_attr(feature = "serde", serde(skip))]
    pub peak_live_moment: Option<Moment>,
    /// That moment's entry (`null` for the start, or none).
    pub peak_live_entry: Option<u64>,
    /// The most bytes reserved from the device at once.
    pub peak_reserved_bytes: u64,
    /// Device allocations: blocks (segments) reserved, or map calls for paging; those holding what was live at the
    /// start of a recording begun mid-run included, for every contender (PyTorch's own count leaves them out).
    pub device_allocs: u64,
    /// Device frees: blocks released, or unmap calls.
    pub device_frees: u64,
    /// Requests that could not be served.
    pub ooms: u64,
    /// The first of them.
    pub first_oom: Option<FirstOom>,
    /// The contender's own time per event, in nanoseconds (parsing excluded).
    pub ns_per_event: f64,
    /// For `pytorch` on a PyTorch file: how its decisions compare with the recorded ones (none for a what-if).
    pub fidelity: Option<Fidelity>,
    /// For `pytorch`: the settings it ran with, as `PYTORCH_CUDA_ALLOC_CONF` (`""`: PyTorch's defaults).
    pub settings: Option<String>,
    /// For `pytorch`: settings other than the recording's — a what-if, whose decisions are not the recorded ones to
    /// compare with.
    pub what_if: bool,
    /// For `pytorch`: PyTorch's own counters (`torch.cuda.memory_stats()`).
    #[cfg_attr(feature = "serde", serde(skip))]
    pub memory_stats: Option<MemoryStats>,
    /// For a heap contender replayed with a [`CompactRule`]: what compacting did (`None` without one).
    pub compaction: Option<CompactionFigures>,
}

/// What became of a contender on a recording: its [`Figures`], or why it did not run.
pub type Outcome = crate::outcome::Outcome<Figures>;

impl Outcome {
    /// The contender's name, as reports print it.
    pub fn policy(&self) -> &str {
        match self {
            Self::Ran(figures) => &figures.policy,
            Self::NotRun { name, .. } => name,
        }
    }
}

/// One JSON object per contender, the same keys whether it ran or not: the figures (every count 0 for a contender
/// that did not run), then `not_run` (`null`, or why).
#[cfg(feature = "serde")]
impl serde::Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Line<'a> {
            #[serde(flatten)]
            figures: &'a Figures,
            not_run: Option<&'a str>,
        }
        match self {
            Self::Ran(figures) => Line { figures, not_run: None }.serialize(serializer),
            Self::NotRun { name, why } => Line { figures: &Figures::none(name), not_run: Some(why) }.serialize(serializer),
        }
    }
}

#[cfg(feature = "serde")]
impl Figures {
    /// Every count 0: a contender named `policy` that replayed nothing.
    fn none(policy: &str) -> Self {
        Self {
            policy: policy.to_owned(),
            events: 0,
            entries: 0,
            allocs: 0,
            frees: 0,
            peak_live_bytes: 0,
            peak_live_moment: None,
            peak_live_entry: None,
            peak_reserved_bytes: 0,
            device_allocs: 0,
            device_frees: 0,
            ooms: 0,
            first_oom: None,
            ns_per_event: 0.0,
            fidelity: None,
            settings: None,
            what_if: false,
            memory_stats: None,
            compaction: None,
        }
    }
}

impl Figures {
    /// Peak reserved over peak live (1.0 is no waste; none when nothing was live).
    pub fn reserved_over_live(&self) -> ReservedOverLive {
        ReservedOverLive::new(self.peak_reserved_bytes, self.peak_live_bytes)
    }
}

/// Settings shared by the contenders of one comparison.
#[derive(Clone, Debug)]
pub struct CompareConfig {
    /// Device memory available; `None` for no limit.
    pub capacity_bytes: Option<u64>,
    /// Page size of the `paged` contender.
    pub page_bytes: u64,
    /// When the `paged` contender unmaps wholly free pages.
    pub paged_unmap: UnmapRule,
    /// The `paged` contender's virtual range; `None`: four times the capacity, at least 1 TiB, 4 EiB without a capacity
    /// (simulated: [`PagedConfig::new`]), four times
    /// the trace's peak within the device's sparse address space (Vulkan).
    pub paged_virtual_bytes: Option<u64>,
    /// Alignment of every request (PyTorch rounds to 512 B).
    pub align_bytes: u64,
    /// The heap rules for heap contenders (the policy field is replaced by the contender's).
    pub heap: HeapConfig,
    /// PyTorch's allocator settings in place of the recording's own, as `PYTORCH_CUDA_ALLOC_CONF` would set them
    /// (`--alloc-conf`; [`alloc_conf`]).
    pub alloc_conf: Option<String>,
    /// PyTorch's allocator settings in full, instead of the recording's or `alloc_conf` (a row of `advise`, opened as
    /// a pane).
    pub pytorch_settings: Option<AllocConf>,
    /// When the heap contenders compact ([`crate::compaction`]; `paged` remaps pages, `pytorch` never moves anything).
    pub compact: CompactRule,
}

impl CompareConfig {
    /// The settings of a PyTorch contender on `recording`: [`CompareConfig::pytorch_settings`], else `alloc_conf`,
    /// else the recording's own ([`alloc_conf`]) — and for `pytorch-expandable` (`expandable`) the other `expandable_segments`
    /// than the recording's: on, or off for a recording made with them on (where "on" would be `pytorch` again).
    ///
    /// # Errors
    /// An `alloc_conf` PyTorch would refuse, naming the key or value.
    pub fn pytorch_conf(&self, recording: &Recording, expandable: bool) -> Result<AllocConf> {
        let mut conf = match &self.pytorch_settings {
            Some(conf) => conf.clone(),
            None => alloc_conf(recording, self.alloc_conf.as_deref())?,
        };
        if expandable {
            conf.expandable_segments = !recorded_expandable(recording);
        }
        Ok(conf)
    }

    /// The name a PyTorch contender's run goes by on `recording`: the contender's, or for `pytorch-expandable` on a
    /// recording made with expandable segments the setting it runs with instead,
    /// `pytorch (expandable_segments:False)`.
    pub fn pytorch_name(&self, recording: &Recording, expandable: bool) -> String {
        if expandable && recorded_expandable(recording) {
            "pytorch (expandable_segments:False)".to_owned()
        } else {
            Contender::Pytorch { expandable }.name().to_owned()
        }
    }

    /// The heap a heap contender with `kind` inside runs in: blocks from a simulated device of the capacity, its
    /// policies keeping their free runs' best fit for the replay's alignment (every request has it).
    ///
    /// # Errors
    /// Invalid heap settings.
    pub fn heap(&self, kind: PolicyKind) -> Result<Heap<SimulatedSource>> {
        let source =
            SimulatedSource::new(self.capacity_bytes.unwrap_or(LARGEST_DEVICE_BYTES), SimulatedSource::DEFAULT_ALIGNMENT_BYTES);
        let mut config = HeapConfig { policy: kind, ..self.heap.clone() };
        config.policy_config.fit_align_bytes = self.align_bytes;
        // A budget above the device is the device: what the heap may reserve, and what its verdicts say it may.
        config.capacity_bytes =
            config.capacity_bytes.map(|budget| self.capacity_bytes.map_or(budget, |capacity| capacity.min(budget)));
        Heap::new(config, source)
    }

    /// The most bytes a contender other than PyTorch's emulation reserves at once: the capacity, or the heap rules'
    /// budget (`--budget`) where that is less. It bounds the heaps (their rules hold it), `paged`'s pages and the
    /// Vulkan peers alike; PyTorch's emulation runs on the device's capacity and its own settings
    /// (`per_process_memory_fraction`).
    pub fn budgeted_bytes(&self) -> Option<u64> {
        match (self.capacity_bytes, self.heap.capacity_bytes) {
            (Some(capacity), Some(budget)) => Some(capacity.min(budget)),
            (capacity, budget) => capacity.or(budget),
        }
    }

    /// The paged contender, its pages bounded by [`CompareConfig::budgeted_bytes`].
    ///
    /// # Errors
    /// Invalid paging settings (a page size that is not a power of two or exceeds the virtual range).
    pub fn paged_heap(&self) -> Result<PagedHeap> {
        let defaults = PagedConfig::new(self.budgeted_bytes());
        PagedHeap::new(PagedConfig {
            page_bytes: self.page_bytes,
            unmap: self.paged_unmap,
            virtual_bytes: self.paged_virtual_bytes.unwrap_or(defaults.virtual_bytes),
            ..defaults
        })
    }
}

impl Default for CompareConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: None,
            page_bytes: PagedConfig::DEFAULT_PAGE_BYTES,
            paged_unmap: UnmapRule::Eager,
            paged_virtual_bytes: None,
            align_bytes: 512,
            heap: HeapConfig::new(PolicyKind::Tlsf),
            alloc_conf: None,
            pytorch_settings: None,
            compact: CompactRule::Never,
        }
    }
}

/// Runs of a replay for its timing: up to this many ...
const TIMING_RUNS: u32 = 5;
/// ... while they take less than this in total ...
const TIMING_BUDGET: Duration = Duration::from_millis(50);
/// ... and only when the first run was shorter than this.
const TIMING_REPEAT_BELOW: Duration = Duration::from_millis(10);

/// Runs `replay` (which builds its contender afresh) up to `TIMING_RUNS` times within `TIMING_BUDGET` when
/// the first run is short,
/// and returns the first run's result with the best run's time in nanoseconds: one cold run of a short
/// trace mostly measures page faults and cold caches, not the allocator, while a long one is its own
/// warm-up. Replays are deterministic, so every run computes the same result.
pub fn best_time<T, E>(mut replay: impl FnMut() -> Result<T, E>) -> Result<(T, u128), E> {
    let started = Instant::now();
    let first = replay()?;
    let mut best = started.elapsed();
    let runs = if best < TIMING_REPEAT_BELOW { TIMING_RUNS } else { 1 };
    for _ in 1..runs {
        if started.elapsed() >= TIMING_BUDGET {
            break;
        }
        let run = Instant::now();
        replay()?;
        best = best.min(run.elapsed());
    }
    Ok((first, best.as_nanos()))
}

/// The outcome of a heap replay of `recording` by `policy` that took `nanos`, with the device counters left at 0
/// for the caller to fill in (they depend on the heap); the first OOM at its moment of the recording.
pub fn summed(policy: &str, replay: &HeapReplay, recording: &Recording, nanos: u128) -> Figures {
    let stats = &replay.stats;
    Figures {
        policy: policy.to_owned(),
        events: stats.events,
        entries: recording.entries,
        allocs: stats.allocations,
        frees: stats.frees,
        peak_live_bytes: stats.peak_live_bytes,
        peak_live_moment: stats.peak_live_event.map(|event| recording.moment_of(event)),
        peak_live_entry: stats.peak_live_event.and_then(|event| entry_number(recording.moment_of(event))),
        peak_reserved_bytes: 0,
        device_allocs: 0,
        device_frees: 0,
        ooms: stats.failed_allocations,
        first_oom: stats
            .first_failure
            .zip(replay.first_oom.as_ref())
            .map(|(index, verdict)| FirstOom::from_verdict(recording.moment_of(index), verdict)),
        ns_per_event: nanos as f64 / stats.events.max(1) as f64,
        fidelity: None,
        settings: None,
        what_if: false,
        memory_stats: None,
        compaction: None,
    }
}

/// The entry of `moment` (`None` for the start).
fn entry_number(moment: Moment) -> Option<u64> {
    match moment {
        Moment::Start => None,
        Moment::Entry(entry) => Some(entry),
    }
}

/// Replays `recording` through `contender` on a simulated device with `config`: the one entry point of every
/// simulated replay (`replay`, `compare`, `summary`). A contender that exists only on a Vulkan device is an
/// outcome that says so ([`Outcome::NotRun`](crate::outcome::Outcome::NotRun)).
///
/// # Errors
/// Invalid settings (`--alloc-conf` included), a snapshot the emulation cannot replay, or a contender bug on free.
pub fn replay(recording: &Recording, contender: Contender, config: &CompareConfig) -> Result<Outcome> {
    let figures = match contender {
        Contender::Pytorch { expandable } => {
            let name = config.pytorch_name(recording, expandable);
            let conf = config.pytorch_conf(recording, expandable)?;
            if let Some(why) = start_exceeds(recording, &conf, config.capacity_bytes) {
                return Ok(Outcome::not_run(name, why));
            }
            let (replay, nanos) = best_time(|| emulate_pytorch(recording, &conf, config.capacity_bytes, &mut Unbacked))?;
            replay.figures(&name, recording, nanos)
        }
        Contender::Heap(kind) => heap_figures(
            recording,
            config,
            kind.name(),
            || config.heap(kind),
            |heap| {
                let stats = heap.stats();
                (stats.peak_reserved_bytes, stats.blocks_reserved, stats.blocks_released)
            },
        )?,
        Contender::Paged => heap_figures(
            recording,
            config,
            "paged",
            || config.paged_heap(),
            |heap| {
                let stats = heap.stats();
                (stats.peak_mapped_bytes, stats.map_calls, stats.unmap_calls)
            },
        )?,
        Contender::GpuAllocator | Contender::Vma => {
            return Ok(Outcome::not_run(contender.name(), "runs on a Vulkan device only: add --vulkan"));
        }
    };
    Ok(Outcome::Ran(figures))
}

/// The figures, named `name`, of `recording` through a fresh heap from `make` (timed by [`best_time`]), with its
/// peak reserved bytes, device allocations and device frees as `counts` reads them off the heap.
fn heap_figures<H: DeviceHeap>(
    recording: &Recording,
    config: &CompareConfig,
    name: &str,
    make: impl Fn() -> Result<H>,
    counts: impl Fn(&H) -> (u64, u64, u64),
) -> Result<Figures> {
    let ((heap, replay), nanos) = best_time(|| {
        let mut heap = make()?;
        let replay = replay_device_heap_compacting(&recording.trace, &mut heap, config.align_bytes, config.compact)?;
        Ok((heap, replay))
    })?;
    let (peak_reserved_bytes, device_allocs, device_frees) = counts(&heap);
    let compaction = (config.compact != CompactRule::Never).then_some(replay.stats.compaction);
    Ok(Figures { peak_reserved_bytes, device_allocs, device_frees, compaction, ..summed(name, &replay, recording, nanos) })
}

/// The allocator settings for the `pytorch` contender: `alloc_conf` in `PYTORCH_CUDA_ALLOC_CONF` syntax, read as that
/// variable is (every key it does not set at PyTorch's default, in place of the recording's settings, so that a row
/// of `advise` pasted here is the same run), else the recording's own (PyTorch's defaults for a plain trace).
///
/// # Errors
/// [`heapscope_core::Error::InvalidConfig`] naming the bad key or value.
pub fn alloc_conf(recording: &Recording, alloc_conf: Option<&str>) -> Result<AllocConf> {
    let Some(text) = alloc_conf else {
        return Ok(recording.snapshot.as_ref().map_or_else(AllocConf::default, AllocConf::of_snapshot));
    };
    let mut conf = AllocConf::default();
    conf.parse_overrides(text)
        .map_err(|error| heapscope_core::Error::InvalidConfig { what: format!("--alloc-conf: {error}") })?;
    Ok(conf)
}

/// Why PyTorch's allocator with `conf` cannot replay `recording` on a device of `capacity_bytes`: the recording began
/// with more reserved than the allocator may hold there (the device, or its share of it under
/// `per_process_memory_fraction`): its start state holds those segments, and no device of that size ran it; or, for a
/// what-if of the other kind of memory, what was live at the start takes more than that once allocated afresh
/// ([`afresh_start_bytes`]).
pub fn start_exceeds(recording: &Recording, conf: &AllocConf, capacity_bytes: Option<u64>) -> Option<String> {
    let capacity = capacity_bytes?;
    let allowed = conf.allowed_bytes(Some(capacity)).unwrap_or(capacity);
    let room = if allowed < capacity {
        format!("its share of the device's {} ({}, per_process_memory_fraction)", Bytes(capacity), Bytes(allowed))
    } else {
        format!("the device's {}", Bytes(capacity))
    };
    let start = crate::capacity::reserved_at_start(recording);
    if start > allowed {
        return Some(format!(
            "the recording began with {} reserved by PyTorch, more than {room}: no device of that size ran it",
            Bytes(start)
        ));
    }
    let afresh = afresh_start_bytes(recording, conf)?;
    (afresh > allowed).then(|| {
        format!(
            "what was live at the start, allocated afresh with expandable segments {}, takes {} reserved, more than {room}",
            if conf.expandable_segments { "on" } else { "off" },
            Bytes(afresh)
        )
    })
}

/// What a what-if of the other kind of memory than `recording`'s (expandable segments turned on or off,
/// [`starts_afresh`]) holds reserved at its start, where it allocates what was live then afresh in
/// segments or pages of its own kind: it may take more than the recording held (150 MiB of 30 MiB blocks in 20 MiB
/// pages take 160 MiB). `None` for any other run, or where the emulation cannot build the start (the replay says why).
pub fn afresh_start_bytes(recording: &Recording, conf: &AllocConf) -> Option<u64> {
    if !starts_afresh(recording, conf) {
        return None;
    }
    let snapshot = recording.snapshot.as_ref()?;
    // The start is built whatever the device: the capacity (and a share of it) applies from the first entry.
    let conf = AllocConf { per_process_memory_fraction: None, ..conf.clone() };
    Emulator::new(snapshot, recording.device, &conf, None).ok().map(|emulator| emulator.capacity_read_up_to())
}

/// What PyTorch's allocator with `conf` holds reserved at the start of `recording`: what the recording held
/// ([`crate::capacity::reserved_at_start`]), or, allocated afresh by a what-if of the other kind of memory, what that
/// takes if more. No smaller device (or share of one) runs it.
pub fn start_reserved_bytes(recording: &Recording, conf: &AllocConf) -> u64 {
    crate::capacity::reserved_at_start(recording).max(afresh_start_bytes(recording, conf).unwrap_or(0))
}

/// Whether `recording` was made with expandable segments (its recorded settings, or its segments and maps, say
/// so: [`AllocConf::of_snapshot`]).
pub fn recorded_expandable(recording: &Recording) -> bool {
    recording.snapshot.as_ref().is_some_and(|snapshot| AllocConf::of_snapshot(snapshot).expandable_segments)
}

/// Whether a PyTorch run of `conf` on `recording` allocates what was live at the start afresh: the other kind of memory
/// than a recording begun mid-run (expandable segments turned on or off), as the emulation does
/// (`heapscope_pytorch::Emulator::new`). A state with no trace replays nothing: it stays as recorded.
pub fn starts_afresh(recording: &Recording, conf: &AllocConf) -> bool {
    recording.start_events > 0
        && recording.entries > 0
        && recording.snapshot.is_some()
        && conf.expandable_segments != recorded_expandable(recording)
}

/// Free bytes PyTorch keeps apart from a refused request (cached blocks of the other size, another stream or pool),
/// with the largest block it could use, which may be none: `30.00 MiB of it is cached in blocks this request cannot use
/// (...) and the largest free block it could use is 0 B`; `None` when every free block was the request's to use (the
/// core's heaps: their free bytes count only those). Every sentence about a fragmentation refusal says it so.
pub fn unusable_free_words(unusable_free_bytes: u64, largest_free_bytes: u64) -> Option<String> {
    (unusable_free_bytes > 0).then(|| {
        format!(
            "{} of it is cached in blocks this request cannot use (PyTorch keeps small and large blocks, streams and pools \
             apart) and the largest free block it could use is {}",
            Bytes(unusable_free_bytes),
            Bytes(largest_free_bytes)
        )
    })
}

/// PyTorch's out-of-memory message for `report`, in its words ("Tried to allocate ...").
fn pytorch_message(report: &OomReport, unreserved_bytes: Option<u64>) -> String {
    // PyTorch says the segment it tried for (`alloc_size`), not the request.
    let mut message = format!("Tried to allocate {}.", FormatSize(report.alloc_bytes));
    if let Some(unreserved) = unreserved_bytes {
        message.push_str(&format!(" {} left on the device.", FormatSize(unreserved)));
    }
    message.push_str(&format!(
        " Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated \
         (largest free block it could use {}).",
        FormatSize(report.allocated_bytes),
        FormatSize(report.free_in_reserved_bytes),
        FormatSize(report.largest_free_block_bytes)
    ));
    message
}

/// The bytes the device had left when `report` was refused at `entry` (`None` for a plain trace): what the
/// capacity leaves beside the reserved bytes, or without one what the driver reported with a recorded `oom`; none on
/// the unlimited device of [`LARGEST_DEVICE_BYTES`] (what it has left would read as a limit).
pub(crate) fn unreserved_bytes(capacity_bytes: Option<u64>, report: &OomReport, entry: Option<&TraceEntry>) -> Option<u64> {
    match capacity_bytes {
        Some(LARGEST_DEVICE_BYTES..) => None,
        Some(capacity) => Some(capacity.saturating_sub(report.reserved_bytes)),
        None => entry.and_then(TraceEntry::device_free),
    }
}

pub(crate) fn pytorch_first_oom(event_index: u64, report: &OomReport, unreserved_bytes: Option<u64>) -> FirstOom {
    FirstOom {
        event_index,
        moment: Moment::Entry(event_index),
        before_recording: false,
        request_bytes: report.request_bytes,
        needed_bytes: report.needed_bytes,
        reserved_bytes: report.reserved_bytes,
        free_bytes: report.free_in_reserved_bytes,
        largest_free_bytes: report.largest_free_block_bytes,
        unusable_free_bytes: report.free_in_reserved_bytes.saturating_sub(report.usable_free_bytes),
        unreserved_bytes,
        virtual_range_bytes: None,
        new_block_bytes: None,
        verdict: OomCause::judge(heapscope_core::Shortfall {
            requested_bytes: report.request_bytes,
            needed_bytes: report.needed_bytes,
            free_in_blocks_bytes: report.free_in_reserved_bytes,
            unreserved_bytes: unreserved_bytes.unwrap_or(0),
            padding_bytes: 0,
        }),
        message: pytorch_message(report, unreserved_bytes),
    }
}

/// Replays `recording` through the emulation of PyTorch's caching allocator with `conf`, on a device of
/// `capacity_bytes` (unlimited when `None`; a recorded `oom` is then refused as the device refused it).
///
/// A PyTorch recording replays entry by entry, starting from the state at the start of the recording,
/// with the fidelity of every decision measured; a plain trace replays on one stream, segments at
/// increasing addresses.
///
/// # Errors
///
/// [`heapscope_core::Error::Trace`] naming the recording and the segment, block or trace entry of its snapshot
/// that the emulation cannot replay ([`heapscope_pytorch::EmulationError`]).
pub fn replay_pytorch(recording: &Recording, conf: &AllocConf, capacity_bytes: Option<u64>) -> Result<Figures> {
    let (replay, nanos) = best_time(|| emulate_pytorch(recording, conf, capacity_bytes, &mut Unbacked))?;
    Ok(replay.figures(Contender::Pytorch { expandable: false }.name(), recording, nanos))
}

/// One replay of a recording through the emulation of PyTorch's caching allocator: what an [`Outcome`] of it
/// is made of.
#[derive(Clone, Debug)]
pub struct PytorchReplay {
    /// PyTorch's counters at the end (`torch.cuda.memory_stats()`).
    pub stats: MemoryStats,
    /// The first request refused.
    pub first_oom: Option<FirstOom>,
    /// For a PyTorch recording: how the decisions compare with the recorded ones.
    pub fidelity: Option<Fidelity>,
    /// When the requested bytes first reached their peak.
    pub peak_live_moment: Option<Moment>,
    /// The settings it ran with, as `PYTORCH_CUDA_ALLOC_CONF`.
    pub settings: String,
    /// Whether they differ from the recording's (a what-if: its fidelity is left out).
    pub what_if: bool,
    /// The segments and mapped ranges it held at the start of the recording (a recording begun mid-run).
    pub start_device_allocs: u64,
}

impl PytorchReplay {
    /// The figures, named `policy`, of a replay of `recording` that took `nanos`.
    pub fn figures(self, policy: &str, recording: &Recording, nanos: u128) -> Figures {
        let events = recording.trace.events().len() as u64;
        let count = |value: i64| u64::try_from(value).unwrap_or(0);
        let stats = self.stats;
        Figures {
            policy: policy.to_owned(),
            events,
            entries: recording.entries,
            allocs: count(stats.allocation.all().allocated),
            frees: count(stats.allocation.all().freed),
            peak_live_bytes: count(stats.requested_bytes.all().peak),
            peak_live_moment: self.peak_live_moment,
            peak_live_entry: self.peak_live_moment.and_then(entry_number),
            peak_reserved_bytes: count(stats.reserved_bytes.all().peak),
            device_allocs: count(stats.num_device_alloc) + self.start_device_allocs,
            device_frees: count(stats.num_device_free),
            ooms: count(stats.num_ooms),
            first_oom: self.first_oom,
            ns_per_event: nanos as f64 / events.max(1) as f64,
            fidelity: self.fidelity.filter(|_| !self.what_if),
            settings: Some(self.settings),
            what_if: self.what_if,
            memory_stats: Some(stats),
            compaction: None,
        }
    }
}

/// One replay of `recording` through the emulation of PyTorch's caching allocator (as [`replay_pytorch`]
/// replays it), every segment operation applied to `backing` as it is made: what the allocator holds at the
/// start of a PyTorch recording first, then each `cudaMalloc` / `cudaFree` of a segment and each map / unmap
/// of expandable pages ([`SegmentBacking`]; [`Unbacked`] for none). After every entry (for a plain trace: every
/// event) `backing` also hears what it did to the blocks ([`SegmentBacking::replayed`]): the timeline of the
/// `pytorch` contender is written down from this very run.
///
/// # Errors
///
/// What [`replay_pytorch`] returns; [`heapscope_core::Error::Source`] naming the entry whose segment operation
/// `backing` refused.
pub fn emulate_pytorch(
    recording: &Recording,
    conf: &AllocConf,
    capacity_bytes: Option<u64>,
    backing: &mut dyn SegmentBacking,
) -> Result<PytorchReplay> {
    Ok(emulate_pytorch_copied(recording, conf, capacity_bytes, backing, None)?.0)
}

/// [`emulate_pytorch`], keeping lean copies of a PyTorch recording's emulation every `copy_every` entries
/// ([`SnapshotTarget::keep_copies`]; none for a plain trace): checkpoints that later replays resume from.
///
/// # Errors
/// What [`emulate_pytorch`] returns.
pub fn emulate_pytorch_copied<'r>(
    recording: &'r Recording,
    conf: &AllocConf,
    capacity_bytes: Option<u64>,
    backing: &mut dyn SegmentBacking,
    copy_every: Option<usize>,
) -> Result<(PytorchReplay, Option<Copies<'r>>)> {
    let what_if = *conf != alloc_conf(recording, None)?;
    let mut follower = BackingFollower::new(recording, capacity_bytes, backing, false);
    let (stats, fidelity, copies) = follower.emulate(conf, copy_every)?;
    let replay = PytorchReplay {
        stats,
        first_oom: follower.first_oom,
        fidelity,
        peak_live_moment: follower.peak_live.map(|(_, moment)| moment),
        start_device_allocs: follower.start_device_allocs,
        settings: conf.overrides(),
        what_if,
    };
    Ok((replay, copies))
}

/// The first request PyTorch's emulation refuses replaying `recording` with `conf` on a device of `capacity_bytes`
/// (`None`: the recording fits), the replay stopped there: whether a setting fits a device, asked many times over by
/// `advise`'s search for the smallest capacity.
///
/// # Errors
/// What [`emulate_pytorch`] returns.
pub fn first_refusal(recording: &Recording, conf: &AllocConf, capacity_bytes: Option<u64>) -> Result<Option<FirstOom>> {
    let mut unbacked = Unbacked;
    let mut follower = BackingFollower::new(recording, capacity_bytes, &mut unbacked, true);
    follower.emulate(conf, None)?;
    Ok(follower.first_oom)
}

/// Hands a replay through PyTorch's emulation to a [`SegmentBacking`], as an observer of the driver: what the
/// allocator holds at the start, then every segment operation as the driver reports it, then after each entry what
/// it did to the blocks; and notes the first refusal in PyTorch's words.
struct BackingFollower<'a, 'b> {
    recording: &'a Recording,
    capacity_bytes: Option<u64>,
    backing: &'b mut dyn SegmentBacking,
    first_oom: Option<FirstOom>,
    /// What the last step of the current moment did.
    step_effect: EntryEffect,
    /// Stop the replay at the first refusal (a yes / no question: does the recording fit?).
    stop_at_first_oom: bool,
    /// The most bytes requested and live so far, and the moment they were first.
    peak_live: Option<(i64, Moment)>,
    /// The segments and mapped ranges held at the start.
    start_device_allocs: u64,
}

/// What the follower stops the driver with at the first refusal, when asked to.
const STOPPED_AT_FIRST_OOM: &str = "stopped at the first refusal";

impl<'a, 'b> BackingFollower<'a, 'b> {
    fn new(
        recording: &'a Recording,
        capacity_bytes: Option<u64>,
        backing: &'b mut dyn SegmentBacking,
        stop_at_first_oom: bool,
    ) -> Self {
        Self {
            recording,
            capacity_bytes,
            backing,
            first_oom: None,
            step_effect: EntryEffect::Unchanged,
            stop_at_first_oom,
            peak_live: None,
            start_device_allocs: 0,
        }
    }

    /// Notes the most requested bytes live up to the end of `moment`: PyTorch's own peak counter, so a request the
    /// recording refused and the emulation serves, freed again within its own entry, peaks at that entry.
    fn note_live(&mut self, moment: Moment, allocator: &CachingAllocator) {
        let live = allocator.stats().requested_bytes.all().peak;
        if live > 0 && self.peak_live.is_none_or(|(peak, _)| live > peak) {
            self.peak_live = Some((live, moment));
        }
    }

    /// Replays the recording through PyTorch's emulation with `conf`, followed: PyTorch's counters at the end, for
    /// a PyTorch recording how its decisions compare with the recorded ones, and the copies asked for
    /// (`copy_every`).
    fn emulate(
        &mut self,
        conf: &AllocConf,
        copy_every: Option<usize>,
    ) -> Result<(MemoryStats, Option<Fidelity>, Option<Copies<'a>>)> {
        let recording = self.recording;
        Ok(match &recording.snapshot {
            Some(snapshot) => {
                // A PyTorch recording: the emulation replays each entry when its moment begins, from the state at
                // the start of the recording.
                let mut target = SnapshotTarget::new(recording, snapshot, conf, self.capacity_bytes)
                    .map_err(|error| emulation_error(recording, &error))?;
                if let Some(every) = copy_every {
                    target.keep_copies(every);
                }
                self.follow(Stream::of(recording), &mut target)?;
                let copies = target.take_copies();
                let emulation = target.finish();
                (emulation.stats, Some(emulation.fidelity), copies)
            }
            None => {
                // A plain trace: the emulation is a heap like any other.
                let mut heap = CachingHeap::new(conf.clone(), self.capacity_bytes);
                heap.record_device_events(true);
                self.follow(Stream::of(recording), &mut HeapTarget::new(&mut heap))?;
                (heap.allocator().stats().clone(), None, None)
            }
        })
    }

    /// Replays `stream` through `target` (PyTorch rounds and aligns every request itself: no alignment of ours).
    fn follow<T: CachingTarget>(&mut self, stream: Stream<'_>, target: &mut T) -> Result<()> {
        let start = target.held_at_start();
        self.start_device_allocs = start.len() as u64;
        if !start.is_empty() {
            self.apply(Moment::Start, &start, target.allocator())?;
        }
        self.backing.started(target.allocator(), &target.moved_at_start());
        self.note_live(Moment::Start, target.allocator());
        match drive(stream, target, 1, &mut [self]) {
            Err(heapscope_core::Error::Source(why)) if self.stop_at_first_oom && why == STOPPED_AT_FIRST_OOM => Ok(()),
            other => other,
        }
    }

    fn apply(&mut self, moment: Moment, device_events: &[DeviceEvent], allocator: &CachingAllocator) -> Result<()> {
        self.backing.apply(device_events, allocator).map_err(|what| {
            let when = match moment {
                Moment::Start => "at the start of the recording".to_owned(),
                Moment::Entry(entry) => format!("entry {entry}"),
            };
            heapscope_core::Error::Source(format!("{}: {when}: {what}", self.recording.name))
        })
    }
}

impl<T: CachingTarget> Observer<T> for BackingFollower<'_, '_> {
    fn step(
        &mut self,
        _event: u64,
        moment: Moment,
        step: Step<'_, CachingAllocation>,
        device_events: &[DeviceEvent],
        target: &T,
    ) -> Result<()> {
        if !device_events.is_empty() {
            self.apply(moment, device_events, target.allocator())?;
        }
        self.step_effect = match step {
            Step::Placed { handle, .. } => EntryEffect::Placed { address: handle.address() },
            Step::Freed { handle, .. } => EntryEffect::Freed { address: handle.address() },
            // PyTorch's allocator never moves what it handed out.
            Step::Unserved { .. } | Step::Moved { .. } | Step::CacheEmptied => EntryEffect::Unchanged,
            Step::Refused { .. } => target.last_refusal().map_or(EntryEffect::Unchanged, |&report| EntryEffect::Refused(report)),
        };
        Ok(())
    }

    fn moment_done(&mut self, moment: Moment, device_events: &[DeviceEvent], target: &T) -> Result<()> {
        if !device_events.is_empty() {
            self.apply(moment, device_events, target.allocator())?;
        }
        let step_effect = std::mem::replace(&mut self.step_effect, EntryEffect::Unchanged);
        let Moment::Entry(entry) = moment else { return Ok(()) };
        self.note_live(moment, target.allocator());
        let effect = target.moment_effect(step_effect);
        if let EntryEffect::Refused(report) = effect
            && self.first_oom.is_none()
        {
            let recorded = self.recording.trace_entry(entry);
            // Counted against what the allocator may reserve: its share of the device under a memory fraction.
            let allowed = target.allocator().conf().allowed_bytes(self.capacity_bytes);
            let unreserved = unreserved_bytes(allowed, &report, recorded);
            self.first_oom = Some(pytorch_first_oom(entry, &report, unreserved));
        }
        self.backing.replayed(usize::try_from(entry).unwrap_or(usize::MAX), effect, target.allocator());
        if self.stop_at_first_oom && self.first_oom.is_some() {
            return Err(heapscope_core::Error::Source(STOPPED_AT_FIRST_OOM.to_owned()));
        }
        Ok(())
    }
}

/// An emulation error as an error of the recording's file (a refusal of the memory under the allocator as the
/// source's failure: the file is fine).
pub(crate) fn emulation_error(recording: &Recording, error: &heapscope_pytorch::EmulationError) -> heapscope_core::Error {
    match error {
        heapscope_pytorch::EmulationError::Backing { .. } => {
            heapscope_core::Error::Source(format!("{}: {error}", recording.name))
        }
        _ => heapscope_core::Error::Trace { file: recording.name.clone(), line: 0, what: error.to_string() },
    }
}

/// The verdict of a comparison in one sentence, when the reference contender ran out of memory: what was
/// free and which contenders would have served the request it refused — the contenders of `outcomes` and the
/// `others` run for the verdict (each with the name to say), on the device's capacity when it is known
/// (`capacity_known`), else said to be with unlimited memory. One that served it but refused a later request is
/// said with that request's entry: the recording asked for more than it.
pub fn verdict_sentence(
    failed: &Figures,
    outcomes: &[Outcome],
    others: &[(String, Figures)],
    capacity_known: bool,
) -> Option<String> {
    let oom = failed.first_oom.as_ref()?;
    let named = outcomes.iter().filter_map(Outcome::figures).map(|figures| (format!("`{}`", figures.policy), figures));
    let mut survivors: Vec<String> = named
        .chain(others.iter().map(|(name, figures)| (name.clone(), figures)))
        .filter_map(|(name, figures)| match &figures.first_oom {
            None => Some(name),
            // Its first refusal comes later: it served this one.
            Some(later) if later.moment > oom.moment => Some(format!("{name} (until entry {})", later.event_index)),
            Some(_) => None,
        })
        .collect();
    let (policy, request) = (&failed.policy, Bytes(oom.request_bytes));
    // The rounded size, where it reads differently: PyTorch's message names the segment it tried for.
    let rounded = match (oom.new_block_bytes, Bytes(oom.needed_bytes)) {
        (Some(block), _) => format!(" (which needs a new {} block)", Bytes(block)),
        (None, needed) if needed.to_string() != request.to_string() => format!(" ({needed} once rounded)"),
        _ => String::new(),
    };
    let free = oom.free_words();
    let head = match oom.verdict {
        // What any device had left is beside the point.
        _ if oom.fits_no_device() => format!(
            "`{policy}` refused a {request} request{rounded}: more than any device holds (heapscope models devices of up \
             to 1 EiB)"
        ),
        OomCause::Fragmentation if let Some(apart) = unusable_free_words(oom.unusable_free_bytes, oom.largest_free_bytes) => {
            format!("`{policy}` ran out of memory on a {request} request{rounded}: {free}, but {apart} (fragmentation)")
        }
        OomCause::Fragmentation => format!(
            "`{policy}` ran out of memory on a {request} request{rounded}: {free}, but the largest free run is {} \
             (fragmentation)",
            Bytes(oom.largest_free_bytes)
        ),
        // Enough free even once rounded, but in the tails of pages live allocations hold (paged).
        OomCause::InternalWaste if oom.free_memory().total_bytes() >= oom.needed_bytes => format!(
            "`{policy}` ran out of memory on a {request} request{rounded}: {free}, but in the tails of pages live \
             allocations hold, none taking it (internal waste)"
        ),
        // Enough free for the request as asked: the rounding (of the request, or to the segment or pages the device
        // must give) made it short; else the padding inside live allocations would have covered it.
        OomCause::InternalWaste if oom.free_memory().total_bytes() >= oom.request_bytes => format!(
            "`{policy}` ran out of memory on a {request} request: {free}, enough for the request as asked but not for \
             {} (internal waste)",
            match oom.new_block_bytes {
                Some(block) => format!("the new {} block it needed", Bytes(block)),
                None => format!("the {} serving it needed once rounded", Bytes(oom.needed_bytes)),
            }
        ),
        OomCause::InternalWaste => format!(
            "`{policy}` ran out of memory on a {request} request: {free}, too little {}, with bytes wasted inside \
             allocations that would have covered it (internal waste)",
            if oom.needed_bytes > oom.request_bytes {
                format!("once rounded to {}", Bytes(oom.needed_bytes))
            } else {
                "for it".to_owned()
            }
        ),
        OomCause::Exhaustion => format!(
            "`{policy}` ran out of memory on a {request} request{rounded}: only {free}, too little even without any \
             waste (not enough memory)"
        ),
    };
    let on = if capacity_known { "" } else { " with unlimited memory" };
    Some(match survivors.len() {
        0 => format!("{head}; no contender would have served it{on}."),
        1 => format!("{head}; {} would have served it{on}.", survivors[0]),
        _ => {
            let last = survivors.pop().unwrap_or_default();
            format!("{head}; {} and {last} would have served it{on}.", survivors.join(", "))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::replay_paged;
    use crate::story::frag_oom;
    use heapscope_core::units::MIB;

    #[test]
    fn frag_oom_heap_fails_and_paging_survives() {
        let story = frag_oom();
        let config = CompareConfig {
            capacity_bytes: Some(story.device_bytes),
            heap: HeapConfig { release: heapscope_core::ReleaseRule::OnPressure, ..HeapConfig::new(PolicyKind::BestFit) },
            ..CompareConfig::default()
        };
        let recording = Recording::from_trace(story.trace.clone());
        let heap_outcome = replay(&recording, Contender::Heap(PolicyKind::BestFit), &config).unwrap();
        let paged_outcome = replay(&recording, Contender::Paged, &config).unwrap();
        let (heap, paged) = (heap_outcome.figures().unwrap(), paged_outcome.figures().unwrap());
        let vma = replay(&recording, Contender::Vma, &config).unwrap();
        assert_eq!(vma.why_not_run(), Some("runs on a Vulkan device only: add --vulkan"));
        assert_eq!(vma.policy(), "vma");
        assert_eq!((heap.ooms, paged.ooms), (1, 0));
        assert_eq!((heap.allocs, heap.frees, heap.events), (40, 20, 61));
        let oom = heap.first_oom.as_ref().unwrap();
        assert_eq!(
            (oom.event_index, oom.request_bytes, oom.free_bytes, oom.verdict),
            (60, 1024 * MIB, 1000 * MIB, OomCause::Fragmentation)
        );
        assert_eq!(paged.peak_reserved_bytes, 3024 * MIB);
        // A contender that did not run (a device limit) served nothing: it is no survivor.
        let not_run = Outcome::not_run("vma (vulkan)", "no device");
        assert!(!not_run.ran() && not_run.figures().is_none());
        let outcomes = [heap_outcome.clone(), paged_outcome.clone(), not_run];
        let extra = [("`pytorch` with expandable segments".to_owned(), paged.clone())];
        // Without a known capacity, "would have served it" is said to be with unlimited memory.
        let unlimited = verdict_sentence(heap, &outcomes, &extra, false).unwrap();
        assert!(unlimited.ends_with("would have served it with unlimited memory."), "{unlimited}");
        let sentence = verdict_sentence(heap, &outcomes, &extra, true).unwrap();
        assert!(
            sentence.contains(
                "1000.00 MiB free in reserved memory and 584.00 MiB more on the device, 1.55 GiB in all, but the largest \
                 free run is 50.00 MiB (fragmentation)"
            ) && sentence.ends_with("`paged` and `pytorch` with expandable segments would have served it."),
            "{sentence}"
        );
        // Each contender is judged on the request refused: one refusing only a later request served it (said with
        // its entry), one refusing it or an earlier one did not.
        let refusing_at = |entry: u64| {
            let mut figures = heap.clone();
            let first = figures.first_oom.as_mut().unwrap();
            (first.event_index, first.moment) = (entry, Moment::Entry(entry));
            figures
        };
        for (entry, said) in [(60, None), (10, None), (61, Some("`later` (until entry 61) would have served it."))] {
            let others = [("`later`".to_owned(), refusing_at(entry))];
            let sentence = verdict_sentence(heap, &[], &others, true).unwrap();
            let expected = said.unwrap_or("no contender would have served it.");
            assert!(sentence.ends_with(expected), "a refusal at entry {entry}: {sentence}");
        }
    }

    /// A budget above the device's capacity is the capacity: a heap contender's verdict says what it may reserve, the
    /// device, not the budget (it said "112 MiB reservable of the 8 GiB it may reserve" on a 2.6 GiB device).
    #[test]
    fn a_budget_above_the_capacity_is_the_capacity() {
        let story = frag_oom();
        let recording = Recording::from_trace(story.trace.clone());
        let device = story.device_bytes;
        for budget in [device * 4, device / 2] {
            let config = CompareConfig {
                capacity_bytes: Some(device),
                heap: HeapConfig {
                    capacity_bytes: Some(budget),
                    release: heapscope_core::ReleaseRule::OnPressure,
                    ..HeapConfig::new(PolicyKind::BestFit)
                },
                ..CompareConfig::default()
            };
            let outcome = replay(&recording, Contender::Heap(PolicyKind::BestFit), &config).unwrap();
            let figures = outcome.figures().unwrap();
            let oom = figures.first_oom.as_ref().unwrap();
            let limit = Bytes(budget.min(device));
            assert!(oom.message.contains(&format!("of the {limit} it may reserve")), "budget {budget}: {}", oom.message);
            assert!(figures.peak_reserved_bytes <= budget.min(device), "budget {budget}");
        }
    }

    #[test]
    fn frag_oom_paged_under_pressure_reuses_pages_then_releases_them() {
        let story = frag_oom();
        let recording = Recording::from_trace(story.trace.clone());
        let eager = CompareConfig { capacity_bytes: Some(story.device_bytes), ..CompareConfig::default() };
        let pressure = CompareConfig { paged_unmap: UnmapRule::UnderPressure, ..eager.clone() };
        let eager = replay(&recording, Contender::Paged, &eager).unwrap().figures().cloned().unwrap();
        let pressure = replay(&recording, Contender::Paged, &pressure).unwrap().figures().cloned().unwrap();
        assert_eq!((eager.ooms, pressure.ooms), (0, 0), "both serve the 1 GiB request");
        // Eager unmaps the 150 MiB pages and maps them again for the 100 MiB ones; under pressure those are
        // served from the cache, which is unmapped only when the 1 GiB request needs the room.
        assert!(pressure.device_allocs < eager.device_allocs, "{} < {}", pressure.device_allocs, eager.device_allocs);
        assert_eq!((eager.peak_reserved_bytes, pressure.peak_reserved_bytes), (3024 * MIB, 3024 * MIB));
        let mut heap = CompareConfig { paged_unmap: UnmapRule::UnderPressure, ..CompareConfig::default() }.paged_heap().unwrap();
        replay_paged(&story.trace, &mut heap, 512).unwrap();
        // Without a capacity nothing is released: the 100 MiB allocations reuse 2000 MiB of cached pages and the
        // 1 GiB one, placed after them, the last 1000 MiB of the cache.
        assert_eq!(heap.stats().pages_reused * PagedConfig::DEFAULT_PAGE_BYTES, 3000 * MIB);
        assert_eq!((heap.stats().cache_releases, heap.stats().peak_mapped_bytes), (0, 3024 * MIB));
    }

    /// On a device large enough for the request the recording refused (frag_oom's 1 GiB at entry 100), every
    /// contender serves it and frees it again within that entry: each peaks there, PyTorch's emulation too (its peak
    /// counter, not the bytes live after each entry), and all at the same bytes.
    #[test]
    fn a_served_refusal_is_the_peak_of_every_contender() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch/frag_oom-default.pickle.gz");
        let recording = Recording::open(&path, 0).unwrap();
        let config = CompareConfig { capacity_bytes: Some(100 << 30), ..CompareConfig::default() };
        let contenders = [
            Contender::Pytorch { expandable: false },
            Contender::Pytorch { expandable: true },
            Contender::Heap(PolicyKind::Tlsf),
            Contender::Paged,
        ];
        let peaks: Vec<(u64, Option<u64>)> = contenders
            .into_iter()
            .map(|contender| {
                let outcome = replay(&recording, contender, &config).unwrap();
                let figures = outcome.figures().unwrap();
                assert_eq!(figures.ooms, 0, "{contender:?}");
                (figures.peak_live_bytes, figures.peak_live_entry)
            })
            .collect();
        assert_eq!(peaks[0].1, Some(100), "{peaks:?}");
        assert!(peaks.iter().all(|&peak| peak == peaks[0]), "{peaks:?}");
    }

    /// A recording begun mid-run with more reserved than the capacity asked for cannot have run there: PyTorch's
    /// contender says so instead of replaying over the capacity; a heap contender refuses the start state itself.
    #[test]
    fn a_start_state_larger_than_the_device_is_said() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch/frag_oom-default.pickle.gz");
        let mut snapshot = heapscope_pytorch::read_snapshot(&path).unwrap();
        snapshot.device_traces[0].drain(..60);
        let recording = Recording::from_snapshot("cut", snapshot, 0).unwrap();
        let start = crate::capacity::reserved_at_start(&recording);
        assert!(start > 100 * MIB, "the cut recording holds segments at its start: {start}");
        let config = CompareConfig { capacity_bytes: Some(100 * MIB), ..CompareConfig::default() };
        let outcome = replay(&recording, Contender::Pytorch { expandable: false }, &config).unwrap();
        let why = outcome.why_not_run().unwrap();
        assert!(why.starts_with("the recording began with") && why.contains("100.00 MiB"), "{why}");
        let tlsf = replay(&recording, Contender::Heap(PolicyKind::Tlsf), &config).unwrap();
        assert!(tlsf.figures().unwrap().first_oom.as_ref().unwrap().before_recording);
        let roomy = CompareConfig { capacity_bytes: Some(start), ..CompareConfig::default() };
        assert!(replay(&recording, Contender::Pytorch { expandable: false }, &roomy).unwrap().ran());
    }

    /// What the allocator may hold at the start is the device's share under `per_process_memory_fraction`, and what a
    /// what-if of the other kind of memory holds there is what was live allocated afresh: five 30 MiB tensors live at
    /// the start of a recording without expandable segments take 150 MiB of segments, and 160 MiB of 20 MiB pages with
    /// them. Each run on a device too small for its own start says so (it held 160 MiB on 150 MiB, 0 OOMs), and
    /// `advise` needs that much.
    #[test]
    fn a_start_beyond_the_share_or_allocated_afresh_beyond_the_device_is_said() {
        use heapscope_pytorch::{Action, Block, BlockState, Pool, Segment, Snapshot, TraceEntry};
        let addresses: Vec<u64> = (0..5).map(|i| 0x7f00_0000_0000 + i * (32 * MIB)).collect();
        let snapshot = Snapshot {
            segments: Vec::new(),
            device_traces: vec![
                addresses
                    .iter()
                    .flat_map(|&address| {
                        [Action::FreeRequested, Action::FreeCompleted].map(|action| TraceEntry::new(action, address, 30 * MIB))
                    })
                    .collect(),
            ],
            ..Snapshot::default()
        };
        // The five blocks were live before the first entry: the final state holds their segments, cached.
        let segments = addresses
            .iter()
            .map(|&address| {
                Segment::from_blocks(
                    0,
                    address,
                    30 * MIB,
                    Pool::Large,
                    vec![Block::new(address, 30 * MIB, 0, BlockState::Inactive)],
                )
            })
            .collect();
        let recording = Recording::from_snapshot("five", Snapshot { segments, ..snapshot }, 0).unwrap();
        assert_eq!(crate::capacity::reserved_at_start(&recording), 150 * MIB);
        let conf = |setting: &str| {
            let mut conf = AllocConf::default();
            conf.parse_overrides(setting).unwrap();
            conf
        };
        assert_eq!(afresh_start_bytes(&recording, &conf("expandable_segments:True")), Some(160 * MIB));
        assert_eq!(afresh_start_bytes(&recording, &conf("")), None, "the recording's kind keeps its start");
        // (setting, capacity, why it cannot run there, or none)
        let cases: [(&str, u64, Option<&str>); 6] = [
            ("", 150 * MIB, None),
            ("", 149 * MIB, Some("the recording began with 150.00 MiB reserved by PyTorch, more than the device's 149.00 MiB")),
            ("per_process_memory_fraction:0.5", 300 * MIB, None),
            (
                "per_process_memory_fraction:0.5",
                200 * MIB,
                Some("more than its share of the device's 200.00 MiB (100.00 MiB, per_process_memory_fraction)"),
            ),
            ("expandable_segments:True", 160 * MIB, None),
            (
                "expandable_segments:True",
                150 * MIB,
                Some(
                    "allocated afresh with expandable segments on, takes 160.00 MiB reserved, more than the device's 150.00 MiB",
                ),
            ),
        ];
        for (setting, capacity, why) in cases {
            let config = CompareConfig {
                capacity_bytes: Some(capacity),
                alloc_conf: Some(setting.to_owned()),
                ..CompareConfig::default()
            };
            let outcome = replay(&recording, Contender::Pytorch { expandable: false }, &config).unwrap();
            match why {
                Some(why) => {
                    assert!(outcome.why_not_run().is_some_and(|said| said.contains(why)), "{setting} {capacity}: {outcome:?}");
                }
                None => {
                    let figures = outcome.figures().unwrap_or_else(|| panic!("{setting} {capacity}: {outcome:?}"));
                    assert_eq!(figures.ooms, 0, "{setting} {capacity}");
                    assert!(figures.peak_reserved_bytes <= capacity, "{setting} {capacity}: {figures:?}");
                }
            }
        }
        let advice = crate::advise::advise(
            &recording,
            &crate::advise::AdviseConfig {
                capacity_bytes: Some(150 * MIB),
                settings: vec![String::new(), "expandable_segments:True".to_owned()],
                threads: 1,
            },
            &|_, _| {},
        )
        .unwrap();
        let row = |setting: &str| advice.settings.iter().find(|row| row.setting == setting).unwrap();
        assert!(row("").fits() && !row("").start_exceeds_capacity);
        let afresh = row("expandable_segments:True");
        assert!(afresh.start_exceeds_capacity && !afresh.fits(), "{afresh:?}");
        assert_eq!(afresh.min_capacity_bytes, Some(160 * MIB));
    }
}
