//! The bench runner: a [`Workload`](crate::workload::Workload) played on a [`Target`] ([`run`]), the contenders
//! ([`heapscope_lab::contender::Contender`]) and their shared rules ([`BenchSettings`]), and the simulated target
//! ([`SimTarget`], [`run_simulated`]). The device targets ([`crate::VulkanTarget`], [`crate::WgpuTarget`]) run the
//! kernels with their device's runner. What every device target must do (verify clean, count what the simulation
//! counts) is `conformance::check_target` (feature `testing`), which the crate's device tests run on both.

#[cfg(any(test, feature = "testing"))]
pub mod conformance;
mod policy;
mod run;
mod target;

pub use policy::{BenchSettings, run_simulated};
pub use run::{KernelDriver, MAX_PENDING_OPS, OpCounts, Placed, RunError, RunReport, run, run_observed};
pub use target::{SimTarget, Target, TargetError, compact_heap, with_requests};

#[cfg(test)]
mod tests;
