//! Best fit: the free run that fits most tightly, in one of two flavours (`PolicyConfig::best_fit_exact`).
//!
//! - **Size classes, by address** (the default): free runs are grouped in size classes of an eighth of a
//!   power of two (the granularity of OffsetAllocator's bins); a request takes the lowest-addressed run that
//!   holds it in its own class, else the lowest-addressed run of the next non-empty class. Within 12.5 % of
//!   the tightest fit it prefers low addresses, which packs live data toward the start of the range and
//!   keeps the high end free: address-ordered policies fragment least (Wilson, Johnstone, Neely and
//!   Boles, "Dynamic Storage Allocation: A Survey and Critical Review", 1995). Each class is a treap by
//!   address with the largest run per subtree, and a bitmap finds the next non-empty class: O(log n).
//! - **Exact**: the smallest run that holds the request, the lowest address among equal sizes; runs
//!   indexed by (size, offset), O(log n).
//!
//! Measured on the GPT-2 training trace (`benches/trace_replay.rs`), the classed flavour needs less range
//! than the exact one, which needs as much as offset-allocator and range-alloc.

use std::collections::BTreeSet;

use super::first_fit::ByAddress;
use super::free_ranges::{FitIndex, FreeRangePolicy, free_range_policy};
use crate::PolicyConfig;

/// log2 of the number of size classes per power of two.
const CLASS_BITS: u32 = 3;
const CLASSES: usize = 64 << CLASS_BITS;

/// The size class of a run of `size` bytes: classes `0..8` are exact sizes, then eight per power of two.
fn class_of(size: u64) -> usize {
    if size < 1 << CLASS_BITS {
        size as usize
    } else {
        let log = 63 - size.leading_zeros();
        (((log - CLASS_BITS + 1) << CLASS_BITS) | ((size >> (log - CLASS_BITS)) as u32 & ((1 << CLASS_BITS) - 1))) as usize
    }
}

/// Free runs in size classes, each class ordered by address.
#[derive(Clone, Debug)]
pub struct BySizeClass {
    classes: Vec<ByAddress>,
    counts: Vec<u32>,
    non_empty: [u64; CLASSES / 64],
}

impl BySizeClass {
    fn new(fit_align: u64) -> Self {
        Self { classes: vec![ByAddress::aligned_to(fit_align); CLASSES], counts: vec![0; CLASSES], non_empty: [0; CLASSES / 64] }
    }

    fn next_non_empty(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        let mut bits = self.non_empty.get(word)? & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            bits = *self.non_empty.get(word)?;
        }
    }
}

/// Free runs ordered by (size, offset).
#[derive(Clone, Debug, Default)]
pub struct BySize(BTreeSet<(u64, u64)>);

/// The best-fit index: one of the two flavours.
#[derive(Clone, Debug)]
pub enum BestFitIndex {
    /// Exact smallest run.
    Exact(BySize),
    /// Size classes, lowest address within a class.
    Classed(BySizeClass),
}

impl FitIndex for BestFitIndex {
    const NAME: &'static str = "best-fit";

    fn with_config(config: &PolicyConfig) -> Self {
        if config.best_fit_exact {
            Self::Exact(BySize::default())
        } else {
            Self::Classed(BySizeClass::new(config.fit_align_bytes))
        }
    }

    fn insert(&mut self, offset: u64, size: u64) {
        match self {
            Self::Exact(BySize(set)) => {
                set.insert((size, offset));
            }
            Self::Classed(index) => {
                let class = class_of(size);
                index.classes[class].insert(offset, size);
                index.counts[class] += 1;
                index.non_empty[class / 64] |= 1 << (class % 64);
            }
        }
    }

    fn remove(&mut self, offset: u64, size: u64) {
        match self {
            Self::Exact(BySize(set)) => {
                set.remove(&(size, offset));
            }
            Self::Classed(index) => {
                let class = class_of(size);
                index.classes[class].remove(offset, size);
                index.counts[class] -= 1;
                if index.counts[class] == 0 {
                    index.non_empty[class / 64] &= !(1 << (class % 64));
                }
            }
        }
    }

    fn find(&self, size: u64, align: u64, mut place: impl FnMut(u64, u64) -> Option<u64>) -> Option<(u64, u64, u64)> {
        match self {
            // The first run that is large enough almost always fits; alignment or granularity may push the
            // request past its end, and then the next larger run is tried.
            Self::Exact(BySize(set)) => set
                .range((size, 0)..)
                .find_map(|&(run_size, run_offset)| Some((run_offset, run_size, place(run_offset, run_size)?))),
            Self::Classed(index) => {
                let mut class = index.next_non_empty(class_of(size))?;
                loop {
                    if let Some(found) = index.classes[class].find(size, align, &mut place) {
                        return Some(found);
                    }
                    class = index.next_non_empty(class + 1)?;
                }
            }
        }
    }

    fn largest_run(&self) -> u64 {
        match self {
            Self::Exact(BySize(set)) => set.last().map_or(0, |&(size, _)| size),
            // The highest non-empty class holds the largest run; its treap knows it.
            Self::Classed(index) => index
                .non_empty
                .iter()
                .enumerate()
                .rev()
                .find(|&(_, &word)| word != 0)
                .map_or(0, |(word, bits)| index.classes[word * 64 + 63 - bits.leading_zeros() as usize].largest_run()),
        }
    }
}

/// The best-fit policy.
pub type BestFit = FreeRangePolicy<BestFitIndex>;

free_range_policy!(BestFitIndex);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::free_ranges::punch_holes;
    use crate::{Policy, Request};

    #[test]
    fn class_table() {
        let cases =
            [(0, 0), (7, 7), (8, 8), (9, 9), (15, 15), (16, 16), (17, 16), (18, 17), (1 << 20, 8 * 18), (u64::MAX, 8 * 61 + 7)];
        for (size, class) in cases {
            assert_eq!(class_of(size), class, "size {size}");
        }
    }

    fn config(exact: bool) -> PolicyConfig {
        PolicyConfig { best_fit_exact: exact, ..PolicyConfig::default() }
    }

    #[test]
    fn smallest_run_wins_then_lowest_address() {
        // The holes of `punch_holes` are classes apart, so both flavours agree.
        let cases = [(1024, Some(4096)), (1025, Some(8192)), (2048, Some(8192)), (2049, Some(0)), (3000, Some(0)), (3073, None)];
        for exact in [true, false] {
            for (size, expected) in cases {
                let mut policy = BestFit::with_config(10 << 10, &config(exact)).unwrap();
                punch_holes(&mut policy);
                let placed = policy.allocate(Request::new(size, 1).unwrap()).map(|a| a.offset());
                assert_eq!(placed, expected, "exact = {exact}, size {size}");
            }
        }
    }

    #[test]
    fn classed_prefers_the_lower_address_within_a_class() {
        // Free runs of 9.25 KiB at 0 and 9 KiB at 16 KiB share a class (9 to 10 KiB): exact best fit takes
        // the tighter one at 16 KiB for an 8 KiB request, the classed flavour the lower address.
        for (exact, expected) in [(true, 16384), (false, 0)] {
            let mut policy = BestFit::with_config(32 << 10, &config(exact)).unwrap();
            let a = policy.allocate(Request::new(9472, 1).unwrap()).unwrap();
            let _wall = policy.allocate(Request::new(6912, 1).unwrap()).unwrap();
            let b = policy.allocate(Request::new(9216, 1).unwrap()).unwrap();
            let _rest = policy.allocate(Request::new(7168, 1).unwrap()).unwrap();
            assert_eq!(b.offset(), 16384);
            policy.free(a).unwrap();
            policy.free(b).unwrap();
            let placed = policy.allocate(Request::new(8192, 1).unwrap()).unwrap();
            assert_eq!(placed.offset(), expected, "exact = {exact}");
        }
    }
}
