//! [`VmaHeap`]: AMD's Vulkan Memory Allocator (VMA 3, through vk-mem 0.5) as a heapscope [`DeviceHeap`], a
//! contender on the same device as heapscope's own `Heap<DeviceMemorySource>` and gpu-allocator.
//!
//! Every request is `vmaAllocateMemory` with requirements {size, the request's alignment, every memory type} and
//! `MemoryUsage::Unknown` with `DEVICE_LOCAL` required (when the device has such a type), VMA's default
//! algorithm and block sizes (`preferredLargeHeapBlockSize` from [`VmaConfig::block_size_bytes`]).
//!
//! VMA's blocks (`VkDeviceMemory`) are followed exactly through its device-memory callbacks
//! (`VmaDeviceMemoryCallbacks`: one call per `vkAllocateMemory` and `vkFreeMemory` it makes), so the heap knows
//! when VMA creates a block, which block an empty one it frees is (VMA keeps one empty block and may free
//! another one on any free), and its reserved bytes at every moment. Blocks get synthetic base addresses like
//! [`crate::DeviceMemorySource`]'s (increasing, never reused); [`DeviceHeap::address`] is `base + offset`.
//!
//! A budget cap ([`VmaConfig::budget_cap_bytes`]) is VMA's own heap size limit (`pHeapSizeLimit`, on every
//! heap): VMA refuses a block that would cross it before allocating it (falling back to smaller blocks as it
//! does on a small heap), so the reserved bytes never exceed the cap, and the request fails with
//! [`Error::OutOfMemory`] and a verdict from VMA's statistics (reserved, allocated, largest free range).
//! `VK_ERROR_OUT_OF_DEVICE_MEMORY` and `VK_ERROR_OUT_OF_HOST_MEMORY` from the device are out-of-memory verdicts too.
//!
//! Its blocks count in [`VulkanContext::live_allocation_count`] alongside every source's, after the fact (VMA
//! calls `vkAllocateMemory` itself).
//!
//! The heap is the shared [`ExternalHeap`] (books, slots, the [`DeviceHeap`] methods) over [`VmaBackend`], which
//! holds only what talks to VMA.
//!
//! [`DeviceHeap`]: heapscope_core::DeviceHeap
//! [`DeviceHeap::address`]: heapscope_core::DeviceHeap::address

use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use ash::vk;
use heapscope_core::{Error, OomVerdict, Request, Result};
use vk_mem::Alloc;

use crate::VulkanContext;
use crate::external::{BlockUsage, ExternalBook, ExternalHandle};
use crate::external_heap::{ExternalAllocator, ExternalConfig, ExternalHeap, Placed};

/// How a [`VmaHeap`] is set up: block size (VMA's `preferredLargeHeapBlockSize`) and budget cap (VMA's heap size
/// limit).
pub type VmaConfig = ExternalConfig;

/// A live allocation of a [`VmaHeap`]: the handle every external allocator's heap gives out.
pub type VmaHandle = ExternalHandle;

/// VMA as a heapscope [`DeviceHeap`](heapscope_core::DeviceHeap): the shared [`ExternalHeap`] over [`VmaBackend`].
/// See the module documentation.
pub type VmaHeap = ExternalHeap<VmaBackend>;

/// One `vkAllocateMemory` (true) or `vkFreeMemory` (false) VMA made, with the memory and its size.
type MemoryCall = (bool, vk::DeviceMemory, u64);

/// What VMA's device-memory callbacks write: boxed, so its address (VMA's `pUserData`) never moves.
#[derive(Debug, Default)]
struct CallbackLog {
    /// Set by a callback: `calls` has something (read without the lock on every operation).
    pending: AtomicBool,
    calls: Mutex<Vec<MemoryCall>>,
}

impl CallbackLog {
    fn push(&self, call: MemoryCall) {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner).push(call);
        self.pending.store(true, Ordering::Release);
    }

    fn take(&self) -> Vec<MemoryCall> {
        if !self.pending.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// VMA's device-memory callback: `(allocator, memory type, memory, size, user data)`.
type MemoryCallback = unsafe extern "C" fn(*mut c_void, u32, vk::DeviceMemory, u64, *mut c_void);

/// `VmaDeviceMemoryCallbacks`, field for field (VMA's C header: two nullable function pointers and a user-data
/// pointer). vk-mem 0.5 takes that structure in `AllocatorCreateInfo::device_memory_callbacks` but keeps its
/// type in a private module, so heapscope declares the same `repr(C)` layout and passes it by pointer.
#[repr(C)]
struct DeviceMemoryCallbacks {
    pfn_allocate: Option<MemoryCallback>,
    pfn_free: Option<MemoryCallback>,
    user_data: *mut c_void,
}

/// The layout of what `callbacks` would point to (a type that cannot be named: inferred).
fn pointee_layout<T>(_callbacks: &Option<&T>) -> std::alloc::Layout {
    std::alloc::Layout::new::<T>()
}

/// VMA's `pfnAllocate`: called after each `vkAllocateMemory` it makes.
unsafe extern "C" fn on_allocate(_: *mut c_void, _: u32, memory: vk::DeviceMemory, size: u64, user: *mut c_void) {
    // SAFETY: `user` is the `CallbackLog` boxed in the `VmaBackend` that created this allocator; the box lives until
    // after the allocator is destroyed (field order), and VMA calls back only from calls the heap makes.
    let log = unsafe { &*user.cast::<CallbackLog>() };
    log.push((true, memory, size));
}

/// VMA's `pfnFree`: called before each `vkFreeMemory` it makes.
unsafe extern "C" fn on_free(_: *mut c_void, _: u32, memory: vk::DeviceMemory, size: u64, user: *mut c_void) {
    // SAFETY: as in `on_allocate`.
    let log = unsafe { &*user.cast::<CallbackLog>() };
    log.push((false, memory, size));
}

/// What talks to VMA in a [`VmaHeap`]: the allocator, its device-memory callbacks' log and the allocation settings.
pub struct VmaBackend {
    // Declared first: dropped (its blocks freed) while the callback log and the device are alive.
    allocator: vk_mem::Allocator,
    callbacks: Box<CallbackLog>,
    _context: Arc<VulkanContext>,
    config: VmaConfig,
    create_info: vk_mem::AllocationCreateInfo,
}

impl fmt::Debug for VmaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VmaBackend").field("config", &self.config).finish_non_exhaustive()
    }
}

/// A VMA failure other than out of memory.
fn failure(what: &str, result: vk::Result) -> Error {
    Error::Source(format!("VMA {what}: {result}"))
}

impl VmaHeap {
    /// From VMA's own statistics (`vmaCalculateStatistics`): bytes allocated in its blocks (alignment padding
    /// included), and the largest free range; `None` when VMA fails to say.
    pub fn allocated_and_largest_free_bytes(&self) -> Option<(u64, u64)> {
        self.allocator().allocated_and_largest_free_bytes()
    }
}

impl VmaBackend {
    /// See [`VmaHeap::allocated_and_largest_free_bytes`].
    fn allocated_and_largest_free_bytes(&self) -> Option<(u64, u64)> {
        let total = self.allocator.calculate_statistics().ok()?.total;
        Some((total.statistics.allocationBytes, total.unusedRangeSizeMax))
    }

    /// Applies the `vkAllocateMemory` / `vkFreeMemory` calls VMA made since the last time.
    fn apply_memory_calls(&self, book: &mut ExternalBook<vk_mem::Allocation>) {
        for (allocated, memory, size_bytes) in self.callbacks.take() {
            if allocated {
                book.reserve_block(memory, size_bytes);
            } else {
                book.release_block(memory);
            }
        }
    }

    /// The verdict for a refused request, from VMA's statistics.
    fn verdict(&self, book: &mut ExternalBook<vk_mem::Allocation>, request: Request) -> OomVerdict {
        let reserved_bytes = book.reserved_bytes();
        let (allocated_bytes, largest_free_run_bytes) = self.allocated_and_largest_free_bytes().unwrap_or((book.live_bytes(), 0));
        let free_in_blocks_bytes = reserved_bytes.saturating_sub(allocated_bytes);
        let usage = BlockUsage {
            reserved_bytes,
            allocated_bytes,
            largest_free_run_bytes: largest_free_run_bytes.min(free_in_blocks_bytes),
        };
        book.verdict(request, usage, self.config.budget_cap_bytes)
    }
}

impl ExternalAllocator for VmaBackend {
    type Live = vk_mem::Allocation;

    const POLICY: &'static str = "vma";

    const BASE_ADDRESS: u64 = 0x6000_0000_0000;

    /// A VMA allocator on `context`'s device; [`Error::Source`] when `vmaCreateAllocator` fails.
    fn new(context: &Arc<VulkanContext>, config: ExternalConfig) -> Result<Self> {
        let callbacks = Box::new(CallbackLog::default());
        let device_callbacks = DeviceMemoryCallbacks {
            pfn_allocate: Some(on_allocate),
            pfn_free: Some(on_free),
            user_data: std::ptr::from_ref::<CallbackLog>(&callbacks).cast_mut().cast(),
        };
        let heap_count = context.properties().memory_heaps.len();
        let limits = vec![config.budget_cap_bytes.unwrap_or(vk::WHOLE_SIZE); heap_count];
        let mut create_info = vk_mem::AllocatorCreateInfo::new(context.instance(), context.device(), context.physical_device());
        create_info.preferred_large_heap_block_size = config.block_size_bytes;
        // The target type is vk-mem's private `VmaDeviceMemoryCallbacks`: its size and alignment checked here, the
        // fields by the comment below.
        assert_eq!(pointee_layout(&create_info.device_memory_callbacks), std::alloc::Layout::new::<DeviceMemoryCallbacks>());
        // SAFETY: `DeviceMemoryCallbacks` has the layout of `VmaDeviceMemoryCallbacks` (the target type, inferred:
        // vk-mem does not export it): `repr(C)`, two `Option<extern "C" fn>` (nullable function pointers whose
        // allocator parameter, a `VmaAllocator` pointer, is taken as `*mut c_void`) and a `void*`. The reference
        // lives until `vmaCreateAllocator` has copied it.
        create_info.device_memory_callbacks = Some(unsafe { &*std::ptr::from_ref(&device_callbacks).cast() });
        if config.budget_cap_bytes.is_some() {
            create_info.heap_size_limits = &limits;
        }
        // SAFETY: the instance, device and physical device are the context's, alive for as long as the `Arc` this
        // backend keeps, which outlives the allocator (field order); VMA copies the callbacks and the limits, and the
        // callbacks' user data (the boxed log) lives as long as the allocator.
        let allocator = unsafe { vk_mem::Allocator::new(create_info) }.map_err(|result| failure("vmaCreateAllocator", result))?;
        let has_device_local = context
            .properties()
            .memory_types
            .iter()
            .any(|info| info.property_flags.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL));
        let create_info = vk_mem::AllocationCreateInfo {
            usage: vk_mem::MemoryUsage::Unknown,
            required_flags: if has_device_local {
                vk::MemoryPropertyFlags::DEVICE_LOCAL
            } else {
                vk::MemoryPropertyFlags::empty()
            },
            ..Default::default()
        };
        Ok(Self { allocator, callbacks, _context: Arc::clone(context), config, create_info })
    }

    fn config(&self) -> &ExternalConfig {
        &self.config
    }

    fn allocate(&mut self, book: &mut ExternalBook<vk_mem::Allocation>, request: Request) -> Result<Placed<vk_mem::Allocation>> {
        let requirements =
            vk::MemoryRequirements { size: request.size_bytes(), alignment: request.align_bytes(), memory_type_bits: !0 };
        // SAFETY: valid requirements (size above 0, power-of-two alignment) and create info (no pool, no user data)
        // on a live allocator; the allocation is freed by `free` or `free_all`.
        let result = unsafe { self.allocator.allocate_memory(&requirements, &self.create_info) };
        self.apply_memory_calls(book);
        let inner = match result {
            Ok(inner) => inner,
            Err(vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY) => {
                return Err(Error::OutOfMemory(Box::new(self.verdict(book, request))));
            }
            Err(result) => return Err(failure("vmaAllocateMemory", result)),
        };
        let info = self.allocator.get_allocation_info(&inner);
        let Some(block) = book.block_mut(info.device_memory) else {
            // SAFETY: the allocation was just made by this allocator and is bound to nothing.
            unsafe { self.allocator.free_memory(&mut { inner }) };
            self.apply_memory_calls(book);
            return Err(Error::Source("VMA placed an allocation in memory its callbacks never reported".into()));
        };
        Ok(Placed { live: inner, offset_bytes: info.offset, block_base: block.base_address })
    }

    fn free(&mut self, book: &mut ExternalBook<vk_mem::Allocation>, mut live: vk_mem::Allocation) -> Result<()> {
        // SAFETY: the allocation was live (checked by slot and generation), made by this allocator, bound to nothing.
        unsafe { self.allocator.free_memory(&mut live) };
        self.apply_memory_calls(book);
        Ok(())
    }

    fn free_all(&mut self, book: &mut ExternalBook<vk_mem::Allocation>, live: Vec<vk_mem::Allocation>) {
        // Frees what is still live so VMA destroys its blocks cleanly (it asserts there is nothing left); the
        // allocator frees the empty blocks it kept when dropped.
        for mut inner in live {
            // SAFETY: each allocation is live, made by this allocator, bound to nothing.
            unsafe { self.allocator.free_memory(&mut inner) };
        }
        self.apply_memory_calls(book);
    }
}
