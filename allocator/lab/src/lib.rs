//! # heapscope-lab
//!
//! The replay lab: one recording, every contender, side by side, on the same stream.
//!
//! ## Design
//!
//! - A [`recording::Recording`] is what a file holds, ready to replay: a [`heapscope_core::Trace`] whose first
//!   events allocate what was live before the recording started (its start state), each event's
//!   [`recording::Moment`] (the file's entry numbering, the one numbering of every command and of the app), and,
//!   for a PyTorch snapshot, the snapshot itself.
//! - A [`contender::Contender`] is who replays it: PyTorch's caching allocator (emulated, in both modes), a heap
//!   of blocks with a core policy, paging, or (on a Vulkan device) gpu-allocator and VMA. One name table.
//! - [`driver::drive`] is the one replay loop: the stream moment by moment through a heap contender, with
//!   [`driver::Observer`]s writing down what they need — statistics ([`driver::Statistics`]), a timeline for the
//!   app ([`timeline::record::TimelineObserver`]), a snapshot for export ([`export::replayed`]). PyTorch's
//!   emulation goes through it too ([`caching_target`]: of a snapshot, a target that replays each whole entry when
//!   its moment begins, since its rules need every entry), followed by a `SegmentBacking` (`compare::emulate_pytorch`).
//! - [`compare`] sums each contender's replay up in one [`compare::Outcome`] ([`outcome::Outcome`]: ran, with its
//!   [`compare::Figures`], or not run, with why — the shape `bench` uses for its runs too) and says who would have
//!   survived an out-of-memory error; [`timeline`] keeps a replay step by step for seeking and explaining; [`export`]
//!   writes replays in other tools' forms (PyTorch snapshots, VMA's JSON); [`story`] holds the built-in teaching
//!   traces; [`top`] says what holds the memory at a moment (the live allocations grouped by the code that made
//!   them); [`caveats`] says what a side-by-side replay does not tell apart (private memory pools, streams).
//! - [`advise`] answers "what do I set?": the recording replayed through PyTorch's emulation under a grid of
//!   `PYTORCH_CUDA_ALLOC_CONF` settings (and `paged` for reference), each with its figures on the device the recording
//!   tells, the estimated time of its driver calls ([`cuda_cost`]) and the smallest capacity it needs, ranked.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod advise;
pub mod caching_target;
pub mod capacity;
pub mod caveats;
pub mod compaction;
pub mod compare;
pub mod contender;
pub mod cuda_cost;
pub mod driver;
pub mod export;
pub mod outcome;
pub mod recording;
pub mod story;
pub mod timeline;
pub mod top;
