//! The layout of a heap at one moment, kept up to date change by change: regions (blocks or virtual ranges
//! with their mapped runs), live allocations by address, and the free runs between them.
//!
//! A free run is a maximal range of reserved bytes no live allocation occupies, inside one region: runs
//! never join across a region boundary, even where two blocks happen to be adjacent. The runs are kept
//! with a count of runs per size, so free bytes and the largest free run (fragmentation) are known after
//! every change without a scan. Every change costs O(log n).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::change::{Change, RegionKind, Span};

/// A change that does not fit the layout: the stream of changes contradicts itself.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// A region overlapping another, or released while holding allocations, or not there.
    #[error("region at {address:#x}: {what}")]
    Region {
        /// Its base address.
        address: u64,
        /// What is wrong.
        what: &'static str,
    },
    /// Memory that should have been free was not (or not reserved at all).
    #[error("{size_bytes} B at {address:#x} are not free reserved memory")]
    NotFree {
        /// Start of the range.
        address: u64,
        /// Bytes.
        size_bytes: u64,
    },
    /// A free of an address where no live allocation starts.
    #[error("no live allocation starts at {address:#x}")]
    NotLive {
        /// The address.
        address: u64,
    },
    /// A start layout set once steps were recorded.
    #[error("the start of a timeline is set before its first step")]
    StartAfterSteps,
}

/// A region of address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// Base address.
    pub address: u64,
    /// Bytes.
    pub size_bytes: u64,
    /// How it is backed.
    pub kind: RegionKind,
    /// Mapped runs by address (virtual regions only), as `address -> bytes`.
    pub mapped: BTreeMap<u64, u64>,
}

impl Region {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.address + self.size_bytes
    }

    /// Bytes reserved from the device: the whole block, or the mapped pages.
    pub fn reserved_bytes(&self) -> u64 {
        match self.kind {
            RegionKind::Block => self.size_bytes,
            RegionKind::Virtual => self.mapped.values().sum(),
        }
    }

    /// Adds `[address, address + size_bytes)` (mapped nowhere yet) to the mapped runs, joining neighbours.
    fn map_pages(&mut self, address: u64, size_bytes: u64) {
        let end = address + size_bytes;
        let mut start = address;
        let mut bytes = size_bytes;
        if let Some((&before, &before_bytes)) = self.mapped.range(..address).next_back()
            && before + before_bytes == address
        {
            self.mapped.remove(&before);
            start = before;
            bytes += before_bytes;
        }
        if let Some(after_bytes) = self.mapped.remove(&end) {
            bytes += after_bytes;
        }
        self.mapped.insert(start, bytes);
    }

    /// Takes `[address, address + size_bytes)` (inside one mapped run) out of the mapped runs.
    fn unmap_pages(&mut self, address: u64, size_bytes: u64) {
        let Some((&start, &bytes)) = self.mapped.range(..=address).next_back() else { return };
        let end = address + size_bytes;
        self.mapped.remove(&start);
        if start < address {
            self.mapped.insert(start, address - start);
        }
        if start + bytes > end {
            self.mapped.insert(end, start + bytes - end);
        }
    }
}

/// Totals of a layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LayoutTotals {
    /// Bytes reserved: blocks plus mapped pages.
    pub reserved_bytes: u64,
    /// Bytes requested by live allocations.
    pub live_bytes: u64,
    /// Bytes set aside for live allocations (requested plus padding).
    pub footprint_bytes: u64,
    /// Free bytes in reserved memory.
    pub free_bytes: u64,
    /// The largest free run.
    pub largest_free_bytes: u64,
    /// Live allocations.
    pub live_allocations: u64,
    /// Free runs.
    pub free_runs: u64,
}

impl LayoutTotals {
    /// External fragmentation: `1 - largest free run / free bytes` (0 when nothing is free).
    pub fn fragmentation(&self) -> f64 {
        if self.free_bytes == 0 { 0.0 } else { 1.0 - self.largest_free_bytes as f64 / self.free_bytes as f64 }
    }

    /// Internal waste: `(footprint - live) / reserved`, the share of the reserved bytes that is padding and rounding
    /// inside live allocations (0 when nothing is reserved).
    pub fn waste(&self) -> f64 {
        if self.reserved_bytes == 0 {
            0.0
        } else {
            self.footprint_bytes.saturating_sub(self.live_bytes) as f64 / self.reserved_bytes as f64
        }
    }
}

/// What a change did beyond itself, for animations and explanations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effect {
    /// The free run an allocation was carved from, `(address, bytes)`: a remainder was split off when it is
    /// larger than the footprint.
    pub carved_from: Option<(u64, u64)>,
    /// The free run a free (or a map) produced, `(address, bytes)`, and how many free neighbours it merged with.
    pub merged_into: Option<((u64, u64), u8)>,
    /// The span a free removed.
    pub freed: Option<Span>,
    /// The region a release removed, `(address, bytes)`.
    pub removed_region: Option<(u64, u64)>,
}

/// The region of `regions` holding `address`, to change.
fn region_at(regions: &mut BTreeMap<u64, Region>, address: u64) -> Option<&mut Region> {
    regions.range_mut(..=address).next_back().map(|(_, region)| region).filter(|region| address < region.end())
}

/// Regions, live allocations and free runs. See the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    regions: BTreeMap<u64, Region>,
    spans: BTreeMap<u64, Span>,
    free_runs: BTreeMap<u64, u64>,
    free_sizes: BTreeMap<u64, u32>,
    totals: LayoutTotals,
}

impl Layout {
    /// An empty layout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Totals now.
    pub fn totals(&self) -> LayoutTotals {
        let mut totals = self.totals;
        totals.largest_free_bytes = self.free_sizes.keys().next_back().copied().unwrap_or(0);
        totals
    }

    /// Regions by address.
    pub fn regions(&self) -> impl DoubleEndedIterator<Item = &Region> + ExactSizeIterator {
        self.regions.values()
    }

    /// The region holding `address`.
    pub fn region_of(&self, address: u64) -> Option<&Region> {
        self.regions.range(..=address).next_back().map(|(_, region)| region).filter(|region| address < region.end())
    }

    /// Live allocations by address.
    pub fn spans(&self) -> impl DoubleEndedIterator<Item = &Span> + ExactSizeIterator {
        self.spans.values()
    }

    /// Live allocations whose footprint overlaps `[start, end)`, by address.
    pub fn spans_in(&self, start: u64, end: u64) -> impl Iterator<Item = &Span> {
        // The span starting before `start` may reach into the range.
        let first = self.spans.range(..start).next_back().filter(|(_, span)| span.end() > start).map(|(&address, _)| address);
        let lower = first.map_or(Bound::Included(start), Bound::Included);
        self.spans.range((lower, Bound::Excluded(end))).map(|(_, span)| span)
    }

    /// The live allocation whose footprint holds `address`.
    pub fn span_at(&self, address: u64) -> Option<&Span> {
        self.spans.range(..=address).next_back().map(|(_, span)| span).filter(|span| address < span.end())
    }

    /// Free runs `(address, bytes)` overlapping `[start, end)`, by address.
    pub fn free_runs_in(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = self.free_runs.range(..start).next_back().filter(|(a, b)| **a + **b > start).map(|(&address, _)| address);
        let lower = first.map_or(Bound::Included(start), Bound::Included);
        self.free_runs.range((lower, Bound::Excluded(end))).map(|(&address, &bytes)| (address, bytes))
    }

    /// Every free run `(address, bytes)`, by address.
    pub fn free_runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free_runs.iter().map(|(&address, &bytes)| (address, bytes))
    }

    /// The regions by address, as a map.
    pub(super) fn region_map(&self) -> &BTreeMap<u64, Region> {
        &self.regions
    }

    /// The regions and live allocations (by address): all a layout is made of, the free runs follow.
    pub fn parts(&self) -> (BTreeMap<u64, Region>, Vec<Span>) {
        (self.regions.clone(), self.spans.values().copied().collect())
    }

    /// The layout of `regions` holding `spans` (by address, as [`Layout::parts`] gives them): free runs are
    /// the gaps of reserved memory between the spans, in one pass.
    pub fn from_parts(regions: BTreeMap<u64, Region>, spans: &[Span]) -> Self {
        Self::from_maps(regions, spans.iter().map(|span| (span.address, *span)).collect())
    }

    /// [`Layout::from_parts`] with the spans already by address.
    fn from_maps(regions: BTreeMap<u64, Region>, spans: BTreeMap<u64, Span>) -> Self {
        let mut layout = Self { spans, ..Self::default() };
        // A free run before each span and one at the end of each region at most.
        let mut runs = Vec::with_capacity(layout.spans.len() + regions.len());
        for region in regions.values() {
            layout.totals.reserved_bytes += region.reserved_bytes();
            let block = [(region.address, region.size_bytes)];
            let reserved: Box<dyn Iterator<Item = (u64, u64)>> = match region.kind {
                RegionKind::Block => Box::new(block.into_iter()),
                RegionKind::Virtual => Box::new(region.mapped.iter().map(|(&address, &bytes)| (address, bytes))),
            };
            for (start, bytes) in reserved {
                let end = start + bytes;
                let mut cursor = start;
                for span in layout.spans_in(start, end) {
                    if span.address > cursor {
                        runs.push((cursor, span.address - cursor));
                    }
                    cursor = cursor.max(span.end());
                }
                if end > cursor {
                    runs.push((cursor, end - cursor));
                }
            }
        }
        layout.regions = regions;
        for span in layout.spans.values() {
            layout.totals.live_bytes += span.requested_bytes;
            layout.totals.footprint_bytes += span.footprint_bytes;
        }
        layout.totals.live_allocations = layout.spans.len() as u64;
        let mut sizes: Vec<u64> = runs.iter().map(|run| run.1).collect();
        sizes.sort_unstable();
        layout.free_sizes = sizes.chunk_by(|a, b| a == b).map(|chunk| (chunk[0], chunk.len() as u32)).collect();
        layout.totals.free_bytes = sizes.iter().sum();
        layout.totals.free_runs = runs.len() as u64;
        layout.free_runs = runs.into_iter().collect();
        layout
    }

    /// The layout of `regions` and `spans` (as [`Layout::parts`] gives them) after `changes`, which were
    /// recorded on it: only regions and allocations are updated change by change, and the free runs are
    /// built once at the end. Much cheaper than applying many changes one by one (a seek); a change that
    /// does not fit is skipped (a recorded stream fits by construction).
    pub fn replayed<'a>(regions: BTreeMap<u64, Region>, spans: &[Span], changes: impl IntoIterator<Item = &'a Change>) -> Self {
        Self::replayed_maps(regions, spans.iter().map(|span| (span.address, *span)).collect(), changes)
    }

    /// [`Layout::replayed`] with the spans already by address.
    pub(super) fn replayed_maps<'a>(
        mut regions: BTreeMap<u64, Region>,
        mut spans: BTreeMap<u64, Span>,
        changes: impl IntoIterator<Item = &'a Change>,
    ) -> Self {
        for change in changes {
            match *change {
                Change::RegionAdded { address, size_bytes, kind } => {
                    regions.insert(address, Region { address, size_bytes, kind, mapped: BTreeMap::new() });
                }
                Change::RegionResized { address, size_bytes } => {
                    if let Some(region) = regions.get_mut(&address) {
                        region.size_bytes = size_bytes;
                    }
                }
                Change::RegionRemoved { address } => {
                    regions.remove(&address);
                }
                Change::PagesMapped { address, size_bytes } => {
                    if let Some(region) = region_at(&mut regions, address) {
                        region.map_pages(address, size_bytes);
                    }
                }
                Change::PagesUnmapped { address, size_bytes } => {
                    if let Some(region) = region_at(&mut regions, address) {
                        region.unmap_pages(address, size_bytes);
                    }
                }
                Change::Allocated(span) => {
                    spans.insert(span.address, span);
                }
                Change::Freed { address } => {
                    spans.remove(&address);
                }
            }
        }
        Self::from_maps(regions, spans)
    }

    /// Applies `change`.
    ///
    /// # Errors
    /// [`LayoutError`] when the change contradicts the layout; the layout is unchanged then.
    pub fn apply(&mut self, change: &Change) -> Result<Effect, LayoutError> {
        match *change {
            Change::RegionAdded { address, size_bytes, kind } => self.add_region(address, size_bytes, kind),
            Change::RegionResized { address, size_bytes } => self.resize_region(address, size_bytes),
            Change::RegionRemoved { address } => self.remove_region(address),
            Change::PagesMapped { address, size_bytes } => self.map(address, size_bytes),
            Change::PagesUnmapped { address, size_bytes } => self.unmap(address, size_bytes),
            Change::Allocated(span) => self.allocate(span),
            Change::Freed { address } => self.free(address),
        }
    }

    fn add_region(&mut self, address: u64, size_bytes: u64, kind: RegionKind) -> Result<Effect, LayoutError> {
        let fail = |what| Err(LayoutError::Region { address, what });
        let Some(end) = address.checked_add(size_bytes).filter(|_| size_bytes > 0) else {
            return fail("empty, or ends past the 64-bit address space");
        };
        let before = self.regions.range(..end).next_back().is_some_and(|(_, region)| region.end() > address);
        if before {
            return fail("overlaps a region already reserved");
        }
        self.regions.insert(address, Region { address, size_bytes, kind, mapped: BTreeMap::new() });
        if kind == RegionKind::Block {
            self.totals.reserved_bytes += size_bytes;
            let run = self.release(address, size_bytes);
            return Ok(Effect { merged_into: Some(run), ..Effect::default() });
        }
        Ok(Effect::default())
    }

    /// A virtual region's new size: its mapped pages (and so its allocations and free runs) must lie within it, and
    /// it must not reach the next region.
    fn resize_region(&mut self, address: u64, size_bytes: u64) -> Result<Effect, LayoutError> {
        let fail = |what| Err(LayoutError::Region { address, what });
        let Some(end) = address.checked_add(size_bytes).filter(|_| size_bytes > 0) else {
            return fail("resized to nothing, or past the 64-bit address space");
        };
        let next = self.regions.range(address + 1..).next().map(|(&next, _)| next);
        let Some(region) = self.regions.get_mut(&address) else {
            return fail("resized, but no region starts there");
        };
        if region.kind != RegionKind::Virtual {
            return fail("resized, but it is a block, not a virtual range");
        }
        let mapped_end = region.mapped.iter().next_back().map_or(address, |(&start, &bytes)| start + bytes);
        if mapped_end > end {
            return fail("resized below its mapped pages");
        }
        if next.is_some_and(|next| next < end) {
            return fail("resized over the next region");
        }
        region.size_bytes = size_bytes;
        Ok(Effect::default())
    }

    fn remove_region(&mut self, address: u64) -> Result<Effect, LayoutError> {
        let Some(region) = self.regions.get(&address) else {
            return Err(LayoutError::Region { address, what: "released, but no region starts there" });
        };
        if self.spans_in(region.address, region.end()).next().is_some() {
            return Err(LayoutError::Region { address, what: "released while it holds live allocations" });
        }
        let (start, end) = (region.address, region.end());
        let runs: Vec<(u64, u64)> = self.free_runs_in(start, end).collect();
        for (run, bytes) in runs {
            self.take_run(run, bytes);
        }
        let region = self.regions.remove(&address).expect("looked up above");
        self.totals.reserved_bytes -= region.reserved_bytes();
        Ok(Effect { removed_region: Some((region.address, region.size_bytes)), ..Effect::default() })
    }

    fn map(&mut self, address: u64, size_bytes: u64) -> Result<Effect, LayoutError> {
        let end = address.checked_add(size_bytes).filter(|_| size_bytes > 0);
        let region = end.and_then(|_| self.regions.range_mut(..=address).next_back().map(|(_, region)| region));
        let Some(region) =
            region.filter(|region| region.kind == RegionKind::Virtual && end.is_some_and(|end| end <= region.end()))
        else {
            return Err(LayoutError::Region { address, what: "pages mapped outside any virtual region" });
        };
        let end = address + size_bytes;
        let overlaps = region.mapped.range(..end).next_back().is_some_and(|(&start, &bytes)| start + bytes > address);
        if overlaps {
            return Err(LayoutError::Region { address, what: "pages mapped twice" });
        }
        region.map_pages(address, size_bytes);
        self.totals.reserved_bytes += size_bytes;
        let run = self.release(address, size_bytes);
        Ok(Effect { merged_into: Some(run), ..Effect::default() })
    }

    fn unmap(&mut self, address: u64, size_bytes: u64) -> Result<Effect, LayoutError> {
        let not_free = LayoutError::NotFree { address, size_bytes };
        let virtual_region = self.region_of(address).is_some_and(|region| region.kind == RegionKind::Virtual);
        if !virtual_region {
            return Err(not_free);
        }
        let run = self.containing_free_run(address, size_bytes).ok_or(not_free)?;
        let region = self.regions.range_mut(..=address).next_back().map(|(_, region)| region).expect("checked above");
        region.unmap_pages(address, size_bytes);
        self.carve(run, address, size_bytes);
        self.totals.reserved_bytes -= size_bytes;
        Ok(Effect::default())
    }

    fn allocate(&mut self, span: Span) -> Result<Effect, LayoutError> {
        let not_free = LayoutError::NotFree { address: span.address, size_bytes: span.footprint_bytes };
        if span.footprint_bytes == 0 || span.requested_bytes + span.lead_bytes > span.footprint_bytes {
            return Err(not_free);
        }
        let run = self.containing_free_run(span.address, span.footprint_bytes).ok_or(not_free)?;
        self.carve(run, span.address, span.footprint_bytes);
        self.spans.insert(span.address, span);
        self.totals.live_bytes += span.requested_bytes;
        self.totals.footprint_bytes += span.footprint_bytes;
        self.totals.live_allocations += 1;
        Ok(Effect { carved_from: Some(run), ..Effect::default() })
    }

    fn free(&mut self, address: u64) -> Result<Effect, LayoutError> {
        let span = self.spans.remove(&address).ok_or(LayoutError::NotLive { address })?;
        self.totals.live_bytes -= span.requested_bytes;
        self.totals.footprint_bytes -= span.footprint_bytes;
        self.totals.live_allocations -= 1;
        let run = self.release(span.address, span.footprint_bytes);
        Ok(Effect { merged_into: Some(run), freed: Some(span), ..Effect::default() })
    }

    /// The free run holding all of `[address, address + size_bytes)`.
    fn containing_free_run(&self, address: u64, size_bytes: u64) -> Option<(u64, u64)> {
        let (&start, &bytes) = self.free_runs.range(..=address).next_back()?;
        (start + bytes >= address.checked_add(size_bytes)?).then_some((start, bytes))
    }

    /// Takes `[address, address + size_bytes)` out of the free run `run`, keeping what is left on either side.
    fn carve(&mut self, run: (u64, u64), address: u64, size_bytes: u64) {
        let (start, bytes) = run;
        self.take_run(start, bytes);
        if address > start {
            self.put_run(start, address - start);
        }
        let end = address + size_bytes;
        if start + bytes > end {
            self.put_run(end, start + bytes - end);
        }
    }

    /// Makes `[address, address + size_bytes)` free, joining the free runs on either side in the same
    /// region; returns the joined run and how many neighbours it absorbed.
    fn release(&mut self, address: u64, size_bytes: u64) -> ((u64, u64), u8) {
        let region = self.region_of(address).map(|region| region.address);
        let same_region = |layout: &Self, other: u64| layout.region_of(other).map(|region| region.address) == region;
        let mut start = address;
        let mut bytes = size_bytes;
        let mut merged = 0;
        if let Some((&before, &before_bytes)) = self.free_runs.range(..address).next_back()
            && before + before_bytes == address
            && same_region(self, before)
        {
            self.take_run(before, before_bytes);
            start = before;
            bytes += before_bytes;
            merged += 1;
        }
        let end = address + size_bytes;
        if let Some(&after_bytes) = self.free_runs.get(&end)
            && same_region(self, end)
        {
            self.take_run(end, after_bytes);
            bytes += after_bytes;
            merged += 1;
        }
        self.put_run(start, bytes);
        ((start, bytes), merged)
    }

    fn put_run(&mut self, address: u64, bytes: u64) {
        self.free_runs.insert(address, bytes);
        *self.free_sizes.entry(bytes).or_insert(0) += 1;
        self.totals.free_bytes += bytes;
        self.totals.free_runs += 1;
    }

    fn take_run(&mut self, address: u64, bytes: u64) {
        self.free_runs.remove(&address);
        if let Some(count) = self.free_sizes.get_mut(&bytes) {
            *count -= 1;
            if *count == 0 {
                self.free_sizes.remove(&bytes);
            }
        }
        self.totals.free_bytes -= bytes;
        self.totals.free_runs -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(address: u64, footprint_bytes: u64, requested_bytes: u64) -> Span {
        Span { address, footprint_bytes, lead_bytes: 0, requested_bytes, slot: 0, before_recording: false, born: 0 }
    }

    /// Free runs after each change, against the expected ones.
    #[test]
    fn free_runs_split_and_merge_table() {
        let block = |address, size_bytes| Change::RegionAdded { address, size_bytes, kind: RegionKind::Block };
        type Case = (Change, &'static [(u64, u64)]);
        let cases: [Case; 8] = [
            (block(1000, 300), &[(1000, 300)]),
            // An adjacent block: its free run stays apart.
            (block(1300, 100), &[(1000, 300), (1300, 100)]),
            (Change::Allocated(span(1000, 100, 90)), &[(1100, 200), (1300, 100)]),
            (Change::Allocated(span(1200, 50, 50)), &[(1100, 100), (1250, 50), (1300, 100)]),
            (Change::Freed { address: 1000 }, &[(1000, 200), (1250, 50), (1300, 100)]),
            (Change::Freed { address: 1200 }, &[(1000, 300), (1300, 100)]),
            (Change::RegionRemoved { address: 1300 }, &[(1000, 300)]),
            (Change::RegionRemoved { address: 1000 }, &[]),
        ];
        let mut layout = Layout::new();
        for (change, expected) in cases {
            layout.apply(&change).unwrap();
            assert_eq!(layout.free_runs().collect::<Vec<_>>(), expected, "after {change:?}");
            let totals = layout.totals();
            assert_eq!(totals.free_bytes, expected.iter().map(|run| run.1).sum::<u64>());
            assert_eq!(totals.largest_free_bytes, expected.iter().map(|run| run.1).max().unwrap_or(0));
            assert_eq!(totals.reserved_bytes, totals.free_bytes + totals.footprint_bytes, "after {change:?}");
        }
    }

    #[test]
    fn virtual_regions_reserve_only_mapped_pages() {
        let mut layout = Layout::new();
        layout.apply(&Change::RegionAdded { address: 0, size_bytes: 1 << 20, kind: RegionKind::Virtual }).unwrap();
        assert_eq!(layout.totals().reserved_bytes, 0);
        layout.apply(&Change::PagesMapped { address: 4096, size_bytes: 8192 }).unwrap();
        layout.apply(&Change::Allocated(span(4096, 6000, 6000))).unwrap();
        layout.apply(&Change::PagesMapped { address: 12288, size_bytes: 4096 }).unwrap();
        assert_eq!(layout.free_runs().collect::<Vec<_>>(), [(10096, 6288)], "the new page joins the free tail");
        assert_eq!(layout.regions().next().unwrap().mapped.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>(), [(4096, 12288)]);
        // An allocation outside mapped pages is refused.
        assert_eq!(
            layout.apply(&Change::Allocated(span(20000, 10, 10))),
            Err(LayoutError::NotFree { address: 20000, size_bytes: 10 })
        );
        layout.apply(&Change::Freed { address: 4096 }).unwrap();
        layout.apply(&Change::PagesUnmapped { address: 4096, size_bytes: 12288 }).unwrap();
        let totals = layout.totals();
        assert_eq!((totals.reserved_bytes, totals.free_bytes, totals.free_runs), (0, 0, 0));
    }

    #[test]
    fn contradictions_are_errors_and_change_nothing() {
        let mut layout = Layout::new();
        layout.apply(&Change::RegionAdded { address: 100, size_bytes: 100, kind: RegionKind::Block }).unwrap();
        layout.apply(&Change::Allocated(span(100, 10, 10))).unwrap();
        layout.apply(&Change::RegionAdded { address: 1000, size_bytes: 1000, kind: RegionKind::Virtual }).unwrap();
        layout.apply(&Change::PagesMapped { address: 1000, size_bytes: 500 }).unwrap();
        layout.apply(&Change::RegionAdded { address: 3000, size_bytes: 1000, kind: RegionKind::Virtual }).unwrap();
        let before = layout.clone();
        let cases = [
            Change::RegionResized { address: 100, size_bytes: 50 },    // a block
            Change::RegionResized { address: 7, size_bytes: 50 },      // no region there
            Change::RegionResized { address: 1000, size_bytes: 499 },  // below its mapped pages
            Change::RegionResized { address: 1000, size_bytes: 2001 }, // over the next region
            Change::RegionResized { address: 1000, size_bytes: 0 },
            Change::RegionAdded { address: 150, size_bytes: 100, kind: RegionKind::Block },
            Change::RegionAdded { address: 50, size_bytes: 0, kind: RegionKind::Block },
            Change::RegionRemoved { address: 100 },
            Change::RegionRemoved { address: 7 },
            Change::Allocated(span(105, 10, 10)),
            Change::Allocated(span(190, 20, 20)),
            Change::Allocated(span(150, 10, 20)),
            Change::Freed { address: 150 },
            Change::PagesMapped { address: 100, size_bytes: 10 },
            Change::PagesUnmapped { address: 150, size_bytes: 10 },
        ];
        for change in cases {
            assert!(layout.apply(&change).is_err(), "{change:?}");
            assert_eq!(layout, before, "{change:?}");
        }
        assert!(LayoutError::NotLive { address: 150 }.to_string().contains("0x96"));
        // Cut to its mapped pages, grown to the next region: allowed.
        for size_bytes in [500, 2000] {
            layout.apply(&Change::RegionResized { address: 1000, size_bytes }).unwrap();
            assert_eq!(layout.region_of(1000).map(|region| region.size_bytes), Some(size_bytes));
        }
    }

    #[test]
    fn queries_by_range() {
        let mut layout = Layout::new();
        layout.apply(&Change::RegionAdded { address: 0, size_bytes: 1000, kind: RegionKind::Block }).unwrap();
        for address in [0, 100, 200] {
            layout.apply(&Change::Allocated(span(address, 50, 50))).unwrap();
        }
        let addresses = |spans: Vec<&Span>| spans.iter().map(|span| span.address).collect::<Vec<_>>();
        assert_eq!(addresses(layout.spans_in(40, 120).collect()), [0, 100], "the span reaching into the range counts");
        assert_eq!(addresses(layout.spans_in(50, 100).collect()), Vec::<u64>::new());
        assert_eq!(layout.span_at(120).map(|span| span.address), Some(100));
        assert_eq!(layout.span_at(170), None);
        assert_eq!(layout.free_runs_in(60, 160).collect::<Vec<_>>(), [(50, 50), (150, 50)]);
        assert_eq!(layout.region_of(999).map(|region| region.address), Some(0));
        assert!(layout.region_of(1000).is_none());
    }

    #[test]
    fn rebuilt_from_parts_equals_the_layout() {
        let mut layout = Layout::new();
        let changes = [
            Change::RegionAdded { address: 0, size_bytes: 1000, kind: RegionKind::Block },
            Change::RegionAdded { address: 1000, size_bytes: 500, kind: RegionKind::Block },
            Change::RegionAdded { address: 1 << 20, size_bytes: 1 << 20, kind: RegionKind::Virtual },
            Change::Allocated(span(100, 100, 100)),
            Change::Allocated(span(1000, 500, 400)),
            Change::PagesMapped { address: 1 << 20, size_bytes: 8192 },
            Change::PagesMapped { address: (1 << 20) + 16384, size_bytes: 4096 },
            Change::Allocated(span((1 << 20) + 4096, 100, 100)),
        ];
        for change in changes {
            layout.apply(&change).unwrap();
            let (regions, spans) = layout.parts();
            assert_eq!(Layout::from_parts(regions, &spans), layout, "after {change:?}");
        }
    }
}
