//! The `Policy` trait: sub-allocation of one contiguous range of abstract `u64` offsets, and the settings every
//! policy shares ([`PolicyConfig`]); the catalogue of policies is [`crate::PolicyKind`].

use std::fmt;

use crate::request::align_up;
use crate::{Allocation, Error, FreeSpace, OwnerId, PolicyReport, Request, Result};

/// Sub-allocates one contiguous range `[0, capacity_bytes)`.
///
/// Contract, checked for every policy by the property tests (`tests/properties.rs`):
/// - a returned allocation lies inside the range, is aligned as requested and overlaps no other live one;
/// - with a granularity, resources of different [`ResourceKind`](crate::ResourceKind)s never share a page;
/// - `report()` covers the range exactly and its totals match the live allocations;
/// - freeing everything restores the initial layout;
/// - misuse (double free, a foreign handle) returns an error and changes nothing.
pub trait Policy: Send + fmt::Debug {
    /// The policy's name (as in [`PolicyKind::name`](crate::PolicyKind::name)).
    fn name(&self) -> &'static str;

    /// Bytes managed (the capacity given at construction, rounded down to the policy's unit).
    fn capacity_bytes(&self) -> u64;

    /// Sets aside memory for `request`, or `None` when it does not fit.
    fn allocate(&mut self, request: Request) -> Option<Allocation>;

    /// Sets aside memory for `request` exactly at `offset` (as compaction re-places a moved allocation), or
    /// `None` when the bytes there are not free, the offset breaks the request's alignment, or the policy cannot
    /// be told where to place (the default: only policies that keep free runs by address can).
    fn allocate_at(&mut self, request: Request, offset: u64) -> Option<Allocation> {
        let _ = (request, offset);
        None
    }

    /// Returns an allocation's memory.
    ///
    /// # Errors
    /// [`Error::DoubleFree`] when it is not live here any more, [`Error::ForeignAllocation`] when another
    /// instance made it. Either way nothing changes.
    fn free(&mut self, allocation: Allocation) -> Result<()>;

    /// Number of live allocations.
    fn live_allocations(&self) -> usize;

    /// An upper bound on the largest request this policy could serve now, cheaply (O(1), or O(log n) for an
    /// ordered index): a heap skips blocks that cannot help without asking them, so the closer the bound, the fewer
    /// searches a refused block costs. No free run may be larger (the checker holds it). The default says nothing
    /// (`u64::MAX`).
    fn largest_free_bound_bytes(&self) -> u64 {
        u64::MAX
    }

    /// What every byte of the range is doing.
    fn report(&self) -> PolicyReport;

    /// The free bytes, their largest run and the retired bytes, exactly as [`Policy::report`]'s totals count them
    /// (the checker holds it): what the verdict of a refused request weighs. The default builds the report, a cost
    /// in the live allocations that every refusal would pay (a replay at its capacity refuses thousands of
    /// requests); a policy that keeps its free runs indexed answers from the index.
    fn free_space(&self) -> FreeSpace {
        FreeSpace::of(&self.report().totals())
    }
}

/// Settings shared by the policies.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PolicyConfig {
    /// Every offset and size is a multiple of this (a power of two); requests are rounded up to it.
    /// It is also the buddy policy's smallest block.
    pub min_align_bytes: u64,
    /// Vulkan's `bufferImageGranularity` (a power of two); 1 disables the rule.
    pub granularity_bytes: u64,
    /// Best fit: choose the exact smallest run (`true`), or the lowest-addressed run of the smallest size
    /// class that fits, classes being eighths of a power of two (`false`, the default: packs toward low
    /// addresses, which fragments less; see `policies/best_fit.rs`).
    pub best_fit_exact: bool,
    /// Slab: the smallest size class (a power of two; `min_align_bytes` when that is larger).
    pub slab_min_class_bytes: u64,
    /// Slab: the largest size class (a power of two); larger requests are placed by TLSF directly.
    pub slab_max_class_bytes: u64,
    /// Slab: bytes per slab page (a power of two, at least the largest class).
    pub slab_page_bytes: u64,
    /// First fit and best fit: the request alignment whose best fit every free run keeps (a power of two; 512 B by
    /// default, PyTorch's unit and the replays' default `--align`; a replay sets its own). Requests aligned to it or
    /// more pass the runs its padding leaves too small in one descent; others try such runs in turn.
    pub fit_align_bytes: u64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            min_align_bytes: 256,
            granularity_bytes: 1,
            best_fit_exact: false,
            slab_min_class_bytes: 256,
            slab_max_class_bytes: 64 << 10,
            slab_page_bytes: 1 << 20,
            fit_align_bytes: 512,
        }
    }
}

impl PolicyConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting.
    pub fn validate(&self) -> Result<()> {
        let powers = [
            ("min_align_bytes", self.min_align_bytes),
            ("granularity_bytes", self.granularity_bytes),
            ("slab_min_class_bytes", self.slab_min_class_bytes),
            ("slab_max_class_bytes", self.slab_max_class_bytes),
            ("slab_page_bytes", self.slab_page_bytes),
            ("fit_align_bytes", self.fit_align_bytes),
        ];
        for (name, value) in powers {
            if !value.is_power_of_two() {
                return Err(Error::InvalidConfig { what: format!("{name} = {value} is not a power of two") });
            }
        }
        let ordered = self.slab_min_class_bytes <= self.slab_max_class_bytes && self.slab_max_class_bytes <= self.slab_page_bytes;
        if !ordered {
            return Err(Error::InvalidConfig {
                what: format!(
                    "slab sizes must satisfy slab_min_class_bytes ({}) <= slab_max_class_bytes ({}) <= slab_page_bytes ({})",
                    self.slab_min_class_bytes, self.slab_max_class_bytes, self.slab_page_bytes
                ),
            });
        }
        Ok(())
    }

    /// The granularity guard page size, when the rule is on.
    pub(crate) fn granularity(&self) -> Option<u64> {
        (self.granularity_bytes > 1).then_some(self.granularity_bytes)
    }
}

/// A request's size rounded up to `min_align` and its alignment raised to `min_align`; `None` when the
/// rounding overflows (such a request fits nowhere).
#[inline]
pub(crate) fn rounded(request: Request, min_align: u64) -> Option<(u64, u64)> {
    Some((align_up(request.size_bytes(), min_align)?, request.align_bytes().max(min_align)))
}

/// The error for freeing `allocation` in the policy or heap `owner` named `name`, when it is not live there.
pub(crate) fn not_live(owner: OwnerId, allocation: &Allocation, name: &'static str) -> Error {
    if allocation.owner() == owner {
        Error::DoubleFree { offset: allocation.offset(), id: allocation.id().0, owner: name }
    } else {
        Error::ForeignAllocation { offset: allocation.offset(), owner: name }
    }
}

/// Refuses a handle made by another instance.
pub(crate) fn check_owner(owner: OwnerId, allocation: &Allocation, name: &'static str) -> Result<()> {
    if allocation.owner() == owner { Ok(()) } else { Err(not_live(owner, allocation, name)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation_table() {
        let ok = PolicyConfig::default();
        let cases = [
            (PolicyConfig { min_align_bytes: 0, ..ok.clone() }, Some("min_align_bytes")),
            (PolicyConfig { granularity_bytes: 3, ..ok.clone() }, Some("granularity_bytes")),
            (PolicyConfig { slab_page_bytes: 1024, ..ok.clone() }, Some("slab sizes")),
            (PolicyConfig { granularity_bytes: 4096, ..ok.clone() }, None),
            (ok, None),
        ];
        for (config, expected) in cases {
            match (config.validate(), expected) {
                (Ok(()), None) => {}
                (Err(error), Some(needle)) => assert!(error.to_string().contains(needle), "{error}"),
                (result, _) => panic!("{config:?}: {result:?}"),
            }
        }
    }
}
