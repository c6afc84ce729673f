//! Compacting a paged heap by remapping pages: allocations move in the virtual range and their bytes stay where
//! they are in physical memory, so nothing is copied.
//!
//! A paged heap's physical memory never fragments (pages map wherever they are needed); its virtual range can,
//! where that range is bounded: a sparse buffer is at most the device's `sparseAddressSpaceSize` (2 GiB on lavapipe),
//! and a request then finds no virtual run long enough although enough virtual bytes are free (an
//! [`crate::OomCause::Fragmentation`] verdict). A move cures that without a copy: the physical pages behind the
//! allocation are unmapped from the old virtual pages and mapped at the new ones (`vkQueueBindSparse`; CUDA's
//! `cuMemUnmap` and `cuMemMap` of the same physical handles), and its contents come along.
//!
//! Pages are the unit of a remap, so an allocation moves together with every allocation it shares a page with: the
//! heap groups the live allocations into *clusters* (allocations chained by shared first or last pages, whose pages
//! are one contiguous run) and plans the moves of whole clusters, page-aligned, with [`crate::compaction::plan`] over
//! a layout of one block, the virtual range; of that plan it applies the longest prefix that keeps the largest free run
//! of bytes (the plan keeps the largest run of free pages). Each allocation keeps its offset within its page, so the pages it
//! shares move with it. A cluster holding an allocation the caller did not list (pinned) stays. The policy then
//! places every member of a moved cluster at its new offset ([`crate::Policy::allocate_at`]: `tlsf`, `best-fit` and
//! `first-fit`; a paged heap of another policy moves nothing).
//!
//! Pages cached under [`super::UnmapRule::UnderPressure`] are unmapped first, so every page a cluster moves to is
//! unmapped. The device log says what a driver does: for each moved cluster, an unmap of its old pages and a map of
//! its new ones; [`PagedCompaction::remaps`] lists the same moves for a backend that rebinds the physical pages.

use std::collections::HashMap;

use super::{PagedHeap, page_span};
use crate::compaction::{Algorithm, Budget, Layout, Placed, plan};
use crate::device_event::DeviceEvent;
use crate::{Allocation, AllocationId, Error, RangeState, Request, Result};

/// A run of pages moved in the virtual range by a compaction: its physical pages unmapped from
/// `from_offset .. from_offset + size_bytes` and mapped at `to_offset ..` (the two may overlap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PageRemap {
    /// The first old page's offset in the virtual range.
    pub from_offset: u64,
    /// The first new page's offset.
    pub to_offset: u64,
    /// Bytes (whole pages).
    pub size_bytes: u64,
}

/// What a paged heap's compaction did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PagedCompaction {
    /// Each allocation moved: the handle it had (no longer valid) and the one it has now, in the order of the remaps.
    pub moves: Vec<(Allocation, Allocation)>,
    /// The page runs to move, in order: a backend rebinds each run's physical pages at its new place.
    pub remaps: Vec<PageRemap>,
    /// Cached pages unmapped before the remaps (`(offset, size_bytes)`): a backend unbinds them first.
    pub cache_released: Vec<(u64, u64)>,
    /// Bytes of the pages remapped (none is copied).
    pub bytes_remapped: u64,
    /// The largest free run of the virtual range, before.
    pub largest_free_before_bytes: u64,
    /// And after.
    pub largest_free_after_bytes: u64,
}

/// A live allocation as the report shows it: its footprint and id.
#[derive(Clone, Copy, Debug)]
struct Footprint {
    id: AllocationId,
    offset: u64,
    end: u64,
}

impl PagedHeap {
    /// Moves the clusters of allocations of `movable` (each handle with the request that made it; whatever is not
    /// listed stays, with every allocation sharing a page with it) to gather the virtual range's free space, by
    /// `algorithm` within `budget` (bytes counted are the pages remapped); see the module docs.
    ///
    /// A virtual range whose last page would end past 2^64 B moves nothing (the defaults never ask for one:
    /// [`crate::PagedConfig::new`]).
    ///
    /// # Errors
    /// [`Error::Source`] when the policy refuses to re-place an allocation where the plan put it (a broken
    /// invariant): that cluster is put back where it was and the moves before it stand.
    pub fn compact(
        &mut self,
        movable: &[(Allocation, Request)],
        algorithm: Algorithm,
        budget: Budget,
    ) -> Result<PagedCompaction> {
        self.changes += 1;
        let page = self.config.page_bytes;
        let footprints = self.footprints();
        let mut compaction = PagedCompaction::default();
        compaction.largest_free_before_bytes = largest_gap(&footprints, self.config.virtual_bytes);
        compaction.largest_free_after_bytes = compaction.largest_free_before_bytes;
        // The range in whole pages; one whose last page would end past 2^64 B (asked for as such) is left as it is.
        let Some(range_bytes) = self.config.virtual_bytes.checked_next_multiple_of(page) else { return Ok(compaction) };
        if !self.config.policy.places_by_address() || footprints.is_empty() {
            return Ok(compaction);
        }
        let listed: HashMap<(AllocationId, u64), (Allocation, Request)> = movable
            .iter()
            .map(|&(allocation, request)| ((allocation.id(), allocation.footprint_offset()), (allocation, request)))
            .collect();
        // Clusters: runs of footprints chained by shared pages, as (first page, last page, members).
        let mut clusters: Vec<(u64, u64, Vec<Footprint>)> = Vec::new();
        for f in footprints {
            let (first, last) = page_span(f.offset, f.end - f.offset, page);
            match clusters.last_mut() {
                Some((_, cluster_last, members)) if first <= *cluster_last => {
                    *cluster_last = (*cluster_last).max(last);
                    members.push(f);
                }
                _ => clusters.push((first, last, vec![f])),
            }
        }
        let layout = Layout {
            block_sizes: vec![range_bytes],
            allocations: (0..)
                .zip(&clusters)
                .map(|(id, (first, last, members))| {
                    // A cluster moves by whole multiples of its members' largest alignment (one above the page size
                    // kept where its start is not aligned to it: any move would misalign a member).
                    let align_bytes = members
                        .iter()
                        .filter_map(|m| listed.get(&(m.id, m.offset)))
                        .map(|(_, request)| request.align_bytes())
                        .fold(page, u64::max);
                    Placed {
                        id,
                        block: 0,
                        offset: first * page,
                        size_bytes: (last - first + 1) * page,
                        alignment_bytes: align_bytes,
                        pinned: members.iter().any(|m| !listed.contains_key(&(m.id, m.offset)))
                            || !(first * page).is_multiple_of(align_bytes),
                    }
                })
                .collect(),
        };
        let mut planned = plan(&layout, algorithm, budget);
        // The plan keeps the largest run of free pages; a run of free bytes may still shrink (whole pages moved leave
        // the parts of pages around them): the longest prefix of the plan that keeps it is applied.
        let gap_after = |moves: &[crate::compaction::Move]| {
            let mut shifted: Vec<Footprint> = clusters
                .iter()
                .enumerate()
                .flat_map(|(index, (_, _, members))| {
                    let delta = moves.iter().filter(|m| m.id == index as u64).map(|m| m.from_offset - m.to_offset).sum::<u64>();
                    members.iter().map(move |m| Footprint { offset: m.offset - delta, end: m.end - delta, ..*m })
                })
                .collect();
            shifted.sort_unstable_by_key(|f| f.offset);
            largest_gap(&shifted, self.config.virtual_bytes)
        };
        while !planned.moves.is_empty() && gap_after(&planned.moves) < compaction.largest_free_before_bytes {
            planned.moves.pop();
        }
        if planned.moves.is_empty() {
            return Ok(compaction);
        }
        if !self.cached.is_empty() {
            let cached: Vec<(u64, u64)> = self.cached.iter().map(|(&start, &pages)| (start * page, pages * page)).collect();
            self.release_cache();
            compaction.cache_released = cached;
        }
        for step in &planned.moves {
            let members = &clusters[step.id as usize].2;
            let delta = step.from_offset - step.to_offset;
            let moved = self.move_cluster(members, delta, &listed)?;
            compaction.moves.extend(moved);
            let remap = PageRemap { from_offset: step.from_offset, to_offset: step.to_offset, size_bytes: step.size_bytes };
            self.device_log.push(|| DeviceEvent::Unmapped { address: remap.from_offset, size_bytes: remap.size_bytes });
            self.device_log.push(|| DeviceEvent::Mapped { address: remap.to_offset, size_bytes: remap.size_bytes });
            self.stats.pages_remapped += remap.size_bytes / page;
            compaction.bytes_remapped += remap.size_bytes;
            compaction.remaps.push(remap);
        }
        compaction.largest_free_after_bytes = largest_gap(&self.footprints(), self.config.virtual_bytes);
        Ok(compaction)
    }

    /// The live allocations' footprints, by address.
    fn footprints(&self) -> Vec<Footprint> {
        let mut footprints: Vec<Footprint> = Vec::new();
        for range in self.policy.report().ranges {
            let (Some(id), RangeState::Live | RangeState::Padding) = (range.allocation, range.state) else { continue };
            match footprints.last_mut() {
                Some(last) if last.id == id && last.end == range.offset => last.end = range.end(),
                _ => footprints.push(Footprint { id, offset: range.offset, end: range.end() }),
            }
        }
        footprints
    }

    /// Moves every member of a cluster `delta` bytes down (a multiple of the page size): each is freed, then placed at
    /// its new offset; the end pages they count move with them. Returns the handles, old and new.
    fn move_cluster(
        &mut self,
        members: &[Footprint],
        delta: u64,
        listed: &HashMap<(AllocationId, u64), (Allocation, Request)>,
    ) -> Result<Vec<(Allocation, Allocation)>> {
        let page = self.config.page_bytes;
        let old: Vec<(Allocation, Request)> = members.iter().filter_map(|m| listed.get(&(m.id, m.offset)).copied()).collect();
        for &(allocation, _) in &old {
            self.policy.free(allocation)?;
        }
        let mut placed: Vec<(Allocation, Allocation)> = Vec::with_capacity(old.len());
        for &(allocation, request) in &old {
            match self.policy.allocate_at(request, allocation.offset() - delta) {
                Some(new) => placed.push((allocation, new)),
                None => {
                    // Put the cluster back: its old places are free again once the new ones are.
                    for &(_, new) in &placed {
                        self.policy.free(new)?;
                    }
                    for &(allocation, request) in &old {
                        self.policy.allocate_at(request, allocation.offset()).ok_or_else(|| {
                            Error::Source(format!("compaction could not put back the allocation at {:#x}", allocation.offset()))
                        })?;
                    }
                    return Err(Error::Source(format!(
                        "compaction: the policy refused to place {} B at {:#x}, where the plan moved it",
                        request.size_bytes(),
                        allocation.offset() - delta
                    )));
                }
            }
        }
        let delta_pages = delta / page;
        let mut counts: Vec<(u64, u32)> = Vec::new();
        for &(allocation, _) in &old {
            let (first, last) = page_span(allocation.footprint_offset(), allocation.footprint_bytes(), page);
            for index in if first == last { vec![first] } else { vec![first, last] } {
                if let Some(count) = self.edge_pages.remove(&index) {
                    counts.push((index - delta_pages, count));
                }
            }
        }
        for (index, count) in counts {
            *self.edge_pages.entry(index).or_insert(0) += count;
        }
        Ok(placed)
    }
}

/// The largest run of `[0, end)` that none of `footprints` (by address) covers.
fn largest_gap(footprints: &[Footprint], end: u64) -> u64 {
    let mut cursor = 0;
    let mut largest = 0;
    for f in footprints {
        largest = largest.max(f.offset.saturating_sub(cursor));
        cursor = cursor.max(f.end);
    }
    largest.max(end.saturating_sub(cursor))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OomCause, PagedConfig, PolicyKind, UnmapRule};

    const PAGE: u64 = 4096;

    /// A virtual range of 64 pages: eight 6-page allocations, every other one freed (four 6-page holes between
    /// the rest), then a 30-page request: 40 pages free, no run of 30.
    fn scattered(unmap: UnmapRule) -> (PagedHeap, Vec<(Allocation, Request)>) {
        let config = PagedConfig { page_bytes: PAGE, virtual_bytes: 64 * PAGE, unmap, ..PagedConfig::new(None) };
        let mut heap = PagedHeap::new(config).unwrap();
        heap.record_device_events(true);
        let request = Request::new(6 * PAGE, PAGE).unwrap();
        let all: Vec<(Allocation, Request)> = (0..8).map(|_| (heap.allocate(request).unwrap(), request)).collect();
        let mut kept = Vec::new();
        for (index, (allocation, request)) in all.into_iter().enumerate() {
            if index % 2 == 0 { heap.free(allocation).unwrap() } else { kept.push((allocation, request)) }
        }
        heap.take_device_events();
        (heap, kept)
    }

    #[test]
    fn a_fragmented_virtual_range_is_cured_by_remapping_pages() {
        for unmap in [UnmapRule::Eager, UnmapRule::UnderPressure] {
            let (mut heap, kept) = scattered(unmap);
            let big = Request::new(30 * PAGE, PAGE).unwrap();
            let Err(Error::OutOfMemory(verdict)) = heap.allocate(big) else { panic!("{unmap:?}: 30 pages fit") };
            assert_eq!(verdict.cause, OomCause::Fragmentation, "{verdict}");
            assert_eq!((verdict.free_in_blocks_bytes, verdict.largest_free_run_bytes), (40 * PAGE, 16 * PAGE), "{unmap:?}");
            let mapped = heap.stats().mapped_bytes - heap.stats().cached_bytes;
            let done = heap.compact(&kept, Algorithm::Full, Budget::UNLIMITED).unwrap();
            // Each kept allocation slides down over the hole below it: four moves of 6 pages.
            assert_eq!(done.moves.len(), 4, "{unmap:?}: {done:?}");
            assert_eq!(done.remaps.len(), 4);
            assert_eq!(done.bytes_remapped, 4 * 6 * PAGE);
            let offsets: Vec<u64> = done.moves.iter().map(|(_, to)| to.offset() / PAGE).collect();
            assert_eq!(offsets, [0, 6, 12, 18]);
            assert_eq!((done.largest_free_before_bytes, done.largest_free_after_bytes), (16 * PAGE, 40 * PAGE));
            assert_eq!(heap.stats().mapped_bytes, mapped, "{unmap:?}: the same pages, elsewhere (the cache let go)");
            assert_eq!(heap.stats().pages_remapped, 24);
            let events = heap.take_device_events();
            let remap_events: Vec<DeviceEvent> = done
                .remaps
                .iter()
                .flat_map(|r| {
                    [
                        DeviceEvent::Unmapped { address: r.from_offset, size_bytes: r.size_bytes },
                        DeviceEvent::Mapped { address: r.to_offset, size_bytes: r.size_bytes },
                    ]
                })
                .collect();
            assert!(events.ends_with(&remap_events), "{unmap:?}: {events:?}");
            heap.allocate(big).unwrap();
            // The old handles are gone, the new ones free their pages.
            assert!(heap.free(kept[0].0).is_err());
            for (_, to) in done.moves {
                heap.free(to).unwrap();
            }
        }
    }

    #[test]
    fn allocations_sharing_a_page_move_together_and_pinned_ones_stay() {
        let config = PagedConfig { page_bytes: PAGE, virtual_bytes: 64 * PAGE, ..PagedConfig::new(None) };
        let mut heap = PagedHeap::new(config).unwrap();
        let whole = Request::new(8 * PAGE, PAGE).unwrap();
        let half = Request::new(PAGE + PAGE / 2 + 256, 256).unwrap();
        let hole = heap.allocate(whole).unwrap();
        // Three allocations of a page and a half and a bit, back to back: one cluster of five pages sharing edges.
        let chain: Vec<(Allocation, Request)> = (0..3).map(|_| (heap.allocate(half).unwrap(), half)).collect();
        let gap = heap.allocate(whole).unwrap();
        let pinned = heap.allocate(whole).unwrap();
        heap.free(hole).unwrap();
        heap.free(gap).unwrap();
        let phases: Vec<u64> = chain.iter().map(|(a, _)| a.offset() % PAGE).collect();
        // The chain may move; `pinned` is not listed.
        let done = heap.compact(&chain, Algorithm::Full, Budget::UNLIMITED).unwrap();
        assert_eq!(done.remaps.len(), 1, "one cluster, one remap: {done:?}");
        assert_eq!(done.remaps[0].size_bytes, 5 * PAGE);
        assert_eq!(done.remaps[0].to_offset, 0);
        let moved: Vec<u64> = done.moves.iter().map(|(_, to)| to.offset() % PAGE).collect();
        assert_eq!(moved, phases, "each keeps its offset within its page");
        assert!(done.moves.iter().all(|(from, _)| from.offset() != pinned.offset()));
        // The pages' counts moved with them: freeing everything unmaps everything.
        for (_, to) in done.moves {
            heap.free(to).unwrap();
        }
        heap.free(pinned).unwrap();
        assert_eq!(heap.stats().mapped_bytes, 0);
        assert_eq!(heap.mapped_runs(), []);
    }

    /// Requests aligned above the page size: a cluster moves only by multiples of their alignment (it moved by pages
    /// and the policy refused the misaligned place, failing the compaction).
    #[test]
    fn alignments_above_the_page_size_stay_aligned() {
        for align_pages in [2, 4, 16] {
            let config = PagedConfig { page_bytes: PAGE, virtual_bytes: 256 * PAGE, ..PagedConfig::new(None) };
            let mut heap = PagedHeap::new(config).unwrap();
            let request = Request::new(8, align_pages * PAGE).unwrap();
            let all: Vec<(Allocation, Request)> = (0..6).map(|_| (heap.allocate(request).unwrap(), request)).collect();
            let mut kept = Vec::new();
            for (index, (allocation, request)) in all.into_iter().enumerate() {
                if index % 2 == 0 { heap.free(allocation).unwrap() } else { kept.push((allocation, request)) }
            }
            let done = heap.compact(&kept, Algorithm::Full, Budget::UNLIMITED).unwrap();
            assert!(!done.moves.is_empty(), "align {align_pages} pages: the holes below are aligned places");
            for (_, to) in &done.moves {
                assert_eq!(to.offset() % (align_pages * PAGE), 0, "align {align_pages} pages: {done:?}");
            }
            assert!(done.largest_free_after_bytes > done.largest_free_before_bytes, "{done:?}");
        }
    }

    #[test]
    fn budgets_and_policies_that_cannot_place_at_an_offset_move_nothing() {
        let (mut heap, kept) = scattered(UnmapRule::Eager);
        let none = heap.compact(&kept, Algorithm::Full, Budget { max_bytes: u64::MAX, max_moves: 0 }).unwrap();
        assert!(none.moves.is_empty() && none.remaps.is_empty());
        let one = heap.compact(&kept, Algorithm::Full, Budget { max_bytes: 6 * PAGE, max_moves: 8 }).unwrap();
        assert_eq!(one.remaps.len(), 1, "the budget holds one cluster");
        let config =
            PagedConfig { page_bytes: PAGE, virtual_bytes: 64 * PAGE, policy: PolicyKind::Buddy, ..PagedConfig::new(None) };
        let mut buddy = PagedHeap::new(config).unwrap();
        let request = Request::new(PAGE, PAGE).unwrap();
        let listed: Vec<(Allocation, Request)> = (0..4).map(|_| (buddy.allocate(request).unwrap(), request)).collect();
        buddy.free(listed[0].0).unwrap();
        assert!(buddy.compact(&listed[1..], Algorithm::Full, Budget::UNLIMITED).unwrap().moves.is_empty());
    }
}
