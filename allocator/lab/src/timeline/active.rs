//! The active memory timeline: memory_viz's first view, what is live over time, as plain data.
//!
//! Every allocation of the recording is a band over the moments it is live, stacked on the allocations made before
//! it that are still live: an allocation keeps its height while live, and when one below it is freed the stack
//! above closes the gap (memory_viz's layout). The bands are the recording's own requests, the same for every
//! contender; what a contender reserved is its timeline's to draw over them.
//!
//! A band is cut into [`Piece`]s, one per stretch of moments at one height: a free below it ends a piece and
//! starts the next one lower down. Positions are the replay's ([`crate::recording::Moment::position`]: the start is
//! 0, entry `N` is `N + 1`), and a piece covers positions `from .. to`. Freeing the newest allocation (the common
//! case: activations freed in reverse) moves nothing, so a training step's pieces stay close to its allocations;
//! a free deep in the stack cuts every band above it once.
//!
//! The level of detail: allocations under 1/[`DETAIL_FRACTION`] of the peak (under half a pixel on the app's
//! timeline) get no band of their own. They are merged into one band per stack group ([`Summaries`]: the
//! [`SUMMARY_GROUPS`] stacks holding the most of them, and every other stack), stacked on top of the bands, each
//! group's bytes as they are at the start of each stretch — memory_viz summarises what it leaves out into one band
//! at the bottom; on top, the bands keep their heights when a small allocation below them is freed (their pieces
//! would otherwise be cut at every stretch). What the stack holds in all is [`ActiveTimeline::live_bytes`], exact at
//! every position.
//!
//! [`build_segments`] stacks what a contender reserved the same way (memory_viz's cached-memory view): each block, or
//! each run of pages mapped in a virtual range, a band while held.

use std::collections::BTreeMap;

use heapscope_core::trace::Event;
use heapscope_pytorch::{CategoryId, StackId};

use super::{Change, RegionKind, Timeline};
use crate::recording::Recording;
use crate::top::Origin;

/// A stretch of moments during which an allocation sits at one height.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// First position.
    pub from: u64,
    /// One past the last position.
    pub to: u64,
    /// Bytes of the allocations below it.
    pub offset_bytes: u64,
}

/// One allocation of the recording over its lifetime (or one segment of a contender's, see [`build_segments`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Band {
    /// Its slot in the recording's trace (a segment's number in order of reservation).
    pub slot: u32,
    /// Bytes requested.
    pub size_bytes: u64,
    /// Its stack frames in the snapshot ([`StackId::NONE`] where none were recorded).
    pub stack: StackId,
    /// Its entry's category in the snapshot ([`CategoryId::NONE`] where it names none).
    pub category: CategoryId,
    /// Where it sits, stretch by stretch, in order.
    pub pieces: Vec<Piece>,
}

/// The recording's allocations stacked over time. See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ActiveTimeline {
    /// Every allocation that is live at some position, in allocation order, except those under
    /// 1/[`DETAIL_FRACTION`] of the peak: they are in [`ActiveTimeline::summaries`] (and count in
    /// [`ActiveTimeline::live_bytes`]); a recording with many of them freed out of order would otherwise cut the bands
    /// above into millions of pieces.
    pub bands: Vec<Band>,
    /// Positions: the start and one per entry.
    pub positions: u64,
    /// The most bytes live at once.
    pub peak_bytes: u64,
    /// The first position where they are.
    pub peak_position: u64,
    /// Bytes live once each position is done (index = position).
    pub live_bytes: Vec<u64>,
    /// For a contender's segments ([`build_segments`]): the address of each band's block or mapped run, by its
    /// [`Band::slot`]; empty for allocations.
    pub addresses: Vec<u64>,
    /// The allocations too small for a band, merged by stack group, on top of the bands.
    pub summaries: Summaries,
}

/// The allocations too small for a band of their own, one band per stack group (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summaries {
    /// The groups, bottom to top: a stack, or `None` for every other stack.
    pub groups: Vec<Option<StackId>>,
    /// From the start of each stretch on (until the next one's), in order of position.
    pub stretches: Vec<SummaryStretch>,
}

/// The summarised bytes of one stretch of positions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SummaryStretch {
    /// Its first position.
    pub from: u64,
    /// Bytes of the bands under the summaries (where the first group starts).
    pub base_bytes: u64,
    /// Each group's bytes, as [`Summaries::groups`] orders them.
    pub bytes: Vec<u64>,
}

impl Summaries {
    /// The stretch `position` is in.
    pub fn stretch_at(&self, position: u64) -> Option<&SummaryStretch> {
        let index = self.stretches.partition_point(|stretch| stretch.from <= position);
        index.checked_sub(1).map(|index| &self.stretches[index])
    }

    /// The group at `position`, `bytes` above the bottom, with its bytes then, if a summary band is there.
    pub fn at(&self, position: u64, bytes: u64) -> Option<(Option<StackId>, u64)> {
        let stretch = self.stretch_at(position)?;
        // Saturating: the heights saturate at u64::MAX where sizes add up past it.
        let mut offset = stretch.base_bytes;
        for (group, &group_bytes) in self.groups.iter().zip(&stretch.bytes) {
            if (offset..offset.saturating_add(group_bytes)).contains(&bytes) {
                return Some((*group, group_bytes));
            }
            offset = offset.saturating_add(group_bytes);
        }
        None
    }
}

/// The stacks holding the most bytes of small allocations get a summary band each; the rest share one.
pub const SUMMARY_GROUPS: usize = 15;

impl ActiveTimeline {
    /// The band and piece at position `position`, `bytes` above the bottom, if an allocation with a band of its own is
    /// there (see [`Summaries::at`] for the rest).
    pub fn at(&self, position: u64, bytes: u64) -> Option<(&Band, &Piece)> {
        self.bands.iter().find_map(|band| {
            let piece = band.pieces.iter().find(|piece| piece.from <= position && position < piece.to)?;
            (piece.offset_bytes <= bytes && bytes < piece.offset_bytes.saturating_add(band.size_bytes)).then_some((band, piece))
        })
    }
}

/// Allocations under this fraction of the peak live bytes get no band of their own (see [`ActiveTimeline::bands`]):
/// at most half a pixel on the app's 210-point timeline.
pub const DETAIL_FRACTION: u64 = 420;

/// The order [`Stacker`] gives a summarised allocation (it is not in the stack of bands).
const SUMMARISED: u64 = u64::MAX;

/// The allocation in a stack being built: its band, its order and where its current piece starts.
struct Open {
    band: usize,
    since: u64,
    offset_bytes: u64,
}

/// A band's pieces start at its allocation and where its height has changed at the start of one of this many equal
/// stretches of positions (a pixel column of any plot up to this wide).
pub const STRETCHES: u64 = 4096;

/// Sums of sizes by allocation order (a Fenwick tree): the bytes live below an allocation in O(log n).
struct Below {
    /// Wide: sizes read from a file may add up past a u64 (a height is shown saturated).
    tree: Vec<u128>,
}

impl Below {
    fn new(len: usize) -> Self {
        Self { tree: vec![0; len + 1] }
    }

    /// Adds `delta` (wrapping: a removal adds the negation) at `order`.
    fn add(&mut self, order: u64, delta: u128) {
        let mut index = order as usize + 1;
        while index < self.tree.len() {
            self.tree[index] = self.tree[index].wrapping_add(delta);
            index += index & index.wrapping_neg();
        }
    }

    /// The sum at orders below `order` (saturated at `u64::MAX`).
    fn before(&self, order: u64) -> u64 {
        let (mut index, mut sum) = (order as usize, 0u128);
        while index > 0 {
            sum = sum.wrapping_add(self.tree[index]);
            index -= index & index.wrapping_neg();
        }
        saturated(sum)
    }
}

/// `bytes`, or `u64::MAX` past it.
fn saturated(bytes: u128) -> u64 {
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

/// Stacks bands as their events arrive in order of position (see [`build`]): each band a dense key, added and removed
/// once.
struct Stacker<'a> {
    timeline: ActiveTimeline,
    /// The open bands by order of addition, each with its open piece.
    open: BTreeMap<u64, Open>,
    /// Each key's order and size while live.
    order_of: Vec<Option<(u64, u64)>>,
    below: Below,
    /// Smaller ones get no band.
    detail_bytes: u64,
    next_order: u64,
    /// Wide, as [`Below`]'s sums (shown saturated).
    live_bytes: u128,
    /// Positions of `live_bytes` written so far; the stretch the heights were last brought up to date in.
    filled: usize,
    stretch: u64,
    /// Where each band comes from (by key), for its band.
    origins: &'a dyn Fn(u32) -> Origin,
    /// The summary group of each stack with one of its own (the rest: the last group).
    group_of: std::collections::HashMap<StackId, usize>,
    /// Bytes live per summary group.
    small_bytes: Vec<u128>,
}

impl<'a> Stacker<'a> {
    /// A stacker over `positions` positions, `keys` keys and at most `adds` additions, banding sizes of at least
    /// `detail_bytes`.
    /// Small ones are summarised by stack: `small_stacks` are the stacks with a group of their own, bottom to top.
    fn new(
        positions: u64,
        (keys, adds): (usize, usize),
        detail_bytes: u64,
        origins: &'a dyn Fn(u32) -> Origin,
        small_stacks: &[StackId],
    ) -> Self {
        let mut groups: Vec<Option<StackId>> = small_stacks.iter().copied().map(Some).collect();
        groups.push(None);
        let summaries = Summaries { groups, stretches: Vec::new() };
        let small_bytes = vec![0u128; summaries.groups.len()];
        Self {
            timeline: ActiveTimeline {
                positions,
                live_bytes: vec![0; positions as usize],
                summaries,
                ..ActiveTimeline::default()
            },
            open: BTreeMap::new(),
            order_of: vec![None; keys],
            below: Below::new(adds),
            detail_bytes,
            next_order: 0,
            live_bytes: 0,
            filled: 0,
            stretch: 0,
            origins,
            group_of: small_stacks.iter().enumerate().map(|(group, &stack)| (stack, group)).collect(),
            small_bytes,
        }
    }

    /// The summary group of key `key`.
    fn group(&self, key: u32) -> usize {
        let stack = (self.origins)(key).stack;
        self.group_of.get(&stack).copied().unwrap_or(self.small_bytes.len() - 1)
    }

    fn close(timeline: &mut ActiveTimeline, open: &Open, to: u64) {
        if to > open.since {
            timeline.bands[open.band].pieces.push(Piece { from: open.since, to, offset_bytes: open.offset_bytes });
        }
    }

    /// Key `key` of `size_bytes` is live from `position`, on top of the stack.
    fn add(&mut self, key: u32, size_bytes: u64, position: u64) {
        self.live_bytes += u128::from(size_bytes);
        if size_bytes < self.detail_bytes {
            let group = self.group(key);
            self.small_bytes[group] += u128::from(size_bytes);
            if let Some(slot) = self.order_of.get_mut(key as usize) {
                *slot = Some((SUMMARISED, size_bytes));
            }
            return;
        }
        {
            // Its own height is exact (the bands below may be a stretch late until the next refresh).
            let origin = (self.origins)(key);
            let band = Band { slot: key, size_bytes, stack: origin.stack, category: origin.category, pieces: Vec::new() };
            self.timeline.bands.push(band);
            let band =
                Open { band: self.timeline.bands.len() - 1, since: position, offset_bytes: self.below.before(self.next_order) };
            self.open.insert(self.next_order, band);
        }
        self.below.add(self.next_order, u128::from(size_bytes));
        if let Some(slot) = self.order_of.get_mut(key as usize) {
            *slot = Some((self.next_order, size_bytes));
        }
        self.next_order += 1;
    }

    /// Key `key` is gone from `position` (nothing for a key not live).
    fn remove(&mut self, key: u32, position: u64) {
        let Some((order, size_bytes)) = self.order_of.get_mut(key as usize).and_then(Option::take) else { return };
        self.live_bytes -= u128::from(size_bytes);
        if order == SUMMARISED {
            let group = self.group(key);
            self.small_bytes[group] -= u128::from(size_bytes);
            return;
        }
        if let Some(band) = self.open.remove(&order) {
            Self::close(&mut self.timeline, &band, position);
        }
        self.below.add(order, u128::from(size_bytes).wrapping_neg());
    }

    /// The events of `position` are done: its live bytes and the peak; the first position done in a new stretch
    /// brings the heights up to date.
    fn done(&mut self, position: u64) {
        let positions = self.timeline.positions;
        let here_stretch =
            u64::try_from(u128::from(position) * u128::from(STRETCHES) / u128::from(positions.max(1))).unwrap_or(u64::MAX);
        let new_stretch = here_stretch != self.stretch || self.timeline.summaries.stretches.is_empty();
        if here_stretch != self.stretch {
            // Each band whose height changed gets a new piece from `position`.
            for (&order, band) in &mut self.open {
                let offset_bytes = self.below.before(order);
                if offset_bytes != band.offset_bytes {
                    Self::close(&mut self.timeline, band, position);
                    (band.since, band.offset_bytes) = (position, offset_bytes);
                }
            }
            self.stretch = here_stretch;
        }
        if new_stretch {
            let small: u128 = self.small_bytes.iter().sum();
            let stretch = SummaryStretch {
                from: position,
                base_bytes: saturated(self.live_bytes - small),
                bytes: self.small_bytes.iter().map(|&bytes| saturated(bytes)).collect(),
            };
            self.timeline.summaries.stretches.push(stretch);
        }
        // Positions without an event of their own keep the bytes of the one before.
        let live = &mut self.timeline.live_bytes;
        let here = (position as usize).min(live.len());
        let before = live.get(self.filled.saturating_sub(1)).copied().unwrap_or(0);
        live[self.filled.min(here)..here].fill(before);
        let live_bytes = saturated(self.live_bytes);
        if let Some(slot) = live.get_mut(here) {
            *slot = live_bytes;
        }
        self.filled = here + 1;
        if live_bytes > self.timeline.peak_bytes {
            (self.timeline.peak_bytes, self.timeline.peak_position) = (live_bytes, position);
        }
    }

    fn finish(mut self) -> ActiveTimeline {
        let live = &mut self.timeline.live_bytes;
        let last = live.get(self.filled.saturating_sub(1)).copied().unwrap_or(0);
        let total = live.len();
        live[self.filled.min(total)..].fill(last);
        let end = self.timeline.positions;
        for band in self.open.values() {
            Self::close(&mut self.timeline, band, end);
        }
        // A band removed in the moment it was added (an out-of-memory request) was never live.
        self.timeline.bands.retain(|band| !band.pieces.is_empty());
        self.timeline
    }
}

/// The active memory timeline of `recording`. See the module docs.
///
/// A free does not cut the bands above it at once (a recording freeing out of order would cut every band above
/// each time: a million allocations made 91 million pieces). A band starts at its exact height, and heights are
/// brought up to date at the start of each of [`STRETCHES`] stretches of positions, each band's height read from a
/// sum of the live sizes by allocation order: exact there, at most one stretch late in between.
pub fn build(recording: &Recording) -> ActiveTimeline {
    let events = recording.trace.events();
    let by_event = crate::top::allocation_origins(recording);
    // Each slot's origin: the one of the event that allocated it.
    let mut origin_of = vec![Origin::default(); recording.trace.slots() as usize];
    for (event, origin) in events.iter().zip(&by_event) {
        if let Event::Alloc { slot, .. } = *event {
            origin_of[slot as usize] = *origin;
        }
    }
    let origins = |slot: u32| origin_of.get(slot as usize).copied().unwrap_or_default();
    let allocs = events.iter().filter(|event| matches!(event, Event::Alloc { .. })).count();
    // Allocations this small get no band of their own: under half a pixel on the app's timeline.
    let detail_bytes = crate::top::peak(recording).1 / DETAIL_FRACTION;
    // The stacks that allocated the most bytes in small allocations get a summary band each, the most at the bottom.
    // Summed wide: every small allocation ever made, which may add up past a u64.
    let mut small_by_stack: std::collections::HashMap<StackId, u128> = std::collections::HashMap::new();
    for event in events {
        if let Event::Alloc { slot, size_bytes } = *event
            && size_bytes < detail_bytes
        {
            *small_by_stack.entry(origins(slot).stack).or_insert(0) += u128::from(size_bytes);
        }
    }
    let mut ranked: Vec<(StackId, u128)> = small_by_stack.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let small_stacks: Vec<StackId> = ranked.into_iter().take(SUMMARY_GROUPS).map(|(stack, _)| stack).collect();
    let keys = (recording.trace.slots() as usize, allocs);
    let mut stacker = Stacker::new(recording.entries + 1, keys, detail_bytes, &origins, &small_stacks);
    for (index, event) in (0..).zip(events) {
        let position = recording.moment_of(index).position();
        match *event {
            Event::Alloc { slot, size_bytes } => stacker.add(slot, size_bytes, position),
            Event::Free { slot } => stacker.remove(slot, position),
            Event::EmptyCache => {}
        }
        // The moment is done once the next event belongs to a later one (or there is none).
        if events.get(index as usize + 1).is_none() || recording.moment_of(index + 1).position() != position {
            stacker.done(position);
        }
    }
    stacker.finish()
}

/// A segment's band starts (at an address, of some bytes) or ends (the one at an address).
#[derive(Clone, Copy)]
enum Held {
    From(u64, u64),
    Until(u64),
}

/// What a contender reserved over time, stacked the same way (memory_viz's cached-memory view): each block it
/// reserved, or each run of pages it mapped in a virtual range, is a band while it is held, stacked on the older ones
/// still held. [`Band::slot`] numbers them in order; [`ActiveTimeline::addresses`] says where each one is. Pages
/// unmapped from the middle of a mapped run end its band and start bands for what stays mapped of it.
pub fn build_segments(timeline: &Timeline) -> ActiveTimeline {
    // Every band the changes make, in order.
    let mut held: BTreeMap<u64, u64> = BTreeMap::new();
    let mut events: Vec<(u64, Held)> = Vec::new();
    let mut apply = |position: u64, change: &Change, events: &mut Vec<(u64, Held)>| match *change {
        Change::RegionAdded { address, size_bytes, kind: RegionKind::Block } | Change::PagesMapped { address, size_bytes } => {
            held.insert(address, size_bytes);
            events.push((position, Held::From(address, size_bytes)));
        }
        Change::RegionRemoved { address } if held.remove(&address).is_some() => events.push((position, Held::Until(address))),
        Change::PagesUnmapped { address, size_bytes } => {
            let end = address + size_bytes;
            let cut: Vec<(u64, u64)> = held
                .range(..end)
                .rev()
                .take_while(|&(&start, &bytes)| start + bytes > address)
                .map(|(&start, &bytes)| (start, bytes))
                .collect();
            for (start, bytes) in cut.into_iter().rev() {
                held.remove(&start);
                events.push((position, Held::Until(start)));
                for (keep_start, keep_end) in [(start, address), (end, start + bytes)] {
                    if keep_end > keep_start {
                        held.insert(keep_start, keep_end - keep_start);
                        events.push((position, Held::From(keep_start, keep_end - keep_start)));
                    }
                }
            }
        }
        _ => {}
    };
    for change in timeline.start_changes() {
        apply(0, change, &mut events);
    }
    for step in 0..timeline.steps() {
        for change in timeline.changes(step) {
            apply(step + 1, change, &mut events);
        }
    }
    let adds = events.iter().filter(|(_, event)| matches!(event, Held::From(..))).count();
    let peak = (0..=timeline.steps()).map(|position| timeline.sample_at(position).reserved_bytes).max().unwrap_or(0);
    let none = |_: u32| Origin::default();
    // Small segments share one summary band.
    let mut stacker = Stacker::new(timeline.steps() + 1, (adds, adds), peak / DETAIL_FRACTION, &none, &[]);
    let mut addresses = Vec::with_capacity(adds);
    let mut key_at: BTreeMap<u64, u32> = BTreeMap::new();
    for (index, &(position, event)) in events.iter().enumerate() {
        match event {
            Held::From(address, bytes) => {
                let key = u32::try_from(addresses.len()).unwrap_or(u32::MAX);
                addresses.push(address);
                key_at.insert(address, key);
                stacker.add(key, bytes, position);
            }
            Held::Until(address) => {
                if let Some(key) = key_at.remove(&address) {
                    stacker.remove(key, position);
                }
            }
        }
        if events.get(index + 1).is_none_or(|&(next, _)| next != position) {
            stacker.done(position);
        }
    }
    let mut built = stacker.finish();
    built.addresses = addresses;
    built
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_core::Trace;

    fn recording(csv: &str) -> Recording {
        Recording::from_trace(Trace::parse_csv("t.csv", csv).unwrap())
    }

    /// Three allocations; the middle one freed: the top one drops by its size; the bottom one never moves.
    #[test]
    fn a_free_below_lowers_what_is_above() {
        let timeline = build(&recording("a,0,100\na,1,200\na,2,300\nf,1\na,3,50\n"));
        assert_eq!((timeline.positions, timeline.peak_bytes, timeline.peak_position), (6, 600, 3));
        assert_eq!(timeline.live_bytes, [0, 100, 300, 600, 400, 450]);
        // (slot, its pieces as (from, to, offset)).
        type Pieces = Vec<(u32, Vec<(u64, u64, u64)>)>;
        let pieces: Pieces = timeline
            .bands
            .iter()
            .map(|band| (band.slot, band.pieces.iter().map(|p| (p.from, p.to, p.offset_bytes)).collect()))
            .collect();
        assert_eq!(
            pieces,
            [(0, vec![(1, 6, 0)]), (1, vec![(2, 4, 100)]), (2, vec![(3, 4, 300), (4, 6, 100)]), (3, vec![(5, 6, 400)]),]
        );
        assert_eq!(timeline.at(3, 350).map(|(band, _)| band.slot), Some(2));
        assert_eq!(timeline.at(4, 150).map(|(band, _)| band.slot), Some(2), "lower once 1 is freed");
        assert_eq!(timeline.at(5, 460).map(|(band, _)| band.slot), None, "above the stack");
    }

    /// A contender's blocks and mapped runs stacked: removing the oldest block lowers the rest; unmapping the middle
    /// of a mapped run ends its band and starts one for each part still mapped, on top.
    #[test]
    fn segments_stack_blocks_and_mapped_runs() {
        let virtual_base = 1 << 30;
        let steps = [
            vec![Change::RegionAdded { address: 0, size_bytes: 100, kind: RegionKind::Block }],
            vec![Change::RegionAdded { address: 0x1000, size_bytes: 200, kind: RegionKind::Block }],
            vec![
                Change::RegionAdded { address: virtual_base, size_bytes: 1 << 20, kind: RegionKind::Virtual },
                Change::PagesMapped { address: virtual_base, size_bytes: 300 },
            ],
            vec![Change::RegionRemoved { address: 0 }],
            vec![Change::PagesUnmapped { address: virtual_base + 100, size_bytes: 100 }],
        ];
        let mut timeline = Timeline::new("t");
        for step in &steps {
            timeline.push(step, None).unwrap();
        }
        let segments = build_segments(&timeline);
        assert_eq!((segments.positions, segments.peak_bytes, segments.peak_position), (6, 600, 3));
        assert_eq!(segments.live_bytes, [0, 100, 300, 600, 500, 400]);
        type Pieces = Vec<(u32, u64, Vec<(u64, u64, u64)>)>;
        let pieces: Pieces = segments
            .bands
            .iter()
            .map(|band| (band.slot, band.size_bytes, band.pieces.iter().map(|p| (p.from, p.to, p.offset_bytes)).collect()))
            .collect();
        assert_eq!(
            pieces,
            [
                (0, 100, vec![(1, 4, 0)]),
                (1, 200, vec![(2, 4, 100), (4, 6, 0)]),
                (2, 300, vec![(3, 4, 300), (4, 5, 200)]),
                (3, 100, vec![(5, 6, 200)]),
                (4, 100, vec![(5, 6, 300)]),
            ]
        );
        assert_eq!(segments.addresses, [0, 0x1000, virtual_base, virtual_base, virtual_base + 200]);
    }

    /// The pytorch contender's segments on frag_oom are the recording's own `segment_alloc`s: as many bands, and
    /// their bytes at every moment are the contender's reserved bytes.
    #[test]
    fn a_contenders_segments_are_its_reserved_bytes() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch/frag_oom-default.pickle.gz");
        let recording = Recording::open_device(&path, None).unwrap();
        let contender = crate::contender::Contender::Pytorch { expandable: false };
        let timeline = crate::timeline::record::record(&recording, contender, &crate::compare::CompareConfig::default()).unwrap();
        let segments = build_segments(&timeline);
        let recorded = recording.snapshot.as_ref().unwrap().device_traces[0]
            .iter()
            .filter(|entry| entry.action == heapscope_pytorch::Action::SegmentAlloc)
            .count();
        assert_eq!(segments.bands.len(), recorded);
        for position in 0..segments.positions {
            assert_eq!(segments.live_bytes[position as usize], timeline.sample_at(position).reserved_bytes, "{position}");
        }
    }

    /// The shipped recordings: the peak is `top`'s, the live curve peaks there, every band's pieces follow each other,
    /// each lower than the one before.
    #[test]
    fn real_recordings_agree_with_top() {
        for name in ["gpt2_train_fixed-default", "frag_oom-default"] {
            let path =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../assets/traces/pytorch/{name}.pickle.gz"));
            let recording = Recording::open_device(&path, None).unwrap();
            let timeline = build(&recording);
            let (moment, bytes) = crate::top::peak(&recording);
            assert_eq!((timeline.peak_position, timeline.peak_bytes), (moment.position(), bytes), "{name}");
            assert_eq!(timeline.live_bytes.len() as u64, timeline.positions);
            assert_eq!(timeline.live_bytes.iter().max().copied(), Some(timeline.peak_bytes), "{name}");
            assert_eq!(timeline.live_bytes[timeline.peak_position as usize], timeline.peak_bytes, "{name}");
            let pieces: usize = timeline.bands.iter().map(|band| band.pieces.len()).sum();
            eprintln!("{name}: {} bands, {pieces} pieces", timeline.bands.len());
            for band in &timeline.bands {
                assert!(band.pieces.windows(2).all(|w| w[0].to == w[1].from && w[0].offset_bytes > w[1].offset_bytes));
            }
        }
    }

    /// Sizes read from a file may add up past a u64: the live bytes, the peak and the heights saturate (they
    /// overflowed, a panic in a build with overflow checks), and drop back exact when the huge one goes.
    #[test]
    fn live_bytes_past_a_u64_saturate() {
        let timeline = build(&recording(&format!("a,1,{}\na,2,4096\nf,2\nf,1\na,3,7\n", u64::MAX)));
        assert_eq!(timeline.live_bytes, [0, u64::MAX, u64::MAX, u64::MAX, 0, 7]);
        assert_eq!((timeline.peak_bytes, timeline.peak_position), (u64::MAX, 1));
        let bands: Vec<u32> = timeline.bands.iter().map(|band| band.slot).collect();
        assert_eq!(bands, [0], "4096 B and 7 B are too small for a band of their own beside 16 EiB");
        let stretch = timeline.summaries.stretch_at(2).unwrap();
        assert_eq!((stretch.base_bytes, stretch.bytes.iter().sum::<u64>()), (u64::MAX, 4096), "summarised on top");
        // Small allocations made one after another add up past a u64 while never more than one is live (the
        // ranking of the summary groups summed them in a u64).
        let mut csv = format!("a,0,{}\nf,0\n", 1u64 << 63);
        for id in 1..=2100 {
            csv.push_str(&format!("a,{id},{}\nf,{id}\n", 1u64 << 53));
        }
        let timeline = build(&recording(&csv));
        assert_eq!(timeline.peak_bytes, 1 << 63);
    }

    /// Allocations under 1/420 of the peak get no band: they are summarised on top of the bands, one summary band per
    /// stack (the rest of the stacks sharing one), their bytes counted in the live bytes; the band above does not move
    /// when one is freed. Here: a 1 MiB band; 1 B and 3 B from stack 0, 2 B from stack 1 (by the CSV: no frames, so
    /// one stack; the groups then are that stack and "the rest").
    #[test]
    fn small_allocations_are_summarised_on_top() {
        let timeline = build(&recording(&format!("a,0,1\na,1,{}\na,2,2\nf,0\na,3,3\n", 1 << 20)));
        assert_eq!(timeline.bands.len(), 1);
        let band = &timeline.bands[0];
        assert_eq!(band.slot, 1);
        let pieces: Vec<(u64, u64, u64)> = band.pieces.iter().map(|p| (p.from, p.to, p.offset_bytes)).collect();
        assert_eq!(pieces, [(2, 6, 0)], "the band sits on nothing summarised, and never moves");
        let mib = 1 << 20;
        assert_eq!(timeline.live_bytes, [0, 1, mib + 1, mib + 3, mib + 2, mib + 5]);
        let summaries = &timeline.summaries;
        assert_eq!(summaries.groups, [Some(StackId::NONE), None]);
        let stretches: Vec<(u64, u64, Vec<u64>)> =
            summaries.stretches.iter().map(|stretch| (stretch.from, stretch.base_bytes, stretch.bytes.clone())).collect();
        assert_eq!(
            stretches,
            [(1, 0, vec![1, 0]), (2, mib, vec![1, 0]), (3, mib, vec![3, 0]), (4, mib, vec![2, 0]), (5, mib, vec![5, 0])]
        );
        assert_eq!(summaries.at(5, mib + 4), Some((Some(StackId::NONE), 5)));
        assert_eq!(summaries.stretch_at(0), None, "nothing is done at the start of a recording that starts empty");
        assert_eq!(summaries.at(5, mib + 5), None, "above the stack");
        assert_eq!(timeline.at(5, mib + 4), None, "no band of its own");
    }

    /// Freeing in reverse (a training step's activations) cuts nothing: one piece per allocation.
    #[test]
    fn freeing_the_newest_moves_nothing() {
        let mut csv = String::new();
        for slot in 0..50 {
            csv.push_str(&format!("a,{slot},{}\n", 10 + slot));
        }
        for slot in (0..50).rev() {
            csv.push_str(&format!("f,{slot}\n"));
        }
        let timeline = build(&recording(&csv));
        assert!(timeline.bands.iter().all(|band| band.pieces.len() == 1));
        assert_eq!(timeline.peak_position, 50);
        // At every position, the pieces live then tile [0, live bytes) without a gap or an overlap.
        for position in 0..timeline.positions {
            let mut spans: Vec<(u64, u64)> = timeline
                .bands
                .iter()
                .flat_map(|band| band.pieces.iter().map(move |p| (p, band.size_bytes)))
                .filter(|(p, _)| p.from <= position && position < p.to)
                .map(|(p, size)| (p.offset_bytes, p.offset_bytes + size))
                .collect();
            spans.sort_unstable();
            assert!(spans.windows(2).all(|w| w[0].1 == w[1].0), "position {position}: {spans:?}");
            assert!(spans.first().is_none_or(|s| s.0 == 0));
        }
    }
}
