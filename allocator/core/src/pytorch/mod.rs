//! PyTorch's world: memory snapshot files (`torch.cuda.memory._dump_snapshot`) read and written, and an
//! emulation of the CUDA caching allocator that replays them decision by decision.

pub mod export;
pub mod import;
mod pickle_read;
mod pickle_write;
pub mod snapshot;

pub use export::write_snapshot;
pub use import::{DeviceTrace, SnapshotError, parse_snapshot, read_snapshot};
pub use snapshot::{Action, Block, BlockState, Frame, Pool, RecordedSettings, Segment, Snapshot, StackId, TraceEntry};
