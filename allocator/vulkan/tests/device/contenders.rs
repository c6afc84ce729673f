//! `replay_on_device`: every device contender replays the same trace on one validated device and is summed up
//! in the lab's `Figures`; `paged`'s sparse buffer is sized from the trace and the device's limits; `pytorch` on
//! device memory reproduces the simulated contender's decisions, peaks and verdicts, on a plain trace and on a
//! PyTorch snapshot.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use crate::common::{finish, sparse_context};
use heapscope_core::units::MIB;
use heapscope_core::{PolicyKind, TraceBuilder, UnmapRule};
use heapscope_lab::compare::{CompareConfig, Figures, replay_pytorch};
use heapscope_lab::contender::Contender;
use heapscope_lab::recording::Recording;
use heapscope_pytorch::{AllocConf, read_snapshot};
use heapscope_vulkan::{VulkanError, paged_virtual_bytes, peak_live_footprint_bytes, replay_on_device};

/// frag_oom at 1/8 scale (18.75 MiB x 20 allocated and freed, 12.5 MiB x 20, then 128 MiB) within 448 MiB.
fn small_frag_oom() -> heapscope_core::Trace {
    let mut builder = TraceBuilder::new("frag_oom / 8");
    for id in 0..20 {
        builder.alloc(id, 75 * MIB / 4).unwrap();
    }
    for id in 0..20 {
        builder.free(id).unwrap();
    }
    for id in 100..120 {
        builder.alloc(id, 25 * MIB / 2).unwrap();
    }
    builder.alloc(999, 128 * MIB).unwrap();
    builder.finish()
}

#[test]
fn every_device_contender_replays_the_same_trace() {
    let Some(context) = sparse_context() else { return };
    let trace = Recording::from_trace(small_frag_oom());
    let capacity = 448 * MIB;
    let config = CompareConfig { capacity_bytes: Some(capacity), ..CompareConfig::default() };
    let contenders = [
        Contender::Pytorch { expandable: false },
        Contender::Heap(PolicyKind::Tlsf),
        Contender::Paged,
        Contender::GpuAllocator,
        Contender::Vma,
    ];
    for contender in contenders {
        let outcome = replay_on_device(&context, &trace, contender, &config).unwrap();
        assert_eq!(outcome.policy, format!("{} (vulkan)", contender.name()));
        assert_eq!(outcome.events, 61, "{outcome:?}");
        assert_eq!(outcome.allocs + outcome.ooms, 41, "{outcome:?}");
        assert!(outcome.peak_reserved_bytes <= capacity, "{outcome:?}");
        assert!(outcome.device_allocs > 0, "{outcome:?}");
        if let Some(oom) = &outcome.first_oom {
            assert!(oom.event_index < 61 && oom.reserved_bytes <= capacity, "{oom:?}");
        }
        if contender == Contender::Paged {
            // 12.5 MiB x 20 + 128 MiB live, in 4 KiB pages (or the device's): every request served.
            assert_eq!(outcome.ooms, 0, "{outcome:?}");
            assert!(outcome.peak_reserved_bytes >= 378 * MIB, "{outcome:?}");
        }
    }
    // Under pressure the freed pages serve the 12.5 MiB allocations without binds.
    let pressure = CompareConfig { paged_unmap: UnmapRule::UnderPressure, ..config.clone() };
    let eager = replay_on_device(&context, &trace, Contender::Paged, &config).unwrap();
    let cached = replay_on_device(&context, &trace, Contender::Paged, &pressure).unwrap();
    assert_eq!(cached.ooms, 0, "{cached:?}");
    assert!(cached.device_allocs < eager.device_allocs, "{cached:?} vs {eager:?}");
    finish(context);
}

#[test]
fn paged_refuses_a_trace_larger_than_the_device_allows() {
    let Some(context) = sparse_context() else { return };
    let limits = context.properties().limits;
    let largest = limits
        .max_buffer_size_bytes
        .map_or(limits.sparse_address_space_size_bytes, |max| max.min(limits.sparse_address_space_size_bytes));
    // One allocation larger than any sparse buffer the device allows.
    let mut builder = TraceBuilder::new("too large");
    builder.alloc(1, largest + (1 << 20)).unwrap();
    let trace = Recording::from_trace(builder.finish());
    assert!(peak_live_footprint_bytes(&trace.trace, 512) > largest);
    let error = replay_on_device(&context, &trace, Contender::Paged, &CompareConfig::default()).unwrap_err();
    assert!(matches!(error, VulkanError::VirtualRangeTooSmall { contender: "paged", .. }), "{error}");
    assert!(error.is_device_limit(), "{error}");
    assert!(error.to_string().contains("sparseAddressSpaceSize"), "{error}");
    // With a capacity below the device's limit the same trace replays (and its one request is refused).
    let config = CompareConfig { capacity_bytes: Some(64 * MIB), ..CompareConfig::default() };
    assert!(paged_virtual_bytes(&limits, 64 * MIB).is_ok());
    let outcome = replay_on_device(&context, &trace, Contender::Paged, &config).unwrap();
    assert_eq!((outcome.allocs, outcome.ooms), (0, 1), "{outcome:?}");
    finish(context);
}

/// `pytorch (vulkan)` against the simulated `pytorch`: the same allocations, refusals, first refusal (entry,
/// request, verdict, message), fidelity, peaks of live and reserved bytes and device allocations and frees — the
/// last two measured on the device.
fn assert_reproduces(on_device: &Figures, simulated: &Figures, what: &str) {
    assert_eq!(on_device.policy, "pytorch (vulkan)", "{what}");
    let numbers = |outcome: &Figures| {
        (
            outcome.events,
            outcome.allocs,
            outcome.frees,
            outcome.ooms,
            outcome.peak_live_bytes,
            outcome.peak_reserved_bytes,
            outcome.device_allocs,
            outcome.device_frees,
        )
    };
    assert_eq!(numbers(on_device), numbers(simulated), "{what}: {on_device:?}");
    assert_eq!(on_device.first_oom, simulated.first_oom, "{what}");
    assert_eq!(on_device.fidelity, simulated.fidelity, "{what}");
}

/// frag_oom at 1/8 scale as a plain trace within 448 MiB: the default allocator fails the 128 MiB request with
/// PyTorch's fragmentation verdict, expandable segments (a sparse buffer, pages bound as PyTorch maps them)
/// serve it; both exactly as simulated.
#[test]
fn pytorch_on_device_memory_reproduces_the_simulation_on_frag_oom() {
    let Some(context) = sparse_context() else { return };
    let recording = Recording::from_trace(small_frag_oom());
    let capacity = Some(448 * MIB);
    let config = CompareConfig { capacity_bytes: capacity, ..CompareConfig::default() };
    for (settings, ooms) in [("", 1), ("expandable_segments:True", 0)] {
        let mut conf = AllocConf::default();
        conf.parse_overrides(settings).unwrap();
        let simulated = replay_pytorch(&recording, &conf, capacity).unwrap();
        let config = CompareConfig { alloc_conf: Some(settings.to_owned()), ..config.clone() };
        let on_device = replay_on_device(&context, &recording, Contender::Pytorch { expandable: false }, &config).unwrap();
        assert_reproduces(&on_device, &simulated, settings);
        assert_eq!(on_device.ooms, ooms, "{on_device:?}");
        assert!(on_device.device_allocs > 0, "{on_device:?}");
        if ooms == 1 {
            let oom = on_device.first_oom.as_ref().unwrap();
            assert_eq!((oom.request_bytes, oom.verdict), (128 * MIB, heapscope_core::OomCause::Fragmentation), "{oom:?}");
            assert!(oom.message.starts_with("Tried to allocate 128.00 MiB."), "{oom:?}");
        }
    }
    finish(context);
}

fn snapshot(name: &str) -> Recording {
    let path = format!("{}/../../assets/traces/pytorch/{name}.pickle.gz", env!("CARGO_MANIFEST_DIR"));
    Recording::from_snapshot(name, read_snapshot(std::path::Path::new(&path)).unwrap(), 0).unwrap()
}

/// The bundled frag_oom snapshots, recorded by PyTorch on an H200, replayed entry by entry on device memory: the
/// default allocator's out-of-memory at entry 100 (a 1 GiB request, 1000 MiB free in reserved memory but at most
/// 50 MiB in one piece) under a 3584 MiB capacity and, without one, the refusal the recording itself holds. The
/// expandable recording needs a sparse buffer of ~3 GiB: where the device has one it matches the simulation too,
/// else it is a device limit that names the need.
#[test]
fn pytorch_on_device_memory_reproduces_a_recorded_snapshot() {
    let Some(context) = sparse_context() else { return };
    let recording = snapshot("frag_oom-default");
    let conf = AllocConf::from_recorded(recording.snapshot.as_ref().unwrap().settings.as_ref().unwrap());
    for capacity in [Some(3584 * MIB), None] {
        let config = CompareConfig { capacity_bytes: capacity, ..CompareConfig::default() };
        let simulated = replay_pytorch(&recording, &conf, capacity).unwrap();
        let on_device = replay_on_device(&context, &recording, Contender::Pytorch { expandable: false }, &config).unwrap();
        assert_reproduces(&on_device, &simulated, &format!("frag_oom-default, capacity {capacity:?}"));
        let oom = on_device.first_oom.as_ref().unwrap();
        assert_eq!((oom.event_index, oom.request_bytes, oom.free_bytes), (100, 1 << 30, 1000 * MIB), "{oom:?}");
        assert_eq!(on_device.peak_reserved_bytes, 3000 * MIB, "{on_device:?}");
        assert!(on_device.fidelity.unwrap().is_exact(), "every segment event and placement as PyTorch recorded them");
    }
    let expandable = snapshot("frag_oom-expandable");
    let conf = AllocConf::from_recorded(expandable.snapshot.as_ref().unwrap().settings.as_ref().unwrap());
    let config = CompareConfig { capacity_bytes: Some(3584 * MIB), ..CompareConfig::default() };
    match replay_on_device(&context, &expandable, Contender::Pytorch { expandable: false }, &config) {
        Ok(on_device) => {
            let simulated = replay_pytorch(&expandable, &conf, config.capacity_bytes).unwrap();
            assert_reproduces(&on_device, &simulated, "frag_oom-expandable");
        }
        Err(error) => {
            // The large pool's segment maps ~3 GiB (its 20 MiB pages, lowest first): more than lavapipe's 1 GiB.
            let VulkanError::VirtualRangeTooSmall { contender: "pytorch", needed_bytes, limit_bytes, .. } = error else {
                panic!("{error}")
            };
            assert!(needed_bytes > limit_bytes && (2900 * MIB..3200 * MIB).contains(&needed_bytes), "{error}");
            assert!(error.is_device_limit(), "{error}");
            let text = error.to_string();
            assert!(
                text.contains("the pytorch contender needs a virtual range of at least 2.97 GiB")
                    && text.contains("sparseAddressSpaceSize"),
                "{text}"
            );
        }
    }
    finish(context);
}
