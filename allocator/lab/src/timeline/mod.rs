//! Timelines: a replay written down step by step, so that any moment of it can be shown, animated and
//! explained.
//!
//! ## Design
//!
//! - A contender's replay becomes a stream of plain [`Change`]s per step (one step per entry of the recording,
//!   after a start with what was live before entry 0):
//!   regions (blocks, virtual ranges) reserved and released, pages mapped and unmapped, allocations placed
//!   and freed, and the requests it refused ([`Refusal`]). The changes come from the device events a heap
//!   logs ([`RegionTracker`] turns them into region and page changes) and the allocations it hands back;
//!   [`record`] turns every contender of `compare` into one — PyTorch's by following `compare`'s own run of
//!   the emulation, from the state at the start of the recording (allocations made before it are spans
//!   [`Span::before_recording`]). Anything else that can describe its heap this way (a live device, another
//!   allocator) plugs in through [`Timeline::push`].
//! - A [`Layout`] is the heap at one moment, rebuilt from changes alone: regions, live allocations by
//!   address, and free runs with their sizes, so live, reserved and free bytes and the largest free run are
//!   known after every step at O(log n) per change. Splits and merges are what [`Layout::apply`] reports
//!   ([`Effect`]) when an allocation is carved from a larger free run or a free joins its neighbours.
//! - The timeline keeps a [`Sample`] per step (what its plot draws; a step that held more inside it than at its
//!   start and end, as a request served and given back within its entry, adds a [`Transient`]) and a checkpoint
//!   every so many steps, as
//!   little as rebuilds the layout there: its live allocations as the indices (`u32`) of the
//!   [`Change::Allocated`] that placed them, by address (the spans are in the changes already: 4 bytes an
//!   allocation instead of a 48-byte copy), and a snapshot of the regions that consecutive checkpoints share,
//!   taken anew only once the region and page changes since the last one (kept as indices too) outnumber a
//!   quarter of its regions and mapped runs. [`Timeline::layout_at`] starts from the nearest checkpoint before
//!   the moment asked for: gathers its allocations from the changes, brings the snapshot's regions up to it,
//!   applies at most one interval of changes to the allocations and regions alone, and rebuilds the free runs
//!   once. The interval is at least [`MIN_CHECKPOINT_INTERVAL`] steps and an eighth of the live allocations,
//!   so the live part of the checkpoints costs at most about 32 bytes per step, and the region snapshots a few
//!   entries per region or page change on top (31–35 MiB in all for 1,000,000 steps with 100,000 live, where
//!   whole copies every quarter took 178–222 MiB; more for a contender that maps pages on most steps), and a seek costs a rebuild of the layout plus at most that
//!   many changes. Gathering the allocations from the changes costs random reads (a few milliseconds for
//!   100,000); the denser checkpoints pay for them.
//! - [`explain`] says in one sentence what each step decided and why, by the contender's rules.

pub mod active;
mod change;
pub mod explain;
mod layout;
pub mod record;
mod regions;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use change::{Change, Refusal, RegionKind, Span};
pub use layout::{Effect, Layout, LayoutError, LayoutTotals, Region};
pub use regions::RegionTracker;

/// Steps between checkpoints at least; more when many allocations are live (see [`Timeline::layout_at`]).
pub const MIN_CHECKPOINT_INTERVAL: u64 = 4096;

/// Checkpoints come at least every [`MIN_CHECKPOINT_INTERVAL`] steps and every live allocations' worth of steps
/// divided by this: a seek applies at most that many changes, and the checkpoints hold a few indices per step.
const LIVE_PER_INTERVAL_STEP: u64 = 8;

/// A layout kept for seeking, as little as rebuilds it: its live allocations as the indices of the
/// [`Change::Allocated`] that placed them, by address (the spans themselves are in the timeline's changes
/// already), and the latest snapshot of the regions, which the region and page changes since bring up to date.
/// The free runs are rebuilt from both.
#[derive(Clone, Debug)]
struct Checkpoint {
    position: u64,
    /// Shared with the checkpoints before and after it that it took no snapshot of its own.
    regions: Arc<RegionSnapshot>,
    live: Box<[u32]>,
}

/// The regions of the layout after the first `region_changes` region and page changes of a timeline.
#[derive(Debug, Default)]
struct RegionSnapshot {
    region_changes: usize,
    regions: BTreeMap<u64, Region>,
}

impl RegionSnapshot {
    /// Regions and mapped runs: what a copy costs.
    fn entries(regions: &BTreeMap<u64, Region>) -> usize {
        regions.len() + regions.values().map(|region| region.mapped.len()).sum::<usize>()
    }

    /// Bytes held, about: the regions and their mapped runs.
    fn bytes(&self) -> usize {
        let run = 2 * size_of::<u64>();
        self.regions.values().map(|region| size_of::<(u64, Region)>() + region.mapped.len() * run).sum()
    }
}

/// Totals after one step, for plots.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Sample {
    /// Bytes requested by live allocations.
    pub live_bytes: u64,
    /// Bytes reserved from the device.
    pub reserved_bytes: u64,
    /// External fragmentation of the free reserved memory, 0 to 1.
    pub fragmentation: f32,
    /// Internal waste: the share of the reserved bytes that is padding inside live allocations, 0 to 1 (an `f32`
    /// beside the other: a sample stays 24 bytes, one per step).
    pub waste: f32,
}

/// The most bytes live and reserved inside one step, where they passed what the step began and ended with: an
/// allocation made and freed within its entry (the recording's `oom` entry, whose request a contender serves though
/// the program never held it), or a block reserved and released within one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Transient {
    /// The most bytes requested by live allocations inside the step.
    pub live_bytes: u64,
    /// The most bytes reserved inside the step.
    pub reserved_bytes: u64,
}

/// A contender's replay, step by step. See the module documentation.
#[derive(Clone, Debug)]
pub struct Timeline {
    /// Who replayed: `pytorch`, `tlsf`, `paged`, ...
    pub contender: String,
    /// The contender's rules, for explanations (`None` for a source that does not say).
    pub rules: Option<explain::Rules>,
    changes: Vec<Change>,
    /// Index into `changes` where each step starts, plus one past the last step's.
    step_starts: Vec<usize>,
    samples: Vec<Sample>,
    /// Totals at the start, before the first step.
    start_sample: Sample,
    refusals: Vec<(u64, Refusal)>,
    /// The steps whose totals passed their start and end inside them, by the position once each is done (few: a sample per step
    /// would cost every step 16 bytes more).
    transients: Vec<(u64, Transient)>,
    /// Layouts after `position` steps, kept as their parts, by increasing position; the first is the start.
    checkpoints: Vec<Checkpoint>,
    /// Steps between checkpoints at least.
    min_interval: u64,
    /// The layout after every step so far, where the next step applies.
    head: Layout,
    /// Index into `changes` of the `Allocated` change of each live allocation of `head`, by its address: what
    /// a checkpoint keeps of it.
    live_changes: BTreeMap<u64, u32>,
    /// Index into `changes` of every region and page change, in order: what brings a snapshot of the regions up
    /// to a checkpoint.
    region_changes: Vec<u32>,
    /// The highest mapped byte ever, per virtual region base: how much of a huge virtual range is worth showing.
    virtual_extent: BTreeMap<u64, u64>,
}

impl Timeline {
    /// An empty timeline for `contender`.
    pub fn new(contender: impl Into<String>) -> Self {
        Self {
            contender: contender.into(),
            rules: None,
            changes: Vec::new(),
            step_starts: vec![0],
            samples: Vec::new(),
            start_sample: Sample::default(),
            refusals: Vec::new(),
            transients: Vec::new(),
            checkpoints: vec![Checkpoint { position: 0, regions: Arc::default(), live: Box::default() }],
            min_interval: MIN_CHECKPOINT_INTERVAL,
            head: Layout::new(),
            live_changes: BTreeMap::new(),
            region_changes: Vec::new(),
            virtual_extent: BTreeMap::new(),
        }
    }

    /// Sets the layout at the start, before the first step (position 0): what was live when the recording
    /// started. Only before the first step; a second call adds to the first.
    ///
    /// # Errors
    /// [`LayoutError`] naming the first change that contradicts the layout (nothing is kept then), or
    /// [`LayoutError::StartAfterSteps`] once a step was pushed.
    pub fn start(&mut self, changes: &[Change]) -> Result<(), LayoutError> {
        if self.steps() > 0 {
            return Err(LayoutError::StartAfterSteps);
        }
        let mut head = self.head.clone();
        // Pages mapped at the start count as far as a view shows a virtual range, as a step's do (a start of mapped
        // pages only was drawn as a range one byte wide: an empty pane).
        let mut extents = Vec::new();
        for change in changes {
            head.apply(change)?;
            extents.extend(mapped_extent(&head, change));
        }
        self.head = head;
        self.widen_virtual_extents(extents);
        let first = self.changes.len();
        self.changes.extend_from_slice(changes);
        self.step_starts = vec![self.changes.len()];
        self.note_live_changes(first);
        let totals = self.head.totals();
        self.start_sample = Sample {
            live_bytes: totals.live_bytes,
            reserved_bytes: totals.reserved_bytes,
            fragmentation: totals.fragmentation() as f32,
            waste: totals.waste() as f32,
        };
        self.checkpoints.clear();
        self.checkpoint_forced(0);
        Ok(())
    }

    /// Totals at the start (position 0): zero unless [`Timeline::start`] set a start layout.
    pub fn start_sample(&self) -> Sample {
        self.start_sample
    }

    /// Totals after `position` steps (clamped): the start sample at 0.
    pub fn sample_at(&self, position: u64) -> Sample {
        match position.min(self.steps()) {
            0 => self.start_sample,
            position => self.samples[position as usize - 1],
        }
    }

    /// Appends one step: its changes in order, and the request it refused, if any.
    ///
    /// # Errors
    /// [`LayoutError`] naming the first change that contradicts the layout; the step is not appended then.
    pub fn push(&mut self, changes: &[Change], refusal: Option<Refusal>) -> Result<(), LayoutError> {
        // How far the step maps into virtual regions: kept only once the whole step applies.
        let mut extents = Vec::new();
        // The most live and reserved inside the step (a step of one change ends at its most), against the most of
        // its start and its end, which its plot joins anyway.
        let before = self.samples.last().copied().unwrap_or(self.start_sample);
        let mut within = Transient::default();
        for change in changes {
            // Copying the head before each step would double the cost of every step: a step that fails
            // half-way is undone instead by rebuilding the head from the last checkpoint.
            if let Err(error) = self.head.apply(change) {
                self.head = self.layout_at(self.steps());
                return Err(error);
            }
            extents.extend(mapped_extent(&self.head, change));
            if changes.len() > 1 {
                let totals = self.head.totals();
                within.live_bytes = within.live_bytes.max(totals.live_bytes);
                within.reserved_bytes = within.reserved_bytes.max(totals.reserved_bytes);
            }
        }
        self.widen_virtual_extents(extents);
        let first = self.changes.len();
        self.changes.extend_from_slice(changes);
        self.step_starts.push(self.changes.len());
        self.note_live_changes(first);
        let totals = self.head.totals();
        self.samples.push(Sample {
            live_bytes: totals.live_bytes,
            reserved_bytes: totals.reserved_bytes,
            fragmentation: totals.fragmentation() as f32,
            waste: totals.waste() as f32,
        });
        let position = self.steps();
        if let Some(refusal) = refusal {
            self.refusals.push((position - 1, refusal));
        }
        if within.live_bytes > totals.live_bytes.max(before.live_bytes)
            || within.reserved_bytes > totals.reserved_bytes.max(before.reserved_bytes)
        {
            let transient = Transient {
                live_bytes: within.live_bytes.max(totals.live_bytes),
                reserved_bytes: within.reserved_bytes.max(totals.reserved_bytes),
            };
            self.transients.push((position, transient));
        }
        let last = self.checkpoints.last().map_or(0, |checkpoint| checkpoint.position);
        if position - last >= self.min_interval.max(totals.live_allocations / LIVE_PER_INTERVAL_STEP) {
            self.checkpoint(position);
        }
        Ok(())
    }

    /// Keeps up `live_changes` and `region_changes` with the changes from index `first` on, all applied.
    fn note_live_changes(&mut self, first: usize) {
        for (index, change) in self.changes.iter().enumerate().skip(first) {
            // Past 2^32 changes no index fits a checkpoint: the last one stays the last (see `checkpoint`).
            let Ok(index) = u32::try_from(index) else { return };
            match *change {
                Change::Allocated(span) => {
                    self.live_changes.insert(span.address, index);
                }
                Change::Freed { address } => {
                    self.live_changes.remove(&address);
                }
                Change::RegionAdded { .. }
                | Change::RegionResized { .. }
                | Change::RegionRemoved { .. }
                | Change::PagesMapped { .. }
                | Change::PagesUnmapped { .. } => self.region_changes.push(index),
            }
        }
    }

    /// Keeps the head, after `position` steps, as a checkpoint. None past 2^32 changes, where indices into them no
    /// longer fit a `u32`: seeks there start from the last checkpoint before (exact, only slower).
    fn checkpoint(&mut self, position: u64) {
        if u32::try_from(self.changes.len()).is_err() {
            return;
        }
        self.checkpoint_forced(position);
    }

    /// Keeps the head, after `position` steps, as a checkpoint.
    fn checkpoint_forced(&mut self, position: u64) {
        let live = self.live_changes.values().copied().collect();
        // A new snapshot of the regions once the changes since the last one outnumber a quarter of what a copy
        // holds: a seek replays at most that many, and the snapshots hold at most four entries per change.
        let last = self.checkpoints.last().map(|checkpoint| &checkpoint.regions);
        let regions = match last {
            Some(snapshot)
                if 4 * (self.region_changes.len() - snapshot.region_changes)
                    <= RegionSnapshot::entries(self.head.region_map()) =>
            {
                Arc::clone(snapshot)
            }
            _ => Arc::new(RegionSnapshot { region_changes: self.region_changes.len(), regions: self.head.region_map().clone() }),
        };
        self.checkpoints.push(Checkpoint { position, regions, live });
    }

    /// Steps recorded.
    pub fn steps(&self) -> u64 {
        self.samples.len() as u64
    }

    /// The changes of the start layout ([`Timeline::start`]): what was there at position 0.
    pub fn start_changes(&self) -> &[Change] {
        &self.changes[..self.step_starts.first().copied().unwrap_or(0)]
    }

    /// The changes of step `step`.
    pub fn changes(&self, step: u64) -> &[Change] {
        let Ok(step) = usize::try_from(step) else { return &[] };
        match (self.step_starts.get(step), self.step_starts.get(step + 1)) {
            (Some(&start), Some(&end)) => &self.changes[start..end],
            _ => &[],
        }
    }

    /// Totals after each step.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// The refused requests, with the step that refused each.
    pub fn refusals(&self) -> &[(u64, Refusal)] {
        &self.refusals
    }

    /// The steps whose live or reserved bytes passed their start and end inside them, each by its position once done (the
    /// position [`Timeline::sample_at`] takes), in order.
    pub fn transients(&self) -> &[(u64, Transient)] {
        &self.transients
    }

    /// What the step ending at `position` held at its most inside it, where that passed its start and end.
    pub fn transient_at(&self, position: u64) -> Option<Transient> {
        let index = self.transients.binary_search_by_key(&position, |&(at, _)| at).ok()?;
        Some(self.transients[index].1)
    }

    /// Widens each virtual region's shown extent to `(region, extent)` where that is further.
    fn widen_virtual_extents(&mut self, extents: Vec<(u64, u64)>) {
        for (region, extent_bytes) in extents {
            let extent = self.virtual_extent.entry(region).or_insert(0);
            *extent = (*extent).max(extent_bytes);
        }
    }

    /// The refusal of step `step`, if it refused one.
    pub fn refusal_at(&self, step: u64) -> Option<&Refusal> {
        let index = self.refusals.binary_search_by_key(&step, |(at, _)| *at).ok()?;
        Some(&self.refusals[index].1)
    }

    /// The layout after the last step.
    pub fn head(&self) -> &Layout {
        &self.head
    }

    /// How much of the region at `region` a view should show: all of a block; of a virtual range, up to the
    /// highest page it ever mapped (at least one byte).
    pub fn shown_bytes(&self, region: &Region) -> u64 {
        match region.kind {
            RegionKind::Block => region.size_bytes,
            RegionKind::Virtual => self.virtual_extent.get(&region.address).copied().unwrap_or(0).clamp(1, region.size_bytes),
        }
    }

    /// The layout after the first `position` steps (clamped to the steps recorded): the nearest checkpoint
    /// at or before it, then the changes since, applied in bulk ([`Layout::replayed`]).
    pub fn layout_at(&self, position: u64) -> Layout {
        let position = position.min(self.steps());
        let index = self.checkpoints.partition_point(|checkpoint| checkpoint.position <= position) - 1;
        let checkpoint = &self.checkpoints[index];
        let start = self.step_starts[checkpoint.position as usize];
        let snapshot = &checkpoint.regions;
        let caught_up = self.region_changes.partition_point(|&change| (change as usize) < start);
        let region_changes = self.region_changes.get(snapshot.region_changes..caught_up).unwrap_or_default();
        let region_changes = region_changes.iter().filter_map(|&change| self.changes.get(change as usize));
        // The indices are by address: the map is built in one pass, without sorting.
        let mut spans = Vec::with_capacity(checkpoint.live.len());
        spans.extend(checkpoint.live.iter().filter_map(|&index| match self.changes.get(index as usize) {
            Some(&Change::Allocated(span)) => Some((span.address, span)),
            _ => None,
        }));
        let spans: BTreeMap<u64, Span> = spans.into_iter().collect();
        let changes = &self.changes[start..self.step_starts[position as usize]];
        Layout::replayed_maps(snapshot.regions.clone(), spans, region_changes.chain(changes))
    }

    /// Moves `layout`, the layout after `from` steps, forward to `to` steps. Cheaper than
    /// [`Timeline::layout_at`] for short moves (playback).
    pub fn advance(&self, layout: &mut Layout, from: u64, to: u64) {
        for step in from..to.min(self.steps()) {
            for change in self.changes(step) {
                // Every recorded change applied to the layout it was recorded on.
                let applied = layout.apply(change);
                debug_assert!(applied.is_ok(), "recorded change {change:?} replays: {applied:?}");
            }
        }
    }

    /// Keeps a checkpoint at least every `steps` steps from now on (the default is
    /// [`MIN_CHECKPOINT_INTERVAL`]; more often costs memory, less often costs seeking time).
    pub fn set_checkpoint_interval(&mut self, steps: u64) {
        self.min_interval = steps.max(1);
    }

    /// Checkpoints kept (the empty start included).
    pub fn checkpoints(&self) -> usize {
        self.checkpoints.len()
    }

    /// Bytes the checkpoints hold, about: the indices of their live allocations, their snapshots of the regions
    /// (with mapped runs; each once, however many checkpoints share it), the indices of the region and page
    /// changes that bring a snapshot up to a checkpoint, and the index of the head's live allocations they are
    /// taken from; not counting the allocator's own overhead. What seeking costs in memory.
    pub fn checkpoint_bytes(&self) -> u64 {
        let mut bytes =
            self.live_changes.len() * (size_of::<u64>() + size_of::<u32>()) + self.region_changes.len() * size_of::<u32>();
        let mut previous: Option<&Arc<RegionSnapshot>> = None;
        for checkpoint in &self.checkpoints {
            bytes += checkpoint.live.len() * size_of::<u32>();
            if !previous.is_some_and(|snapshot| Arc::ptr_eq(snapshot, &checkpoint.regions)) {
                bytes += checkpoint.regions.bytes();
            }
            previous = Some(&checkpoint.regions);
        }
        bytes as u64
    }
}

/// How far into its virtual region `change` (applied to `head`) maps pages: (the region's address, the extent), for
/// pages mapped.
fn mapped_extent(head: &Layout, change: &Change) -> Option<(u64, u64)> {
    let Change::PagesMapped { address, size_bytes } = *change else { return None };
    let region = head.region_of(address)?;
    Some((region.address, address + size_bytes - region.address))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timeline of `steps` steps in one block, allocating and freeing in a pattern that keeps about
    /// `live` allocations live.
    fn churn(steps: u64, live: u64) -> Timeline {
        let mut timeline = Timeline::new("test");
        timeline.push(&[Change::RegionAdded { address: 0, size_bytes: 1 << 40, kind: RegionKind::Block }], None).unwrap();
        for step in 1..steps {
            let slot = step / 2;
            let change = if step % 2 == 1 || slot < live {
                let address = (step % (2 * live)) << 20;
                match timeline.head().span_at(address) {
                    Some(span) => Change::Freed { address: span.address },
                    None => Change::Allocated(Span {
                        address,
                        footprint_bytes: 1 << 19,
                        lead_bytes: 0,
                        requested_bytes: 1000 + step,
                        slot: slot as u32,
                        before_recording: false,
                        born: step,
                    }),
                }
            } else {
                let address = timeline.head().spans().next().map(|span| span.address).unwrap_or(0);
                Change::Freed { address }
            };
            timeline.push(&[change], None).unwrap();
        }
        timeline
    }

    /// A sample per step: the waste share sits beside the fragmentation in the same 24 bytes; both are shares of the
    /// layout's totals.
    #[test]
    fn samples_carry_fragmentation_and_waste() {
        assert_eq!(size_of::<Sample>(), 24);
        let mut timeline = Timeline::new("t");
        let block = Change::RegionAdded { address: 0, size_bytes: 1000, kind: RegionKind::Block };
        let span = Span {
            address: 0,
            footprint_bytes: 400,
            lead_bytes: 0,
            requested_bytes: 300,
            slot: 0,
            before_recording: false,
            born: 0,
        };
        timeline.push(&[block, Change::Allocated(span)], None).unwrap();
        let sample = timeline.sample_at(1);
        assert_eq!((sample.live_bytes, sample.reserved_bytes), (300, 1000));
        assert!((sample.waste - 0.1).abs() < 1e-6, "100 B of padding in 1000 reserved: {}", sample.waste);
        assert_eq!(sample.fragmentation, 0.0, "one free run");
    }

    #[test]
    fn seeking_equals_replaying_from_the_start() {
        let timeline = churn(20_000, 300);
        assert!(timeline.checkpoints() >= 4, "{} checkpoints", timeline.checkpoints());

        let mut replayed = Layout::new();
        let mut at = 0;
        for position in [0, 1, 4095, 4096, 4097, 9000, 12_345, 19_999, 20_000, 50_000] {
            let sought = timeline.layout_at(position);
            if position >= at {
                timeline.advance(&mut replayed, at, position);
                at = position.min(timeline.steps());
                assert_eq!(sought, replayed, "position {position}");
            }
            let expected = position.min(timeline.steps());
            if expected > 0 {
                let sample = timeline.samples()[expected as usize - 1];
                assert_eq!(
                    (sample.live_bytes, sample.reserved_bytes),
                    (sought.totals().live_bytes, sought.totals().reserved_bytes)
                );
            }
        }
    }

    /// A block, then 100 allocations, a checkpoint every 50 steps: the checkpoints after 50 and 100 steps hold
    /// the indices of 49 and 99 allocations and share one snapshot of the block (no region changed in between).
    #[test]
    fn checkpoint_bytes_count_what_checkpoints_hold() {
        let mut timeline = Timeline::new("test");
        timeline.set_checkpoint_interval(50);
        timeline.push(&[Change::RegionAdded { address: 0, size_bytes: 1 << 30, kind: RegionKind::Block }], None).unwrap();
        for slot in 0..100u32 {
            let span = Span {
                address: u64::from(slot) << 20,
                footprint_bytes: 1 << 20,
                lead_bytes: 0,
                requested_bytes: 1000,
                slot,
                before_recording: false,
                born: u64::from(slot) + 1,
            };
            timeline.push(&[Change::Allocated(span)], None).unwrap();
        }
        assert_eq!(timeline.checkpoints(), 3, "the empty start, after 50 and after 100 steps");
        assert!(Arc::ptr_eq(&timeline.checkpoints[1].regions, &timeline.checkpoints[2].regions));
        let head_index = timeline.live_changes.len() * (size_of::<u64>() + size_of::<u32>());
        let region_changes = size_of::<u32>();
        let expected = (49 + 99) * size_of::<u32>() + size_of::<(u64, Region)>() + region_changes + head_index;
        assert_eq!(timeline.checkpoint_bytes(), expected as u64);
    }

    /// One step of a story: its changes and the request it refused.
    type Step = (Vec<Change>, Option<Refusal>);

    /// What a step held at its most inside it is kept where it passed the step's start and end: an allocation served and
    /// returned within its entry, a block reserved and released within one; a step that only grows or only shrinks, or
    /// frees and allocates as much again, keeps none.
    #[test]
    fn steps_keep_what_they_held_at_their_most_inside() {
        let block = |address: u64| Change::RegionAdded { address, size_bytes: 1 << 20, kind: RegionKind::Block };
        let released = |address: u64| Change::RegionRemoved { address };
        let steps: [(Vec<Change>, Option<Transient>); 5] = [
            (vec![block(0), Change::Allocated(span(0, 4096, 0))], None),
            // Served and returned at once: 4 KiB more live and a block more reserved, inside the step only.
            (
                vec![
                    block(1 << 20),
                    Change::Allocated(span(1 << 20, 8192, 1)),
                    Change::Freed { address: 1 << 20 },
                    released(1 << 20),
                ],
                Some(Transient { live_bytes: 2049 + 4097, reserved_bytes: 2 << 20 }),
            ),
            (vec![Change::Allocated(span(8192, 4096, 2))], None),
            (vec![Change::Freed { address: 8192 }, Change::Freed { address: 0 }], None),
            // A free then an allocation as large: nothing passed the end.
            (vec![Change::Allocated(span(0, 4096, 3)), Change::Freed { address: 0 }, Change::Allocated(span(0, 4096, 4))], None),
        ];
        let mut timeline = Timeline::new("t");
        for (changes, _) in &steps {
            timeline.push(changes, None).unwrap();
        }
        for (position, (_, expected)) in (1..).zip(&steps) {
            assert_eq!(timeline.transient_at(position), *expected, "step {position}");
        }
        assert_eq!(timeline.transients().len(), 1);
        assert_eq!(timeline.sample_at(2).reserved_bytes, 1 << 20, "the step's end is its sample");
    }

    fn span(address: u64, footprint_bytes: u64, slot: u32) -> Span {
        Span {
            address,
            footprint_bytes,
            lead_bytes: 0,
            requested_bytes: footprint_bytes / 2 + 1,
            slot,
            before_recording: false,
            born: 0,
        }
    }

    fn refusal(requested_bytes: u64) -> Refusal {
        Refusal {
            requested_bytes,
            needed_bytes: requested_bytes,
            cause: heapscope_core::OomCause::Fragmentation,
            reserved_bytes: 0,
            free_bytes: 0,
            largest_free_bytes: 0,
            unusable_free_bytes: 0,
            waste_bytes: 0,
            unreserved_bytes: None,
            message: format!("{requested_bytes} B refused"),
        }
    }

    /// A pseudo-random story of `steps` steps over eight 1 MiB slots, each empty, a block or a virtual range:
    /// regions reserved and released (again at the same address), page runs mapped and unmapped, allocations
    /// placed on a coarse grid (so the same addresses come back), freed, freed and placed again at the same
    /// address in one step, and refusals. Every change fits the layout it was made on.
    fn random_story(seed: u64, steps: usize) -> Vec<Step> {
        let mut rng = heapscope_core::rng::Rng::new(seed);
        let mut next = move |bound: u64| rng.below(bound);
        let mut layout = Layout::new();
        let mut story = Vec::new();
        while story.len() < steps {
            let slot = next(8) << 20;
            let page = slot + (next(64) << 12);
            // Allocations outnumber frees for 400 steps, then the other way round, and so on.
            let allocations_end = if (story.len() / 400) % 2 == 0 { 28 } else { 20 };
            let proposed = match next(32) {
                // Slots 0 to 3 hold blocks, 4 to 7 virtual ranges.
                0 | 1 if slot < 4 << 20 => {
                    vec![Change::RegionAdded { address: slot, size_bytes: (1 + next(16)) << 16, kind: RegionKind::Block }]
                }
                0 | 1 => vec![Change::RegionAdded { address: slot, size_bytes: 1 << 20, kind: RegionKind::Virtual }],
                // Now and then everything in the slot freed, and its region released, in one step.
                2 if next(8) == 0 => {
                    let mut changes: Vec<Change> =
                        layout.spans_in(slot, slot + (1 << 20)).map(|span| Change::Freed { address: span.address }).collect();
                    changes.push(Change::RegionRemoved { address: slot });
                    changes
                }
                3..=6 => vec![Change::PagesMapped { address: page, size_bytes: (1 + next(8)) << 12 }],
                7 | 8 => vec![Change::PagesUnmapped { address: page, size_bytes: (1 + next(4)) << 12 }],
                9 | 10 => {
                    let live: Vec<Span> = layout.spans().copied().collect();
                    match live.get(next(live.len().max(1) as u64) as usize) {
                        // Freed and placed again at the same address, smaller, in one step.
                        Some(old) => vec![
                            Change::Freed { address: old.address },
                            Change::Allocated(span(old.address, old.footprint_bytes.div_ceil(2), old.slot + 1)),
                        ],
                        None => continue,
                    }
                }
                2 | 11 => vec![],
                choice if choice < allocations_end => {
                    vec![Change::Allocated(span(page, (1 + next(6)) << 10, story.len() as u32))]
                }
                _ => match layout.spans().nth(next(layout.totals().live_allocations.max(1)) as usize) {
                    Some(live) => vec![Change::Freed { address: live.address }],
                    None => continue,
                },
            };
            let mut tried = layout.clone();
            if proposed.iter().all(|change| tried.apply(change).is_ok()) {
                layout = tried;
                let refused = (proposed.is_empty() || next(8) == 0).then(|| refusal(next(1 << 20)));
                story.push((proposed, refused));
            }
        }
        story
    }

    /// Seeking from the compact checkpoints (indices of live allocations, shared snapshots of the regions brought
    /// up to date by the region changes since) gives exactly the layout replayed change by change from the start,
    /// at every position, with every refusal where it was.
    #[test]
    fn seeking_from_checkpoints_equals_replaying_from_zero_table() {
        let block = |address, size_bytes| Change::RegionAdded { address, size_bytes, kind: RegionKind::Block };
        let virtual_range = |address, size_bytes| Change::RegionAdded { address, size_bytes, kind: RegionKind::Virtual };
        let map = |address, size_bytes| Change::PagesMapped { address, size_bytes };
        let unmap = |address, size_bytes| Change::PagesUnmapped { address, size_bytes };
        let alloc = |address, footprint_bytes, slot| Change::Allocated(span(address, footprint_bytes, slot));
        let free = |address| Change::Freed { address };
        let steps = |changes: Vec<Vec<Change>>| -> Vec<Step> { changes.into_iter().map(|step| (step, None)).collect() };
        // (case, checkpoint interval, story)
        let cases: Vec<(&str, u64, Vec<Step>)> = vec![
            (
                "frees and re-allocations at the same address, across steps and within one",
                2,
                steps(vec![
                    vec![block(0, 1 << 20)],
                    vec![alloc(0, 4096, 0)],
                    vec![alloc(4096, 8192, 1)],
                    vec![free(0)],
                    vec![alloc(0, 2048, 2)],
                    vec![free(4096), alloc(4096, 4096, 3)],
                    vec![free(0), free(4096)],
                    vec![alloc(0, 1 << 20, 4)],
                    vec![free(0), alloc(0, 100, 5), alloc(100, 100, 6)],
                    vec![],
                ]),
            ),
            (
                "a virtual range with page runs mapped, split, joined and unmapped",
                3,
                steps(vec![
                    vec![virtual_range(1 << 30, 1 << 24)],
                    vec![map(1 << 30, 4 << 12)],
                    vec![alloc(1 << 30, 4096, 0), map((1 << 30) + (8 << 12), 2 << 12)],
                    vec![map((1 << 30) + (4 << 12), 4 << 12)],
                    vec![unmap((1 << 30) + (5 << 12), 1 << 12)],
                    vec![alloc((1 << 30) + (6 << 12), 3 << 12, 1)],
                    vec![free(1 << 30), unmap(1 << 30, 5 << 12)],
                    vec![map((1 << 30) + (5 << 12), 1 << 12), free((1 << 30) + (6 << 12))],
                    vec![unmap((1 << 30) + (5 << 12), 5 << 12)],
                    vec![],
                ]),
            ),
            (
                "regions released and reserved again at the same address, other sizes and kinds",
                1,
                steps(vec![
                    vec![block(0, 1 << 16), block(1 << 16, 1 << 16)],
                    vec![alloc(0, 1 << 16, 0)],
                    vec![free(0)],
                    vec![Change::RegionRemoved { address: 0 }],
                    vec![block(0, 1 << 12)],
                    vec![Change::RegionRemoved { address: 0 }, virtual_range(0, 1 << 16)],
                    vec![map(0, 1 << 12), alloc(0, 1 << 12, 1)],
                    vec![free(0), unmap(0, 1 << 12), Change::RegionRemoved { address: 0 }],
                ]),
            ),
            (
                "refusals, with and without changes",
                2,
                vec![
                    (vec![block(0, 1 << 20)], None),
                    (vec![], Some(refusal(1 << 21))),
                    (vec![alloc(0, 1 << 19, 0)], None),
                    (vec![], Some(refusal(1 << 20))),
                    (vec![free(0), alloc(0, 1 << 20, 1)], Some(refusal(1))),
                ],
            ),
            ("a random story, a checkpoint every 7 steps", 7, random_story(1, 3000)),
            ("a random story, a checkpoint every step", 1, random_story(2, 600)),
            ("a random story, checkpoints far apart", 500, random_story(3, 3000)),
        ];
        for (case, interval, story) in cases {
            let mut timeline = Timeline::new("test");
            timeline.set_checkpoint_interval(interval);
            for (changes, refused) in &story {
                timeline.push(changes, refused.clone()).unwrap_or_else(|error| panic!("{case}: {error}"));
            }
            // More live allocations than eight times the interval space checkpoints further apart.
            assert!(timeline.checkpoints() >= 3, "{case}: seeks start from {} checkpoints", timeline.checkpoints());
            let mut replayed = Layout::new();
            for position in 0..=story.len() {
                assert_eq!(timeline.layout_at(position as u64), replayed, "{case}: at {position}");
                let Some((changes, refused)) = story.get(position) else { break };
                for change in changes {
                    replayed.apply(change).unwrap();
                }
                assert_eq!(timeline.refusal_at(position as u64), refused.as_ref(), "{case}: step {position}");
            }
            assert_eq!(&replayed, timeline.head(), "{case}");
        }
    }

    /// The random stories both share snapshots of the regions between checkpoints and take new ones, so the test
    /// above covers seeks through both.
    #[test]
    fn random_stories_share_and_renew_region_snapshots() {
        let mut timeline = Timeline::new("test");
        timeline.set_checkpoint_interval(7);
        for (changes, refused) in random_story(1, 3000) {
            timeline.push(&changes, refused).unwrap();
        }
        let snapshots =
            1 + timeline.checkpoints.windows(2).filter(|pair| !Arc::ptr_eq(&pair[0].regions, &pair[1].regions)).count();
        assert!(
            1 < snapshots && snapshots < timeline.checkpoints() / 2,
            "{snapshots} snapshots, {} checkpoints",
            timeline.checkpoints()
        );
        let caught_up = timeline.checkpoints.iter().filter(|checkpoint| {
            let start = timeline.step_starts[checkpoint.position as usize];
            timeline.region_changes.partition_point(|&change| (change as usize) < start) > checkpoint.regions.region_changes
        });
        assert!(caught_up.count() > 10, "checkpoints whose regions replay changes since their snapshot");
    }

    #[test]
    fn a_contradicting_step_is_refused_and_leaves_the_timeline_as_it_was() {
        let mut timeline = churn(10, 3);
        let head = timeline.head().clone();
        let steps = timeline.steps();
        let bad = [Change::Allocated(Span {
            address: 1 << 41,
            footprint_bytes: 1,
            lead_bytes: 0,
            requested_bytes: 1,
            slot: 0,
            before_recording: false,
            born: 0,
        })];
        let good_then_bad = [Change::RegionAdded { address: 1 << 42, size_bytes: 10, kind: RegionKind::Block }, bad[0]];
        assert!(timeline.push(&bad, None).is_err());
        assert!(timeline.push(&good_then_bad, None).is_err());
        assert_eq!((timeline.head(), timeline.steps()), (&head, steps));
        timeline.push(&[], None).unwrap();
        assert_eq!(timeline.steps(), steps + 1);
        // Pages a refused step mapped before its contradiction do not widen the virtual range's view.
        let range = Change::RegionAdded { address: 1 << 43, size_bytes: 1 << 20, kind: RegionKind::Virtual };
        timeline.push(&[range, Change::PagesMapped { address: 1 << 43, size_bytes: 4096 }], None).unwrap();
        let mapped_then_bad = [Change::PagesMapped { address: (1 << 43) + 8192, size_bytes: 65536 }, bad[0]];
        assert!(timeline.push(&mapped_then_bad, None).is_err());
        let region = timeline.head().region_of(1 << 43).unwrap().clone();
        assert_eq!(timeline.shown_bytes(&region), 4096, "only what the accepted steps mapped");
    }

    /// Pages mapped in the start layout count as far as a view shows a virtual range: a start of mapped pages only (a
    /// file of segments, a recording begun mid-run that only frees) was drawn one byte wide, an empty pane; and a later
    /// step that maps less does not narrow it.
    #[test]
    fn pages_mapped_at_the_start_are_shown() {
        let mut timeline = Timeline::new("paged");
        let range = Change::RegionAdded { address: 1 << 43, size_bytes: 1 << 30, kind: RegionKind::Virtual };
        timeline.start(&[range, Change::PagesMapped { address: 1 << 43, size_bytes: 1 << 24 }]).unwrap();
        let region = timeline.head().region_of(1 << 43).unwrap().clone();
        assert_eq!(timeline.shown_bytes(&region), 1 << 24);
        timeline.push(&[Change::PagesMapped { address: (1 << 43) + (1 << 25), size_bytes: 4096 }], None).unwrap();
        assert_eq!(timeline.shown_bytes(&region), (1 << 25) + 4096);
        timeline.push(&[Change::PagesUnmapped { address: 1 << 43, size_bytes: 1 << 24 }], None).unwrap();
        assert_eq!(timeline.shown_bytes(&region), (1 << 25) + 4096, "the highest page ever mapped");
    }
}
