//! PyTorch's world: memory snapshot files (`torch.cuda.memory._dump_snapshot`) read and written, and an
//! emulation of the CUDA caching allocator that replays them decision by decision.

pub mod alloc_conf;
pub mod caching;
#[cfg(test)]
mod json_fixture;
pub mod memory_stats;
pub mod snapshot;

pub use alloc_conf::{AllocConf, AllocConfError};
pub use caching::{CachingAllocator, Emulation, Fidelity, OomReport, emulate};
pub use memory_stats::{MemoryStats, Stat, StatArray};
pub use snapshot::{Action, Block, BlockState, Frame, Pool, RecordedSettings, Segment, Snapshot, StackId, TraceEntry};
