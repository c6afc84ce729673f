//! PyTorch's world: memory snapshot files (`torch.cuda.memory._dump_snapshot`) read and written, and an
//! emulation of the CUDA caching allocator that replays them decision by decision.

pub mod replayed;
pub mod snapshot;

pub use snapshot::{Action, Block, BlockState, Frame, Pool, RecordedSettings, Segment, Snapshot, StackId, TraceEntry};

