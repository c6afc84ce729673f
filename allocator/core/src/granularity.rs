//! Vulkan's `bufferImageGranularity`: a linear and an optimal resource must not share a page of
//! `page_bytes`.
//!
//! One mechanism serves every policy that places allocations at arbitrary offsets (TLSF, best/first fit,
//! linear). A live resource's interior pages are its own, so only its first and last page can be shared; the
//! guard records those boundary pages with their kind and a count. A placement conflicts when its first or
//! last page is recorded with the other kind. Placing at the lowest feasible offset of a free run is optimal:
//! the run's neighbours are the only resources its pages can meet.

use crate::hash::FastMap;

use crate::ResourceKind;
use crate::request::align_up;

/// The pages at the boundaries of live resources, with their kind.
#[derive(Clone, Debug)]
pub struct GranularityGuard {
    page_bytes: u64,
    boundary_pages: FastMap<u64, (ResourceKind, u32)>,
}

impl GranularityGuard {
    /// A guard for pages of `page_bytes` (a power of two).
    pub fn new(page_bytes: u64) -> Self {
        debug_assert!(page_bytes.is_power_of_two());
        Self { page_bytes, boundary_pages: FastMap::default() }
    }

    /// The page size.
    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    fn conflicts(&self, page: u64, kind: ResourceKind) -> bool {
        self.boundary_pages.get(&page).is_some_and(|(owner, _)| *owner != kind)
    }

    /// The lowest offset `>= start`, aligned to `align`, where `size_bytes` of `kind` fit before `end` without
    /// sharing a page with a resource of the other kind.
    pub fn place(&self, start: u64, end: u64, size_bytes: u64, align: u64, kind: ResourceKind) -> Option<u64> {
        let mut offset = align_up(start, align)?;
        if self.conflicts(offset / self.page_bytes, kind) {
            offset = align_up(align_up(offset + 1, self.page_bytes)?, align)?;
        }
        let last = offset.checked_add(size_bytes)?.checked_sub(1)?;
        if last >= end || self.conflicts(last / self.page_bytes, kind) {
            return None;
        }
        Some(offset)
    }

    /// Records a live resource `[offset, offset + size_bytes)`.
    pub fn insert(&mut self, offset: u64, size_bytes: u64, kind: ResourceKind) {
        for page in self.boundaries(offset, size_bytes) {
            let entry = self.boundary_pages.entry(page).or_insert((kind, 0));
            debug_assert_eq!(entry.0, kind, "granularity conflict on page {page}");
            entry.1 += 1;
        }
    }

    /// Forgets a resource recorded by [`GranularityGuard::insert`].
    pub fn remove(&mut self, offset: u64, size_bytes: u64) {
        for page in self.boundaries(offset, size_bytes) {
            if let Some(entry) = self.boundary_pages.get_mut(&page) {
                entry.1 -= 1;
                if entry.1 == 0 {
                    self.boundary_pages.remove(&page);
                }
            }
        }
    }

    fn boundaries(&self, offset: u64, size_bytes: u64) -> impl Iterator<Item = u64> + use<> {
        let first = offset / self.page_bytes;
        let last = (offset + size_bytes - 1) / self.page_bytes;
        std::iter::once(first).chain((last != first).then_some(last))
    }
}

/// Where a request of `kind` goes inside the free run `[start, end)`: the lowest offset aligned to `align`,
/// away from resources of the other kind when a guard is active.
#[inline]
pub(crate) fn place(
    guard: Option<&GranularityGuard>,
    start: u64,
    end: u64,
    size_bytes: u64,
    align: u64,
    kind: ResourceKind,
) -> Option<u64> {
    match guard {
        Some(guard) => guard.place(start, end, size_bytes, align, kind),
        None => {
            let offset = align_up(start, align)?;
            (end.checked_sub(offset)? >= size_bytes).then_some(offset)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ResourceKind::{Linear, Optimal};

    #[test]
    fn placement_table() {
        let mut guard = GranularityGuard::new(1024);
        guard.insert(0, 100, Linear); // page 0 is linear
        guard.insert(4000, 100, Optimal); // pages 3 and 4 are optimal
        // (start, end, size, align, kind) -> offset
        let cases = [
            ((100, 4000, 100, 1, Linear), Some(100)),
            ((100, 4000, 100, 1, Optimal), Some(1024)),
            ((100, 4000, 100, 256, Linear), Some(256)),
            ((100, 4000, 2000, 1, Optimal), Some(1024)),
            ((100, 4000, 2100, 1, Optimal), Some(1024)),
            ((100, 4000, 3000, 1, Linear), None), // would end on page 3, next to the optimal resource
            ((100, 4000, 2000, 1, Linear), Some(100)),
            ((100, 3072, 1948, 1, Linear), Some(100)),
            ((100, 4000, 3900, 1, Optimal), None),
        ];
        for ((start, end, size, align, kind), expected) in cases {
            assert_eq!(guard.place(start, end, size, align, kind), expected, "{start}..{end} size {size} {kind:?}");
        }
        guard.remove(0, 100);
        assert_eq!(guard.place(100, 4000, 100, 1, Optimal), Some(100));
        assert_eq!(place(None, 100, 4000, 3900, 1, Linear), Some(100));
        assert_eq!(place(None, 100, 4000, 3901, 1, Linear), None);
        assert_eq!(place(None, u64::MAX - 1, u64::MAX, 1, 4, Linear), None);
    }
}
