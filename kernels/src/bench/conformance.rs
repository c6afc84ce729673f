//! What every device [`Target`] must do, whatever its device: the checks the Vulkan and wgpu crates' tests run
//! against their targets ([`check_target`]). Every contender plays small workloads ([`workloads`]) under a budget
//! a little above each one's peak, with every allocation filled, computed on, copied and verified by the kernels.
//! A conforming target finds no mismatch, runs the payload, and counts what the simulated run counts
//! (allocations, frees, refusals and the first one's step, peak live and reserved bytes); over the lot some
//! contender is refused, so refusals are compared too. Device-free: the caller makes the targets.

use std::fmt;

use heapscope_lab::contender::Contender;

use super::{BenchSettings, RunReport, Target, run, run_simulated};
use crate::workload::{ChurnConfig, KvLayout, ServeConfig, ServeModel, Workload, churn, serve};

/// A small serve (2 MiB of weights, 32 KiB of KV a token, 150 steps, seed 7) with `kv`'s layout of the KV cache.
pub fn small_serve(kv: KvLayout) -> Workload {
    let model =
        ServeModel { weights_bytes: 2 << 20, kv_bytes_per_token: 32 << 10, hidden: 512, vocab: 4096, ..ServeModel::default() };
    serve(&ServeConfig { steps: 150, kv, seed: 7, model })
}

/// The workloads [`check_target`] plays: small serves with paged and with contiguous KV, and a churn of 400 steps
/// of 4 KiB to 1 MiB.
pub fn workloads() -> [Workload; 3] {
    [
        small_serve(KvLayout::Paged),
        small_serve(KvLayout::Contiguous),
        churn(&ChurnConfig { steps: 400, size_range: (4 << 10, 1 << 20), ..ChurnConfig::new(3) }),
    ]
}

/// One conforming run of a contender on the device target.
#[derive(Debug)]
pub struct DeviceRun {
    /// The contender.
    pub policy: Contender,
    /// The workload's name.
    pub workload: String,
    /// What the device run counted.
    pub report: RunReport,
    /// Submits the target recorded.
    pub submits: u64,
    /// Dispatches the target recorded.
    pub dispatches: u64,
}

impl fmt::Display for DeviceRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = &self.report;
        write!(
            f,
            "{:<18} {:<28} allocs {:>5} ooms {:>3} reserved/live {:.3} verified {:>4} MiB, {} submits, {:.2?}",
            self.policy.name(),
            self.workload.split(',').next().unwrap_or_default(),
            report.allocs,
            report.ooms,
            report.reserved_over_live(),
            report.ops.bytes_verified >> 20,
            self.submits,
            report.wall
        )
    }
}

/// Where a target does not do what it must: the run (`policy on workload`, or `all runs`) and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{run}: {problem}")]
pub struct Nonconformance {
    /// The run.
    pub run: String,
    /// What is wrong.
    pub problem: String,
}

/// The numbers a device run and a simulated run must share.
type Shared = (u64, u64, u64, u64, u64, Option<u64>);

fn shared(report: &RunReport) -> Shared {
    (
        report.allocs,
        report.frees,
        report.ooms,
        report.peak_live_bytes,
        report.peak_reserved_bytes,
        report.first_oom.as_ref().map(|(step, _)| *step),
    )
}

/// Plays every [`workload`](workloads) with every [default contender](Contender::BENCH) on the target `make`
/// gives for it and the workload's settings (a budget an eighth above the workload's peak, rounded up to MiB),
/// and compares each run with the simulated run of the same contender. `make` gives `Ok(None)` for a contender
/// the target rightly refuses (the caller checks the refusal); `kernel_counts` says how many submits and
/// dispatches a target recorded. The target is dropped before the next one is made. Returns the runs, in order.
///
/// # Errors
/// [`Nonconformance`] on the first run that fails or whose target cannot be made, verifies a mismatch, runs no
/// kernels, no payload or verifies nothing, counts differently from the simulation, records no submit or fewer
/// dispatches than fills; and when no contender is refused over all runs.
pub fn check_target<T: Target, E: fmt::Display>(
    mut make: impl FnMut(Contender, &BenchSettings) -> Result<Option<T>, E>,
    kernel_counts: impl Fn(&T) -> (u64, u64),
) -> Result<Vec<DeviceRun>, Nonconformance> {
    let mut runs = Vec::new();
    for workload in &workloads() {
        let peak = workload
            .check()
            .map_err(|error| Nonconformance { run: workload.name.clone(), problem: error.to_string() })?
            .peak_live_bytes;
        // A budget a little above the peak: some contenders are refused, the others fit.
        let settings = BenchSettings::new(Some((peak + peak / 8).next_multiple_of(1 << 20)));
        for policy in Contender::BENCH {
            let failed = |problem: String| Nonconformance { run: format!("{policy} on {}", workload.name), problem };
            let Some(mut target) = make(policy, &settings).map_err(|error| failed(format!("no target: {error}")))? else {
                continue;
            };
            let report = run(workload, &mut target).map_err(|error| failed(error.to_string()))?;
            let (submits, dispatches) = kernel_counts(&target);
            drop(target);
            let simulated = run_simulated(workload, policy, &settings).map_err(|error| failed(format!("simulated: {error}")))?;
            let problem = if !report.kernels_ran {
                Some("the kernels did not run".to_owned())
            } else if report.mismatches > 0 {
                Some(format!("{} words mismatched, first {:?}", report.mismatches, report.first_mismatch))
            } else if shared(&report) != shared(&simulated) {
                Some(format!(
                    "(allocs, frees, ooms, peak live, peak reserved, first oom step) {:?} on the device, {:?} simulated",
                    shared(&report),
                    shared(&simulated)
                ))
            } else if report.ops.bytes_verified == 0 || report.ops.matvecs == 0 {
                Some(format!("nothing verified or no payload ran: {:?}", report.ops))
            } else if submits == 0 || dispatches < report.ops.fills {
                Some(format!("{submits} submits, {dispatches} dispatches for {} fills", report.ops.fills))
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(failed(problem));
            }
            runs.push(DeviceRun { policy, workload: workload.name.clone(), report, submits, dispatches });
        }
    }
    if runs.iter().all(|run| run.report.ooms == 0) {
        return Err(Nonconformance {
            run: "all runs".to_owned(),
            problem: "no contender was refused, so no refusal was compared".to_owned(),
        });
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use heapscope_core::{Heap, PolicyKind, SimulatedSource};

    use super::*;
    use crate::bench::SimTarget;

    fn sim_target(settings: &BenchSettings) -> SimTarget<Heap<SimulatedSource>> {
        let source = SimulatedSource::new(settings.budget_bytes.unwrap_or(1 << 40), settings.block_alignment_bytes);
        SimTarget::new(Heap::new(settings.heap_config(PolicyKind::Tlsf), source).unwrap(), settings.align_bytes)
    }

    /// A target that skips the kernels, one that cannot be made, and one that refuses every contender are each a
    /// nonconformance naming the run and what is wrong.
    #[test]
    fn nonconforming_targets_are_named() {
        let skips_kernels = check_target(|_, settings| Ok::<_, String>(Some(sim_target(settings))), |_| (1, 1_000_000));
        let cannot_be_made = check_target(|_, _| Err::<Option<SimTarget<Heap<SimulatedSource>>>, _>("no device"), |_| (0, 0));
        let refuses_all = check_target(|_, _| Ok::<Option<SimTarget<Heap<SimulatedSource>>>, String>(None), |_| (0, 0));
        let cases = [
            (skips_kernels, "pytorch on serve", "the kernels did not run"),
            (cannot_be_made, "pytorch on serve", "no target: no device"),
            (refuses_all, "all runs", "no contender was refused"),
        ];
        for (result, run, problem) in cases {
            let error = result.unwrap_err();
            assert!(error.run.starts_with(run) && error.problem.starts_with(problem), "{error}");
        }
    }
}
