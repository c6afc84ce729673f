//! Compaction: planning moves that turn a heap's scattered free runs into fewer, larger ones.
//!
//! A heap that refuses a request with enough bytes free in total (an [`crate::OomCause::Fragmentation`] verdict) can
//! be cured by moving allocations: VMA's defragmentation plans moves, the application copies the bytes and rebinds
//! its resources, VMA updates its metadata. This module is the planning, as plain data: given a [`Layout`] (blocks
//! and where each allocation sits in them) it returns the [`Move`]s, in the order they must be applied; copying the
//! bytes (on the device, or by remapping sparse pages) and telling the owners of moved handles are the caller's.
//!
//! The algorithms follow VMA's three ([`Algorithm`]):
//!
//! - [`Algorithm::Fast`] empties whole blocks: the blocks holding the fewest live bytes give their allocations to the
//!   free runs of the fullest ones (first fit by offset), a block at a time, and only when every allocation of that
//!   block finds room, so the block can be released.
//! - [`Algorithm::Balanced`] does the same, then slides the allocations of each block whose free space is split
//!   down to its start, so what is free in a block is one run at its end.
//! - [`Algorithm::Full`] slides every block first, so that the blocks' free space is gathered before blocks are
//!   emptied into it.
//!
//! Every plan keeps three promises, checked by the property tests against a model of the bytes: after the moves,
//! no two allocations overlap and each holds the bytes it held; pinned allocations stay where they are; and the
//! largest free run (a block emptied counts whole) is never smaller than before. A [`Budget`] bounds the bytes
//! and moves of one pass: a block is emptied only when all its moves fit in what is left of it, and a slide is cut
//! short where the budget ends (any prefix of a slide is one).

use std::collections::BTreeSet;

/// One allocation as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Placed {
    /// The caller's handle for it (reported back in each [`Move`]).
    pub id: u64,
    /// Index of its block in [`Layout::block_sizes`].
    pub block: usize,
    /// Offset in the block.
    pub offset: u64,
    /// Bytes.
    pub size_bytes: u64,
    /// Its offset stays a multiple of this (a power of two; 1 for none).
    pub alignment_bytes: u64,
    /// May not move (a resource the caller cannot rebind).
    pub pinned: bool,
}

/// Blocks and the allocations in them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Layout {
    /// Each block's size in bytes.
    pub block_sizes: Vec<u64>,
    /// The allocations, in any order.
    pub allocations: Vec<Placed>,
}

/// How hard a pass tries (VMA's fast / balanced / full; see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Algorithm {
    /// Empty whole blocks into the free runs of others.
    Fast,
    /// Empty whole blocks, then slide the allocations of blocks whose free space is split.
    #[default]
    Balanced,
    /// Slide every block, then empty whole blocks.
    Full,
}

impl Algorithm {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fast => "fast",
            Self::Balanced => "balanced",
            Self::Full => "full",
        }
    }
}

impl std::str::FromStr for Algorithm {
    type Err = crate::UnknownName;

    fn from_str(text: &str) -> Result<Self, crate::UnknownName> {
        [Self::Fast, Self::Balanced, Self::Full].into_iter().find(|a| a.name() == text).ok_or_else(|| crate::UnknownName {
            what: "compaction algorithm",
            name: text.to_owned(),
            expected: "fast, balanced or full".to_owned(),
        })
    }
}

/// The most one pass may move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Budget {
    /// Bytes copied (or remapped).
    pub max_bytes: u64,
    /// Moves.
    pub max_moves: usize,
}

impl Budget {
    /// No limit.
    pub const UNLIMITED: Budget = Budget { max_bytes: u64::MAX, max_moves: usize::MAX };

    /// Whether `moves` more moves of `bytes` fit, after `moves_done` of `bytes_done`.
    pub fn allows(&self, moves_done: usize, bytes_done: u64, moves: usize, bytes: u64) -> bool {
        moves_done.saturating_add(moves) <= self.max_moves
            && bytes_done.checked_add(bytes).is_some_and(|total| total <= self.max_bytes)
    }
}

/// One allocation moved: from where to where. Apply a plan's moves in order; each destination is free when its turn
/// comes (earlier moves may have vacated it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Move {
    /// The allocation's [`Placed::id`].
    pub id: u64,
    /// Bytes.
    pub size_bytes: u64,
    /// Block it leaves.
    pub from_block: usize,
    /// Offset it leaves.
    pub from_offset: u64,
    /// Block it goes to.
    pub to_block: usize,
    /// Offset it goes to.
    pub to_offset: u64,
}

impl Move {
    /// Source and destination share bytes (a slide within a block by less than its size): a copy must go through a
    /// staging buffer or run front to back (Vulkan's `vkCmdCopyBuffer` forbids overlapping regions).
    pub fn overlaps_itself(&self) -> bool {
        self.from_block == self.to_block
            && self.from_offset < self.to_offset + self.size_bytes
            && self.to_offset < self.from_offset + self.size_bytes
    }
}

/// What a pass will do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Plan {
    /// The moves, in order.
    pub moves: Vec<Move>,
    /// Their bytes.
    pub bytes_moved: u64,
    /// Blocks that hold nothing after the moves and held something before: the caller may release them.
    pub blocks_emptied: Vec<usize>,
    /// The largest free run before the moves (an empty block counts whole).
    pub largest_free_before_bytes: u64,
    /// And after.
    pub largest_free_after_bytes: u64,
}

/// Plans one pass of `algorithm` over `layout`, within `budget`. Allocations that overlap, lie outside their
/// block or name a block that does not exist are left where they are (and so is everything in their block).
pub fn plan(layout: &Layout, algorithm: Algorithm, budget: Budget) -> Plan {
    let mut state = State::new(layout);
    let before = state.largest_free_run();
    let mut planner = Planner { state: &mut state, budget, moves: Vec::new(), bytes: 0 };
    match algorithm {
        Algorithm::Fast => planner.empty_blocks(),
        Algorithm::Balanced => {
            planner.empty_blocks();
            planner.slide_blocks(true);
        }
        Algorithm::Full => {
            planner.slide_blocks(false);
            planner.empty_blocks();
        }
    }
    let Planner { moves, bytes, .. } = planner;
    let blocks_emptied = (0..layout.block_sizes.len())
        .filter(|&b| state.blocks[b].is_empty() && layout.allocations.iter().any(|a| a.block == b))
        .collect();
    Plan {
        moves,
        bytes_moved: bytes,
        blocks_emptied,
        largest_free_before_bytes: before,
        largest_free_after_bytes: state.largest_free_run(),
    }
}

impl Layout {
    /// The layout after `moves` (each allocation found by its id; a move of an unknown id changes nothing).
    pub fn after(&self, moves: &[Move]) -> Layout {
        let mut layout = self.clone();
        for m in moves {
            if let Some(a) = layout.allocations.iter_mut().find(|a| a.id == m.id) {
                a.block = m.to_block;
                a.offset = m.to_offset;
            }
        }
        layout
    }

    /// The largest free run in any block (an empty block counts whole).
    pub fn largest_free_run(&self) -> u64 {
        State::new(self).largest_free_run()
    }
}

/// Each block's allocations by offset: (offset, end, index into the layout's allocations).
struct State<'l> {
    layout: &'l Layout,
    block_sizes: Vec<u64>,
    blocks: Vec<BTreeSet<(u64, u64, usize)>>,
    /// Blocks with a pinned allocation: never emptied.
    pinned: Vec<bool>,
    /// Blocks with an allocation the planner cannot read (overlapping another, outside the block, misaligned,
    /// empty): left alone, and not counted in the largest free run.
    malformed: Vec<bool>,
}

impl<'l> State<'l> {
    fn new(layout: &'l Layout) -> State<'l> {
        let count = layout.block_sizes.len();
        let mut blocks = vec![BTreeSet::new(); count];
        let mut pinned = vec![false; count];
        let mut malformed = vec![false; count];
        for (index, a) in layout.allocations.iter().enumerate() {
            let Some(set) = blocks.get_mut(a.block) else { continue };
            let end = a.offset.checked_add(a.size_bytes).filter(|&end| end <= layout.block_sizes[a.block]);
            match end {
                Some(end) if a.size_bytes > 0 && a.alignment_bytes.is_power_of_two() && a.offset % a.alignment_bytes == 0 => {
                    pinned[a.block] |= a.pinned;
                    set.insert((a.offset, end, index));
                }
                _ => malformed[a.block] = true,
            }
        }
        for (block, set) in blocks.iter().enumerate() {
            let mut cursor = 0;
            for &(start, end, _) in set {
                malformed[block] |= start < cursor;
                cursor = cursor.max(end);
            }
        }
        State { layout, block_sizes: layout.block_sizes.clone(), blocks, pinned, malformed }
    }

    fn free_runs(&self, block: usize) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut cursor = 0;
        for &(start, end, _) in &self.blocks[block] {
            if start > cursor {
                runs.push((cursor, start));
            }
            cursor = cursor.max(end);
        }
        if self.block_sizes[block] > cursor {
            runs.push((cursor, self.block_sizes[block]));
        }
        runs
    }

    fn largest_free_run(&self) -> u64 {
        (0..self.blocks.len())
            .filter(|&b| !self.malformed[b])
            .flat_map(|b| self.free_runs(b))
            .map(|(s, e)| e - s)
            .max()
            .unwrap_or(0)
    }

    /// The lowest offset in `block` where `a` fits, aligned.
    fn first_fit(&self, block: usize, a: &Placed) -> Option<u64> {
        self.free_runs(block).into_iter().find_map(|(start, end)| {
            let at = start.checked_next_multiple_of(a.alignment_bytes)?;
            (at.checked_add(a.size_bytes)? <= end).then_some(at)
        })
    }

    fn live_bytes(&self, block: usize) -> u64 {
        self.blocks[block].iter().map(|&(s, e, _)| e - s).sum()
    }
}

struct Planner<'s, 'l> {
    state: &'s mut State<'l>,
    budget: Budget,
    moves: Vec<Move>,
    bytes: u64,
}

impl Planner<'_, '_> {
    fn room_for(&self, moves: &[Move]) -> bool {
        let bytes: u64 = moves.iter().map(|m| m.size_bytes).sum();
        self.budget.allows(self.moves.len(), self.bytes, moves.len(), bytes)
    }

    fn apply(&mut self, moves: Vec<Move>, indices: &[usize]) {
        for (m, &index) in moves.iter().zip(indices) {
            let from = &mut self.state.blocks[m.from_block];
            from.remove(&(m.from_offset, m.from_offset + m.size_bytes, index));
            self.state.blocks[m.to_block].insert((m.to_offset, m.to_offset + m.size_bytes, index));
            self.bytes += m.size_bytes;
        }
        self.moves.extend(moves);
    }

    /// Empties blocks, the fewest live bytes first, into the fullest blocks' free runs.
    fn empty_blocks(&mut self) {
        let count = self.state.blocks.len();
        let usable = |b: usize| !self.state.malformed[b] && !self.state.blocks[b].is_empty();
        let mut sources: Vec<usize> = (0..count).filter(|&b| usable(b) && !self.state.pinned[b]).collect();
        sources.sort_by_key(|&b| (self.state.live_bytes(b), std::cmp::Reverse(b)));
        let mut emptied = vec![false; count];
        for source in sources {
            let before = self.state.largest_free_run();
            let mut destinations: Vec<usize> = (0..count)
                .filter(|&b| b != source && !emptied[b] && !self.state.malformed[b] && !self.state.blocks[b].is_empty())
                .collect();
            destinations.sort_by_key(|&b| (std::cmp::Reverse(self.state.live_bytes(b)), b));
            // The source's allocations, largest first, each to the first destination with room: tried on a copy.
            let mut items: Vec<(u64, u64, usize)> = self.state.blocks[source].iter().copied().collect();
            items.sort_by_key(|&(s, e, _)| (std::cmp::Reverse(e - s), s));
            let saved: Vec<BTreeSet<(u64, u64, usize)>> = destinations.iter().map(|&d| self.state.blocks[d].clone()).collect();
            let mut moves = Vec::new();
            let mut indices = Vec::new();
            let mut all_fit = true;
            for &(offset, end, index) in &items {
                let a = self.state.layout.allocations[index];
                let found = destinations.iter().find_map(|&d| self.state.first_fit(d, &a).map(|at| (d, at)));
                let Some((to_block, to_offset)) = found else {
                    all_fit = false;
                    break;
                };
                self.state.blocks[to_block].insert((to_offset, to_offset + a.size_bytes, index));
                moves.push(Move {
                    id: a.id,
                    size_bytes: end - offset,
                    from_block: source,
                    from_offset: offset,
                    to_block,
                    to_offset,
                });
                indices.push(index);
            }
            for (&d, blocks) in destinations.iter().zip(saved) {
                self.state.blocks[d] = blocks;
            }
            if !all_fit || !self.room_for(&moves) {
                continue;
            }
            let kept = self.state.blocks.clone();
            self.apply(moves.clone(), &indices);
            if self.state.largest_free_run() < before {
                // Filling the runs cost more than the block gave back: undone.
                self.state.blocks = kept;
                self.moves.truncate(self.moves.len() - moves.len());
                self.bytes -= moves.iter().map(|m| m.size_bytes).sum::<u64>();
                continue;
            }
            emptied[source] = true;
        }
    }

    /// Slides each block's movable allocations down to the lowest offsets they fit, in offset order (each stays
    /// below the next pinned one). `only_split`: only blocks whose free space is in more than one run.
    fn slide_blocks(&mut self, only_split: bool) {
        for block in 0..self.state.blocks.len() {
            if self.state.malformed[block] || only_split && self.state.free_runs(block).len() < 2 {
                continue;
            }
            let items: Vec<(u64, u64, usize)> = self.state.blocks[block].iter().copied().collect();
            let mut moves = Vec::new();
            let mut indices = Vec::new();
            let mut cursor = 0;
            for &(offset, end, index) in &items {
                let a = self.state.layout.allocations[index];
                if a.pinned {
                    cursor = end;
                    continue;
                }
                let at = cursor.next_multiple_of(a.alignment_bytes);
                if at < offset {
                    moves.push(Move {
                        id: a.id,
                        size_bytes: end - offset,
                        from_block: block,
                        from_offset: offset,
                        to_block: block,
                        to_offset: at,
                    });
                    indices.push(index);
                    cursor = at + a.size_bytes;
                } else {
                    cursor = end;
                }
            }
            // Any prefix of a slide is a slide: as many moves as the budget lets through.
            while !moves.is_empty() && !self.room_for(&moves) {
                moves.pop();
            }
            if !moves.is_empty() {
                self.apply(moves, &indices);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn placed(id: u64, block: usize, offset: u64, size_bytes: u64) -> Placed {
        Placed { id, block, offset, size_bytes, alignment_bytes: 1, pinned: false }
    }

    /// Applies `plan` to a model of the bytes (each byte knows its allocation and its index in it), checking that every
    /// destination is free when its move comes; returns the layout after.
    fn apply_to_bytes(layout: &Layout, plan: &Plan) -> Layout {
        let mut bytes: Vec<Vec<Option<(u64, u64)>>> = layout.block_sizes.iter().map(|&s| vec![None; s as usize]).collect();
        for a in &layout.allocations {
            for i in 0..a.size_bytes {
                bytes[a.block][(a.offset + i) as usize] = Some((a.id, i));
            }
        }
        for m in &plan.moves {
            let taken: Vec<Option<(u64, u64)>> =
                (0..m.size_bytes).map(|i| bytes[m.from_block][(m.from_offset + i) as usize].take()).collect();
            assert!(taken.iter().enumerate().all(|(i, b)| *b == Some((m.id, i as u64))), "{m:?} moves what it holds");
            for (i, b) in taken.into_iter().enumerate() {
                let slot = &mut bytes[m.to_block][m.to_offset as usize + i];
                assert!(slot.is_none(), "{m:?}: its destination is free when it comes");
                *slot = b;
            }
        }
        let after = layout.after(&plan.moves);
        for a in &after.allocations {
            for i in 0..a.size_bytes {
                assert_eq!(bytes[a.block][(a.offset + i) as usize], Some((a.id, i)), "{a:?} holds its bytes");
            }
        }
        after
    }

    fn check(layout: &Layout, algorithm: Algorithm, budget: Budget) -> (Plan, Layout) {
        let plan = plan(layout, algorithm, budget);
        let after = apply_to_bytes(layout, &plan);
        assert_eq!(plan.largest_free_before_bytes, layout.largest_free_run());
        assert_eq!(plan.largest_free_after_bytes, after.largest_free_run());
        assert!(plan.largest_free_after_bytes >= plan.largest_free_before_bytes, "{algorithm:?}: {plan:?}");
        assert!(plan.moves.len() <= budget.max_moves && plan.bytes_moved <= budget.max_bytes);
        assert_eq!(plan.bytes_moved, plan.moves.iter().map(|m| m.size_bytes).sum::<u64>());
        for (a, b) in layout.allocations.iter().zip(&after.allocations) {
            assert!(!a.pinned || a == b, "{a:?} is pinned");
            assert_eq!(b.offset % b.alignment_bytes, 0, "{b:?} stays aligned");
        }
        for &block in &plan.blocks_emptied {
            assert!(after.allocations.iter().all(|a| a.block != block), "block {block} emptied");
        }
        (plan, after)
    }

    /// (what, the layout as (block sizes, allocations (block, offset, size)), algorithm, budget in moves, what must
    /// hold after: the largest free run, and the blocks emptied)
    #[test]
    fn each_algorithm_on_small_heaps() {
        type Case = (&'static str, &'static [u64], &'static [(usize, u64, u64)], Algorithm, usize, u64, &'static [usize]);
        let cases: &[Case] = &[
            (
                "fast empties the emptiest block into the holes of the others",
                &[100, 100],
                &[(0, 0, 30), (0, 50, 30), (1, 10, 20)],
                Algorithm::Fast,
                usize::MAX,
                100,
                &[1],
            ),
            (
                "fast moves nothing when no block can be emptied",
                &[100, 100],
                &[(0, 0, 60), (1, 0, 60)],
                Algorithm::Fast,
                usize::MAX,
                40,
                &[],
            ),
            (
                "balanced slides a block whose free space is split",
                &[100],
                &[(0, 10, 20), (0, 50, 20)],
                Algorithm::Balanced,
                usize::MAX,
                60,
                &[],
            ),
            (
                "full slides, then the tails take a whole block",
                &[100, 100, 100],
                &[(0, 10, 40), (0, 70, 20), (1, 30, 30), (2, 50, 20)],
                Algorithm::Full,
                usize::MAX,
                100,
                &[2],
            ),
            ("a budget of one move slides the first", &[100], &[(0, 10, 20), (0, 50, 20)], Algorithm::Balanced, 1, 30, &[]),
            (
                "nine 100s with 50 free between them in five blocks of 300: full packs them into three",
                &[300, 300, 300, 300, 300],
                &[
                    (0, 0, 100),
                    (0, 150, 100),
                    (1, 0, 100),
                    (1, 150, 100),
                    (2, 0, 100),
                    (2, 150, 100),
                    (3, 0, 100),
                    (3, 150, 100),
                    (4, 0, 100),
                ],
                Algorithm::Full,
                usize::MAX,
                300,
                &[3, 4],
            ),
        ];
        for &(what, sizes, allocations, algorithm, max_moves, largest, emptied) in cases {
            let layout = Layout {
                block_sizes: sizes.to_vec(),
                allocations: allocations.iter().enumerate().map(|(i, &(b, o, s))| placed(i as u64, b, o, s)).collect(),
            };
            let (plan, _) = check(&layout, algorithm, Budget { max_bytes: u64::MAX, max_moves });
            assert_eq!((plan.largest_free_after_bytes, &plan.blocks_emptied[..]), (largest, emptied), "{what}: {plan:?}");
        }
    }

    #[test]
    fn a_pinned_allocation_stays_and_its_block_is_never_emptied() {
        let mut layout = Layout {
            block_sizes: vec![100, 100],
            allocations: vec![placed(0, 0, 0, 50), placed(1, 1, 40, 10), placed(2, 1, 70, 10)],
        };
        layout.allocations[1].pinned = true;
        let (plan, after) = check(&layout, Algorithm::Full, Budget::UNLIMITED);
        assert!(plan.blocks_emptied.is_empty(), "{plan:?}");
        assert_eq!(after.allocations[1], layout.allocations[1]);
        assert_eq!(after.allocations[2].offset, 50, "slid down to the pinned one");
    }

    #[test]
    fn malformed_blocks_are_left_alone() {
        let layout = Layout {
            block_sizes: vec![100, 100],
            allocations: vec![placed(0, 0, 10, 50), placed(1, 0, 40, 20), placed(2, 1, 90, 20), placed(3, 7, 0, 10)],
        };
        let plan = plan(&layout, Algorithm::Full, Budget::UNLIMITED);
        assert!(plan.moves.is_empty(), "{plan:?}");
        assert_eq!(plan.largest_free_before_bytes, 0, "neither block is read");
    }

    /// Random heaps, aligned and pinned allocations among them, every algorithm and budget: the promises of the module
    /// docs hold, against the byte model.
    #[test]
    fn plans_keep_their_promises_on_random_heaps() {
        let mut rng = Rng::new(16);
        let mut moved = 0;
        for round in 0..400 {
            let blocks = 1 + rng.range(0, 6) as usize;
            let block_sizes: Vec<u64> = (0..blocks).map(|_| 64 << rng.range(0, 3)).collect();
            let mut allocations = Vec::new();
            for (block, &size) in block_sizes.iter().enumerate() {
                let mut cursor = rng.range(0, 16);
                while cursor < size {
                    let alignment = 1u64 << rng.range(0, 4);
                    let offset = cursor.next_multiple_of(alignment);
                    let bytes = 1 + rng.range(0, 24);
                    if offset + bytes > size {
                        break;
                    }
                    let pinned = rng.chance(0.05);
                    allocations.push(Placed {
                        id: 1000 + allocations.len() as u64,
                        block,
                        offset,
                        size_bytes: bytes,
                        alignment_bytes: alignment,
                        pinned,
                    });
                    cursor = offset + bytes + rng.range(0, 20);
                }
            }
            let layout = Layout { block_sizes, allocations };
            for algorithm in [Algorithm::Fast, Algorithm::Balanced, Algorithm::Full] {
                let budget = match round % 3 {
                    0 => Budget::UNLIMITED,
                    1 => Budget { max_bytes: u64::MAX, max_moves: rng.range(0, 5) as usize },
                    _ => Budget { max_bytes: rng.range(0, 100), max_moves: usize::MAX },
                };
                let (plan, after) = check(&layout, algorithm, budget);
                moved += usize::from(!plan.moves.is_empty());
                if budget == Budget::UNLIMITED && algorithm == Algorithm::Full {
                    // A second full pass finds nothing more to slide in a block without pins.
                    let again = super::plan(&after, Algorithm::Full, Budget::UNLIMITED);
                    assert!(again.largest_free_after_bytes >= plan.largest_free_after_bytes);
                }
            }
        }
        assert!(moved >= 400, "plans moved something in {moved} of 1,200 passes");
    }

    #[test]
    fn algorithms_by_name() {
        for algorithm in [Algorithm::Fast, Algorithm::Balanced, Algorithm::Full] {
            assert_eq!(algorithm.name().parse::<Algorithm>(), Ok(algorithm));
        }
        assert!("quick".parse::<Algorithm>().unwrap_err().to_string().contains("fast, balanced or full"));
    }
}
