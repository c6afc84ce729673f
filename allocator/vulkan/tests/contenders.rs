//! `replay_on_device`: every device contender replays the same trace on one validated device and is summed up
//! in the core's `Outcome`; `paged`'s sparse buffer is sized from the trace and the device's limits.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

mod common;

use common::{finish, sparse_context};
use heapscope_core::compare::CompareConfig;
use heapscope_core::units::MIB;
use heapscope_core::{PolicyKind, TraceBuilder, UnmapRule};
use heapscope_vulkan::{DeviceContender, VulkanError, paged_virtual_bytes, peak_live_footprint_bytes, replay_on_device};

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
    let trace = small_frag_oom();
    let capacity = 448 * MIB;
    let identity = |index| index;
    let config = CompareConfig { capacity_bytes: Some(capacity), ..CompareConfig::default() };
    let contenders =
        [DeviceContender::Heap(PolicyKind::Tlsf), DeviceContender::Paged, DeviceContender::GpuAllocator, DeviceContender::Vma];
    for contender in contenders {
        let outcome = replay_on_device(&context, &trace, contender, &config, &identity).unwrap();
        assert_eq!(outcome.policy, format!("{} (vulkan)", contender.name()));
        assert_eq!(outcome.events, 61, "{outcome:?}");
        assert_eq!(outcome.allocs + outcome.ooms, 41, "{outcome:?}");
        assert!(outcome.peak_reserved_bytes <= capacity, "{outcome:?}");
        assert!(outcome.device_allocs > 0, "{outcome:?}");
        if let Some(oom) = &outcome.first_oom {
            assert!(oom.event_index < 61 && oom.reserved_bytes <= capacity, "{oom:?}");
        }
        if contender == DeviceContender::Paged {
            // 12.5 MiB x 20 + 128 MiB live, in 4 KiB pages (or the device's): every request served.
            assert_eq!(outcome.ooms, 0, "{outcome:?}");
            assert!(outcome.peak_reserved_bytes >= 378 * MIB, "{outcome:?}");
        }
    }
    // Under pressure the freed pages serve the 12.5 MiB allocations without binds.
    let pressure = CompareConfig { paged_unmap: UnmapRule::UnderPressure, ..config.clone() };
    let eager = replay_on_device(&context, &trace, DeviceContender::Paged, &config, &identity).unwrap();
    let cached = replay_on_device(&context, &trace, DeviceContender::Paged, &pressure, &identity).unwrap();
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
    let trace = builder.finish();
    assert!(peak_live_footprint_bytes(&trace, 512) > largest);
    let error =
        replay_on_device(&context, &trace, DeviceContender::Paged, &CompareConfig::default(), &|index| index).unwrap_err();
    assert!(matches!(error, VulkanError::VirtualRangeTooSmall { .. }), "{error}");
    assert!(error.to_string().contains("sparseAddressSpaceSize"), "{error}");
    // With a capacity below the device's limit the same trace replays (and its one request is refused).
    let config = CompareConfig { capacity_bytes: Some(64 * MIB), ..CompareConfig::default() };
    assert!(paged_virtual_bytes(&limits, 64 * MIB).is_ok());
    let outcome = replay_on_device(&context, &trace, DeviceContender::Paged, &config, &|index| index).unwrap();
    assert_eq!((outcome.allocs, outcome.ooms), (0, 1), "{outcome:?}");
    finish(context);
}
