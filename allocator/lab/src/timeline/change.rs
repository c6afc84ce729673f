//! What happens to a heap's layout at one step, as plain data: the changes a timeline records, the
//! animation plays and a live source sends.

use heapscope_core::{FreeMemory, OomCause, OomVerdict};

/// How a region of address space is backed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum RegionKind {
    /// A block (segment) reserved whole from the device: every byte is reserved.
    Block,
    /// A virtual range backed by pages mapped on demand (a paged heap, PyTorch's expandable segments,
    /// Vulkan sparse binding): only its mapped runs are reserved.
    Virtual,
}

/// A live allocation where it sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Span {
    /// Address of the first byte set aside for it (its footprint).
    pub address: u64,
    /// Bytes set aside: the requested bytes plus padding (alignment, rounding, a whole unsplit block).
    pub footprint_bytes: u64,
    /// Padding before the requested bytes (alignment).
    pub lead_bytes: u64,
    /// Bytes requested.
    pub requested_bytes: u64,
    /// The trace slot of the allocation (a start event's for one live before the recording started);
    /// [`Span::BEFORE_RECORDING`] where the contender cannot tell which.
    pub slot: u32,
    /// Whether it was live before the recording started (a PyTorch recording begun mid-run): no entry made it.
    pub before_recording: bool,
    /// The step that allocated it (0 for one live before the recording started).
    pub born: u64,
}

impl Span {
    /// The `slot` of an allocation live before the recording started that the contender cannot match with a start
    /// event of the recording (a block the emulation holds at an address no start event has).
    pub const BEFORE_RECORDING: u32 = u32::MAX;

    /// An allocation live before the recording started, in the layout from step 0 on: `footprint_bytes` at
    /// `address` set aside for `requested_bytes`, the start event of trace slot `slot` (or
    /// [`Span::BEFORE_RECORDING`]).
    pub fn before_recording(address: u64, footprint_bytes: u64, requested_bytes: u64, slot: u32) -> Self {
        Self { address, footprint_bytes, lead_bytes: 0, requested_bytes, slot, before_recording: true, born: 0 }
    }

    /// Whether the allocation was live before the recording started.
    pub fn is_before_recording(&self) -> bool {
        self.before_recording
    }

    /// Its trace slot, where it has one.
    pub fn trace_slot(&self) -> Option<u32> {
        (self.slot != Self::BEFORE_RECORDING).then_some(self.slot)
    }

    /// One past the footprint's last byte.
    pub fn end(&self) -> u64 {
        self.address + self.footprint_bytes
    }

    /// Padding and rounding: footprint bytes not requested.
    pub fn waste_bytes(&self) -> u64 {
        self.footprint_bytes - self.requested_bytes
    }
}

/// One change to a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Change {
    /// A region was reserved: a block (all of it free) or a virtual range (nothing mapped yet).
    RegionAdded {
        /// Base address.
        address: u64,
        /// Bytes.
        size_bytes: u64,
        /// How it is backed.
        kind: RegionKind,
    },
    /// The virtual region at `address` now spans `size_bytes`: its reservation was cut (PyTorch reserved another
    /// expandable segment closer than the first one's default size, at an address taken from the trace) or grown;
    /// its mapped pages and allocations stay, within it.
    RegionResized {
        /// Base address.
        address: u64,
        /// Bytes, now.
        size_bytes: u64,
    },
    /// The region at `address`, which holds no live allocation, was released.
    RegionRemoved {
        /// Base address.
        address: u64,
    },
    /// Pages of a virtual region were mapped; they become free memory.
    PagesMapped {
        /// Address of the first page.
        address: u64,
        /// Bytes.
        size_bytes: u64,
    },
    /// Free mapped pages were unmapped.
    PagesUnmapped {
        /// Address of the first page.
        address: u64,
        /// Bytes.
        size_bytes: u64,
    },
    /// An allocation was placed in free memory.
    Allocated(Span),
    /// The allocation whose footprint starts at `address` was freed.
    Freed {
        /// Footprint address.
        address: u64,
    },
}

/// A request the contender refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Refusal {
    /// Bytes requested.
    pub requested_bytes: u64,
    /// Bytes the contender needed for them (rounded by its rules).
    pub needed_bytes: u64,
    /// Fragmentation, internal waste or exhaustion.
    pub cause: OomCause,
    /// Bytes reserved then.
    pub reserved_bytes: u64,
    /// Free bytes inside reserved memory the request could use.
    pub free_bytes: u64,
    /// The largest free run among them.
    pub largest_free_bytes: u64,
    /// Of `free_bytes`, what the request could not use (PyTorch's cached blocks of another size, stream or pool; 0 for a
    /// heap, whose free bytes count only the blocks a request could use).
    pub unusable_free_bytes: u64,
    /// Padding inside live allocations (rounding, size classes, page tails): waste *inside* allocations.
    pub waste_bytes: u64,
    /// What the device (or the budget) still had beside the reserved memory, where known.
    pub unreserved_bytes: Option<u64>,
    /// The verdict in words.
    pub message: String,
}

impl Refusal {
    /// What was free, for the sentences about it.
    pub fn free_memory(&self) -> FreeMemory {
        FreeMemory { reserved_free_bytes: self.free_bytes, unreserved_bytes: self.unreserved_bytes }
    }
}

impl From<&OomVerdict> for Refusal {
    /// The refusal a heap's out-of-memory verdict describes.
    fn from(verdict: &OomVerdict) -> Self {
        Self {
            requested_bytes: verdict.requested_bytes,
            needed_bytes: verdict.needed_bytes,
            cause: verdict.cause,
            reserved_bytes: verdict.reserved_bytes,
            free_bytes: verdict.free_in_blocks_bytes,
            largest_free_bytes: verdict.largest_free_run_bytes,
            unusable_free_bytes: 0,
            waste_bytes: verdict.padding_bytes,
            unreserved_bytes: Some(verdict.unreserved_bytes),
            message: verdict.describe(),
        }
    }
}
