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
//! a free deep in the stack cuts every band above it once. Allocations under 1/[`DETAIL_FRACTION`] of the peak get
//! no band (the level of detail: they are in the live bytes).

use std::collections::BTreeMap;

use heapscope_core::trace::Event;
use heapscope_pytorch::{CategoryId, StackId};

use crate::recording::Recording;

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

/// One allocation of the recording over its lifetime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Band {
    /// Its slot in the recording's trace.
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
    /// 1/[`DETAIL_FRACTION`] of the peak: they count in [`ActiveTimeline::live_bytes`] (and lower the bands above them
    /// when freed) but would be under half a pixel on any plot up to 2,048 pixels tall, and a recording with many of
    /// them freed out of order would otherwise cut the bands above into millions of pieces.
    pub bands: Vec<Band>,
    /// Positions: the start and one per entry.
    pub positions: u64,
    /// The most bytes live at once.
    pub peak_bytes: u64,
    /// The first position where they are.
    pub peak_position: u64,
    /// Bytes live once each position is done (index = position).
    pub live_bytes: Vec<u64>,
}

impl ActiveTimeline {
    /// The band and piece at position `position`, `bytes` above the bottom, if an allocation is there.
    pub fn at(&self, position: u64, bytes: u64) -> Option<(&Band, &Piece)> {
        self.bands.iter().find_map(|band| {
            let piece = band.pieces.iter().find(|piece| piece.from <= position && position < piece.to)?;
            (piece.offset_bytes <= bytes && bytes < piece.offset_bytes + band.size_bytes).then_some((band, piece))
        })
    }
}

/// Allocations under this fraction of the peak live bytes get no band (see [`ActiveTimeline::bands`]).
pub const DETAIL_FRACTION: u64 = 4096;

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
    tree: Vec<u64>,
}

impl Below {
    fn new(len: usize) -> Self {
        Self { tree: vec![0; len + 1] }
    }

    /// Adds `delta` (wrapping: a removal adds the negation) at `order`.
    fn add(&mut self, order: u64, delta: u64) {
        let mut index = order as usize + 1;
        while index < self.tree.len() {
            self.tree[index] = self.tree[index].wrapping_add(delta);
            index += index & index.wrapping_neg();
        }
    }

    /// The sum at orders below `order`.
    fn before(&self, order: u64) -> u64 {
        let (mut index, mut sum) = (order as usize, 0u64);
        while index > 0 {
            sum = sum.wrapping_add(self.tree[index]);
            index -= index & index.wrapping_neg();
        }
        sum
    }
}

/// The active memory timeline of `recording`. See the module docs.
///
/// A free does not cut the bands above it at once (a recording freeing out of order would cut every band above
/// each time: a million allocations made 91 million pieces). A band starts at its exact height, and heights are
/// brought up to date at the start of each of [`STRETCHES`] stretches of positions, each band's height read from a
/// sum of the live sizes by allocation order: exact there, at most one stretch late in between.
pub fn build(recording: &Recording) -> ActiveTimeline {
    let origins = crate::top::allocation_origins(recording);
    let events = recording.trace.events();
    let positions = recording.entries + 1;
    let mut timeline = ActiveTimeline { positions, live_bytes: vec![0; positions as usize], ..ActiveTimeline::default() };
    // The banded allocations live, by allocation order, each with its open piece; each slot's order and size.
    let mut open: BTreeMap<u64, Open> = BTreeMap::new();
    let mut order_of: Vec<Option<(u64, u64)>> = vec![None; recording.trace.slots() as usize];
    let allocs = events.iter().filter(|event| matches!(event, Event::Alloc { .. })).count();
    let mut below = Below::new(allocs);
    // Allocations this small get no band of their own: under half a pixel on any plot up to 2,048 pixels tall.
    let detail_bytes = crate::top::peak(recording).1 / DETAIL_FRACTION;
    let (mut next_order, mut live_bytes) = (0u64, 0u64);
    // Positions of `live_bytes` written so far; the stretch the heights were last brought up to date in.
    let mut filled = 0usize;
    let mut stretch = 0u64;
    let close = |timeline: &mut ActiveTimeline, open: &Open, to: u64| {
        if to > open.since {
            timeline.bands[open.band].pieces.push(Piece { from: open.since, to, offset_bytes: open.offset_bytes });
        }
    };
    // Each band whose height changed gets a new piece from `position`.
    let refresh = |timeline: &mut ActiveTimeline, open: &mut BTreeMap<u64, Open>, below: &Below, position: u64| {
        for (&order, band) in open.iter_mut() {
            let offset_bytes = below.before(order);
            if offset_bytes != band.offset_bytes {
                close(timeline, band, position);
                (band.since, band.offset_bytes) = (position, offset_bytes);
            }
        }
    };
    for (index, event) in (0..).zip(events) {
        let position = recording.moment_of(index).position();
        match *event {
            Event::Alloc { slot, size_bytes } => {
                if size_bytes >= detail_bytes {
                    // Its own height is exact (the bands below may be a stretch late until the next refresh).
                    let origin = origins[index as usize];
                    timeline.bands.push(Band {
                        slot,
                        size_bytes,
                        stack: origin.stack,
                        category: origin.category,
                        pieces: Vec::new(),
                    });
                    let band = Open { band: timeline.bands.len() - 1, since: position, offset_bytes: below.before(next_order) };
                    open.insert(next_order, band);
                }
                below.add(next_order, size_bytes);
                order_of[slot as usize] = Some((next_order, size_bytes));
                next_order += 1;
                live_bytes += size_bytes;
            }
            Event::Free { slot } => {
                let Some((order, size_bytes)) = order_of.get_mut(slot as usize).and_then(Option::take) else { continue };
                if let Some(band) = open.remove(&order) {
                    close(&mut timeline, &band, position);
                }
                below.add(order, size_bytes.wrapping_neg());
                live_bytes -= size_bytes;
            }
        }
        // The peak once the moment is done: the next event belongs to a later one (or there is none).
        let moment_done = events.get(index as usize + 1).is_none() || recording.moment_of(index + 1).position() != position;
        if moment_done {
            // The first moment done in a new stretch brings the heights up to date from there.
            let here_stretch =
                u64::try_from(u128::from(position) * u128::from(STRETCHES) / u128::from(positions)).unwrap_or(u64::MAX);
            if here_stretch != stretch {
                refresh(&mut timeline, &mut open, &below, position);
                stretch = here_stretch;
            }
            // Positions without an event of their own keep the bytes of the one before.
            let here = (position as usize).min(timeline.live_bytes.len());
            let before = timeline.live_bytes.get(filled.saturating_sub(1)).copied().unwrap_or(0);
            timeline.live_bytes[filled.min(here)..here].fill(before);
            if let Some(slot) = timeline.live_bytes.get_mut(here) {
                *slot = live_bytes;
            }
            filled = here + 1;
            if live_bytes > timeline.peak_bytes {
                (timeline.peak_bytes, timeline.peak_position) = (live_bytes, position);
            }
        }
    }
    let last = timeline.live_bytes.get(filled.saturating_sub(1)).copied().unwrap_or(0);
    let total = timeline.live_bytes.len();
    timeline.live_bytes[filled.min(total)..].fill(last);
    let end = timeline.positions;
    for band in open.values() {
        close(&mut timeline, band, end);
    }
    // An allocation freed in the moment it was made (an out-of-memory request) was never live.
    timeline.bands.retain(|band| !band.pieces.is_empty());
    timeline
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

    /// An allocation under 1/4096 of the peak gets no band, but its bytes and its free still move the bands above.
    #[test]
    fn tiny_allocations_have_no_band_but_count() {
        let timeline = build(&recording(&format!("a,0,1\na,1,{}\nf,0\n", 1 << 20)));
        assert_eq!(timeline.bands.len(), 1);
        let band = &timeline.bands[0];
        assert_eq!(band.slot, 1);
        let pieces: Vec<(u64, u64, u64)> = band.pieces.iter().map(|p| (p.from, p.to, p.offset_bytes)).collect();
        assert_eq!(pieces, [(2, 3, 1), (3, 4, 0)]);
        assert_eq!(timeline.live_bytes, [0, 1, (1 << 20) + 1, 1 << 20]);
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
