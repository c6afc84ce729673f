//! Contenders on a real device, summed up like the simulated ones (`heapscope_core::compare::Outcome`):
//! a core policy inside a heap of `vkAllocateMemory` blocks, or gpu-allocator 0.28 itself, so `heapscope
//! replay --vulkan` and `compare --vulkan` put the allocator users have today beside heapscope's on the same
//! device.

use std::sync::Arc;

use heapscope_core::compare::{CompareConfig, Outcome, best_time, summed};
use heapscope_core::replay::replay_device_heap;
use heapscope_core::{DeviceEvent, DeviceHeap, Heap, HeapConfig, PolicyKind, Trace};

use crate::memory_types::MemoryUsage;
use crate::{DeviceMemorySource, DeviceSourceConfig, GpuAllocatorConfig, GpuAllocatorHeap, VulkanContext, VulkanError};

/// Who replays a trace on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceContender {
    /// A core policy inside device-local `vkAllocateMemory` blocks (the heap rules of the comparison).
    Heap(PolicyKind),
    /// gpu-allocator 0.28 (`MemoryLocation::GpuOnly`, 256 MiB blocks).
    GpuAllocator,
}

impl DeviceContender {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Heap(kind) => kind.name(),
            Self::GpuAllocator => "gpu-allocator",
        }
    }
}

/// Counts blocks reserved and released in `events`.
fn count_device_events(events: &[DeviceEvent]) -> (u64, u64) {
    events.iter().fold((0, 0), |(reserved, released), event| match event {
        DeviceEvent::Reserved { .. } | DeviceEvent::Mapped { .. } => (reserved + 1, released),
        DeviceEvent::Released { .. } | DeviceEvent::Unmapped { .. } => (reserved, released + 1),
    })
}

/// Replays `trace` through `contender` on `context`'s device, with `config`'s capacity as the budget cap.
/// `event_of` maps an event index of `trace` to the recording's numbering. Each run starts from a fresh heap
/// (every block of the previous run freed), so the device holds one run's memory at a time.
///
/// # Errors
/// A Vulkan failure other than running out of memory (which is an out-of-memory outcome), or invalid settings.
pub fn replay_on_device(
    context: &Arc<VulkanContext>,
    trace: &Trace,
    contender: DeviceContender,
    config: &CompareConfig,
    event_of: &dyn Fn(u64) -> u64,
) -> Result<Outcome, VulkanError> {
    match contender {
        DeviceContender::Heap(kind) => {
            let ((replay, peak_reserved_bytes, blocks_reserved, blocks_released), nanos) = best_time(|| {
                let source = DeviceMemorySource::new(
                    Arc::clone(context),
                    DeviceSourceConfig {
                        persistent_mapping: false,
                        budget_cap_bytes: config.capacity_bytes,
                        report_leaks_on_drop: false,
                        ..DeviceSourceConfig::new(MemoryUsage::DeviceLocal)
                    },
                )?;
                let mut heap = Heap::new(HeapConfig { policy: kind, ..config.heap.clone() }, source)?;
                let replay = replay_device_heap(trace, &mut heap, config.align_bytes)?;
                let stats = heap.stats();
                Ok::<_, VulkanError>((replay, stats.peak_reserved_bytes, stats.blocks_reserved, stats.blocks_released))
            })?;
            Ok(Outcome {
                peak_reserved_bytes,
                device_allocs: blocks_reserved,
                device_frees: blocks_released,
                ..summed(&format!("{} (vulkan)", kind.name()), &replay, event_of, nanos)
            })
        }
        DeviceContender::GpuAllocator => {
            let ((replay, peak_reserved_bytes, events), nanos) = best_time(|| {
                let gpu_config = GpuAllocatorConfig { budget_cap_bytes: config.capacity_bytes, ..GpuAllocatorConfig::default() };
                let mut heap = GpuAllocatorHeap::new(Arc::clone(context), gpu_config)?;
                heap.record_device_events(true);
                let replay = replay_device_heap(trace, &mut heap, config.align_bytes)?;
                let events = heap.take_device_events();
                Ok::<_, VulkanError>((replay, heap.peak_reserved_bytes(), events))
            })?;
            let (device_allocs, device_frees) = count_device_events(&events);
            Ok(Outcome {
                peak_reserved_bytes,
                device_allocs,
                device_frees,
                ..summed("gpu-allocator (vulkan)", &replay, event_of, nanos)
            })
        }
    }
}
