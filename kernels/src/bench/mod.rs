//! The bench runner, device-free: a [`Workload`](crate::workload::Workload) played on a [`Target`] ([`run`]),
//! the contenders ([`heapscope_lab::contender::Contender`]) and their shared rules ([`BenchSettings`]), and the simulated target
//! ([`SimTarget`], [`run_simulated`]). Device backends implement [`Target`]: the Vulkan crate's runs the
//! kernels with `ComputeKernels`, the wgpu crate's with its own runner. What every device target must do (verify
//! clean, count what the simulation counts) is `conformance::check_target` (feature `testing`), which both crates' tests run.

#[cfg(any(test, feature = "testing"))]
pub mod conformance;
mod policy;
mod run;
mod target;

pub use policy::{BenchSettings, run_simulated};
pub use run::{KernelDriver, MAX_PENDING_OPS, OpCounts, Placed, RunError, RunReport, run, run_observed};
pub use target::{SimTarget, Target, TargetError};

#[cfg(test)]
mod tests;
