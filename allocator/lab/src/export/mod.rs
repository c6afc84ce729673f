//! Replays written down in other tools' forms: [`replayed`], the snapshot a contender would have recorded (PyTorch's
//! memory_viz opens it), and [`vma_json`], a heap's final layout as VMA's detailed JSON statistics.

pub mod replayed;
pub mod vma_json;
