//! # heapscope-core
//!
//! Allocation policies over an abstract address space, and everything heapscope says about them. No GPU,
//! no `unsafe`: it builds in seconds, runs anywhere and is fuzzed.
//!
//! ## Design
//!
//! - A [`Policy`] sub-allocates one contiguous range of `u64` offsets (GPU heaps exceed 4 GiB). A request
//!   ([`Request`]) is valid by construction; "doesn't fit" is `None`; misuse (double free, a foreign
//!   handle) is an [`Error`], never undefined behaviour. Metadata lives outside the managed memory, so the
//!   same policies serve simulated ranges, `VkDeviceMemory` and `wgpu::Buffer` arenas.
//! - Policies, one per file under [`policies`]: [`Tlsf`] (O(1), the default), [`BestFit`] and
//!   [`FirstFit`] (ordered free ranges), [`Buddy`], [`Linear`] (bump, stack, ring) and [`Slab`]. Each
//!   honours alignment and an optional granularity rule (Vulkan's `bufferImageGranularity`, see
//!   [`granularity`]).
//! - A [`Heap`] puts a policy inside each block (segment) that a [`MemorySource`] hands out, with a
//!   block-size rule, dedicated blocks for large requests, release of empty blocks and a budget. When a
//!   request cannot be served it returns an [`OomVerdict`] with one of three causes ([`OomCause`]):
//!   fragmentation (enough bytes free in total, no run large enough: waste between allocations), internal waste
//!   (rounding of the request or padding inside live allocations took what was missing) or exhaustion.
//! - [`compaction`] plans moves that gather a heap's scattered free runs (VMA's fast / balanced / full), as plain
//!   data: the caller copies the bytes (or remaps sparse pages) and rebinds what moved.
//! - Reports are plain data ([`PolicyReport`], [`HeapReport`], [`Totals`]): every byte is live, padding,
//!   free or retired; drawing is the GUI's business.
//! - A [`Trace`] is a stream of allocations and frees (its compact CSV form in [`trace`], heapscope's binary
//!   form in [`native_trace`]). Heaps say what they ask of the device ([`DeviceEvent`]) when asked to, and a
//!   [`DeviceHeap`] is what a heap of blocks, a paged heap and a backend's heap have in common.
//! - Which device to run on ([`selection`]) is one rule over plain device descriptions, shared by every backend;
//!   [`rng::Rng`] (splitmix64) is the deterministic generator of the workloads and randomised tests.
//!
//! ## Where the rest lives
//!
//! This crate is the allocator alone. PyTorch's world (snapshots, the caching allocator's emulation) is
//! `heapscope-pytorch`; replaying recordings through contenders side by side (the one replay driver, timelines,
//! comparisons, exports, stories) is `heapscope-lab`; device memory is the `heapscope-vulkan` and
//! `heapscope-wgpu` backends.
//!
//! ## Test support (feature `testing`)
//!
//! `check` verifies the policy contract after every step of any operation sequence (the property tests and the
//! fuzzer both use it); `synthetic` makes deterministic traces of any length for benchmarks.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod allocation;
#[cfg(any(test, feature = "testing"))]
pub mod check;
pub mod compaction;
mod device_event;
mod device_heap;
mod error;
pub mod granularity;
pub mod hash;
mod heap;
pub mod native_trace;
mod oom;
pub mod paged;
mod path_name;
pub mod policies;
mod policy;
mod policy_kind;
mod report;
mod request;
pub mod rng;
pub mod selection;
mod slots;
pub mod source;
#[cfg(any(test, feature = "testing"))]
pub mod synthetic;
pub mod trace;
pub mod units;
pub mod whole_file;

pub use allocation::{Allocation, AllocationId, OwnerId};
pub use device_event::{DeviceEvent, DeviceLog};
pub use device_heap::{DeviceHeap, moved_indices};
pub use error::{Error, Result, UnknownName};
pub use heap::{
    BlockReport, Heap, HeapAllocation, HeapCompaction, HeapConfig, HeapMove, HeapReport, HeapStats, Movable, ReleaseRule,
};
pub use oom::{FreeMemory, OomCause, OomVerdict, Shortfall};
pub use paged::{PageRemap, PagedCompaction, PagedConfig, PagedHeap, PagedStats, UnmapRule};
pub use path_name::path_name;
pub use policies::{BestFit, Buddy, FirstFit, Linear, LinearMode, Slab, Tlsf};
pub use policy::{Policy, PolicyConfig};
pub use policy_kind::PolicyKind;
pub use report::{FreeRunHistogram, FreeSpace, HistogramBucket, PolicyReport, RangeReport, RangeState, Totals};
pub use request::{Request, ResourceKind};
pub use source::{BlockCopy, LARGEST_DEVICE_BYTES, MemorySource, SimulatedSource, SourceBlock, SourceError};
pub use trace::{BadEvent, Caption, Event, Trace, TraceBuilder};
