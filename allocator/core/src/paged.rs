//! Virtual paging: one large virtual range, physical pages mapped on demand.
//!
//! The simulated twin of CUDA virtual memory (PyTorch's `expandable_segments`) and of Vulkan sparse
//! binding. A policy (TLSF by default) places allocations in a virtual range far larger than the device;
//! only the pages an allocation touches are backed by physical memory, mapped when the first allocation
//! touches them and unmapped when no live allocation does. Reserved memory is therefore the mapped
//! pages, and fragmentation of the virtual range costs nothing: a free run split by a live allocation is
//! still served by mapping pages around it. What remains is the waste inside partly used pages.
//!
//! When wholly free pages are unmapped is the [`UnmapRule`]: at once ([`UnmapRule::Eager`], the default:
//! mapped bytes follow the live pages exactly), or under pressure ([`UnmapRule::UnderPressure`]): they stay
//! mapped in a cache, a later allocation landing on them reuses them without a map call, and only when a
//! request needs more new pages than the capacity leaves are all cached pages unmapped, before the request
//! is refused — PyTorch's "release cached blocks, then retry", for pages. Cached pages count as mapped
//! (reserved) bytes.
//!
//! Allocations never overlap, so only the first and last page of an allocation can be shared with another
//! one: those two carry a count of the live allocations touching them, the pages between belong to one
//! allocation alone and are mapped and unmapped with it. Allocating or freeing costs O(1) whatever the
//! size, not one step per page.
//!
//! Counters follow the driver calls a real backend makes: one map call per run of contiguous pages that an
//! allocation needs mapped (sparse binds are coalesced the same way), one unmap call per run released.

mod compact;

pub use compact::{PageRemap, PagedCompaction};

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::hash::FastMap;

use crate::device_event::{DeviceEvent, DeviceLog};
use crate::report::FreeSpace;
use crate::source::LARGEST_DEVICE_BYTES;
use crate::units::GIB;
use crate::{Allocation, Error, OomCause, OomVerdict, Policy, PolicyConfig, PolicyKind, PolicyReport, Request, Result};

/// When a [`PagedHeap`] unmaps pages that no live allocation touches any more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum UnmapRule {
    /// As soon as they are wholly free.
    #[default]
    Eager,
    /// Keep them mapped (cached) for later allocations; unmap every cached page only when a request needs more
    /// new pages than the capacity leaves, before refusing it.
    UnderPressure,
}

impl UnmapRule {
    /// The name on the command line: `eager` or `pressure`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Eager => "eager",
            Self::UnderPressure => "pressure",
        }
    }
}

impl fmt::Display for UnmapRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for UnmapRule {
    type Err = crate::UnknownName;

    fn from_str(text: &str) -> std::result::Result<Self, crate::UnknownName> {
        [Self::Eager, Self::UnderPressure].into_iter().find(|rule| rule.name() == text).ok_or_else(|| crate::UnknownName {
            what: "unmap rule",
            name: text.to_owned(),
            expected: "eager or pressure".to_owned(),
        })
    }
}

/// Settings of a [`PagedHeap`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PagedConfig {
    /// The policy placing allocations in the virtual range.
    pub policy: PolicyKind,
    /// Its settings.
    pub policy_config: PolicyConfig,
    /// Bytes per physical page (2 MiB, CUDA's granularity; lavapipe's sparse pages are 4 KiB, discrete
    /// GPUs' usually 64 KiB). A power of two.
    pub page_bytes: u64,
    /// Size of the virtual range.
    pub virtual_bytes: u64,
    /// The most bytes mapped at once (the device's memory); `None` for no limit but the largest device heapscope
    /// models ([`LARGEST_DEVICE_BYTES`]), as for every other contender.
    pub capacity_bytes: Option<u64>,
    /// When wholly free pages are unmapped.
    pub unmap: UnmapRule,
}

impl PagedConfig {
    /// The default page size: 2 MiB.
    pub const DEFAULT_PAGE_BYTES: u64 = 2 << 20;

    /// The largest virtual range a default makes: four times the largest device heapscope models (4 EiB), so that
    /// ranges and their pages stay far from 2^64 B.
    pub const MAX_DEFAULT_VIRTUAL_BYTES: u64 = 4 * LARGEST_DEVICE_BYTES;

    /// TLSF in a virtual range of four times `capacity_bytes` (at least 1 TiB, at most
    /// [`Self::MAX_DEFAULT_VIRTUAL_BYTES`]; without a capacity, that most, so that the range holds whatever the
    /// unlimited device of the other contenders holds), 2 MiB pages, eager unmapping.
    pub fn new(capacity_bytes: Option<u64>) -> Self {
        let virtual_bytes = capacity_bytes.map_or(Self::MAX_DEFAULT_VIRTUAL_BYTES, |capacity| {
            capacity.saturating_mul(4).clamp(1024 * GIB, Self::MAX_DEFAULT_VIRTUAL_BYTES)
        });
        Self {
            policy: PolicyKind::Tlsf,
            policy_config: PolicyConfig::default(),
            page_bytes: Self::DEFAULT_PAGE_BYTES,
            virtual_bytes,
            capacity_bytes,
            unmap: UnmapRule::Eager,
        }
    }
}

/// Counters of a paged heap's life.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PagedStats {
    /// Bytes mapped now (the reserved memory), cached pages included.
    pub mapped_bytes: u64,
    /// The most bytes mapped at once.
    pub peak_mapped_bytes: u64,
    /// Bytes requested by live allocations now.
    pub live_bytes: u64,
    /// The most live bytes at once.
    pub peak_live_bytes: u64,
    /// Map calls (one per run of contiguous pages newly mapped).
    pub map_calls: u64,
    /// Unmap calls (one per run of contiguous pages released).
    pub unmap_calls: u64,
    /// Pages mapped so far.
    pub pages_mapped: u64,
    /// Pages unmapped so far.
    pub pages_unmapped: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Requests refused for lack of physical memory or virtual range.
    pub ooms: u64,
    /// Bytes of pages mapped now that no live allocation touches ([`UnmapRule::UnderPressure`]'s cache).
    pub cached_bytes: u64,
    /// Pages kept mapped in the cache when they became wholly free, so far.
    pub pages_cached: u64,
    /// Cached pages taken by a later allocation, so far: each one a page map (bind) avoided.
    pub pages_reused: u64,
    /// Times the cache was unmapped because a request needed more pages than the capacity left.
    pub cache_releases: u64,
    /// Pages moved in the virtual range by compaction (remapped, not copied), so far.
    pub pages_remapped: u64,
}

/// A policy over a virtual range, backed by physical pages on demand. See the module documentation.
#[derive(Debug)]
pub struct PagedHeap {
    config: PagedConfig,
    policy: Box<dyn Policy>,
    /// Live allocations touching each shared (first or last) page, by page index; pages between an
    /// allocation's first and last belong to it alone and are not listed.
    edge_pages: FastMap<u64, u32>,
    /// Footprint bytes of the live allocations.
    footprint_bytes: u64,
    /// Mapped pages no live allocation touches, as runs: first page -> pages (disjoint, never adjacent).
    cached: BTreeMap<u64, u64>,
    stats: PagedStats,
    device_log: DeviceLog,
    /// Changes to the mapped pages and to the layout, other than a refused request's own allocation and free.
    changes: u64,
    /// The largest free run inside mapped pages as the last refusal measured it (a report's cost in the live
    /// allocations), with the changes count and the policy's free space then: refusals in a row, as a replay at its
    /// capacity makes them, measure it once.
    refusal_free_run: Option<(u64, FreeSpace, u64)>,
}

/// Pages `[first, last]` covered by `[offset, offset + size)` (size > 0).
fn page_span(offset: u64, size_bytes: u64, page_bytes: u64) -> (u64, u64) {
    (offset / page_bytes, (offset + size_bytes - 1) / page_bytes)
}

/// The runs of pages that change state when an allocation spanning pages `[first, last]` comes or goes,
/// as `(first page, pages)`: the pages between its ends always do, each end page when `first_changes` /
/// `last_changes` says so (a single page: `first_changes`).
fn runs(first: u64, last: u64, first_changes: bool, last_changes: bool) -> Vec<(u64, u64)> {
    if first == last {
        return if first_changes { vec![(first, 1)] } else { Vec::new() };
    }
    let start = if first_changes { first } else { first + 1 };
    let end = if last_changes { last } else { last - 1 };
    if end >= start { vec![(start, end - start + 1)] } else { Vec::new() }
}

/// The runs of `[start, end)` not covered by `covered` (runs `(first, pages)` inside it, by address).
fn gaps(start: u64, end: u64, covered: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut gaps = Vec::new();
    let mut cursor = start;
    for &(run, pages) in covered {
        if run > cursor {
            gaps.push((cursor, run - cursor));
        }
        cursor = run + pages;
    }
    if end > cursor {
        gaps.push((cursor, end - cursor));
    }
    gaps
}

impl PagedHeap {
    /// A paged heap with nothing mapped.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a page size that is not a power of two, or invalid policy settings.
    pub fn new(config: PagedConfig) -> Result<Self> {
        if !config.page_bytes.is_power_of_two() || config.page_bytes > config.virtual_bytes {
            return Err(Error::InvalidConfig {
                what: format!(
                    "page size {} B: must be a power of two no larger than the virtual range ({} B)",
                    config.page_bytes, config.virtual_bytes
                ),
            });
        }
        let policy = config.policy.build(config.virtual_bytes, &config.policy_config)?;
        Ok(Self {
            config,
            policy,
            edge_pages: FastMap::default(),
            footprint_bytes: 0,
            cached: BTreeMap::new(),
            stats: PagedStats::default(),
            device_log: DeviceLog::default(),
            changes: 0,
            refusal_free_run: None,
        })
    }

    /// The settings.
    pub fn config(&self) -> &PagedConfig {
        &self.config
    }

    /// Counters.
    pub fn stats(&self) -> &PagedStats {
        &self.stats
    }

    /// Switches the log of page runs mapped and unmapped on (emptied) or off. Addresses are offsets in
    /// the virtual range.
    pub fn record_device_events(&mut self, on: bool) {
        self.device_log.set_recording(on);
    }

    /// The page runs mapped and unmapped since the last call, while recording is on.
    pub fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        self.device_log.take()
    }

    /// Counts a request refused before it reached the heap (a size no device holds) among the
    /// out-of-memory errors.
    pub fn count_refused(&mut self) {
        self.stats.ooms += 1;
    }

    /// Live allocations.
    pub fn live_allocations(&self) -> usize {
        self.policy.live_allocations()
    }

    /// Serves `request`, mapping the pages it needs (reusing cached ones first).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the virtual range has no room or the pages to map exceed the capacity (under
    /// [`UnmapRule::UnderPressure`]: even once every cached page is unmapped).
    pub fn allocate(&mut self, request: Request) -> Result<Allocation> {
        let Some(allocation) = self.policy.allocate(request) else {
            return Err(self.virtual_range_refusal(request));
        };
        let page = self.config.page_bytes;
        let (first, last) = page_span(allocation.footprint_offset(), allocation.footprint_bytes(), page);
        let mut mapped = runs(first, last, !self.edge_pages.contains_key(&first), !self.edge_pages.contains_key(&last));
        // Cached pages under the allocation are taken back from the cache; only the gaps between them are mapped.
        let reused = match mapped.first() {
            Some(&(start, pages)) if !self.cached.is_empty() => {
                let reused = self.take_cached(start, start + pages);
                mapped = gaps(start, start + pages, &reused);
                reused
            }
            _ => Vec::new(),
        };
        let reused_pages: u64 = reused.iter().map(|&(_, pages)| pages).sum();
        let new_pages: u64 = mapped.iter().map(|&(_, pages)| pages).sum();
        // Pages past 2^64 bytes (a request near `u64::MAX` in a range that large) fit no device: over any capacity;
        // without one, the largest device heapscope models is the limit, as for every other contender.
        let new_bytes = new_pages.checked_mul(page);
        let over = |heap: &Self| match new_bytes.and_then(|bytes| heap.stats.mapped_bytes.checked_add(bytes)) {
            Some(total) => total > heap.config.capacity_bytes.unwrap_or(LARGEST_DEVICE_BYTES),
            None => true,
        };
        if over(self) && !self.cached.is_empty() {
            self.release_cache();
        }
        if over(self) {
            for &(start, pages) in &reused {
                self.insert_cached(start, pages);
            }
            self.policy.free(allocation)?;
            // What it needs, as every contender's verdict says it: the request in whole pages (a request that shares a
            // page with its neighbour needs fewer new ones, never less than asked: 2.5 MiB beside a mapped page needs
            // 2 MiB of new ones, it takes 4 MiB of pages), or the new pages where they are more.
            let rounded = request.size_bytes().checked_next_multiple_of(page).unwrap_or(u64::MAX);
            return Err(self.out_of_memory(request, new_bytes.unwrap_or(u64::MAX).max(rounded)));
        }
        self.stats.map_calls += mapped.len() as u64;
        for (index, pages) in mapped {
            self.device_log.push(|| DeviceEvent::Mapped { address: index * page, size_bytes: pages * page });
        }
        *self.edge_pages.entry(first).or_insert(0) += 1;
        if last != first {
            *self.edge_pages.entry(last).or_insert(0) += 1;
        }
        self.stats.pages_mapped += new_pages;
        self.stats.pages_reused += reused_pages;
        self.stats.mapped_bytes += new_bytes.unwrap_or(0);
        self.stats.peak_mapped_bytes = self.stats.peak_mapped_bytes.max(self.stats.mapped_bytes);
        self.stats.allocations += 1;
        self.stats.live_bytes += allocation.size_bytes();
        self.stats.peak_live_bytes = self.stats.peak_live_bytes.max(self.stats.live_bytes);
        self.footprint_bytes += allocation.footprint_bytes();
        self.changes += 1;
        Ok(allocation)
    }

    /// Frees `allocation`; the pages no live allocation touches any more are unmapped, or cached under
    /// [`UnmapRule::UnderPressure`].
    ///
    /// # Errors
    /// [`Error::DoubleFree`] or [`Error::ForeignAllocation`]; nothing changes then.
    pub fn free(&mut self, allocation: Allocation) -> Result<()> {
        self.policy.free(allocation)?;
        self.changes += 1;
        let page = self.config.page_bytes;
        let (first, last) = page_span(allocation.footprint_offset(), allocation.footprint_bytes(), page);
        let mut release = |index: u64| {
            let count = self.edge_pages.get_mut(&index).expect("a live allocation's end pages are counted");
            *count -= 1;
            let released = *count == 0;
            if released {
                self.edge_pages.remove(&index);
            }
            released
        };
        let first_released = release(first);
        let last_released = if last == first { first_released } else { release(last) };
        let released = runs(first, last, first_released, last_released);
        match self.config.unmap {
            UnmapRule::Eager => self.unmap(&released),
            UnmapRule::UnderPressure => {
                for &(start, pages) in &released {
                    self.insert_cached(start, pages);
                    self.stats.pages_cached += pages;
                }
            }
        }
        self.stats.live_bytes -= allocation.size_bytes();
        self.footprint_bytes -= allocation.footprint_bytes();
        Ok(())
    }

    /// Takes back `allocation`, just served, after the device failed to map the page runs it newly needed
    /// (`mapped_runs`: offsets and sizes as its `Mapped` events logged them): the allocation is freed, the
    /// pages of `mapped_runs` count as never mapped, the cached pages it reused go back to the cache, and
    /// nothing of this is logged. Counters of calls and pages keep the attempt.
    ///
    /// # Errors
    /// [`Error::DoubleFree`] or [`Error::ForeignAllocation`]; nothing changes then.
    pub fn undo_allocate(&mut self, allocation: Allocation, mapped_runs: &[(u64, u64)]) -> Result<()> {
        let logged = self.device_log.len();
        self.free(allocation)?;
        self.device_log.truncate(logged);
        // Eager: the free unmapped exactly those pages. Under pressure it cached them with the reused ones.
        let page = self.config.page_bytes;
        for &(offset, size_bytes) in mapped_runs {
            let start = offset / page;
            let taken: u64 = self.take_cached(start, start + size_bytes.div_ceil(page)).iter().map(|&(_, pages)| pages).sum();
            self.stats.mapped_bytes -= taken * page;
        }
        Ok(())
    }

    /// Unmaps page runs `(first page, pages)`, logging and counting them.
    fn unmap(&mut self, released: &[(u64, u64)]) {
        self.changes += 1;
        let page = self.config.page_bytes;
        let released_pages: u64 = released.iter().map(|&(_, pages)| pages).sum();
        self.stats.unmap_calls += released.len() as u64;
        for &(index, pages) in released {
            self.device_log.push(|| DeviceEvent::Unmapped { address: index * page, size_bytes: pages * page });
        }
        self.stats.pages_unmapped += released_pages;
        self.stats.mapped_bytes -= released_pages * page;
    }

    /// `empty_cache()`: unmaps every cached page (the pages kept mapped under [`UnmapRule::UnderPressure`]).
    pub fn empty_cache(&mut self) {
        if !self.cached.is_empty() {
            self.release_cache();
        }
    }

    /// Unmaps every cached page (pressure).
    fn release_cache(&mut self) {
        let cached: Vec<(u64, u64)> = std::mem::take(&mut self.cached).into_iter().collect();
        self.stats.cached_bytes = 0;
        self.stats.cache_releases += 1;
        self.unmap(&cached);
    }

    /// Adds the run of `pages` pages from `start` (mapped, touched by no live allocation) to the cache,
    /// merging it with adjacent cached runs.
    fn insert_cached(&mut self, start: u64, pages: u64) {
        self.changes += 1;
        let (mut start, mut end) = (start, start + pages);
        if let Some((&before, &before_pages)) = self.cached.range(..start).next_back()
            && before + before_pages == start
        {
            self.cached.remove(&before);
            start = before;
        }
        if let Some(after_pages) = self.cached.remove(&end) {
            end += after_pages;
        }
        self.cached.insert(start, end - start);
        self.stats.cached_bytes += pages * self.config.page_bytes;
    }

    /// Removes the cached pages in `[start, end)` from the cache and returns them as runs, by address.
    fn take_cached(&mut self, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.changes += 1;
        let mut overlapping: Vec<(u64, u64)> = Vec::new();
        if let Some((&before, &pages)) = self.cached.range(..start).next_back()
            && before + pages > start
        {
            overlapping.push((before, pages));
        }
        overlapping.extend(self.cached.range(start..end).map(|(&run, &pages)| (run, pages)));
        let mut taken = Vec::with_capacity(overlapping.len());
        for (run, pages) in overlapping {
            self.cached.remove(&run);
            let run_end = run + pages;
            if run < start {
                self.cached.insert(run, start - run);
            }
            if run_end > end {
                self.cached.insert(end, run_end - end);
            }
            let (from, to) = (run.max(start), run_end.min(end));
            taken.push((from, to - from));
        }
        let taken_pages: u64 = taken.iter().map(|&(_, pages)| pages).sum();
        self.stats.cached_bytes -= taken_pages * self.config.page_bytes;
        taken
    }

    /// The mapped pages as runs `(offset, size_bytes)` in the virtual range, by address: the pages the live
    /// allocations touch, and the cached ones.
    pub fn mapped_runs(&self) -> Vec<(u64, u64)> {
        self.mapped_runs_of(&self.policy.report())
    }

    /// The mapped runs of the layout `report`.
    fn mapped_runs_of(&self, report: &PolicyReport) -> Vec<(u64, u64)> {
        let page = self.config.page_bytes;
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for range in
            report.ranges.iter().filter(|range| matches!(range.state, crate::RangeState::Live | crate::RangeState::Padding))
        {
            let (first, last) = page_span(range.offset, range.size_bytes, page);
            runs.push((first * page, (last + 1) * page - first * page));
        }
        runs.extend(self.cached.iter().map(|(&start, &pages)| (start * page, pages * page)));
        runs.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
        for (start, size) in runs {
            let end = start + size;
            match merged.last_mut() {
                Some((offset, size)) if *offset + *size >= start => *size = (*size).max(end - *offset),
                _ => merged.push((start, size)),
            }
        }
        merged
    }

    /// The layout of the virtual range (live and free ranges; see [`PagedHeap::mapped_runs`] for what is
    /// backed).
    pub fn report(&self) -> PolicyReport {
        self.policy.report()
    }

    /// The verdict for a request the virtual range had no run for, the free figures the range's: fragmentation of
    /// the range when compaction could gather a run that holds the request, internal waste when the free bytes would
    /// hold it but no gathering can, exhaustion otherwise. Compaction remaps allocations' pages ([`PagedHeap::compact`]),
    /// each allocation keeping its offset in its page: the longest run it could make is every page no allocation
    /// touches, after the longest free end of a page an allocation holds and before the longest free start of one. A
    /// range of 2 MiB pages each holding a live 1 MiB read as fragmentation, and compacting for it moved nothing.
    fn virtual_range_refusal(&mut self, request: Request) -> Error {
        let mut error = self.out_of_memory(request, request.size_bytes());
        let page = self.config.page_bytes;
        let report = self.policy.report();
        let (mut free_bytes, mut largest_bytes, mut whole_pages_bytes) = (0u64, 0u64, 0u64);
        // The two longest free ends of held pages and the two longest free starts, each with its page: a page holds
        // one of each at most, and one page cannot both open and close the run.
        let (mut ends, mut starts) = ([(0u64, u64::MAX); 2], [(0u64, u64::MAX); 2]);
        let keep = |best: &mut [(u64, u64); 2], bytes: u64, page_index: u64| {
            if bytes > best[0].0 {
                *best = [(bytes, page_index), best[0]];
            } else if bytes > best[1].0 {
                best[1] = (bytes, page_index);
            }
        };
        for range in report.ranges.iter().filter(|range| range.state == crate::RangeState::Free) {
            let end = range.offset.saturating_add(range.size_bytes);
            let (first_whole, end_whole) = (range.offset.div_ceil(page), end / page);
            free_bytes += range.size_bytes;
            largest_bytes = largest_bytes.max(range.size_bytes);
            whole_pages_bytes += end_whole.saturating_sub(first_whole) * page;
            // A range that reaches past a page boundary frees the end of the page it starts in and the start of the
            // page it ends in; a hole inside one page frees neither (an allocation sits on each side of it).
            if end_whole >= first_whole {
                if range.offset % page != 0 {
                    keep(&mut ends, first_whole * page - range.offset, first_whole - 1);
                }
                if end % page != 0 {
                    keep(&mut starts, end - end_whole * page, end_whole);
                }
            }
        }
        let ends_and_starts = if ends[0].1 == starts[0].1 && ends[0].0 > 0 && starts[0].0 > 0 {
            (ends[0].0 + starts[1].0).max(ends[1].0 + starts[0].0)
        } else {
            ends[0].0 + starts[0].0
        };
        let gatherable_bytes = whole_pages_bytes.saturating_add(ends_and_starts);
        if let Error::OutOfMemory(verdict) = &mut error {
            verdict.free_in_blocks_bytes = free_bytes;
            verdict.largest_free_run_bytes = largest_bytes;
            // The range's free bytes are all it could map: nothing beside them.
            (verdict.unreserved_bytes, verdict.virtual_range_bytes) = (0, Some(self.config.virtual_bytes));
            // The range's own free bytes decide (what the device could still map does not matter: there is no run).
            verdict.cause = if gatherable_bytes >= request.size_bytes() {
                OomCause::Fragmentation
            } else if free_bytes >= request.size_bytes() {
                OomCause::InternalWaste
            } else {
                OomCause::Exhaustion
            };
        }
        error
    }

    /// The verdict for a request that needed `needed_bytes` (virtual range, or pages: the request in whole pages):
    /// exhaustion, or internal waste: the rounding of the request to whole pages is what was missing, or the free bytes
    /// inside mapped pages would hold it but lie in the tails of pages live allocations hold. Those are waste inside
    /// allocations' pages, never a free run in the wrong place: remapping allocations (each keeps its offset in its
    /// page) cannot gather them, so this is no fragmentation for compaction to cure.
    fn out_of_memory(&mut self, request: Request, needed_bytes: u64) -> Error {
        self.stats.ooms += 1;
        // Free memory inside mapped pages: what live footprints leave of them, and its largest run. The refused
        // request's own allocation and free left the layout as it was, unless the policy retires what it frees (linear),
        // which its free space then shows: measured again only after a change.
        let space = self.policy.free_space();
        let largest_free_run_bytes = match self.refusal_free_run {
            Some((changes, measured_space, largest)) if changes == self.changes && measured_space == space => largest,
            _ => {
                let report = self.policy.report();
                let mapped = self.mapped_runs_of(&report);
                let mut free: Vec<(u64, u64)> = report
                    .ranges
                    .iter()
                    .filter(|range| range.state == crate::RangeState::Free)
                    .map(|range| (range.offset, range.offset + range.size_bytes))
                    .collect();
                free.sort_unstable();
                let largest = largest_overlap(&free, mapped.iter().map(|&(offset, size)| (offset, offset + size)));
                self.refusal_free_run = Some((self.changes, space, largest));
                largest
            }
        };
        // More pages: what the budget (or device) leaves, or what the virtual range leaves unmapped where that is less.
        let range_left = self.config.virtual_bytes.saturating_sub(self.stats.mapped_bytes);
        let device_left = self.config.capacity_bytes.unwrap_or(LARGEST_DEVICE_BYTES).saturating_sub(self.stats.mapped_bytes);
        let (unreserved_bytes, virtual_range_bytes) =
            if device_left <= range_left { (device_left, None) } else { (range_left, Some(self.config.virtual_bytes)) };
        let free_in_blocks_bytes = self.stats.mapped_bytes - self.footprint_bytes.min(self.stats.mapped_bytes);
        let mut verdict = OomVerdict {
            policy: "paged",
            requested_bytes: request.size_bytes(),
            needed_bytes,
            align_bytes: request.align_bytes(),
            reserved_bytes: self.stats.mapped_bytes,
            live_bytes: self.stats.live_bytes,
            padding_bytes: self.footprint_bytes.saturating_sub(self.stats.live_bytes),
            free_in_blocks_bytes,
            largest_free_run_bytes,
            retired_bytes: space.retired_bytes,
            unreserved_bytes,
            capacity_bytes: self.config.capacity_bytes,
            virtual_range_bytes,
            new_block_bytes: None,
            cause: OomCause::Exhaustion,
        }
        .judged();
        if verdict.cause == OomCause::Fragmentation {
            verdict.cause = OomCause::InternalWaste;
        }
        Error::OutOfMemory(Box::new(verdict))
    }
}

/// The longest overlap of a range of `a` with a range of `b`: two lists of disjoint `[start, end)` ranges sorted by
/// start, swept once together (not every pair: a big heap has many of both).
fn largest_overlap(a: &[(u64, u64)], b: impl IntoIterator<Item = (u64, u64)>) -> u64 {
    let mut largest = 0;
    let mut a = a.iter().copied().peekable();
    let mut b = b.into_iter().peekable();
    while let (Some(&(a_start, a_end)), Some(&(b_start, b_end))) = (a.peek(), b.peek()) {
        largest = largest.max(a_end.min(b_end).saturating_sub(a_start.max(b_start)));
        if a_end <= b_end {
            a.next();
        } else {
            b.next();
        }
    }
    largest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    #[test]
    fn largest_overlap_table() {
        type Ranges = &'static [(u64, u64)];
        // (a, b, longest overlap): against every pair compared.
        let cases: [(Ranges, Ranges, u64); 5] = [
            (&[], &[(0, 10)], 0),
            (&[(0, 10)], &[(5, 20)], 5),
            (&[(0, 4), (6, 30)], &[(2, 8), (10, 12), (20, 40)], 10),
            (&[(0, 100)], &[(10, 20), (30, 60), (70, 75)], 30),
            (&[(0, 5), (10, 15)], &[(5, 10), (15, 20)], 0),
        ];
        for (a, b, expected) in cases {
            let pairs =
                a.iter().flat_map(|&(s, e)| b.iter().map(move |&(t, f)| e.min(f).saturating_sub(s.max(t)))).max().unwrap_or(0);
            assert_eq!((largest_overlap(a, b.iter().copied()), pairs), (expected, expected), "{a:?} {b:?}");
        }
    }

    fn request(size_bytes: u64) -> Request {
        Request::new(size_bytes, 256).unwrap()
    }

    /// Where the virtual range bounds what can still be mapped (no capacity, or one larger than the range), the refusal
    /// names the range and what it leaves: it said 2^64 B "reservable from the device". Defaults stay far from 2^64 B,
    /// and a range asked to end within a page of it compacts (moving nothing) instead of overflowing.
    #[test]
    fn the_virtual_range_is_named_where_it_binds() {
        use crate::compaction::{Algorithm, Budget};
        for capacity in [None, Some(100 * MIB)] {
            let mut heap = PagedHeap::new(PagedConfig { virtual_bytes: 8 * MIB, ..PagedConfig::new(capacity) }).unwrap();
            heap.allocate(request(2 * MIB)).unwrap();
            let Err(Error::OutOfMemory(verdict)) = heap.allocate(request(8 * MIB)) else { panic!("{capacity:?}: 8 MiB fit") };
            assert_eq!((verdict.unreserved_bytes, verdict.virtual_range_bytes), (0, Some(8 * MIB)), "{capacity:?}");
            let words = verdict.to_string();
            assert!(words.contains("0 B more mappable beside them in its 8.00 MiB virtual range"), "{words}");
            assert!(!words.contains("reservable"), "{words}");
        }
        // The capacity binds first: its words as before.
        let mut heap = PagedHeap::new(PagedConfig { virtual_bytes: 64 * MIB, ..PagedConfig::new(Some(4 * MIB)) }).unwrap();
        heap.allocate(request(2 * MIB)).unwrap();
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(request(4 * MIB)) else { panic!("4 MiB under a 4 MiB cap") };
        assert_eq!((verdict.unreserved_bytes, verdict.virtual_range_bytes), (2 * MIB, None), "{verdict}");
        for capacity in [Some(1 << 62), Some(u64::MAX)] {
            assert_eq!(PagedConfig::new(capacity).virtual_bytes, PagedConfig::MAX_DEFAULT_VIRTUAL_BYTES, "{capacity:?}");
        }
        let mut heap = PagedHeap::new(PagedConfig { virtual_bytes: u64::MAX, ..PagedConfig::new(None) }).unwrap();
        let allocation = heap.allocate(request(4096)).unwrap();
        let compaction = heap.compact(&[(allocation, request(4096))], Algorithm::Full, Budget::UNLIMITED).unwrap();
        assert!(compaction.moves.is_empty());
    }

    /// A bounded range with no run for the request: fragmentation only where its whole free pages would hold it (what
    /// compaction can gather), internal waste where only the tails of pages live allocations hold would (a range full of
    /// 2 MiB pages each holding a live 1 MiB read as fragmentation, and compacting for it moved nothing), else
    /// exhaustion. (page, allocations, freed every other one, request; MiB)
    #[test]
    fn a_bounded_range_is_fragmented_only_by_whole_free_pages() {
        let cases = [
            (2, 32, false, 8, OomCause::InternalWaste),
            (2, 32, false, 40, OomCause::Exhaustion),
            (1, 64, true, 8, OomCause::Fragmentation),
            (1, 64, true, 40, OomCause::Exhaustion),
        ];
        for (page_mib, count, free_every_other, request_mib, cause) in cases {
            let config =
                PagedConfig { page_bytes: page_mib * MIB, virtual_bytes: 64 * MIB, ..PagedConfig::new(Some(1024 * MIB)) };
            let mut heap = PagedHeap::new(config).unwrap();
            // 1 MiB allocations, each at the start of its own page: `count` of them fill the range.
            let live: Vec<Allocation> =
                (0..count).map(|_| heap.allocate(Request::new(MIB, page_mib * MIB).unwrap()).unwrap()).collect();
            if free_every_other {
                for allocation in live.iter().step_by(2) {
                    heap.free(*allocation).unwrap();
                }
            }
            let Err(Error::OutOfMemory(verdict)) = heap.allocate(request(request_mib * MIB)) else {
                panic!("{request_mib} MiB fit in a range of 64 MiB with 32 MiB live")
            };
            assert_eq!(verdict.virtual_range_bytes, Some(64 * MIB), "{verdict}");
            assert_eq!(verdict.cause, cause, "{page_mib} MiB pages, {request_mib} MiB: {verdict}");
        }
    }

    /// What compaction could gather, counted exactly: a hole inside one page (an allocation on each side) frees no
    /// page's end or start, and one page cannot both open and close the run. 2 MiB pages, a 6 MiB range: the free bytes
    /// are a 1 MiB hole in page 0 and 0.5 MiB either side of the boundary of pages 1 and 2; at most 1 MiB can be
    /// gathered, so a 1.5 MiB request is internal waste (the hole read as a page's free end made it fragmentation, and
    /// compacting for it moved nothing); 1 MiB fits as it is.
    #[test]
    fn a_hole_inside_a_page_is_not_gathered() {
        let config = PagedConfig { page_bytes: 2 * MIB, virtual_bytes: 6 * MIB, ..PagedConfig::new(Some(1024 * MIB)) };
        let mut heap = PagedHeap::new(config).unwrap();
        let sizes = [MIB / 2, MIB, MIB / 2, 3 * MIB / 2, MIB / 2, MIB / 2, 3 * MIB / 2];
        let live: Vec<Allocation> = sizes.iter().map(|&size| heap.allocate(request(size)).unwrap()).collect();
        let offsets: Vec<u64> = live.iter().map(Allocation::offset).collect();
        assert_eq!(offsets, [0, MIB / 2, 3 * MIB / 2, 2 * MIB, 7 * MIB / 2, 4 * MIB, 9 * MIB / 2], "packed in order");
        for index in [1, 4, 5] {
            heap.free(live[index]).unwrap();
        }
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(request(3 * MIB / 2)) else { panic!("no run of 1.5 MiB") };
        assert_eq!((verdict.cause, verdict.free_in_blocks_bytes), (OomCause::InternalWaste, 2 * MIB), "{verdict}");
        heap.allocate(request(MIB)).unwrap();
    }

    /// Refusals in a row measure the free run inside mapped pages once; a change between them (a free, under each unmap
    /// rule) is seen: every verdict is what a heap built afresh in the same state says.
    #[test]
    fn refusals_in_a_row_see_every_change() {
        for unmap in [UnmapRule::Eager, UnmapRule::UnderPressure] {
            let config = PagedConfig { unmap, ..PagedConfig::new(Some(8 * MIB)) };
            let sizes = [MIB, 3 * MIB, MIB + 4096, 2 * MIB];
            let mut heap = PagedHeap::new(config.clone()).unwrap();
            let live: Vec<Allocation> = sizes.iter().map(|&size| heap.allocate(request(size)).unwrap()).collect();
            // Freed between the rounds: the 3 MiB, then the 1 MiB before it.
            let order = [1, 0];
            let mut largest = Vec::new();
            for round in 0..=order.len() {
                let refuse = |heap: &mut PagedHeap| match heap.allocate(request(6 * MIB)) {
                    Err(Error::OutOfMemory(verdict)) => *verdict,
                    other => panic!("{unmap:?}, round {round}: 6 MiB under an 8 MiB cap: {other:?}"),
                };
                let first = refuse(&mut heap);
                assert_eq!(refuse(&mut heap), first, "{unmap:?}, round {round}: the same state, the same verdict");
                // A heap that made the same requests and frees, refusing for the first time.
                let mut fresh = PagedHeap::new(config.clone()).unwrap();
                let handles: Vec<Allocation> = sizes.iter().map(|&size| fresh.allocate(request(size)).unwrap()).collect();
                for &index in &order[..round] {
                    fresh.free(handles[index]).unwrap();
                }
                assert_eq!(first, refuse(&mut fresh), "{unmap:?}, round {round}");
                largest.push(first.largest_free_run_bytes);
                if let Some(&index) = order.get(round) {
                    heap.free(live[index]).unwrap();
                }
            }
            // The frees changed the run (a verdict kept from before them would differ from the fresh heap's).
            assert!(largest.windows(2).any(|pair| pair[0] != pair[1]), "{unmap:?}: {largest:?}");
        }
    }

    /// Issue 17: a request near `u64::MAX` in a range that large needs 2^64 bytes of pages: refused, whatever the
    /// capacity (the byte count used to wrap to 0 and the request was served with nothing mapped).
    #[test]
    fn pages_past_two_to_the_64_bytes_are_refused() {
        let huge = u64::MAX - 511;
        for capacity in [Some(u64::MAX / 2), Some(1 << 62), None] {
            let config = PagedConfig { virtual_bytes: u64::MAX, ..PagedConfig::new(capacity) };
            let mut heap = PagedHeap::new(config).unwrap();
            let Err(Error::OutOfMemory(verdict)) = heap.allocate(Request::new(huge, 512).unwrap()) else {
                panic!("capacity {capacity:?}: {huge} B must not be served");
            };
            assert_eq!(verdict.requested_bytes, huge, "capacity {capacity:?}");
            assert_eq!((heap.stats().mapped_bytes, heap.live_allocations()), (0, 0), "capacity {capacity:?}");
            // The heap goes on serving what fits.
            heap.allocate(request(4096)).unwrap();
        }
    }

    #[test]
    fn runs_table() {
        // (first, last, first changes, last changes) -> runs
        type Case = ((u64, u64, bool, bool), &'static [(u64, u64)]);
        let cases: [Case; 8] = [
            ((10, 10, true, true), &[(10, 1)]),
            ((10, 10, false, false), &[]),
            ((10, 11, false, false), &[]),
            ((10, 11, true, false), &[(10, 1)]),
            ((10, 11, false, true), &[(11, 1)]),
            ((10, 13, true, true), &[(10, 4)]),
            ((10, 13, false, true), &[(11, 3)]),
            ((10, 13, false, false), &[(11, 2)]),
        ];
        for ((first, last, first_changes, last_changes), expected) in cases {
            assert_eq!(runs(first, last, first_changes, last_changes), expected, "{first} {last} {first_changes} {last_changes}");
        }
    }

    /// Mapped bytes and map calls against a page-by-page model, under random allocations and frees.
    #[test]
    fn counters_match_a_page_by_page_model() {
        let mut heap = PagedHeap::new(PagedConfig { page_bytes: 4096, ..PagedConfig::new(None) }).unwrap();
        let mut model: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
        let mut live = Vec::new();
        let mut rng = crate::rng::Rng::new(0x9e37_79b9_7f4a_7c15);
        let mut next = move || rng.next_u64();
        for _ in 0..5000 {
            if live.is_empty() || next() % 3 != 0 {
                let size = 1 + next() % 40_000;
                let calls_before = heap.stats().map_calls;
                let allocation = heap.allocate(Request::new(size, 256).unwrap()).unwrap();
                let (first, last) = page_span(allocation.footprint_offset(), allocation.footprint_bytes(), 4096);
                let mut new_runs = 0;
                let mut previous_new = false;
                for index in first..=last {
                    let new = !model.contains_key(&index);
                    new_runs += u64::from(new && !previous_new);
                    previous_new = new;
                    *model.entry(index).or_insert(0) += 1;
                }
                assert_eq!(heap.stats().map_calls - calls_before, new_runs, "one map call per run of new pages");
                live.push(allocation);
            } else {
                let allocation = live.swap_remove((next() % live.len() as u64) as usize);
                heap.free(allocation).unwrap();
                let (first, last) = page_span(allocation.footprint_offset(), allocation.footprint_bytes(), 4096);
                for index in first..=last {
                    let count = model.get_mut(&index).unwrap();
                    *count -= 1;
                    if *count == 0 {
                        model.remove(&index);
                    }
                }
            }
            assert_eq!(heap.stats().mapped_bytes, model.len() as u64 * 4096);
        }
        let mapped: u64 = heap.mapped_runs().iter().map(|&(_, size)| size).sum();
        assert_eq!(mapped, heap.stats().mapped_bytes);
    }

    #[test]
    fn pages_are_mapped_on_demand_and_unmapped_when_wholly_free() {
        let mut heap = PagedHeap::new(PagedConfig::new(Some(64 * MIB))).unwrap();
        heap.record_device_events(true);
        // 3 MiB touches two 2 MiB pages; a 512 KiB neighbour shares the second page.
        let a = heap.allocate(request(3 * MIB)).unwrap();
        assert_eq!((heap.stats().mapped_bytes, heap.stats().map_calls), (4 * MIB, 1));
        let b = heap.allocate(request(MIB / 2)).unwrap();
        assert_eq!(b.offset(), 3 * MIB);
        assert_eq!((heap.stats().mapped_bytes, heap.stats().map_calls), (4 * MIB, 1), "the page is already mapped");
        heap.free(a).unwrap();
        assert_eq!(heap.stats().mapped_bytes, 2 * MIB, "the first page is released, the shared one stays");
        assert_eq!(heap.mapped_runs(), [(2 * MIB, 2 * MIB)]);
        heap.free(b).unwrap();
        assert_eq!((heap.stats().mapped_bytes, heap.stats().peak_mapped_bytes, heap.stats().unmap_calls), (0, 4 * MIB, 2));
        assert_eq!(
            heap.take_device_events(),
            [
                DeviceEvent::Mapped { address: 0, size_bytes: 4 * MIB },
                DeviceEvent::Unmapped { address: 0, size_bytes: 2 * MIB },
                DeviceEvent::Unmapped { address: 2 * MIB, size_bytes: 2 * MIB },
            ]
        );
        assert!(matches!(heap.free(b), Err(Error::DoubleFree { .. })));
    }

    #[test]
    fn fragmented_virtual_range_costs_nothing() {
        // The frag_oom story in 3584 MiB: a one-range policy fails the 1 GiB request, paging serves it.
        let mut heap = PagedHeap::new(PagedConfig::new(Some(3584 * MIB))).unwrap();
        let big: Vec<_> = (0..20).map(|_| heap.allocate(request(150 * MIB)).unwrap()).collect();
        for allocation in big {
            heap.free(allocation).unwrap();
        }
        let _small: Vec<_> = (0..20).map(|_| heap.allocate(request(100 * MIB)).unwrap()).collect();
        let huge = heap.allocate(request(1024 * MIB)).unwrap();
        assert_eq!(huge.size_bytes(), 1024 * MIB);
        assert_eq!(heap.stats().peak_mapped_bytes, 3024 * MIB);
        // Now the device is full: the next request is refused with the numbers.
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(request(600 * MIB)) else { panic!("expected an OOM") };
        assert_eq!((verdict.reserved_bytes, verdict.needed_bytes, verdict.unreserved_bytes), (3024 * MIB, 600 * MIB, 560 * MIB));
        assert_eq!(verdict.cause, OomCause::Exhaustion);
        assert_eq!(heap.stats().ooms, 1);
        assert_eq!(heap.live_allocations(), 21, "the refused request left nothing behind");
    }

    /// Issue 19: a 15 MiB request in 2 MiB pages needs 16 MiB; with 15 MiB left it is refused for the tail of its last
    /// page (internal waste), not for want of memory.
    #[test]
    fn a_page_tail_is_internal_waste() {
        let mut heap = PagedHeap::new(PagedConfig { page_bytes: 2 * MIB, ..PagedConfig::new(Some(15 * MIB)) }).unwrap();
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(request(15 * MIB)) else { panic!("16 MiB of pages do not fit") };
        assert_eq!((verdict.needed_bytes, verdict.unreserved_bytes), (16 * MIB, 15 * MIB), "{verdict}");
        assert_eq!(verdict.cause, OomCause::InternalWaste, "{verdict}");
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(request(20 * MIB)) else { panic!("more than the device") };
        assert_eq!(verdict.cause, OomCause::Exhaustion, "{verdict}");
    }

    /// A refusal for want of pages says what the request needs in whole pages, never less than asked: 1 MiB
    /// allocations fill 2 MiB pages, every other one is freed, and 2.5 MiB are asked for once the device is full.
    /// Beside a page it shares, it needs only 2 MiB of new ones; it was said to need that much "once rounded". The free
    /// bytes are page tails either way: internal waste, which compaction does not try to cure (it made thousands of
    /// remaps for nothing when this read as fragmentation). (allocations, capacity in MiB, free in MiB)
    #[test]
    fn a_refusal_for_want_of_pages_needs_the_request_in_whole_pages() {
        let cases = [(6, 6, 3, OomCause::InternalWaste), (10, 10, 5, OomCause::InternalWaste)];
        for (count, capacity, free, cause) in cases {
            let mut heap = PagedHeap::new(PagedConfig { page_bytes: 2 * MIB, ..PagedConfig::new(Some(capacity * MIB)) }).unwrap();
            let held: Vec<Allocation> = (0..count).map(|_| heap.allocate(request(MIB)).unwrap()).collect();
            for allocation in held.into_iter().skip(1).step_by(2) {
                heap.free(allocation).unwrap();
            }
            let Err(Error::OutOfMemory(verdict)) = heap.allocate(request(5 * MIB / 2)) else { panic!("no page left") };
            assert_eq!((verdict.needed_bytes, verdict.free_in_blocks_bytes), (4 * MIB, free * MIB), "{verdict}");
            assert_eq!(verdict.cause, cause, "{verdict}");
        }
    }

    #[test]
    fn unmap_rule_names_round_trip() {
        for rule in [UnmapRule::Eager, UnmapRule::UnderPressure] {
            assert_eq!(rule.name().parse::<UnmapRule>(), Ok(rule));
        }
        assert_eq!(UnmapRule::default(), UnmapRule::Eager);
        assert!("lazy".parse::<UnmapRule>().unwrap_err().to_string().contains("expected eager or pressure"));
    }

    fn pressure_heap(capacity_bytes: Option<u64>) -> PagedHeap {
        let mut heap =
            PagedHeap::new(PagedConfig { unmap: UnmapRule::UnderPressure, ..PagedConfig::new(capacity_bytes) }).unwrap();
        heap.record_device_events(true);
        heap
    }

    #[test]
    fn under_pressure_freed_pages_stay_mapped_and_are_reused_without_a_map() {
        let mut heap = pressure_heap(Some(64 * MIB));
        let a = heap.allocate(request(6 * MIB)).unwrap();
        heap.free(a).unwrap();
        let stats = heap.stats().clone();
        assert_eq!((stats.mapped_bytes, stats.cached_bytes, stats.pages_cached, stats.unmap_calls), (6 * MIB, 6 * MIB, 3, 0));
        assert_eq!(heap.mapped_runs(), [(0, 6 * MIB)], "cached pages are mapped");
        // 3 MiB at offset 0 lands on two cached pages: no map call.
        let b = heap.allocate(request(3 * MIB)).unwrap();
        assert_eq!(b.offset(), 0);
        let stats = heap.stats().clone();
        assert_eq!((stats.map_calls, stats.pages_reused, stats.cached_bytes, stats.mapped_bytes), (1, 2, 2 * MIB, 6 * MIB));
        // 6 MiB more: the last cached page, then two new pages (one map call for the gap after the cache).
        let c = heap.allocate(request(6 * MIB)).unwrap();
        assert_eq!(c.offset(), 3 * MIB);
        let stats = heap.stats().clone();
        assert_eq!((stats.map_calls, stats.pages_mapped, stats.pages_reused, stats.cached_bytes), (2, 5, 3, 0));
        assert_eq!(stats.mapped_bytes, 10 * MIB);
        assert_eq!(
            heap.take_device_events(),
            [
                DeviceEvent::Mapped { address: 0, size_bytes: 6 * MIB },
                DeviceEvent::Mapped { address: 6 * MIB, size_bytes: 4 * MIB }
            ]
        );
        heap.free(b).unwrap();
        heap.free(c).unwrap();
        assert_eq!((heap.stats().cached_bytes, heap.stats().mapped_bytes), (10 * MIB, 10 * MIB));
        assert_eq!(heap.mapped_runs(), [(0, 10 * MIB)], "adjacent cached runs merge");
        assert!(heap.take_device_events().is_empty(), "nothing was unmapped");
    }

    #[test]
    fn pressure_unmaps_the_cache_before_refusing() {
        // 20 MiB capacity, 16 MiB mapped of which 12 MiB cached; a 14 MiB request cannot land on the cache (a
        // 12 MiB hole between live allocations) and needs 14 MiB of new pages: 16 + 14 > 20, so the cache is
        // unmapped first and the request fits (4 + 14 <= 20).
        let mut heap = pressure_heap(Some(20 * MIB));
        let keep = heap.allocate(request(2 * MIB)).unwrap();
        let freed: Vec<_> = (0..3).map(|_| heap.allocate(request(4 * MIB)).unwrap()).collect();
        let pin = heap.allocate(request(2 * MIB)).unwrap();
        for allocation in freed {
            heap.free(allocation).unwrap();
        }
        heap.take_device_events();
        assert_eq!((heap.stats().mapped_bytes, heap.stats().cached_bytes), (16 * MIB, 12 * MIB));
        let big = heap.allocate(request(14 * MIB)).unwrap();
        assert!(big.offset() >= 16 * MIB, "placed past the pin: {big:?}");
        let stats = heap.stats().clone();
        assert_eq!((stats.cache_releases, stats.cached_bytes, stats.mapped_bytes), (1, 0, 18 * MIB));
        assert_eq!(
            heap.take_device_events(),
            [
                DeviceEvent::Unmapped { address: 2 * MIB, size_bytes: 12 * MIB },
                DeviceEvent::Mapped { address: big.offset(), size_bytes: 14 * MIB }
            ],
            "the cache is unmapped before the new pages are mapped"
        );
        // Past the capacity with no cache left: refused, with the numbers.
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(request(4 * MIB)) else { panic!("expected an OOM") };
        assert_eq!((verdict.reserved_bytes, verdict.unreserved_bytes), (18 * MIB, 2 * MIB));
        assert_eq!(heap.stats().cache_releases, 1, "nothing to release the second time");
        for allocation in [keep, pin, big] {
            heap.free(allocation).unwrap();
        }
    }

    #[test]
    fn a_refused_request_keeps_the_pages_it_would_have_reused_cached() {
        let mut heap = pressure_heap(Some(8 * MIB));
        let a = heap.allocate(request(4 * MIB)).unwrap();
        let b = heap.allocate(request(4 * MIB)).unwrap();
        heap.free(a).unwrap();
        heap.free(b).unwrap();
        assert_eq!(heap.stats().cached_bytes, 8 * MIB);
        // 10 MiB from offset 0 would reuse the four cached pages and need one more: 10 MiB > 8 MiB.
        let Err(Error::OutOfMemory(verdict)) = heap.allocate(request(10 * MIB)) else { panic!("expected an OOM") };
        // It needs its five pages (one new), more than the device: not enough memory (it read as internal waste, its
        // need as the one new page).
        assert_eq!((verdict.needed_bytes, verdict.cause), (10 * MIB, OomCause::Exhaustion), "{verdict}");
        let stats = heap.stats().clone();
        assert_eq!((stats.cache_releases, stats.cached_bytes, stats.mapped_bytes), (0, 8 * MIB, 8 * MIB));
        assert_eq!(heap.mapped_runs(), [(0, 8 * MIB)]);
        // What fits is served from the cache.
        let c = heap.allocate(request(8 * MIB)).unwrap();
        assert_eq!((heap.stats().pages_reused, heap.stats().map_calls), (4, 2), "a and b took one map call each, c none");
        heap.free(c).unwrap();
    }

    #[test]
    fn undo_allocate_restores_the_state_before() {
        for unmap in [UnmapRule::Eager, UnmapRule::UnderPressure] {
            let mut heap = PagedHeap::new(PagedConfig { unmap, ..PagedConfig::new(Some(64 * MIB)) }).unwrap();
            heap.record_device_events(true);
            let a = heap.allocate(request(5 * MIB)).unwrap();
            let b = heap.allocate(request(MIB)).unwrap();
            heap.free(a).unwrap();
            heap.take_device_events();
            let (mapped_before, cached_before, runs_before) =
                (heap.stats().mapped_bytes, heap.stats().cached_bytes, heap.mapped_runs());
            // 9 MiB from 0: under pressure it reuses a's cached pages and maps the rest.
            let c = heap.allocate(request(9 * MIB)).unwrap();
            let mapped: Vec<(u64, u64)> = heap
                .take_device_events()
                .into_iter()
                .map(|event| match event {
                    DeviceEvent::Mapped { address, size_bytes } => (address, size_bytes),
                    other => panic!("{unmap}: unexpected {other:?}"),
                })
                .collect();
            assert!(!mapped.is_empty(), "{unmap}");
            heap.undo_allocate(c, &mapped).unwrap();
            assert!(heap.take_device_events().is_empty(), "{unmap}: the undo logs nothing");
            assert_eq!(
                (heap.stats().mapped_bytes, heap.stats().cached_bytes, heap.mapped_runs()),
                (mapped_before, cached_before, runs_before),
                "{unmap}"
            );
            assert_eq!(heap.live_allocations(), 1);
            heap.free(b).unwrap();
        }
    }

    #[test]
    fn bad_page_size_is_refused() {
        for page_bytes in [0, 3 * MIB, 1 << 63] {
            let config = PagedConfig { page_bytes, ..PagedConfig::new(None) };
            assert!(matches!(PagedHeap::new(config), Err(Error::InvalidConfig { .. })), "{page_bytes}");
        }
    }
}
