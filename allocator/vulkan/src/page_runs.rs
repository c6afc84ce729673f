//! The bookkeeping of a [`crate::SparseBuffer`], kept in runs of pages rather than pages: which physical pages
//! back which buffer pages ([`BoundRuns`]) and which physical pages of the pool are free ([`FreeRuns`]).
//!
//! - A **bound run** is a maximal run of buffer pages contiguous in the buffer *and* backed by consecutive pages
//!   of one memory chunk: exactly a live mapping, so the number of live mappings is the number of runs, with no
//!   counting on the side. Runs are kept maximal (a new run merges with the neighbours it continues), which makes
//!   the representation canonical: undoing an insert by removing the same pages restores the same runs.
//! - A **free run** is a run of free pages of one chunk, merged with its free neighbours; pages are taken lowest
//!   first (chunk, then page), so pages taken together are consecutive in one chunk where possible.
//!
//! Every operation costs `O(runs touched × log runs)`: binding or unbinding a 756 MiB range of 4 KiB pages
//! (~190,000 pages) is a handful of map operations, not one per page. No device here: the sparse buffer applies
//! these runs with `vkQueueBindSparse`.

use std::collections::BTreeMap;

/// A physical page: its chunk and its index in the chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageRef {
    /// The chunk's index in the pool.
    pub chunk: u32,
    /// The page's index in the chunk.
    pub page: u32,
}

/// `pages` consecutive physical pages of one chunk, from `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PhysicalRun {
    /// The first page.
    pub first: PageRef,
    /// How many.
    pub pages: u32,
}

/// Buffer pages `start .. start + pages` backed by physical pages from `physical` on (a live mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BoundRun {
    /// The first buffer page.
    pub start: u64,
    /// How many pages.
    pub pages: u32,
    /// The physical page behind `start`; the next ones follow in the same chunk.
    pub physical: PageRef,
}

impl BoundRun {
    /// One past the last buffer page.
    fn end(&self) -> u64 {
        self.start + u64::from(self.pages)
    }

    /// Whether `next` continues this run: next in the buffer and next in the same chunk.
    fn continued_by(&self, next: &BoundRun) -> bool {
        self.end() == next.start
            && self.physical.chunk == next.physical.chunk
            && u64::from(self.physical.page) + u64::from(self.pages) == u64::from(next.physical.page)
    }

    /// The part of the run from buffer page `from` to `to` (both inside it).
    fn slice(&self, from: u64, to: u64) -> BoundRun {
        // Offsets inside a run are below its page count, a u32.
        let skip = (from - self.start) as u32;
        BoundRun {
            start: from,
            pages: (to - from) as u32,
            physical: PageRef { chunk: self.physical.chunk, page: self.physical.page + skip },
        }
    }
}

/// Pairs buffer page runs `(start, pages)` (sorted, disjoint) with physical runs holding as many pages in all,
/// in order: the lowest buffer page gets the first physical page. Pieces that continue each other (contiguous in
/// the buffer and in one chunk) come out as one run.
pub(crate) fn pair(buffer_runs: &[(u64, u64)], physical: &[PhysicalRun]) -> Vec<BoundRun> {
    let mut out: Vec<BoundRun> = Vec::new();
    let mut physical_runs = physical.iter().copied();
    let mut current = physical_runs.next();
    for &(start, pages) in buffer_runs {
        let (mut at, end) = (start, start + pages);
        while at < end {
            let Some(run) = current.as_mut() else { return out };
            // At most the physical run's pages, a u32.
            let take = (end - at).min(u64::from(run.pages)) as u32;
            let piece = BoundRun { start: at, pages: take, physical: run.first };
            match out.last_mut() {
                Some(last) if last.continued_by(&piece) => last.pages += take,
                _ => out.push(piece),
            }
            at += u64::from(take);
            run.first.page += take;
            run.pages -= take;
            if run.pages == 0 {
                current = physical_runs.next();
            }
        }
    }
    out
}

/// The bound runs of a buffer, keyed by their first buffer page; kept maximal. See the module documentation.
#[derive(Clone, Debug, Default)]
pub(crate) struct BoundRuns {
    runs: BTreeMap<u64, BoundRun>,
    pages: u64,
}

impl BoundRuns {
    /// Live mappings: the runs.
    pub fn len(&self) -> u64 {
        self.runs.len() as u64
    }

    /// Pages bound.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// The run holding buffer page `page`.
    fn run_at(&self, page: u64) -> Option<&BoundRun> {
        self.runs.range(..=page).next_back().map(|(_, run)| run).filter(|run| run.end() > page)
    }

    /// The physical page behind buffer page `page`.
    pub fn at(&self, page: u64) -> Option<PageRef> {
        self.run_at(page).map(|run| run.slice(page, page + 1).physical)
    }

    /// Whether any page of `start .. start + pages` is bound.
    pub fn any_bound(&self, start: u64, pages: u64) -> bool {
        self.run_at(start).is_some() || self.runs.range(start..start + pages).next().is_some()
    }

    /// Whether every page of `start .. start + pages` is bound.
    pub fn all_bound(&self, start: u64, pages: u64) -> bool {
        let (mut at, end) = (start, start + pages);
        while at < end {
            match self.run_at(at) {
                Some(run) => at = run.end(),
                None => return false,
            }
        }
        true
    }

    /// The bound parts of `start .. start + pages`, as buffer runs `(start, pages)` merged where contiguous.
    pub fn bound_within(&self, start: u64, pages: u64) -> Vec<(u64, u64)> {
        let end = start + pages;
        let first = self.run_at(start).map(|run| run.start).unwrap_or(start);
        let mut out: Vec<(u64, u64)> = Vec::new();
        for run in self.runs.range(first..end).map(|(_, run)| run) {
            let (from, to) = (run.start.max(start), run.end().min(end));
            match out.last_mut() {
                Some((last, count)) if *last + *count == from => *count += to - from,
                _ => out.push((from, to - from)),
            }
        }
        out
    }

    /// The bound runs of `start .. start + pages`, cut at the range's ends.
    pub fn runs_within(&self, start: u64, pages: u64) -> Vec<BoundRun> {
        let end = start + pages;
        let first = self.run_at(start).map(|run| run.start).unwrap_or(start);
        self.runs.range(first..end).map(|(_, run)| run.slice(run.start.max(start), run.end().min(end))).collect()
    }

    /// Adds `run` (none of its pages bound), merged with the neighbours it continues or that continue it.
    pub fn insert(&mut self, mut run: BoundRun) {
        self.pages += u64::from(run.pages);
        if let Some((&left_start, left)) = self.runs.range(..run.start).next_back()
            && left.continued_by(&run)
        {
            run = BoundRun { start: left_start, pages: left.pages + run.pages, physical: left.physical };
            self.runs.remove(&left_start);
        }
        if let Some(right) = self.runs.get(&run.end()).copied()
            && run.continued_by(&right)
        {
            run.pages += right.pages;
            self.runs.remove(&right.start);
        }
        self.runs.insert(run.start, run);
    }

    /// Removes every bound page of `start .. start + pages` and returns the physical runs that backed them
    /// (the runs cut at the range's ends keep their outer parts).
    pub fn remove(&mut self, start: u64, pages: u64) -> Vec<PhysicalRun> {
        let end = start + pages;
        let first = self.run_at(start).map(|run| run.start).unwrap_or(start);
        let touched: Vec<BoundRun> = self.runs.range(first..end).map(|(_, run)| *run).collect();
        let mut freed = Vec::with_capacity(touched.len());
        for run in touched {
            self.runs.remove(&run.start);
            let (from, to) = (run.start.max(start), run.end().min(end));
            if run.start < from {
                self.runs.insert(run.start, run.slice(run.start, from));
            }
            if to < run.end() {
                self.runs.insert(to, run.slice(to, run.end()));
            }
            let middle = run.slice(from, to);
            self.pages -= u64::from(middle.pages);
            freed.push(PhysicalRun { first: middle.physical, pages: middle.pages });
        }
        freed
    }
}

/// The free pages of a pool: runs of one chunk, merged, taken lowest first. See the module documentation.
#[derive(Clone, Debug, Default)]
pub(crate) struct FreeRuns {
    runs: BTreeMap<PageRef, u32>,
    pages: u64,
}

impl FreeRuns {
    /// Free pages.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Adds free pages (none of them free yet), merged with their free neighbours in the chunk.
    pub fn add(&mut self, run: PhysicalRun) {
        if run.pages == 0 {
            return;
        }
        self.pages += u64::from(run.pages);
        let (mut first, mut pages) = (run.first, run.pages);
        if let Some((&left, &left_pages)) = self.runs.range(..first).next_back()
            && left.chunk == first.chunk
            && left.page + left_pages == first.page
        {
            self.runs.remove(&left);
            first = left;
            pages += left_pages;
        }
        let right = PageRef { chunk: first.chunk, page: first.page + pages };
        if let Some(right_pages) = self.runs.remove(&right) {
            pages += right_pages;
        }
        self.runs.insert(first, pages);
    }

    /// Takes `count` pages, lowest first, as runs; `None` (nothing taken) when fewer are free.
    pub fn take(&mut self, count: u64) -> Option<Vec<PhysicalRun>> {
        if count > self.pages {
            return None;
        }
        let mut out = Vec::new();
        let mut left = count;
        while left > 0 {
            let (first, pages) = self.runs.pop_first()?;
            // At most the run's pages, a u32.
            let take = left.min(u64::from(pages)) as u32;
            out.push(PhysicalRun { first, pages: take });
            if take < pages {
                self.runs.insert(PageRef { chunk: first.chunk, page: first.page + take }, pages - take);
            }
            left -= u64::from(take);
        }
        self.pages -= count;
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const fn page(chunk: u32, page: u32) -> PageRef {
        PageRef { chunk, page }
    }

    const fn physical(chunk: u32, first: u32, pages: u32) -> PhysicalRun {
        PhysicalRun { first: page(chunk, first), pages }
    }

    #[test]
    fn pairing_table() {
        // (buffer runs, physical runs) -> bound runs as (start, pages, chunk, page)
        type Case = (&'static [(u64, u64)], &'static [PhysicalRun], &'static [(u64, u32, u32, u32)]);
        const CASES: [Case; 5] = [
            (&[(0, 10)], &[physical(0, 0, 10)], &[(0, 10, 0, 0)]),
            // Two buffer runs, one physical run: split where the buffer is.
            (&[(0, 4), (10, 6)], &[physical(0, 0, 10)], &[(0, 4, 0, 0), (10, 6, 0, 4)]),
            // One buffer run over two chunks: split where the chunk ends.
            (&[(5, 8)], &[physical(0, 60, 4), physical(1, 0, 4)], &[(5, 4, 0, 60), (9, 4, 1, 0)]),
            // Adjacent buffer runs, consecutive physical pages: one run.
            (&[(0, 2), (2, 3)], &[physical(3, 7, 5)], &[(0, 5, 3, 7)]),
            // Physical runs with a gap: two runs even though the buffer is contiguous.
            (&[(0, 4)], &[physical(0, 0, 2), physical(0, 5, 2)], &[(0, 2, 0, 0), (2, 2, 0, 5)]),
        ];
        for (buffer, physical, expected) in CASES {
            let runs: Vec<(u64, u32, u32, u32)> =
                pair(buffer, physical).iter().map(|run| (run.start, run.pages, run.physical.chunk, run.physical.page)).collect();
            assert_eq!(runs, expected, "{buffer:?} {physical:?}");
        }
    }

    #[test]
    fn bound_runs_merge_split_and_answer() {
        let mut bound = BoundRuns::default();
        bound.insert(BoundRun { start: 0, pages: 4, physical: page(0, 0) });
        bound.insert(BoundRun { start: 4, pages: 4, physical: page(0, 4) });
        assert_eq!((bound.len(), bound.pages()), (1, 8), "consecutive in the buffer and the chunk: one mapping");
        bound.insert(BoundRun { start: 8, pages: 2, physical: page(1, 0) });
        assert_eq!(bound.len(), 2, "another chunk: another mapping");
        assert_eq!(bound.at(5), Some(page(0, 5)));
        assert_eq!(bound.at(9), Some(page(1, 1)));
        assert_eq!(bound.at(10), None);
        assert!(bound.all_bound(2, 8) && !bound.all_bound(2, 9));
        assert!(bound.any_bound(9, 5) && !bound.any_bound(10, 5));
        // Removing the middle of a run splits it; the physical pages come back.
        assert_eq!(bound.remove(2, 2), vec![physical(0, 2, 2)]);
        assert_eq!((bound.len(), bound.pages()), (3, 8));
        assert_eq!(bound.bound_within(0, 20), vec![(0, 2), (4, 6)]);
        // Putting them back restores the one run (the representation is canonical).
        bound.insert(BoundRun { start: 2, pages: 2, physical: page(0, 2) });
        assert_eq!(bound.len(), 2);
        assert_eq!(bound.remove(0, 10), vec![physical(0, 0, 8), physical(1, 0, 2)]);
        assert_eq!((bound.len(), bound.pages()), (0, 0));
    }

    #[test]
    fn free_runs_merge_and_hand_out_lowest_first() {
        let mut free = FreeRuns::default();
        free.add(physical(1, 0, 8));
        free.add(physical(0, 4, 4));
        free.add(physical(0, 0, 2));
        assert_eq!(free.take(3), Some(vec![physical(0, 0, 2), physical(0, 4, 1)]));
        assert_eq!(free.pages(), 11);
        free.add(physical(0, 0, 2));
        free.add(physical(0, 2, 2));
        // Chunk 0 is whole again (pages 0..8 minus page 4 taken): 0..4 and 5..8.
        assert_eq!(free.take(5), Some(vec![physical(0, 0, 4), physical(0, 5, 1)]));
        assert_eq!(free.take(100), None, "all or nothing");
        assert_eq!(free.pages(), 10);
        free.add(physical(0, 4, 1));
        free.add(physical(0, 0, 4));
        assert_eq!(free.pages(), 15);
        // Page 5 closes the gap: one run on both sides of it.
        free.add(physical(0, 5, 1));
        assert_eq!(free.take(16), Some(vec![physical(0, 0, 8), physical(1, 0, 8)]));
        assert_eq!(free.pages(), 0);
    }

    /// A per-page model (the former bookkeeping): a map from buffer page to physical page, mappings counted by
    /// neighbours. Random binds and unbinds through `FreeRuns` + `BoundRuns` must agree with it after every step.
    #[test]
    fn runs_agree_with_a_per_page_model() {
        let (buffer_pages, chunk_pages) = (512_u64, 16_u32);
        let mut free = FreeRuns::default();
        for chunk in 0..24 {
            free.add(physical(chunk, 0, chunk_pages));
        }
        let mut bound = BoundRuns::default();
        let mut model: HashMap<u64, PageRef> = HashMap::new();
        let (mut binds, mut unbinds, mut peak_mappings) = (0, 0, 0);
        let mut rng = heapscope_core::rng::Rng::new(0x2545_f491_4f6c_dd1d);
        let mut next = |below: u64| rng.below(below);
        for step in 0..3_000 {
            let start = next(buffer_pages);
            let pages = (1 + next(24)).min(buffer_pages - start);
            if next(2) == 0 {
                if bound.any_bound(start, pages) {
                    assert!((start..start + pages).any(|p| model.contains_key(&p)), "step {step}");
                    continue;
                }
                let Some(taken) = free.take(pages) else { continue };
                let mut handed: Vec<PageRef> = Vec::new();
                for run in &taken {
                    handed.extend((0..run.pages).map(|offset| page(run.first.chunk, run.first.page + offset)));
                }
                for (offset, &physical) in handed.iter().enumerate() {
                    model.insert(start + offset as u64, physical);
                }
                for run in pair(&[(start, pages)], &taken) {
                    bound.insert(run);
                }
                binds += 1;
            } else {
                let covered = bound.all_bound(start, pages);
                assert_eq!(covered, (start..start + pages).all(|p| model.contains_key(&p)), "step {step}");
                if !covered {
                    let within: u64 = bound.bound_within(start, pages).iter().map(|&(_, count)| count).sum();
                    assert_eq!(within, (start..start + pages).filter(|p| model.contains_key(p)).count() as u64);
                    continue;
                }
                for run in bound.remove(start, pages) {
                    free.add(run);
                }
                for p in start..start + pages {
                    model.remove(&p);
                }
                unbinds += 1;
            }
            let mappings = model
                .iter()
                .filter(|&(&index, &physical)| {
                    index
                        .checked_sub(1)
                        .and_then(|left| model.get(&left))
                        .is_none_or(|left| !(left.chunk == physical.chunk && left.page + 1 == physical.page))
                })
                .count() as u64;
            assert_eq!((bound.len(), bound.pages()), (mappings, model.len() as u64), "step {step}");
            peak_mappings = peak_mappings.max(mappings);
            assert_eq!(free.pages() + bound.pages(), 24 * u64::from(chunk_pages), "step {step}");
            for (&index, &physical) in &model {
                assert_eq!(bound.at(index), Some(physical), "step {step}, page {index}");
            }
        }
        // The walk went through real work: many binds and unbinds, scattered mappings.
        assert!(binds > 100 && unbinds > 100 && peak_mappings > 20, "{binds} binds, {unbinds} unbinds, {peak_mappings} mappings");
    }
}
