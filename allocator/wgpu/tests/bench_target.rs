//! The bench runner on wgpu (`WgpuTarget`), validation on: every contender plays small workloads with every
//! allocation filled, computed on, copied and verified by the kernels — no mismatch — and counts what the simulated
//! run counts (allocations, refusals and the first one's step, peak live and reserved bytes). On wgpu over
//! heapscope's Vulkan device every contender runs; on plain wgpu, `paged` and `pytorch-expandable` are refused
//! with the reason (skipped without a device unless `HEAPSCOPE_REQUIRE_GPU=1`).
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

mod common;

use common::{devices, finish};
use heapscope_core::PolicyKind;
use heapscope_kernels::bench::{BenchPolicy, BenchSettings, RunReport, run, run_simulated};
use heapscope_kernels::workload::{ChurnConfig, KvLayout, ServeConfig, ServeModel, Workload, churn, serve};
use heapscope_wgpu::{WgpuError, WgpuTarget};

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

fn needs_sparse(policy: BenchPolicy) -> bool {
    matches!(policy, BenchPolicy::Paged | BenchPolicy::PytorchExpandable)
}

#[test]
fn every_contender_verifies_clean_and_matches_the_simulation() {
    let workloads = [
        small_serve(KvLayout::Paged),
        small_serve(KvLayout::Contiguous),
        churn(&ChurnConfig { steps: 400, size_range: (4 << 10, 1 << 20), ..ChurnConfig::new(3) }),
    ];
    let mut ooms = 0;
    for (route, device) in devices() {
        for workload in &workloads {
            let peak = workload.check().unwrap().peak_live_bytes;
            // A budget a little above the peak: some contenders are refused, the others fit.
            let settings = BenchSettings::new(Some((peak + peak / 8).next_multiple_of(1 << 20)));
            for policy in BenchPolicy::DEFAULT {
                let mut target = match WgpuTarget::new(&device, policy, &settings) {
                    Err(WgpuError::Unsupported(why)) if !device.is_vulkan_interop() && needs_sparse(policy) => {
                        assert!(
                            why.starts_with(policy.name()) && why.contains("sparse binding") && why.contains("--backend vulkan"),
                            "{why}"
                        );
                        continue;
                    }
                    other => other.unwrap(),
                };
                let on_device = run(workload, &mut target).unwrap();
                let (submits, dispatches) = target.kernel_counts();
                drop(target);
                let simulated = run_simulated(workload, policy, &settings).unwrap();
                assert!(
                    on_device.kernels_ran && on_device.mismatches == 0,
                    "{route}: {policy} on {}: {:?}",
                    workload.name,
                    on_device.first_mismatch
                );
                assert_eq!(shared(&on_device), shared(&simulated), "{route}: {policy} on {}", workload.name);
                assert!(on_device.ops.bytes_verified > 0 && submits > 0 && dispatches >= on_device.ops.fills, "{policy}");
                assert!(on_device.ops.matvecs > 0, "{policy}: the payload ran");
                ooms += on_device.ooms;
                eprintln!(
                    "{route:<34} {:<18} {:<28} allocs {:>4} ooms {:>3} reserved/live {:.3} verified {:>4} MiB, {} submits, {:.2?}",
                    policy.name(),
                    workload.name.split(',').next().unwrap_or_default(),
                    on_device.allocs,
                    on_device.ooms,
                    on_device.reserved_over_live(),
                    on_device.ops.bytes_verified >> 20,
                    submits,
                    on_device.wall
                );
            }
        }
        finish(device);
    }
    assert!(ooms > 0, "the budgets refuse some contenders, so refusals are compared too");
}

/// A target gives its device memory back when dropped: what it held after the run (arenas, cached segments) is
/// gone — heapscope's Vulkan allocations back to where they were, and `finish` finds no handle kept.
#[test]
fn a_dropped_target_leaves_nothing_behind() {
    let workload = small_serve(KvLayout::Paged);
    for (route, device) in devices() {
        let baseline = device.vulkan_context().map(|context| context.live_allocation_count());
        for policy in
            [BenchPolicy::Heap(PolicyKind::Tlsf), BenchPolicy::Pytorch, BenchPolicy::Paged, BenchPolicy::PytorchExpandable]
        {
            if needs_sparse(policy) && !device.is_vulkan_interop() {
                continue;
            }
            let mut target = WgpuTarget::new(&device, policy, &BenchSettings::new(None)).unwrap();
            run(&workload, &mut target).unwrap();
            if !needs_sparse(policy) {
                assert!(target.device_bytes() > 0, "{route}: {policy}: memory stays cached after the run");
            }
            drop(target);
            let now = device.vulkan_context().map(|context| context.live_allocation_count());
            assert_eq!(now, baseline, "{route}: {policy}: heapscope's device memory is freed");
        }
        finish(device);
    }
}

/// Settings a heap refuses are an error naming them, never a panic; an allocation larger than a storage binding
/// stops the run with the limit named.
#[test]
fn bad_settings_and_unbindable_allocations_are_clear_errors() {
    for (route, device) in devices() {
        {
            let settings = BenchSettings { block_alignment_bytes: 3 << 10, ..BenchSettings::new(None) };
            let error = WgpuTarget::new(&device, BenchPolicy::Heap(PolicyKind::Tlsf), &settings).unwrap_err();
            assert!(error.to_string().contains("not a power of two"), "{route}: {error}");
            let limit = device.limits().max_storage_buffer_binding_size;
            let mut target = WgpuTarget::new(&device, BenchPolicy::Heap(PolicyKind::Tlsf), &BenchSettings::new(None)).unwrap();
            let error = heapscope_kernels::bench::Target::allocate(&mut target, limit + 4).unwrap_err();
            let message = error.to_string();
            assert!(
                message.contains("max_storage_buffer_binding_size") && message.contains("--backend vulkan"),
                "{route}: {message}"
            );
        }
        finish(device);
    }
}
