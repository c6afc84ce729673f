//! The policies, one per file. [`BestFit`] and [`FirstFit`] share the ordered free ranges of
//! `free_ranges.rs`; [`Slab`] places its pages and large requests with [`Tlsf`].

mod best_fit;
mod buddy;
mod first_fit;
pub mod free_ranges;
mod linear;
mod slab;
mod tlsf;

pub use best_fit::{BestFit, BestFitIndex, BySize, BySizeClass};
pub use buddy::Buddy;
pub use first_fit::{ByAddress, FirstFit};
pub use free_ranges::{FitIndex, FreeRangePolicy};
pub use linear::{Linear, LinearMode};
pub use slab::Slab;
pub use tlsf::Tlsf;
