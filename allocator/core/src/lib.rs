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
//!   request cannot be served it returns an [`OomVerdict`]: fragmentation (enough bytes free in total, no
//!   run large enough) or exhaustion.
//! - Reports are plain data ([`PolicyReport`], [`HeapReport`], [`Totals`]): every byte is live, padding,
//!   free or retired; drawing is the GUI's business.
//! - A [`Trace`] is a stream of allocations and frees; [`replay`] runs one through a policy or a heap, and
//!   [`timeline`] writes a replay down step by step (layout changes, totals, checkpoints for seeking,
//!   one sentence per decision) for the GUI.
//!   [`check`] verifies the policy contract after every step of any operation sequence; the property tests
//!   and the fuzzer both use it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod allocation;
pub mod check;
pub mod compare;
pub mod contender;
mod device_event;
mod device_heap;
pub mod driver;
mod error;
pub mod granularity;
mod hash;
mod heap;
pub mod native_trace;
mod oom;
pub mod paged;
pub mod policies;
mod policy;
pub mod pytorch;
pub mod recording;
mod report;
mod request;
mod slots;
pub mod source;
pub mod story;
pub mod synthetic;
pub mod timeline;
pub mod trace;
pub mod units;
pub mod vma_json;

pub use allocation::{Allocation, AllocationId, OwnerId};
pub use device_event::DeviceEvent;
pub use device_heap::DeviceHeap;
pub use error::{Error, Result};
pub use heap::{BlockReport, Heap, HeapAllocation, HeapConfig, HeapReport, HeapStats, ReleaseRule};
pub use oom::{OomCause, OomVerdict};
pub use paged::{PagedConfig, PagedHeap, PagedStats, UnmapRule};
pub use policies::{BestFit, Buddy, FirstFit, Linear, LinearMode, Slab, Tlsf};
pub use policy::{Policy, PolicyConfig, PolicyKind};
pub use report::{FreeRunHistogram, HistogramBucket, PolicyReport, RangeReport, RangeState, Totals};
pub use request::{Request, ResourceKind};
pub use source::{MemorySource, SimulatedSource, SourceBlock, SourceError};
pub use trace::{Event, Trace, TraceBuilder};
