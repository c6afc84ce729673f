//! Compacting a heap of blocks: the moves of [`crate::compaction`]'s algorithms, placed by the blocks' own policies.
//!
//! The heap does not know its callers' handles; the caller lists the allocations it lets move ([`Movable`]: the
//! handle and the request that made it; whatever is not listed is pinned) and gets back which handles changed
//! ([`HeapMove`]: old and new), and rebinds what used them. The bytes are the source's to copy: before blocks the
//! moves emptied go back, the heap asks its [`MemorySource`] to copy every move's bytes from the old place to the new
//! one, in the order of the moves ([`MemorySource::copy_between_blocks`]: a device records the copies with a barrier
//! between each; a simulated device has no bytes). A new place is always taken while the old one is still held, so no
//! move's source and destination overlap, and labels follow their allocations.
//!
//! As VMA's defragmentation does, the policies place the moved allocations (a policy cannot be told an offset):
//! emptying a block asks the fullest other blocks, fullest first, for room for each of its allocations, largest
//! first, and commits only when all of them found room; a slide within a block asks the block for a second place
//! for each allocation, highest first, and keeps it when it is lower. Every step is checked first against the free
//! runs it would leave, so the largest free run of the blocks a request could use never shrinks. Only policies that
//! coalesce free space (`tlsf`, `best-fit`, `first-fit`) can be checked that way; a heap of another policy moves
//! nothing. Blocks emptied then go back to the source as the heap's [`super::ReleaseRule`] says for a block that
//! becomes empty.

use std::collections::HashMap;

use super::{Heap, HeapAllocation};
use crate::compaction::{Algorithm, Budget};
use crate::report::{PolicyReport, RangeState};
use crate::source::{BlockCopy, MemorySource, SourceError};
use crate::{AllocationId, Error, Request, Result};

/// An allocation the caller lets compaction move, with the request that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Movable {
    /// Its handle now.
    pub allocation: HeapAllocation,
    /// What it was allocated with (size, alignment, resource kind): its new place honours the same.
    pub request: Request,
}

/// One allocation moved: the handle it had and the handle it has now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapMove {
    /// The handle before (no longer valid).
    pub from: HeapAllocation,
    /// The handle after.
    pub to: HeapAllocation,
}

/// What a compaction did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapCompaction {
    /// The moves, in the order the bytes must be copied.
    pub moves: Vec<HeapMove>,
    /// Their bytes.
    pub bytes_moved: u64,
    /// Blocks the moves emptied (given back to the source or kept as the heap's release rule says).
    pub blocks_emptied: usize,
    /// The largest free run of the blocks a request could use, before.
    pub largest_free_before_bytes: u64,
    /// And after the moves (blocks they emptied counted whole, before the release rule gives any back).
    pub largest_free_after_bytes: u64,
}

impl<S: MemorySource> Heap<S> {
    /// Moves allocations of `movable` to gather free space ([`Algorithm`]), within `budget`, and has the source copy
    /// their bytes; see the module docs. Handles of other heaps, and of blocks no longer held, are left out.
    ///
    /// # Errors
    /// [`Error::Source`] when the source fails to copy: the moves stand (every returned handle is gone, the new ones
    /// are not returned), but the moved allocations' bytes are not defined.
    pub fn compact(&mut self, movable: &[Movable], algorithm: Algorithm, budget: Budget) -> Result<HeapCompaction> {
        let mut compaction =
            HeapCompaction { largest_free_before_bytes: self.largest_usable_free_run(), ..HeapCompaction::default() };
        if !self.config.policy.places_by_address() {
            compaction.largest_free_after_bytes = compaction.largest_free_before_bytes;
            return Ok(compaction);
        }
        let mut live: HashMap<(u32, AllocationId), Movable> = HashMap::new();
        for m in movable {
            let held = self.blocks.get(m.allocation.block as usize).is_some_and(Option::is_some);
            if m.allocation.owner == self.owner && held {
                live.insert((m.allocation.block, m.allocation.allocation.id()), *m);
            }
        }
        let mut pass = Pass { live, budget, compaction, emptied: Vec::new() };
        match algorithm {
            Algorithm::Fast => self.empty_blocks(&mut pass),
            Algorithm::Balanced => {
                self.empty_blocks(&mut pass);
                self.slide_blocks(&mut pass, true);
            }
            Algorithm::Full => {
                self.slide_blocks(&mut pass, false);
                self.empty_blocks(&mut pass);
            }
        }
        let mut compaction = pass.compaction;
        compaction.largest_free_after_bytes = self.largest_usable_free_run();
        // The bytes move before any block they leave goes back: whole 4-byte words where every offset and size is a
        // multiple of 4 (`min_align_bytes`), the words kernels write whole (a move that left an allocation's last 1 to 3
        // bytes of padding behind read as damage on a device), else exactly its bytes (its neighbour may start there).
        let words = self.config.policy_config.min_align_bytes >= 4;
        let copied_bytes =
            |size_bytes: u64| if words { size_bytes.checked_next_multiple_of(4).unwrap_or(size_bytes) } else { size_bytes };
        let copies: Vec<BlockCopy> = compaction
            .moves
            .iter()
            .map(|m| BlockCopy {
                from_block: self.source_handle(m.from.block),
                from_offset_bytes: m.from.offset(),
                to_block: self.source_handle(m.to.block),
                to_offset_bytes: m.to.offset(),
                size_bytes: copied_bytes(m.from.size_bytes()),
            })
            .collect();
        let copied = if copies.is_empty() { Ok(()) } else { self.source.copy_between_blocks(&copies) };
        for index in pass.emptied {
            self.block_emptied(index);
        }
        match copied {
            Ok(()) => Ok(compaction),
            Err(SourceError::OutOfMemory { requested_bytes }) => {
                Err(Error::Source(format!("copying {} moves: out of device memory for {requested_bytes} bytes", copies.len())))
            }
            Err(SourceError::Failed(why)) => Err(Error::Source(format!("copying {} moves: {why}", copies.len()))),
        }
    }

    /// The source's handle of block `index` (held: a move's blocks are held until the copies are done).
    fn source_handle(&self, index: u32) -> u64 {
        self.blocks.get(index as usize).and_then(Option::as_ref).map_or(u64::MAX, |block| block.source.handle)
    }

    /// The largest free run in the blocks a request could use (shared ones, and empty ones).
    fn largest_usable_free_run(&self) -> u64 {
        self.blocks
            .iter()
            .flatten()
            .filter(|b| !b.dedicated || b.live == 0)
            .map(|b| largest_run(&b.policy.report(), &[]))
            .max()
            .unwrap_or(0)
    }

    /// Blocks emptied into the others, the fewest live bytes first.
    fn empty_blocks(&mut self, pass: &mut Pass) {
        let shared = |heap: &Self, index: usize| heap.blocks[index].as_ref().is_some_and(|b| !b.dedicated && b.live > 0);
        let live_bytes =
            |heap: &Self, index: usize| heap.blocks[index].as_ref().map_or(0, |b| b.policy.report().totals().live_bytes);
        // Blocks whose every allocation may move.
        let mut movable = vec![0usize; self.blocks.len()];
        for &(block, _) in pass.live.keys() {
            if let Some(count) = movable.get_mut(block as usize) {
                *count += 1;
            }
        }
        let mut sources: Vec<usize> = (0..self.blocks.len())
            .filter(|&i| shared(self, i) && movable[i] == self.blocks[i].as_ref().map_or(0, |b| b.live))
            .collect();
        sources.sort_by_cached_key(|&i| (live_bytes(self, i), std::cmp::Reverse(i)));
        // Each block's live bytes and the heap's largest usable free run, as known until a block emptied changes them
        // (places taken and given back leave every block as it was: the policies coalesce).
        let mut known_live: Vec<Option<u64>> = vec![None; self.blocks.len()];
        let mut known_before = None;
        for source in sources {
            if !shared(self, source) {
                continue;
            }
            let mut items = pass.movable_in(source as u32);
            // Ties by offset: `movable_in` comes in hash order, and the moves must not depend on it.
            items.sort_by_key(|m| (std::cmp::Reverse(m.request.size_bytes()), m.allocation.offset()));
            let bytes: u64 = items.iter().map(|m| m.allocation.size_bytes()).sum();
            if !pass.room_for(items.len(), bytes) {
                continue;
            }
            let mut destinations: Vec<usize> = (0..self.blocks.len()).filter(|&i| i != source && shared(self, i)).collect();
            destinations
                .sort_by_cached_key(|&i| (std::cmp::Reverse(*known_live[i].get_or_insert_with(|| live_bytes(self, i))), i));
            // Room for each, largest first, in the fullest blocks first: taken now, given back unless all find room.
            let before = *known_before.get_or_insert_with(|| self.largest_usable_free_run());
            let mut placed: Vec<(Movable, u32, crate::Allocation)> = Vec::new();
            for m in &items {
                let found = destinations.iter().find_map(|&d| {
                    let block = self.blocks[d].as_mut()?;
                    let allocation = block.policy.allocate(m.request)?;
                    block.refresh();
                    Some((d as u32, allocation))
                });
                match found {
                    Some((d, allocation)) => placed.push((*m, d, allocation)),
                    None => break,
                }
            }
            let source_bytes = self.blocks[source].as_ref().map_or(0, |b| b.source.size_bytes);
            if placed.len() < items.len() || self.largest_usable_free_run().max(source_bytes) < before {
                for &(_, d, allocation) in &placed {
                    self.give_back(d, allocation);
                }
                continue;
            }
            known_before = None;
            known_live[source] = None;
            for (m, d, allocation) in placed {
                known_live[d as usize] = None;
                self.commit(pass, m, d, allocation);
            }
            pass.emptied.push(source as u32);
            pass.compaction.blocks_emptied += 1;
        }
    }

    /// Each block's movable allocations, highest first, moved to a lower place the block offers.
    /// `only_split`: only blocks whose free space is in more than one run.
    fn slide_blocks(&mut self, pass: &mut Pass, only_split: bool) {
        for index in 0..self.blocks.len() {
            let Some(block) = self.blocks[index].as_ref() else { continue };
            if block.dedicated || (only_split && block.policy.report().totals().free_runs < 2) {
                continue;
            }
            let mut items = pass.movable_in(index as u32);
            items.sort_by_key(|m| std::cmp::Reverse(m.allocation.offset()));
            // The block's largest free run, known until a move changes the block (a place given back leaves it as it
            // was: the policies coalesce).
            let mut known_before = None;
            for m in items {
                if !pass.room_for(1, m.allocation.size_bytes()) {
                    return;
                }
                let Some(block) = self.blocks[index].as_mut() else { break };
                let before = *known_before.get_or_insert_with(|| largest_run(&block.policy.report(), &[]));
                // The lowest of a few places the policy offers: one whose free lists are not in address order (TLSF
                // hands out the run freed last) offers the lowest only among several. The others go back.
                let mut offered = Vec::new();
                while offered.len() < SLIDE_OFFERS
                    && let Some(place) = block.policy.allocate(m.request)
                {
                    let lowest_so_far = offered.iter().all(|other: &crate::Allocation| place.offset() < other.offset());
                    offered.push(place);
                    if !lowest_so_far || place.offset() == 0 {
                        break;
                    }
                }
                offered.sort_by_key(crate::Allocation::offset);
                let mut offered = offered.into_iter();
                let Some(allocation) = offered.next() else { continue };
                for other in offered {
                    block.policy.free(other).expect("a place just taken");
                }
                block.refresh();
                let lower = allocation.offset() < m.allocation.offset();
                if lower && largest_run(&block.policy.report(), &[m.allocation.allocation.id()]) >= before {
                    self.commit(pass, m, index as u32, allocation);
                    known_before = None;
                } else {
                    self.give_back(index as u32, allocation);
                }
            }
        }
    }

    /// Frees a place taken for a move that did not happen.
    fn give_back(&mut self, block: u32, allocation: crate::Allocation) {
        if let Some(b) = self.blocks[block as usize].as_mut() {
            b.policy.free(allocation).expect("a place just taken");
            b.refresh();
        }
        self.sync_room(block);
    }

    /// Makes a move: the old place freed, the label carried over, the move noted.
    fn commit(&mut self, pass: &mut Pass, m: Movable, block: u32, allocation: crate::Allocation) {
        let from = m.allocation;
        if let Some(b) = self.blocks[from.block as usize].as_mut() {
            b.policy.free(from.allocation).expect("a movable allocation is live");
            b.refresh();
        }
        self.sync_room(from.block);
        self.sync_room(block);
        let to = self.heap_allocation(block, allocation);
        if let Some(label) = self.labels.remove(&(from.block, from.allocation.id())) {
            self.labels.insert((to.block, to.allocation.id()), label);
        }
        pass.live.remove(&(from.block, from.allocation.id()));
        pass.live.insert((to.block, to.allocation.id()), Movable { allocation: to, request: m.request });
        pass.compaction.bytes_moved += from.size_bytes();
        pass.compaction.moves.push(HeapMove { from, to });
    }
}

/// How many places a slide asks the policy for, keeping the lowest.
const SLIDE_OFFERS: usize = 8;

/// One compaction's state: the movable allocations by (block, id), the budget and what was done.
struct Pass {
    live: HashMap<(u32, AllocationId), Movable>,
    budget: Budget,
    compaction: HeapCompaction,
    /// Blocks emptied by the pass.
    emptied: Vec<u32>,
}

impl Pass {
    fn movable_in(&self, block: u32) -> Vec<Movable> {
        self.live.iter().filter(|((b, _), _)| *b == block).map(|(_, m)| *m).collect()
    }

    fn room_for(&self, moves: usize, bytes: u64) -> bool {
        self.budget.allows(self.compaction.moves.len(), self.compaction.bytes_moved, moves, bytes)
    }
}

/// The largest run of free bytes in `report` with the allocations `freed` given back (their live and padding bytes
/// merged with the free runs beside them, as a coalescing policy merges them).
fn largest_run(report: &PolicyReport, freed: &[AllocationId]) -> u64 {
    let mut largest = 0;
    let mut run = 0;
    for range in &report.ranges {
        let free = range.state == RangeState::Free || range.allocation.is_some_and(|id| freed.contains(&id));
        run = if free { run + range.size_bytes } else { 0 };
        largest = largest.max(run);
    }
    largest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PolicyKind;
    use crate::compaction::{Algorithm, Budget};
    use crate::heap::{HeapConfig, ReleaseRule};
    use crate::rng::Rng;
    use crate::units::MIB;
    use crate::{Heap, SimulatedSource};

    fn heap(policy: PolicyKind, block_mib: u64) -> Heap<SimulatedSource> {
        let config = HeapConfig {
            block_size_bytes: block_mib * MIB,
            dedicated_threshold_bytes: u64::MAX,
            release: ReleaseRule::Never,
            ..HeapConfig::new(policy)
        };
        Heap::new(config, SimulatedSource::new(1 << 40, 2 * MIB)).unwrap()
    }

    fn request(mib: u64) -> Request {
        Request::new(mib * MIB, 256).unwrap()
    }

    /// The bytes of each live allocation, by address: what a copy of each move keeps.
    fn check_moves(before: &[Movable], compaction: &HeapCompaction) -> Vec<Movable> {
        let mut now: Vec<Movable> = before.to_vec();
        for mv in &compaction.moves {
            let slot = now.iter_mut().find(|m| m.allocation == mv.from).expect("a move of a live allocation");
            assert_ne!((mv.from.block(), mv.from.offset()), (mv.to.block(), mv.to.offset()));
            assert_eq!(mv.from.size_bytes(), mv.to.size_bytes());
            assert_eq!(mv.to.offset() % slot.request.align_bytes(), 0, "aligned as requested");
            slot.allocation = mv.to;
        }
        // No two overlap after the moves.
        let mut spans: Vec<(u64, u64)> =
            now.iter().map(|m| (m.allocation.address(), m.allocation.address() + m.allocation.size_bytes())).collect();
        spans.sort_unstable();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "overlap: {spans:?}");
        assert_eq!(compaction.bytes_moved, compaction.moves.iter().map(|m| m.from.size_bytes()).sum::<u64>());
        assert!(compaction.largest_free_after_bytes >= compaction.largest_free_before_bytes, "{compaction:?}");
        now
    }

    /// frag_oom in small: ten 150 MiB tensors in 400 MiB blocks, every other one freed, then 100 MiB ones in the holes:
    /// scattered free space no request of 300 MiB can use until compaction empties blocks into the others' holes.
    #[test]
    fn compaction_makes_room_a_fragmented_heap_refused() {
        for policy in [PolicyKind::Tlsf, PolicyKind::BestFit, PolicyKind::FirstFit] {
            let mut heap = heap(policy, 400);
            let mut live: Vec<Movable> = Vec::new();
            for i in 0..8 {
                let allocation = heap.allocate(request(120), Some(&format!("t{i}"))).unwrap();
                live.push(Movable { allocation, request: request(120) });
            }
            // Free every other one: 120 MiB holes beside 160 MiB tails.
            let kept: Vec<Movable> = live.iter().enumerate().filter(|(i, _)| i % 2 == 0).map(|(_, m)| *m).collect();
            for (_, m) in live.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
                heap.free(m.allocation).unwrap();
            }
            let before = heap.report().totals.largest_free_run_bytes;
            assert!(before < 300 * MIB, "{policy:?}: {before}");
            let compaction = heap.compact(&kept, Algorithm::Full, Budget::UNLIMITED).unwrap();
            let now = check_moves(&kept, &compaction);
            assert!(
                compaction.largest_free_after_bytes >= 300 * MIB || compaction.blocks_emptied > 0,
                "{policy:?}: {compaction:?}"
            );
            // Labels follow; every handle the caller holds now frees cleanly.
            let report = heap.report();
            let labels: Vec<String> =
                report.blocks.iter().flat_map(|b| b.layout.ranges.iter().filter_map(|r| r.label.clone())).collect();
            assert_eq!(labels.len(), kept.len(), "{policy:?}: {labels:?}");
            for m in now {
                heap.free(m.allocation).unwrap();
            }
            assert_eq!(heap.live_allocations(), 0);
        }
    }

    #[test]
    fn what_is_not_listed_stays_and_a_budget_stops_the_pass() {
        let mut heap = heap(PolicyKind::Tlsf, 100);
        let a: Vec<HeapAllocation> = (0..6).map(|_| heap.allocate(request(30), None).unwrap()).collect();
        for &x in &[a[0], a[3]] {
            heap.free(x).unwrap();
        }
        let movable: Vec<Movable> =
            [a[1], a[2], a[4]].iter().map(|&allocation| Movable { allocation, request: request(30) }).collect();
        let compaction = heap.compact(&movable, Algorithm::Full, Budget::UNLIMITED).unwrap();
        check_moves(&movable, &compaction);
        assert!(compaction.moves.iter().all(|m| m.from != a[5]), "a[5] is pinned: not listed");
        let none = heap.compact(&movable, Algorithm::Full, Budget { max_bytes: u64::MAX, max_moves: 0 }).unwrap();
        assert!(none.moves.is_empty());
    }

    #[test]
    fn other_policies_move_nothing_and_foreign_handles_are_left_out() {
        let mut buddy = heap(PolicyKind::Buddy, 64);
        let x = buddy.allocate(request(10), None).unwrap();
        let m = [Movable { allocation: x, request: request(10) }];
        assert!(buddy.compact(&m, Algorithm::Full, Budget::UNLIMITED).unwrap().moves.is_empty());
        let mut tlsf = heap(PolicyKind::Tlsf, 64);
        assert!(tlsf.compact(&m, Algorithm::Full, Budget::UNLIMITED).unwrap().moves.is_empty(), "a handle of another heap");
    }

    /// Random heaps: allocations and frees, then every algorithm with random budgets; the promises hold, and every
    /// handle the caller ends up with frees cleanly.
    #[test]
    fn compaction_keeps_its_promises_on_random_heaps() {
        let mut rng = Rng::new(61);
        let mut moved = 0;
        for round in 0..60 {
            let policy = [PolicyKind::Tlsf, PolicyKind::BestFit, PolicyKind::FirstFit][round % 3];
            let mut heap = heap(policy, 64);
            let mut live: Vec<Movable> = Vec::new();
            for _ in 0..80 {
                if !live.is_empty() && rng.chance(0.45) {
                    let i = rng.range(0, live.len() as u64 - 1) as usize;
                    heap.free(live.swap_remove(i).allocation).unwrap();
                } else {
                    let request = Request::new(rng.range(1, 20) * MIB + rng.range(0, 4096), 1 << rng.range(0, 12)).unwrap();
                    if let Ok(allocation) = heap.allocate(request, None) {
                        live.push(Movable { allocation, request });
                    }
                }
            }
            let algorithm = [Algorithm::Fast, Algorithm::Balanced, Algorithm::Full][(round / 3) % 3];
            let budget =
                if round % 2 == 0 { Budget::UNLIMITED } else { Budget { max_bytes: rng.range(0, 200) * MIB, max_moves: 8 } };
            let compaction = heap.compact(&live, algorithm, budget).unwrap();
            assert!(compaction.moves.len() <= budget.max_moves && compaction.bytes_moved <= budget.max_bytes);
            moved += usize::from(!compaction.moves.is_empty());
            let now = check_moves(&live, &compaction);
            let live_bytes: u64 = now.iter().map(|m| m.allocation.size_bytes()).sum();
            assert_eq!(heap.stats().live_bytes, live_bytes);
            for m in now {
                heap.free(m.allocation).unwrap();
            }
        }
        assert!(moved >= 20, "compaction moved something in {moved} of 60 heaps");
    }

    /// Device memory as a model: blocks that hold bytes, copied as the heap asks (or refusing to, when `fail`).
    #[derive(Debug)]
    struct BytesSource {
        inner: SimulatedSource,
        bytes: HashMap<u64, Vec<u8>>,
        fail: bool,
    }

    impl MemorySource for BytesSource {
        fn name(&self) -> &str {
            "bytes"
        }

        fn block_alignment_bytes(&self) -> u64 {
            self.inner.block_alignment_bytes()
        }

        fn allocate_block(&mut self, size_bytes: u64) -> std::result::Result<crate::SourceBlock, SourceError> {
            let block = self.inner.allocate_block(size_bytes)?;
            self.bytes.insert(block.handle, vec![0; size_bytes as usize]);
            Ok(block)
        }

        fn free_block(&mut self, block: crate::SourceBlock) {
            self.bytes.remove(&block.handle);
            self.inner.free_block(block);
        }

        fn available_bytes(&self) -> Option<u64> {
            self.inner.available_bytes()
        }

        fn copy_between_blocks(&mut self, copies: &[BlockCopy]) -> std::result::Result<(), SourceError> {
            if self.fail {
                return Err(SourceError::Failed("the device was lost".to_owned()));
            }
            for c in copies {
                let range = |offset: u64| offset as usize..(offset + c.size_bytes) as usize;
                let read = self.bytes.get(&c.from_block).ok_or_else(|| SourceError::Failed("no such block".to_owned()))?;
                let chunk = read[range(c.from_offset_bytes)].to_vec();
                let write = self.bytes.get_mut(&c.to_block).ok_or_else(|| SourceError::Failed("no such block".to_owned()))?;
                write[range(c.to_offset_bytes)].copy_from_slice(&chunk);
            }
            Ok(())
        }
    }

    /// Every allocation's bytes survive compaction in a source that holds bytes: the heap asks for the copies, in an
    /// order where no copy reads what another already overwrote, before it gives emptied blocks back. On random heaps of
    /// the three policies; a failed copy is an error naming it.
    #[test]
    fn the_source_copies_every_move_before_blocks_go_back() {
        use crate::units::KIB;
        let mut rng = Rng::new(0xc0b1);
        let mut moved = 0;
        for round in 0..45 {
            let policy = [PolicyKind::Tlsf, PolicyKind::BestFit, PolicyKind::FirstFit][round % 3];
            let config = HeapConfig {
                block_size_bytes: 64 * KIB,
                dedicated_threshold_bytes: u64::MAX,
                release: [ReleaseRule::Immediately, ReleaseRule::KeepOne, ReleaseRule::Never][(round / 3) % 3],
                ..HeapConfig::new(policy)
            };
            let source = BytesSource { inner: SimulatedSource::new(1 << 30, 4 * KIB), bytes: HashMap::new(), fail: false };
            let mut heap = Heap::new(config, source).unwrap();
            // Each live allocation with the byte it is filled with.
            let mut live: Vec<(Movable, u8)> = Vec::new();
            for step in 0..120u32 {
                if !live.is_empty() && rng.chance(0.4) {
                    let i = rng.range(0, live.len() as u64 - 1) as usize;
                    heap.free(live.swap_remove(i).0.allocation).unwrap();
                } else {
                    let request = Request::new(rng.range(1, 12) * KIB + rng.range(0, 255), 1 << rng.range(0, 8)).unwrap();
                    let allocation = heap.allocate(request, None).unwrap();
                    let fill = (step % 251 + 1) as u8;
                    let handle = heap.blocks[allocation.block() as usize].as_ref().unwrap().source.handle;
                    let block = heap.source.bytes.get_mut(&handle).unwrap();
                    block[allocation.offset() as usize..(allocation.offset() + allocation.size_bytes()) as usize].fill(fill);
                    live.push((Movable { allocation, request }, fill));
                }
            }
            let movable: Vec<Movable> = live.iter().map(|(m, _)| *m).collect();
            let compaction = heap.compact(&movable, Algorithm::Full, Budget::UNLIMITED).unwrap();
            moved += usize::from(!compaction.moves.is_empty());
            let now = check_moves(&movable, &compaction);
            for (m, (_, fill)) in now.iter().zip(&live) {
                let handle = heap.blocks[m.allocation.block() as usize].as_ref().unwrap().source.handle;
                let bytes = &heap.source.bytes[&handle];
                let span = m.allocation.offset() as usize..(m.allocation.offset() + m.allocation.size_bytes()) as usize;
                assert!(bytes[span].iter().all(|b| b == fill), "round {round} {policy:?}: the bytes of {:?}", m.allocation);
            }
        }
        assert!(moved >= 20, "compaction moved something in {moved} of 45 heaps");
        // A source that cannot copy: an error that says so.
        let config = HeapConfig { block_size_bytes: 64 * KIB, release: ReleaseRule::Never, ..HeapConfig::new(PolicyKind::Tlsf) };
        let source = BytesSource { inner: SimulatedSource::new(1 << 30, 4 * KIB), bytes: HashMap::new(), fail: true };
        let mut heap = Heap::new(config, source).unwrap();
        let request = Request::new(8 * KIB, 256).unwrap();
        let all: Vec<Movable> = (0..8).map(|_| Movable { allocation: heap.allocate(request, None).unwrap(), request }).collect();
        for m in all.iter().step_by(2) {
            heap.free(m.allocation).unwrap();
        }
        let kept: Vec<Movable> = all.iter().skip(1).step_by(2).copied().collect();
        let error = heap.compact(&kept, Algorithm::Full, Budget::UNLIMITED).unwrap_err();
        assert!(error.to_string().contains("copying") && error.to_string().contains("the device was lost"), "{error}");
    }
}
