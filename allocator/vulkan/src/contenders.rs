//! Contenders on a real device, summed up like the simulated ones (`heapscope_lab::compare::Figures`):
//! a core policy inside a heap of `vkAllocateMemory` blocks, `paged` on a sparse buffer whose pages are bound on
//! demand ([`DevicePagedHeap`]), PyTorch's caching allocator on device memory, or the allocators users have today —
//! gpu-allocator 0.28 and VMA (vk-mem 0.5) — so `heapscope replay --vulkan` and `compare --vulkan` put them beside
//! heapscope's on the same device.
//!
//! `pytorch` replays the recording through the core's emulation of PyTorch's allocator (the simulated
//! contender's replay: a PyTorch snapshot entry by entry, from the state at its start) with a [`SegmentMemory`]
//! under it: every segment a dedicated `vkAllocateMemory` block, every expandable segment a sparse buffer whose
//! pages are bound as PyTorch maps them. Its decisions, peaks and out-of-memory verdicts are the simulated ones;
//! its peak reserved bytes and device allocations and frees are measured on the device. Expandable segments are
//! first replayed without a device to learn how far into its range each maps; a buffer that large must fit the
//! device (half the sparse address space, `maxBufferSize`), else [`VulkanError::VirtualRangeTooSmall`] before
//! anything is allocated. The device refusing memory the allocator reserved below its capacity stops the replay
//! ([`VulkanError::Unsupported`] saying so): the emulation cannot take a decision back.
//!
//! `paged`'s virtual range is one sparse buffer: four times what the trace needs at once (its live allocations
//! at their peak, each aligned, or the capacity when that is less), at most what the device allows one sparse
//! buffer (`sparseAddressSpaceSize`, `maxBufferSize`); a trace that needs more than that fails with
//! [`VulkanError::VirtualRangeTooSmall`] before anything is bound. Its page size is the buffer's sparse page
//! size (the simulated contender's `page_bytes` does not apply), its reserved bytes the pages bound (cached ones
//! included), its device allocations and frees the sparse bind and unbind entries.

use std::sync::Arc;

use heapscope_core::trace::Event;
use heapscope_core::units::Bytes;
use heapscope_core::{DeviceEvent, Heap, HeapConfig, PolicyConfig, Trace};
use heapscope_lab::compaction::{CompactRule, CompactionFigures};
use heapscope_lab::compare::{CompareConfig, Figures, best_time, emulate_pytorch, summed};
use heapscope_lab::contender::Contender;
use heapscope_lab::driver::replay_device_heap_compacting;
use heapscope_lab::recording::Recording;
use heapscope_pytorch::caching::SMALL_BUFFER_BYTES;
use heapscope_pytorch::{AllocConf, BackingRefused, CachingAllocator, SegmentBacking};

use crate::{
    DeviceLimits, DeviceMemorySource, DevicePagedConfig, DevicePagedHeap, DeviceSourceConfig, PytorchDeviceConfig, SegmentMemory,
    SparseBuffer, VulkanContext, VulkanError,
};

/// Counts blocks reserved and released in `events`.
#[cfg(any(feature = "gpu-allocator", feature = "vma"))]
fn count_device_events(events: &[DeviceEvent]) -> (u64, u64) {
    events.iter().fold((0, 0), |(reserved, released), event| match event {
        DeviceEvent::Reserved { .. } | DeviceEvent::Mapped { .. } => (reserved + 1, released),
        DeviceEvent::Released { .. } | DeviceEvent::Unmapped { .. } => (reserved, released + 1),
    })
}

/// The most bytes `trace`'s live allocations take at once, each size rounded up to `align_bytes` (at least the
/// policies' default unit); sizes no device holds are left out (they fail anyway).
pub fn peak_live_footprint_bytes(trace: &Trace, align_bytes: u64) -> u64 {
    let unit = align_bytes.max(PolicyConfig::default().min_align_bytes).max(1);
    let mut sizes = vec![0_u64; trace.slots() as usize];
    let (mut live, mut peak) = (0_u64, 0_u64);
    for event in trace.events() {
        match *event {
            Event::Alloc { slot, size_bytes } => {
                let footprint = size_bytes.checked_next_multiple_of(unit).unwrap_or(0);
                sizes[slot as usize] = footprint;
                live = live.saturating_add(footprint);
                peak = peak.max(live);
            }
            Event::Free { slot } => live -= std::mem::take(&mut sizes[slot as usize]),
            Event::EmptyCache => {}
        }
    }
    peak
}

/// The virtual range for `needed_bytes` at once on a device with `limits`: four times the need, at most the
/// largest sparse buffer the limits allow.
///
/// # Errors
/// [`VulkanError::VirtualRangeTooSmall`] when the need itself exceeds that.
pub fn paged_virtual_bytes(limits: &DeviceLimits, needed_bytes: u64) -> Result<u64, VulkanError> {
    let address_space = limits.sparse_address_space_size_bytes;
    let limit_bytes = sparse_buffer_limit(
        limits,
        VirtualNeed { contender: "paged", need: "its live allocations at their peak, or the capacity if less", needed_bytes },
        address_space,
        || format!("sparseAddressSpaceSize {}", Bytes(address_space)),
    )?;
    // At least 2 MiB (a multiple of every sparse page size met, so one page fits even under a tiny budget: the
    // budget, not the range, then refuses what the contender cannot hold).
    Ok(needed_bytes.saturating_mul(4).max(MIN_PAGED_RANGE_BYTES).min(limit_bytes))
}

/// The smallest virtual range `paged` gets on a device: 2 MiB.
const MIN_PAGED_RANGE_BYTES: u64 = 2 << 20;

/// What a contender needs of one sparse buffer's virtual range, for [`sparse_buffer_limit`].
#[derive(Clone, Copy, Debug)]
struct VirtualNeed {
    contender: &'static str,
    /// What the bytes are, in words.
    need: &'static str,
    needed_bytes: u64,
}

/// The largest sparse buffer on a device with `limits` when it may take `space_bytes` of the sparse address
/// space (and at most `maxBufferSize`).
///
/// # Errors
/// [`VulkanError::VirtualRangeTooSmall`] when `need` exceeds it, its limit named by `space` (what `space_bytes`
/// is) and `maxBufferSize`.
fn sparse_buffer_limit(
    limits: &DeviceLimits,
    need: VirtualNeed,
    space_bytes: u64,
    space: impl FnOnce() -> String,
) -> Result<u64, VulkanError> {
    let limit_bytes = largest_sparse_buffer_bytes(limits, space_bytes);
    if need.needed_bytes > limit_bytes {
        let max_buffer = limits
            .max_buffer_size_bytes
            .map_or_else(|| "maxBufferSize unknown".to_owned(), |max| format!("maxBufferSize {}", Bytes(max)));
        return Err(VulkanError::VirtualRangeTooSmall {
            contender: need.contender,
            need: need.need,
            needed_bytes: need.needed_bytes,
            limit_bytes,
            limit: format!("{}, {max_buffer}", space()),
        });
    }
    Ok(limit_bytes)
}

/// The largest sparse buffer on a device with `limits` that may take `space_bytes` of the sparse address space, in
/// whole pages ([`crate::sparse::whole_sparse_pages`]).
pub fn largest_sparse_buffer_bytes(limits: &DeviceLimits, space_bytes: u64) -> u64 {
    crate::sparse::whole_sparse_pages(limits.max_buffer_size_bytes.map_or(space_bytes, |max| max.min(space_bytes)))
}

/// The bytes `trace` needs at once in `paged`'s virtual range under `config` (its live allocations at their
/// peak, or the capacity when that is less), and the virtual range for that on `context`'s device.
///
/// # Errors
/// [`VulkanError::VirtualRangeTooSmall`] when the device's sparse buffers cannot hold the need: callers check
/// this before replaying anything.
pub fn paged_range_for(context: &VulkanContext, trace: &Trace, config: &CompareConfig) -> Result<(u64, u64), VulkanError> {
    let peak_bytes = peak_live_footprint_bytes(trace, config.align_bytes);
    let needed_bytes = config.budgeted_bytes().map_or(peak_bytes, |capacity| capacity.min(peak_bytes));
    let limits = &context.properties().limits;
    match config.paged_virtual_bytes {
        None => Ok((needed_bytes, paged_virtual_bytes(limits, needed_bytes)?)),
        Some(asked) => {
            let largest_bytes = largest_sparse_buffer_bytes(limits, limits.sparse_address_space_size_bytes);
            if asked > largest_bytes {
                return Err(VulkanError::InvalidArgument(format!(
                    "a virtual range of {} for paged: the device's sparse buffers hold at most {} (sparseAddressSpaceSize, \
                     maxBufferSize)",
                    Bytes(asked),
                    Bytes(largest_bytes)
                )));
            }
            Ok((needed_bytes, asked))
        }
    }
}

/// How far into their virtual range PyTorch's expandable segments map (the end of the highest page mapped, from
/// the segment's base), learned from a replay without a device.
#[derive(Debug, Default)]
struct ExpandableReach {
    reach_bytes: u64,
}

impl SegmentBacking for ExpandableReach {
    fn apply(&mut self, events: &[DeviceEvent], allocator: &CachingAllocator) -> Result<(), BackingRefused> {
        for event in events {
            if let DeviceEvent::Mapped { address, size_bytes } = *event
                && let Some((base, _)) = allocator.segment_at(address)
            {
                self.reach_bytes = self.reach_bytes.max(address - base + size_bytes);
            }
        }
        Ok(())
    }
}

/// The virtual range each expandable segment's sparse buffer needs for `recording` under `conf` (how far the
/// allocator maps into a segment, in whole 2 MiB pages; at least one page).
///
/// # Errors
/// [`VulkanError::VirtualRangeTooSmall`] when that exceeds what one buffer may be on `context`'s device: half the
/// sparse address space (the small and the large pool have a segment each), at most `maxBufferSize`;
/// [`VulkanError::Heap`] when the recording does not replay.
fn expandable_virtual_bytes(
    context: &VulkanContext,
    recording: &Recording,
    conf: &AllocConf,
    capacity_bytes: Option<u64>,
) -> Result<u64, VulkanError> {
    let mut reach = ExpandableReach::default();
    emulate_pytorch(recording, conf, capacity_bytes, &mut reach)?;
    let needed_bytes = reach.reach_bytes.max(1).next_multiple_of(SMALL_BUFFER_BYTES);
    let limits = &context.properties().limits;
    sparse_buffer_limit(
        limits,
        VirtualNeed { contender: "pytorch", need: "how far PyTorch maps into an expandable segment", needed_bytes },
        limits.sparse_address_space_size_bytes / 2,
        || {
            format!(
                "half of sparseAddressSpaceSize {} for each of the small and the large pool's segments",
                Bytes(limits.sparse_address_space_size_bytes)
            )
        },
    )?;
    Ok(needed_bytes)
}

/// `pytorch` on the device: the core's emulation with a [`SegmentMemory`] under it (see the module
/// documentation).
fn replay_pytorch_on_device(
    context: &Arc<VulkanContext>,
    recording: &Recording,
    name: &str,
    conf: &AllocConf,
    capacity_bytes: Option<u64>,
) -> Result<Figures, VulkanError> {
    let mut device_config = PytorchDeviceConfig::new(conf.clone(), capacity_bytes);
    if conf.expandable_segments {
        device_config.expandable_virtual_bytes = expandable_virtual_bytes(context, recording, conf, capacity_bytes)?;
    }
    let ((replay, counts), nanos) = best_time(|| {
        let mut memory = SegmentMemory::new(Arc::clone(context), &device_config)?;
        let replay =
            emulate_pytorch(recording, conf, capacity_bytes, &mut memory).map_err(|error| match memory.take_error() {
                Some(refused) if refused.is_out_of_memory() => VulkanError::Unsupported(format!(
                    "the device refused memory PyTorch's allocator reserved below its capacity ({error}); pytorch on the \
                 device makes PyTorch's decisions, so the device must hold what PyTorch reserves: replay with a \
                 --capacity the device holds"
                )),
                Some(refused) => refused,
                None => VulkanError::Heap(error),
            })?;
        memory.wait_binds()?;
        Ok::<_, VulkanError>((replay, memory.counts()))
    })?;
    Ok(Figures {
        peak_reserved_bytes: counts.peak_device_bytes,
        device_allocs: counts.device_allocs,
        device_frees: counts.device_frees,
        ..replay.figures(&format!("{name} (vulkan)"), recording, nanos)
    })
}

/// Replays `recording` through the external allocator `A` on a fresh [`ExternalHeap`] (default blocks, `config`'s
/// capacity as the budget cap), its device allocations and frees being its block events.
#[cfg(any(feature = "gpu-allocator", feature = "vma"))]
fn replay_external<A: crate::ExternalAllocator>(
    context: &Arc<VulkanContext>,
    recording: &Recording,
    config: &CompareConfig,
) -> Result<Figures, VulkanError> {
    use crate::{ExternalConfig, ExternalHeap};
    use heapscope_core::DeviceHeap;

    let ((replay, peak_reserved_bytes, events, copy_nanos), nanos) = best_time(|| {
        let external = ExternalConfig { budget_cap_bytes: config.budgeted_bytes(), ..ExternalConfig::default() };
        let mut heap = ExternalHeap::<A>::new(Arc::clone(context), external)?;
        heap.record_device_events(true);
        // VMA compacts with its own defragmentation, copying on the device; gpu-allocator moves nothing.
        let replay = replay_device_heap_compacting(&recording.trace, &mut heap, config.align_bytes, config.compact)?;
        let events = heap.take_device_events();
        Ok::<_, VulkanError>((replay, heap.peak_reserved_bytes(), events, heap.copy_nanos()))
    })?;
    let (device_allocs, device_frees) = count_device_events(&events);
    let policy = format!("{} (vulkan)", A::POLICY);
    let compaction = (config.compact != CompactRule::Never && A::DEFRAGMENTS)
        .then_some(CompactionFigures { device_copy_ns: Some(copy_nanos), ..replay.stats.compaction });
    Ok(Figures { peak_reserved_bytes, device_allocs, device_frees, compaction, ..summed(&policy, &replay, recording, nanos) })
}

/// Replays `recording` through `contender` on `context`'s device, with `config`'s capacity as the budget cap
/// (the allocator's capacity for `pytorch`). Each run starts from a fresh heap (every block of the previous run
/// freed), so the device holds one run's memory at a time.
///
/// # Errors
/// A Vulkan failure other than running out of memory (which is an out-of-memory outcome), invalid settings;
/// [`VulkanError::is_device_limit`] errors when the contender cannot run on this device: `paged` or `pytorch`'s
/// expandable segments needing a larger virtual range than the device allows
/// ([`VulkanError::VirtualRangeTooSmall`]), a missing feature, or (`pytorch`) the device refusing memory the
/// allocator reserved below its capacity.
pub fn replay_on_device(
    context: &Arc<VulkanContext>,
    recording: &Recording,
    contender: Contender,
    config: &CompareConfig,
) -> Result<Figures, VulkanError> {
    let trace = &recording.trace;
    // A request past the device's largest allocation cannot run here (gpu-allocator and VMA ask the driver anyway, and
    // say what it does). One past the capacity is refused as out of memory whatever the device: it does not count.
    if matches!(contender, Contender::Heap(_) | Contender::Pytorch { .. }) {
        let pytorch = match contender {
            Contender::Pytorch { expandable } => config.pytorch_conf(recording, expandable)?,
            _ => AllocConf::default(),
        };
        let largest_bytes = trace
            .events()
            .iter()
            .filter_map(|event| match *event {
                Event::Alloc { size_bytes, .. } if config.capacity_bytes.is_none_or(|capacity| size_bytes <= capacity) => {
                    Some(size_bytes)
                }
                _ => None,
            })
            .max()
            .unwrap_or(0);
        if let Some(largest) = context.properties().limits.largest_allocation()
            && let Some(too_large) = contender.allocation_too_large(largest_bytes, &pytorch, largest)
        {
            return Err(VulkanError::AllocationTooLarge(too_large));
        }
    }
    match contender {
        Contender::Pytorch { expandable } => {
            let conf = config.pytorch_conf(recording, expandable)?;
            replay_pytorch_on_device(
                context,
                recording,
                &config.pytorch_name(recording, expandable),
                &conf,
                config.capacity_bytes,
            )
        }
        Contender::Heap(kind) => {
            let ((replay, peak_reserved_bytes, blocks_reserved, blocks_released, copies), nanos) = best_time(|| {
                let source =
                    DeviceMemorySource::new(Arc::clone(context), DeviceSourceConfig::device_only(config.capacity_bytes))?;
                let mut heap = Heap::new(HeapConfig { policy: kind, ..config.heap.clone() }, source)?;
                // Compacting copies the moved allocations' bytes between the device's blocks.
                let replay = replay_device_heap_compacting(trace, &mut heap, config.align_bytes, config.compact)?;
                let stats = heap.stats();
                let copies = heap.source().copy_stats();
                Ok::<_, VulkanError>((replay, stats.peak_reserved_bytes, stats.blocks_reserved, stats.blocks_released, copies))
            })?;
            let compaction = (config.compact != CompactRule::Never)
                .then_some(CompactionFigures { device_copy_ns: Some(copies.nanos), ..replay.stats.compaction });
            Ok(Figures {
                peak_reserved_bytes,
                device_allocs: blocks_reserved,
                device_frees: blocks_released,
                compaction,
                ..summed(&format!("{} (vulkan)", kind.name()), &replay, recording, nanos)
            })
        }
        Contender::Paged => {
            let (needed_bytes, virtual_bytes) = paged_range_for(context, trace, config)?;
            let mut paged = DevicePagedConfig::new(virtual_bytes, config.budgeted_bytes());
            paged.unmap = config.paged_unmap;
            // About a thousand chunks at the trace's peak: few memory objects, few mappings.
            let peak_pages = needed_bytes.div_ceil(SparseBuffer::page_bytes_on(context)?);
            paged.pages_per_chunk = u32::try_from((peak_pages / 1024).clamp(64, 1 << 16)).unwrap_or(1 << 16);
            let ((replay, stats), nanos) = best_time(|| {
                let mut heap = DevicePagedHeap::new(Arc::clone(context), paged)?;
                // Compacting remaps the moved allocations' pages: nothing is copied.
                let replay = replay_device_heap_compacting(trace, &mut heap, config.align_bytes, config.compact)?;
                heap.wait_binds()?;
                Ok::<_, VulkanError>((replay, heap.stats()))
            })?;
            let compaction = (config.compact != CompactRule::Never).then_some(replay.stats.compaction);
            Ok(Figures {
                peak_reserved_bytes: stats.heap.peak_mapped_bytes,
                device_allocs: stats.sparse.bind_entries,
                device_frees: stats.sparse.unbind_entries,
                compaction,
                ..summed("paged (vulkan)", &replay, recording, nanos)
            })
        }
        #[cfg(feature = "gpu-allocator")]
        Contender::GpuAllocator => replay_external::<crate::GpuAllocatorBackend>(context, recording, config),
        #[cfg(feature = "vma")]
        Contender::Vma => replay_external::<crate::VmaBackend>(context, recording, config),
        #[cfg(not(all(feature = "gpu-allocator", feature = "vma")))]
        #[allow(unreachable_patterns, reason = "the contenders of the features left out")]
        Contender::GpuAllocator | Contender::Vma => Err(VulkanError::Unsupported(format!(
            "heapscope-vulkan was built without its `{contender}` feature: {contender} is not in this build"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_core::TraceBuilder;

    const GIB: u64 = 1 << 30;

    fn limits(address_space: u64, max_buffer: Option<u64>) -> DeviceLimits {
        DeviceLimits {
            max_memory_allocation_count: 4096,
            buffer_image_granularity_bytes: 1,
            non_coherent_atom_size_bytes: 1,
            sparse_address_space_size_bytes: address_space,
            max_buffer_size_bytes: max_buffer,
            max_memory_allocation_size_bytes: None,
        }
    }

    #[test]
    fn virtual_range_table() {
        // (address space, maxBufferSize, need) -> range, or the limit named in the error
        let lavapipe = limits(2 * GIB, Some(4 * GIB - 1));
        let nvidia = limits(1 << 40, Some(1 << 40));
        let old = limits(1 << 40, None);
        let small = limits(1 << 40, Some(GIB));
        // RADV: both limits 2^32 - 4, not a whole page: the range is in whole pages below them.
        let radv = limits(0xFFFF_FFFC, Some(0xFFFF_FFFC));
        let cases: [(&DeviceLimits, u64, Result<u64, &str>); 8] = [
            (&radv, 3 * GIB, Ok(4 * GIB - (64 << 10))),
            (&lavapipe, 256 << 20, Ok(GIB)),
            (&lavapipe, GIB, Ok(2 * GIB)),
            (&lavapipe, 2 * GIB, Ok(2 * GIB)),
            (&lavapipe, 13 * GIB, Err("sparseAddressSpaceSize 2.00 GiB, maxBufferSize 4.00 GiB")),
            (&nvidia, 13 * GIB, Ok(52 * GIB)),
            (&old, 0, Ok(2 << 20)),
            (&small, 2 * GIB, Err("sparseAddressSpaceSize 1.00 TiB, maxBufferSize 1.00 GiB")),
        ];
        for (limits, need, expected) in cases {
            match (paged_virtual_bytes(limits, need), expected) {
                (Ok(range), Ok(expected)) => assert_eq!(range, expected, "{limits:?} {need}"),
                (Err(error), Err(named)) => {
                    let text = error.to_string();
                    assert!(text.contains(named) && text.contains("needs a virtual range of at least"), "{text}");
                }
                (got, expected) => panic!("{limits:?} {need}: {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn peak_footprint_aligns_and_follows_frees() {
        let mut builder = TraceBuilder::new("peak");
        builder.alloc(1, 1000).unwrap();
        builder.alloc(2, 3000).unwrap();
        builder.free(1).unwrap();
        builder.alloc(3, 512).unwrap();
        builder.alloc(4, u64::MAX).unwrap();
        let trace = builder.finish();
        assert_eq!(peak_live_footprint_bytes(&trace, 512), 1024 + 3072);
        assert_eq!(peak_live_footprint_bytes(&trace, 4096), 8192, "1000 and 3000 B take a 4 KiB unit each");
    }
}
