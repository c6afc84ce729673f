//! [`GpuAllocatorHeap`]: gpu-allocator 0.28 (`gpu_allocator::vulkan::Allocator`) as a heapscope [`DeviceHeap`], a
//! contender on the same device as heapscope's own `Heap<DeviceMemorySource>`.
//!
//! Every request is a linear resource in [`MemoryLocation::GpuOnly`] memory, with the request's alignment and
//! every memory type allowed. gpu-allocator's blocks (`VkDeviceMemory`) get synthetic base addresses, like
//! [`crate::DeviceMemorySource`]'s (increasing, never reused), so [`DeviceHeap::address`] is `base + offset`.
//! Blocks are told apart by their `VkDeviceMemory` handle; a block is taken to be reserved when an allocation
//! lands in a handle not seen live before, and released when gpu-allocator's capacity drops on the free of its
//! last allocation (gpu-allocator keeps its last general block even when empty).
//!
//! Its blocks count in [`VulkanContext::live_allocation_count`] alongside every source's, after the fact:
//! gpu-allocator calls `vkAllocateMemory` itself, so heapscope cannot refuse past `maxMemoryAllocationCount`.
//!
//! A budget cap ([`GpuAllocatorConfig::budget_cap_bytes`]) is checked before gpu-allocator allocates, so its
//! reserved bytes never exceed the cap: gpu-allocator 0.28's block rule is known (a request larger than the
//! block size gets a block of exactly its size, any other one a free run of an existing block or else a new
//! block of the block size, clamped to 4..=256 MiB in multiples of 4 MiB). When the block a request could
//! need would cross the cap, the request goes to gpu-allocator only if a free run of a live block holds it
//! (read from gpu-allocator's report, with the request's alignment); otherwise it fails with
//! [`Error::OutOfMemory`] and nothing is allocated. Should gpu-allocator still create a block past the cap (a
//! rule of another version), the allocation is freed again and the request refused.
//!
//! The heap is the shared [`ExternalHeap`] (books, slots, the [`DeviceHeap`] methods) over
//! [`GpuAllocatorBackend`], which holds only what talks to gpu-allocator.
//!
//! [`DeviceHeap`]: heapscope_core::DeviceHeap
//! [`DeviceHeap::address`]: heapscope_core::DeviceHeap::address

use std::fmt;
use std::sync::Arc;

use ash::vk;
use gpu_allocator::vulkan::{AllocationCreateDesc, AllocationScheme, Allocator, AllocatorCreateDesc};
use gpu_allocator::{AllocationError, AllocationSizes, AllocatorDebugSettings, MemoryLocation};
use heapscope_core::{Error, OomVerdict, Request, Result};

use crate::VulkanContext;
use crate::external::{BlockUsage, ExternalBook, ExternalHandle};
use crate::external_heap::{ExternalAllocator, ExternalConfig, ExternalHeap, Placed};
use crate::transfer::block_buffer_requirements;

/// How a [`GpuAllocatorHeap`] is set up: gpu-allocator's block size (clamped to 4..=256 MiB, a multiple of 4
/// MiB; larger requests get a block of their own) and a budget cap checked before gpu-allocator allocates.
pub type GpuAllocatorConfig = ExternalConfig;

/// A live allocation of a [`GpuAllocatorHeap`]: the handle every external allocator's heap gives out.
pub type GpuAllocatorHandle = ExternalHandle;

/// gpu-allocator as a heapscope [`DeviceHeap`](heapscope_core::DeviceHeap): the shared [`ExternalHeap`] over
/// [`GpuAllocatorBackend`]. See the module documentation.
pub type GpuAllocatorHeap = ExternalHeap<GpuAllocatorBackend>;

/// A live allocation kept in the heap, with the block it lies in.
#[derive(Debug)]
pub struct Live {
    inner: gpu_allocator::vulkan::Allocation,
    memory: vk::DeviceMemory,
}

/// What talks to gpu-allocator in a [`GpuAllocatorHeap`]: the allocator and the settings.
pub struct GpuAllocatorBackend {
    // Declared first: dropped (its blocks freed) while the device is alive.
    allocator: Allocator,
    _context: Arc<VulkanContext>,
    config: GpuAllocatorConfig,
    /// The memory types a block's buffer may use ([`block_buffer_requirements`]): gpu-allocator allocates among them
    /// only, as it would for such a buffer.
    type_bits: u32,
}

impl fmt::Debug for GpuAllocatorBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuAllocatorBackend").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The block size gpu-allocator 0.28 uses for `requested_bytes` (`AllocationSizes::adjust_memblock_size`): clamped
/// to 4..=256 MiB, rounded up to a multiple of 4 MiB.
pub(crate) fn effective_block_bytes(requested_bytes: u64) -> u64 {
    const FOUR_MIB: u64 = 4 << 20;
    requested_bytes.clamp(FOUR_MIB, 256 << 20).next_multiple_of(FOUR_MIB)
}

/// Whether some block of `report` has a free run (a gap between its allocations, whose report sizes include
/// their alignment padding) that holds `size_bytes` at an offset aligned to `align_bytes`, the test of
/// gpu-allocator's free-list allocator for linear resources.
fn report_has_room(report: &gpu_allocator::AllocatorReport, size_bytes: u64, align_bytes: u64) -> bool {
    report.blocks.iter().any(|block| {
        let mut taken: Vec<(u64, u64)> =
            report.allocations[block.allocations.clone()].iter().map(|a| (a.offset, a.offset + a.size)).collect();
        taken.sort_unstable();
        taken.push((block.size, block.size));
        let mut cursor: u64 = 0;
        taken.into_iter().any(|(start, end)| {
            let fits = cursor.next_multiple_of(align_bytes).checked_add(size_bytes).is_some_and(|end_of_it| end_of_it <= start);
            cursor = cursor.max(end);
            fits
        })
    })
}

/// A gpu-allocator failure other than out of memory.
fn failure(what: &str, error: &AllocationError) -> Error {
    Error::Source(format!("gpu-allocator {what}: {error}"))
}

impl GpuAllocatorHeap {
    /// gpu-allocator's own report (allocations and blocks).
    pub fn report(&self) -> gpu_allocator::AllocatorReport {
        self.allocator().allocator.generate_report()
    }
}

impl GpuAllocatorBackend {
    /// The verdict for a refused request, from gpu-allocator's report (`new_block_bytes`: the block it would have
    /// reserved, where that did not fit).
    fn verdict(&self, book: &mut ExternalBook<Live>, request: Request, new_block_bytes: Option<u64>) -> OomVerdict {
        let report = self.allocator.generate_report();
        let mut largest_free_run_bytes = 0;
        for block in &report.blocks {
            let mut taken: Vec<(u64, u64)> =
                report.allocations[block.allocations.clone()].iter().map(|a| (a.offset, a.offset + a.size)).collect();
            taken.sort_unstable();
            let mut cursor = 0;
            for (start, end) in taken {
                largest_free_run_bytes = largest_free_run_bytes.max(start.saturating_sub(cursor));
                cursor = cursor.max(end);
            }
            largest_free_run_bytes = largest_free_run_bytes.max(block.size.saturating_sub(cursor));
        }
        let usage = BlockUsage {
            reserved_bytes: report.total_capacity_bytes,
            allocated_bytes: report.total_allocated_bytes,
            largest_free_run_bytes,
        };
        book.verdict(request, usage, self.config.budget_cap_bytes, new_block_bytes)
    }

    /// Frees `inner` in gpu-allocator, and records the release of its block when gpu-allocator destroyed it.
    fn free_inner(
        &mut self,
        book: &mut ExternalBook<Live>,
        inner: gpu_allocator::vulkan::Allocation,
        memory: vk::DeviceMemory,
    ) -> Result<()> {
        self.allocator.free(inner).map_err(|error| failure("free", &error))?;
        let Some(block) = book.block_mut(memory) else {
            return Err(Error::Source("gpu-allocator freed an allocation in a block heapscope never saw".into()));
        };
        block.live_allocations -= 1;
        if block.live_allocations == 0 {
            let capacity = self.allocator.capacity();
            if capacity < book.reserved_bytes() {
                book.release_block(memory);
                book.set_reserved_bytes(capacity);
            }
        }
        Ok(())
    }
}

impl ExternalAllocator for GpuAllocatorBackend {
    type Live = Live;

    const POLICY: &'static str = "gpu-allocator";

    /// Apart from [`crate::DeviceMemorySource::BASE_ADDRESS`].
    const BASE_ADDRESS: u64 = 0x5000_0000_0000;

    /// A gpu-allocator on `context`'s device; [`Error::Source`] when gpu-allocator refuses the device.
    fn new(context: &Arc<VulkanContext>, config: ExternalConfig) -> Result<Self> {
        let mut debug_settings = AllocatorDebugSettings::default();
        debug_settings.log_leaks_on_shutdown = false;
        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: context.instance().clone(),
            device: context.device().clone(),
            physical_device: context.physical_device(),
            debug_settings,
            buffer_device_address: false,
            allocation_sizes: AllocationSizes::new(config.block_size_bytes, config.block_size_bytes),
        })
        .map_err(|error| failure("bring-up", &error))?;
        let type_bits = block_buffer_requirements(context)
            .map(|requirements| requirements.memory_type_bits)
            .map_err(|error| Error::Source(error.to_string()))?;
        Ok(Self { allocator, _context: Arc::clone(context), config, type_bits })
    }

    fn config(&self) -> &ExternalConfig {
        &self.config
    }

    fn allocate(&mut self, book: &mut ExternalBook<Live>, request: Request) -> Result<Placed<Live>> {
        if let Some(cap) = self.config.budget_cap_bytes {
            let block_bytes = effective_block_bytes(self.config.block_size_bytes);
            let size = request.size_bytes();
            let personal = size > block_bytes;
            let new_block_bytes = if personal { size } else { block_bytes };
            // Only near the cap is gpu-allocator's report read (it lists every allocation).
            if book.reserved_bytes().saturating_add(new_block_bytes) > cap
                && (personal || !report_has_room(&self.allocator.generate_report(), size, request.align_bytes()))
            {
                return Err(Error::OutOfMemory(Box::new(self.verdict(book, request, Some(new_block_bytes)))));
            }
        }
        let desc = AllocationCreateDesc {
            name: "",
            requirements: vk::MemoryRequirements {
                size: request.size_bytes(),
                alignment: request.align_bytes(),
                memory_type_bits: self.type_bits,
            },
            location: MemoryLocation::GpuOnly,
            linear: true,
            allocation_scheme: AllocationScheme::GpuAllocatorManaged,
        };
        let inner = match self.allocator.allocate(&desc) {
            Ok(inner) => inner,
            Err(AllocationError::OutOfMemory) => return Err(Error::OutOfMemory(Box::new(self.verdict(book, request, None)))),
            Err(error) => return Err(failure("allocate", &error)),
        };
        // SAFETY: the handle is only used as a key to tell blocks apart; it is never bound, mapped or freed here.
        let memory = unsafe { inner.memory() };
        let block = match book.block_mut(memory) {
            Some(block) => block,
            None => {
                let size_bytes = self.allocator.capacity().saturating_sub(book.reserved_bytes());
                book.reserve_block(memory, size_bytes)
            }
        };
        block.live_allocations += 1;
        let block_base = block.base_address;
        // A block past the cap despite the check above (another gpu-allocator block rule): undo it.
        if let Some(cap) = self.config.budget_cap_bytes
            && book.reserved_bytes() > cap
        {
            self.free_inner(book, inner, memory)?;
            return Err(Error::OutOfMemory(Box::new(self.verdict(book, request, None))));
        }
        let offset_bytes = inner.offset();
        Ok(Placed { live: Live { inner, memory }, offset_bytes, block_base })
    }

    fn free(&mut self, book: &mut ExternalBook<Live>, live: Live) -> Result<()> {
        self.free_inner(book, live.inner, live.memory)
    }

    fn free_all(&mut self, _book: &mut ExternalBook<Live>, live: Vec<Live>) {
        // Frees what is still live so gpu-allocator destroys its blocks cleanly; the allocator itself frees the
        // rest when dropped. Every block left (gpu-allocator's last general block, blocks of failed frees) goes
        // with the allocator, and the books take it off the device's count.
        for live in live {
            let _ = self.allocator.free(live.inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_allocator::{AllocationReport, AllocatorReport, MemoryBlockReport};

    const MIB: u64 = 1 << 20;

    #[test]
    fn block_sizes_follow_gpu_allocator() {
        for (requested, effective) in
            [(0, 4 * MIB), (MIB, 4 * MIB), (5 * MIB, 8 * MIB), (256 * MIB, 256 * MIB), (1 << 40, 256 * MIB)]
        {
            assert_eq!(effective_block_bytes(requested), effective, "{requested}");
        }
    }

    /// Blocks of `size` holding allocations `(offset, size)`.
    fn report(blocks: &[(u64, &[(u64, u64)])]) -> AllocatorReport {
        let mut allocations = Vec::new();
        let mut block_reports = Vec::new();
        for &(size, taken) in blocks {
            let first = allocations.len();
            allocations.extend(taken.iter().map(|&(offset, size)| AllocationReport { name: String::new(), offset, size }));
            block_reports.push(MemoryBlockReport { size, allocations: first..allocations.len() });
        }
        AllocatorReport { allocations, blocks: block_reports, total_allocated_bytes: 0, total_capacity_bytes: 0 }
    }

    #[test]
    fn room_in_a_block_table() {
        // (blocks, size, align) -> room
        type Case = (&'static [(u64, &'static [(u64, u64)])], u64, u64, bool);
        let cases: [Case; 8] = [
            (&[], MIB, 256, false),
            (&[(4 * MIB, &[])], 4 * MIB, 256, true),
            (&[(4 * MIB, &[])], 4 * MIB + 1, 256, false),
            // A 1 MiB hole between allocations (listed out of order, as gpu-allocator's report may list them).
            (&[(4 * MIB, &[(2 * MIB, 2 * MIB), (0, MIB)])], MIB, 256, true),
            (&[(4 * MIB, &[(2 * MIB, 2 * MIB), (0, MIB)])], MIB + 1, 256, false),
            // The hole starts at 1 MiB + 100: aligned to 1 MiB the request no longer fits it.
            (&[(4 * MIB, &[(0, MIB + 100), (2 * MIB + 100, 2 * MIB - 100)])], MIB, MIB, false),
            (&[(4 * MIB, &[(0, MIB + 100), (2 * MIB + 100, 2 * MIB - 100)])], MIB, 4, true),
            // The tail of the second block.
            (&[(4 * MIB, &[(0, 4 * MIB)]), (8 * MIB, &[(0, 5 * MIB)])], 3 * MIB, 256, true),
        ];
        for (blocks, size, align, room) in cases {
            assert_eq!(report_has_room(&report(blocks), size, align), room, "{blocks:?} {size} {align}");
        }
    }
}
