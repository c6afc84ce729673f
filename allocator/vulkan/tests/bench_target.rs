//! The bench runner on the device (`VulkanTarget`), validation on: every contender plays small workloads with
//! every allocation filled, computed on, copied and verified by the kernels — no mismatch — and counts what the
//! simulated run counts (allocations, refusals, peak live and reserved bytes).
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

mod common;

use heapscope_kernels::bench::{BenchPolicy, BenchSettings, RunReport, run, run_simulated};
use heapscope_kernels::workload::{ChurnConfig, KvLayout, ServeConfig, ServeModel, Workload, churn, serve};
use heapscope_vulkan::VulkanTarget;

fn small_serve(kv: KvLayout) -> Workload {
    let model =
        ServeModel { weights_bytes: 2 << 20, kv_bytes_per_token: 32 << 10, hidden: 512, vocab: 4096, ..ServeModel::default() };
    serve(&ServeConfig { steps: 150, kv, seed: 7, model })
}

/// The numbers a device run and a simulated run must share.
fn shared(report: &RunReport) -> (u64, u64, u64, u64, u64, Option<u64>) {
    (
        report.allocs,
        report.frees,
        report.ooms,
        report.peak_live_bytes,
        report.peak_reserved_bytes,
        report.first_oom.as_ref().map(|(step, _)| *step),
    )
}

#[test]
fn every_contender_verifies_clean_and_matches_the_simulation() {
    let Some(context) = common::sparse_context() else { return };
    let workloads = [
        small_serve(KvLayout::Paged),
        small_serve(KvLayout::Contiguous),
        churn(&ChurnConfig { steps: 400, size_range: (4 << 10, 1 << 20), ..ChurnConfig::new(3) }),
    ];
    for workload in &workloads {
        let peak = workload.check().unwrap().peak_live_bytes;
        // A budget a little above the peak: some contenders are refused, the others fit.
        let settings = BenchSettings::new(Some((peak + peak / 8).next_multiple_of(1 << 20)));
        for policy in BenchPolicy::DEFAULT {
            let mut target = VulkanTarget::new(&context, policy, &settings).unwrap();
            let device = run(workload, &mut target).unwrap();
            let (submits, dispatches) = target.kernel_counts();
            drop(target);
            let simulated = run_simulated(workload, policy, &settings).unwrap();
            assert!(device.kernels_ran && device.mismatches == 0, "{policy} on {}: {:?}", workload.name, device.first_mismatch);
            assert_eq!(shared(&device), shared(&simulated), "{policy} on {}", workload.name);
            assert!(device.ops.bytes_verified > 0 && submits > 0 && dispatches >= device.ops.fills, "{policy}");
            eprintln!(
                "{policy:<18} {:<60} allocs {:>5} ooms {:>3} reserved/live {:.3} verified {:>4} MiB, {} submits, {:.2?}",
                workload.name.split(',').next().unwrap_or_default(),
                device.allocs,
                device.ooms,
                device.reserved_over_live(),
                device.ops.bytes_verified >> 20,
                submits,
                device.wall
            );
        }
    }
    common::finish(context);
}

/// Each target's device memory (blocks, cached segments) is gone when it is dropped.
#[test]
fn a_dropped_target_leaves_no_device_memory() {
    let Some(context) = common::sparse_context() else { return };
    let baseline = context.live_allocation_count();
    let workload = small_serve(KvLayout::Paged);
    for policy in [BenchPolicy::Heap(heapscope_core::PolicyKind::Tlsf), BenchPolicy::Pytorch] {
        let mut target = VulkanTarget::new(&context, policy, &BenchSettings::new(None)).unwrap();
        run(&workload, &mut target).unwrap();
        assert!(target.device_bytes() > 0, "{policy}: memory stays cached after the run");
        drop(target);
        assert_eq!(context.live_allocation_count(), baseline, "{policy}");
    }
    common::finish(context);
}
