//! Slab allocation: small requests go to fixed power-of-two size classes packed in slab pages; everything
//! else, and the slab pages themselves, is placed by an inner [`Tlsf`] over the same range (the jemalloc
//! split between small size classes and large runs).
//!
//! A slab page holds slots of one class (and, with the granularity rule on, one resource kind, so kinds
//! never share a page); a bitmap marks its free slots. A small request takes the lowest free slot of the
//! lowest-addressed page of its class with room, or a new page; when no page can be had it falls back to a
//! free slot of a larger class, then to TLSF directly, so it fails only when no free run can hold it. A page
//! whose last slot is freed goes back to TLSF at once. Slots cost no per-allocation metadata search and
//! small objects never fragment the large runs; the price is up to half a slot of internal waste.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::Tlsf;
use crate::policy::rounded;
use crate::report::{FreeSpace, allocation_ranges};
use crate::slots::SlotTable;
use crate::{
    Allocation, AllocationId, OwnerId, Policy, PolicyConfig, PolicyReport, RangeReport, RangeState, Request, ResourceKind, Result,
};

#[derive(Clone, Debug)]
struct SlabPage {
    class_log2: u32,
    kind: ResourceKind,
    /// The page's allocation in the inner TLSF.
    inner: Allocation,
    /// One bit per slot, set when the slot is free.
    free_bits: Vec<u64>,
    used: u32,
    slots: u32,
}

impl SlabPage {
    /// The lowest free slot whose index is a multiple of `stride`.
    fn free_slot(&self, stride: u32) -> Option<u32> {
        if stride <= 1 {
            return self
                .free_bits
                .iter()
                .zip(0u32..)
                .find_map(|(&word, index)| (word != 0).then(|| index * 64 + word.trailing_zeros()));
        }
        (0..self.slots).step_by(stride as usize).find(|&slot| self.is_free(slot))
    }

    fn is_free(&self, slot: u32) -> bool {
        self.free_bits[slot as usize / 64] & (1 << (slot % 64)) != 0
    }

    fn flip(&mut self, slot: u32) {
        self.free_bits[slot as usize / 64] ^= 1 << (slot % 64);
    }
}

#[derive(Clone, Copy, Debug)]
enum Placement {
    Slot { page: u64, slot: u32 },
    Large(Allocation),
}

#[derive(Clone, Copy, Debug)]
struct Live {
    placement: Placement,
    offset: u64,
    size_bytes: u64,
}

/// The slab policy.
#[derive(Clone, Debug)]
pub struct Slab {
    owner: OwnerId,
    inner: Tlsf,
    min_class_log2: u32,
    max_class_log2: u32,
    page_bytes: u64,
    separate_kinds: bool,
    pages: BTreeMap<u64, SlabPage>,
    /// Pages with a free slot, per (class, kind).
    partial: HashMap<(u32, ResourceKind), BTreeSet<u64>>,
    /// The bytes of the free slots of every page, counted as slots are taken and freed (for [`Policy::free_space`]).
    free_slot_bytes: u64,
    live: SlotTable<Live>,
}

impl Slab {
    /// A slab policy over `[0, capacity_bytes)` with the default settings.
    pub fn new(capacity_bytes: u64) -> Self {
        Self::with_config(capacity_bytes, &PolicyConfig::default()).expect("the default configuration is valid")
    }

    /// A slab policy over `[0, capacity_bytes)`; the capacity is rounded down to `min_align_bytes`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for invalid settings.
    pub fn with_config(capacity_bytes: u64, config: &PolicyConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            owner: OwnerId::fresh(),
            inner: Tlsf::with_config(capacity_bytes, config)?,
            min_class_log2: config.slab_min_class_bytes.max(config.min_align_bytes).trailing_zeros(),
            max_class_log2: config.slab_max_class_bytes.trailing_zeros(),
            page_bytes: config.slab_page_bytes,
            separate_kinds: config.granularity().is_some(),
            pages: BTreeMap::new(),
            partial: HashMap::new(),
            free_slot_bytes: 0,
            live: SlotTable::default(),
        })
    }

    fn class_key(&self, class_log2: u32, kind: ResourceKind) -> (u32, ResourceKind) {
        (class_log2, if self.separate_kinds { kind } else { ResourceKind::Linear })
    }

    /// A free slot of `class_log2` whose offset is aligned to `align`, in the lowest page that has one.
    fn take_slot(&mut self, class_log2: u32, kind: ResourceKind, align: u64) -> Option<(u64, u32)> {
        let key = self.class_key(class_log2, kind);
        let stride = u32::try_from((align >> class_log2).max(1)).unwrap_or(u32::MAX);
        let pages = self.partial.get(&key)?;
        // Pages are aligned to their size; a larger alignment leaves only the first slot of some pages.
        let (page_offset, slot) = pages
            .iter()
            .filter(|&&page_offset| page_offset % align.max(self.page_bytes) == 0)
            .find_map(|&page_offset| Some((page_offset, self.pages[&page_offset].free_slot(stride)?)))?;
        let page = self.pages.get_mut(&page_offset).expect("partial pages exist");
        page.flip(slot);
        page.used += 1;
        self.free_slot_bytes -= 1 << class_log2;
        if page.used == page.slots {
            self.partial.get_mut(&key).expect("key present").remove(&page_offset);
        }
        Some((page_offset, slot))
    }

    /// A new slab page of `class_log2` from the inner TLSF.
    fn add_page(&mut self, class_log2: u32, kind: ResourceKind) -> bool {
        let key = self.class_key(class_log2, kind);
        let page_request = Request::new(self.page_bytes, self.page_bytes).expect("page size is a power of two").with_kind(key.1);
        let Some(inner) = self.inner.allocate(page_request) else {
            return false;
        };
        let slots = u32::try_from(self.page_bytes >> class_log2).expect("fewer than 2^32 slots a page");
        let mut free_bits = vec![u64::MAX; slots.div_ceil(64) as usize];
        if slots % 64 != 0 {
            *free_bits.last_mut().expect("at least one word") = (1 << (slots % 64)) - 1;
        }
        self.pages.insert(inner.offset(), SlabPage { class_log2, kind: key.1, inner, free_bits, used: 0, slots });
        self.free_slot_bytes += u64::from(slots) << class_log2;
        self.partial.entry(key).or_default().insert(inner.offset());
        true
    }

    fn slot_allocation(&mut self, request: Request, class_log2: u32, (page, slot): (u64, u32)) -> Allocation {
        let offset = page + (u64::from(slot) << class_log2);
        let id = self.live.insert(Live { placement: Placement::Slot { page, slot }, offset, size_bytes: request.size_bytes() });
        Allocation::from_parts(self.owner, id, offset, request.size_bytes(), (offset, 1 << class_log2), request.kind())
    }

    fn allocate_small(&mut self, request: Request, size: u64, align: u64) -> Option<Allocation> {
        let kind = request.kind();
        let class = size.next_power_of_two().trailing_zeros().max(self.min_class_log2).max(align.trailing_zeros());
        if let Some(slot) = self.take_slot(class, kind, align) {
            return Some(self.slot_allocation(request, class, slot));
        }
        if self.add_page(class, kind) {
            let slot = self.take_slot(class, kind, align).expect("a new page has a free slot");
            return Some(self.slot_allocation(request, class, slot));
        }
        None
    }

    /// The largest class with a free slot in some page (0 when none has).
    fn largest_free_slot_bytes(&self) -> u64 {
        self.partial.iter().filter(|(_, pages)| !pages.is_empty()).map(|(&(class_log2, _), _)| 1 << class_log2).max().unwrap_or(0)
    }

    /// Any free slot that holds a small request with its alignment, in the smallest class that has one:
    /// the fallback when no page can be had.
    fn allocate_in_any_slot(&mut self, request: Request, size: u64, align: u64) -> Option<Allocation> {
        let size_class = size.next_power_of_two().trailing_zeros().max(self.min_class_log2);
        (size_class..=self.max_class_log2)
            .find_map(|class| Some((class, self.take_slot(class, request.kind(), align)?)))
            .map(|(class, slot)| self.slot_allocation(request, class, slot))
    }
}

impl Policy for Slab {
    fn name(&self) -> &'static str {
        "slab"
    }

    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }

    fn allocate(&mut self, request: Request) -> Option<Allocation> {
        let (size, align) = rounded(request, 1 << self.min_class_log2)?;
        let max_class = 1 << self.max_class_log2;
        if size <= max_class {
            let small = if align <= max_class { self.allocate_small(request, size, align) } else { None };
            if let Some(allocation) = small.or_else(|| self.allocate_in_any_slot(request, size, align)) {
                return Some(allocation);
            }
        }
        let inner = self.inner.allocate(request)?;
        let id = self.live.insert(Live {
            placement: Placement::Large(inner),
            offset: inner.offset(),
            size_bytes: request.size_bytes(),
        });
        Some(Allocation::from_parts(
            self.owner,
            id,
            inner.offset(),
            request.size_bytes(),
            (inner.footprint_offset(), inner.footprint_bytes()),
            request.kind(),
        ))
    }

    fn free(&mut self, allocation: Allocation) -> Result<()> {
        let live = self.live.take_live(self.owner, &allocation, self.name(), |live| live.offset)?;
        match live.placement {
            Placement::Large(inner) => self.inner.free(inner)?,
            Placement::Slot { page: page_offset, slot, .. } => {
                let page = self.pages.get_mut(&page_offset).expect("a live slot's page exists");
                let key = (page.class_log2, page.kind);
                let was_full = page.used == page.slots;
                page.flip(slot);
                page.used -= 1;
                self.free_slot_bytes += 1 << key.0;
                if page.used == 0 {
                    let page = self.pages.remove(&page_offset).expect("page exists");
                    self.free_slot_bytes -= u64::from(page.slots) << page.class_log2;
                    if let Some(partial) = self.partial.get_mut(&key) {
                        partial.remove(&page_offset);
                    }
                    self.inner.free(page.inner)?;
                } else if was_full {
                    self.partial.entry(key).or_default().insert(page_offset);
                }
            }
        }
        Ok(())
    }

    fn live_allocations(&self) -> usize {
        self.live.len()
    }

    /// The inner TLSF's bound, or a free slot's class when larger: a request is served by a slot, by the inner TLSF, or
    /// by a new page from it (no larger than the page, itself within the inner bound).
    fn largest_free_bound_bytes(&self) -> u64 {
        self.inner.largest_free_bound_bytes().max(self.largest_free_slot_bytes())
    }

    /// The inner TLSF's free space and the free slots of the pages: each slot is a run of its own (the report lists them
    /// one by one), so the largest is the largest class with a page that has one.
    fn free_space(&self) -> FreeSpace {
        let inner = self.inner.free_space();
        let largest_slot_bytes = self.largest_free_slot_bytes();
        FreeSpace {
            free_bytes: inner.free_bytes + self.free_slot_bytes,
            largest_free_run_bytes: inner.largest_free_run_bytes.max(largest_slot_bytes),
            retired_bytes: inner.retired_bytes,
        }
    }

    fn report(&self) -> PolicyReport {
        let mut large: HashMap<AllocationId, AllocationId> = HashMap::new();
        let mut slots: HashMap<(u64, u32), (AllocationId, u64)> = HashMap::new();
        for (id, live) in self.live.iter() {
            match live.placement {
                Placement::Large(inner) => {
                    large.insert(inner.id(), id);
                }
                Placement::Slot { page, slot, .. } => {
                    slots.insert((page, slot), (id, live.size_bytes));
                }
            }
        }
        let mut ranges = Vec::new();
        for mut range in self.inner.report().ranges {
            let page = self.pages.get(&range.offset).filter(|page| Some(page.inner.id()) == range.allocation);
            if let Some(page) = page {
                let slot_bytes = 1u64 << page.class_log2;
                for slot in 0..page.slots {
                    let offset = range.offset + u64::from(slot) * slot_bytes;
                    match slots.get(&(range.offset, slot)) {
                        Some(&(id, size_bytes)) => allocation_ranges(id, (offset, slot_bytes), (offset, size_bytes), &mut ranges),
                        None => ranges.push(RangeReport::unowned(offset, slot_bytes, RangeState::Free)),
                    }
                }
                continue;
            }
            range.allocation = range.allocation.and_then(|inner| large.get(&inner).copied());
            ranges.push(range);
        }
        PolicyReport { policy: self.name(), capacity_bytes: self.capacity_bytes(), ranges }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_table() {
        // (size, align) -> footprint: small requests get a power-of-two slot, large ones TLSF's rounding.
        let cases = [(1, 1, 256), (256, 1, 256), (257, 1, 512), (100, 4096, 4096), (65536, 1, 65536), (65537, 1, 65792)];
        for (size, align, footprint) in cases {
            let mut slab = Slab::new(16 << 20);
            let allocation = slab.allocate(Request::new(size, align).unwrap()).unwrap();
            assert_eq!(allocation.footprint_bytes(), footprint, "size {size} align {align}");
            assert_eq!(allocation.offset() % align, 0);
        }
    }

    #[test]
    fn slots_pack_into_one_page_and_the_page_returns() {
        let mut slab = Slab::new(4 << 20);
        let small: Vec<_> = (0..4096).map(|_| slab.allocate(Request::new(200, 1).unwrap()).unwrap()).collect();
        let pages: BTreeSet<u64> = small.iter().map(|a| a.offset() >> 20).collect();
        assert_eq!(pages.len(), 1, "4096 slots of 256 B fill one 1 MiB page");
        let extra = slab.allocate(Request::new(200, 1).unwrap()).unwrap();
        assert_eq!(extra.offset(), 1 << 20, "the next slot opens a second page");
        for allocation in small.into_iter().chain([extra]) {
            slab.free(allocation).unwrap();
        }
        assert_eq!(slab.report().ranges, [RangeReport::unowned(0, 4 << 20, RangeState::Free)]);
    }

    #[test]
    fn falls_back_to_larger_slots_when_no_page_is_left() {
        let mut slab = Slab::new(1 << 20); // room for exactly one page
        let big_slot = slab.allocate(Request::new(60000, 1).unwrap()).unwrap();
        assert_eq!(big_slot.footprint_bytes(), 65536);
        let small = slab.allocate(Request::new(100, 1).unwrap()).unwrap();
        assert_eq!(small.footprint_bytes(), 65536, "served by a free 64 KiB slot");
    }
}
