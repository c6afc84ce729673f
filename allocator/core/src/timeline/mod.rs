//! Timelines: a replay written down step by step, so that any moment of it can be shown, animated and
//! explained.
//!
//! ## Design
//!
//! - A contender's replay becomes a stream of plain [`Change`]s per step (one step per trace event):
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
//! - The timeline keeps a [`Sample`] per step (what its plot draws) and a copy of the layout every so many
//!   steps (a checkpoint: its regions and live allocations): [`Timeline::layout_at`] starts from the
//!   nearest checkpoint before the moment asked for, applies at most one interval of changes to the
//!   allocations and regions alone, and rebuilds the free runs once. The interval is at least [`MIN_CHECKPOINT_INTERVAL`] steps and a quarter
//!   of the live allocations, so checkpoints cost at most a few allocations' worth of memory per step, and a
//!   seek costs a rebuild of the layout plus at most that many changes.
//! - [`explain`] says in one sentence what each step decided and why, by the contender's rules.

mod change;
pub mod explain;
mod layout;
pub mod record;
mod regions;

use std::collections::BTreeMap;

pub use change::{Change, Refusal, RegionKind, Span};
pub use layout::{Effect, Layout, LayoutError, LayoutTotals, Region};
pub use regions::RegionTracker;

/// Steps between checkpoints at least; more when many allocations are live (see [`Timeline::layout_at`]).
pub const MIN_CHECKPOINT_INTERVAL: u64 = 4096;

/// A layout kept for seeking: its regions and live allocations (the free runs are rebuilt from them).
#[derive(Clone, Debug)]
struct Checkpoint {
    position: u64,
    regions: BTreeMap<u64, Region>,
    spans: Vec<Span>,
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
    refusals: Vec<(u64, Refusal)>,
    /// Layouts after `position` steps, kept as their parts, by increasing position; the first is the empty start.
    checkpoints: Vec<Checkpoint>,
    /// Steps between checkpoints at least.
    min_interval: u64,
    /// The layout after every step so far, where the next step applies.
    head: Layout,
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
            refusals: Vec::new(),
            checkpoints: vec![Checkpoint { position: 0, regions: BTreeMap::new(), spans: Vec::new() }],
            min_interval: MIN_CHECKPOINT_INTERVAL,
            head: Layout::new(),
            virtual_extent: BTreeMap::new(),
        }
    }

    /// Appends one step: its changes in order, and the request it refused, if any.
    ///
    /// # Errors
    /// [`LayoutError`] naming the first change that contradicts the layout; the step is not appended then.
    pub fn push(&mut self, changes: &[Change], refusal: Option<Refusal>) -> Result<(), LayoutError> {
        for change in changes {
            // Copying the head before each step would double the cost of every step: a step that fails
            // half-way is undone instead by rebuilding the head from the last checkpoint.
            if let Err(error) = self.head.apply(change) {
                self.head = self.layout_at(self.steps());
                return Err(error);
            }
            if let Change::PagesMapped { address, size_bytes } = *change
                && let Some(region) = self.head.region_of(address)
            {
                let extent = self.virtual_extent.entry(region.address).or_insert(0);
                *extent = (*extent).max(address + size_bytes - region.address);
            }
        }
        self.changes.extend_from_slice(changes);
        self.step_starts.push(self.changes.len());
        let totals = self.head.totals();
        self.samples.push(Sample {
            live_bytes: totals.live_bytes,
            reserved_bytes: totals.reserved_bytes,
            fragmentation: totals.fragmentation() as f32,
        });
        let position = self.steps();
        if let Some(refusal) = refusal {
            self.refusals.push((position - 1, refusal));
        }
        let last = self.checkpoints.last().map_or(0, |checkpoint| checkpoint.position);
        if position - last >= self.min_interval.max(totals.live_allocations / 4) {
            let (regions, spans) = self.head.parts();
            self.checkpoints.push(Checkpoint { position, regions, spans });
        }
        Ok(())
    }

    /// Steps recorded.
    pub fn steps(&self) -> u64 {
        self.samples.len() as u64
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
        let changes = self.step_starts[checkpoint.position as usize]..self.step_starts[position as usize];
        Layout::replayed(checkpoint.regions.clone(), &checkpoint.spans, &self.changes[changes])
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

    /// Bytes the checkpoints hold, about: their allocations and regions (with mapped runs), not counting the
    /// allocator's own overhead. What seeking costs in memory.
    pub fn checkpoint_bytes(&self) -> u64 {
        let run = 2 * size_of::<u64>();
        self.checkpoints
            .iter()
            .map(|checkpoint| {
                let regions: usize =
                    checkpoint.regions.values().map(|region| size_of::<(u64, Region)>() + region.mapped.len() * run).sum();
                (checkpoint.spans.len() * size_of::<Span>() + regions) as u64
            })
            .sum()
    }
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
    /// 49 and 99 allocations and the block each.
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
                born: u64::from(slot) + 1,
            };
            timeline.push(&[Change::Allocated(span)], None).unwrap();
        }
        assert_eq!(timeline.checkpoints(), 3, "the empty start, after 50 and after 100 steps");
        let expected = (49 + 99) * size_of::<Span>() + 2 * size_of::<(u64, Region)>();
        assert_eq!(timeline.checkpoint_bytes(), expected as u64);
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
            born: 0,
        })];
        let good_then_bad = [Change::RegionAdded { address: 1 << 42, size_bytes: 10, kind: RegionKind::Block }, bad[0]];
        assert!(timeline.push(&bad, None).is_err());
        assert!(timeline.push(&good_then_bad, None).is_err());
        assert_eq!((timeline.head(), timeline.steps()), (&head, steps));
        timeline.push(&[], None).unwrap();
        assert_eq!(timeline.steps(), steps + 1);
    }
}
