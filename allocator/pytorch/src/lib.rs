//! PyTorch's world: memory snapshot files (`torch.cuda.memory._dump_snapshot`) read and written, and an
//! emulation of the CUDA caching allocator that replays them decision by decision.
//!
//! - [`snapshot`]: the snapshot data model; [`import`] reads files (a streaming pickle reader), [`export`]
//!   writes them (pickle protocol 4).
//! - [`alloc_conf`]: the allocator settings (`PYTORCH_CUDA_ALLOC_CONF`).
//! - [`caching`]: the emulated `CUDACachingAllocator` ([`CachingAllocator`], step by step; [`CachingHeap`], the
//!   same as a `DeviceHeap`) and [`emulate`], which replays a trace and measures how exactly it reproduces
//!   PyTorch's recorded decisions.
//! - [`memory_stats`]: `torch.cuda.memory_stats()` counters and the `memory_summary()` table.
//! - [`format_size`]: byte counts in the words of PyTorch's out-of-memory message.
//! - [`frames`]: which stack frames say where memory was allocated (memory_viz's frame filter, the user frame).
//!
//! What a heap or paged contender would have recorded, for export, is the lab's (`heapscope-lab`'s `export`).

pub mod alloc_conf;
pub mod caching;
pub mod export;
pub mod format_size;
pub mod frames;
pub mod import;
pub mod memory_stats;
mod pickle_int;
mod pickle_read;
mod pickle_write;
mod read_ahead;
pub mod snapshot;

pub use alloc_conf::{AllocConf, AllocConfError, LARGE_BUFFER_BYTES};
pub use caching::{
    AddressSource, BackingRefused, CachingAllocation, CachingAllocator, CachingHeap, DriverRuleScore, Emulation, EmulationError,
    Emulator, EntryEffect, Fidelity, OomEvent, OomReport, SegmentBacking, Stepped, Unbacked, emulate, emulate_backed,
};
pub use export::{write_segments, write_snapshot};
pub use format_size::FormatSize;
pub use import::{SnapshotError, parse_snapshot, read_snapshot};
pub use memory_stats::{MemoryStats, Stat, StatArray};
pub use snapshot::{
    Action, Block, BlockState, Category, CategoryId, CategoryKey, ContenderExport, Frame, Pool, PoolId, RecordedSettings,
    Segment, Snapshot, StackId, TraceEntry, UnknownAction,
};
