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

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use ash::vk;
use heapscope_core::compaction::{Algorithm, Budget};
use heapscope_core::{Error, OomVerdict, Request, Result};
use vk_mem::Alloc;

use crate::VulkanContext;
use crate::external::{BlockUsage, ExternalBook, ExternalHandle};
use crate::external_heap::{ExternalAllocator, ExternalConfig, ExternalHeap, Placed};
use crate::transfer::{BufferCopy, MemorySpan, Transfer, block_buffer_requirements, buffer_over_memory};

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

/// `VmaDefragmentationInfo`, field for field (VMA 3's C header). vk-mem 0.5's `Allocator::begin_defragmentation` takes
/// that structure but keeps its type in a private module, so heapscope declares the same `repr(C)` layout, checks
/// its size and alignment against the inferred type, and passes it by pointer.
#[repr(C)]
struct DefragmentationInfo {
    /// `VmaDefragmentationFlags`: the algorithm bit (fast 1, balanced 2, full 4).
    flags: u32,
    /// `VmaPool`: null for the default pools.
    pool: *mut c_void,
    /// `maxBytesPerPass` (0: no limit).
    max_bytes_per_pass: u64,
    /// `maxAllocationsPerPass` (0: no limit).
    max_allocations_per_pass: u32,
    /// `pfnBreakCallback`.
    break_callback: Option<unsafe extern "C" fn(*mut c_void) -> u32>,
    /// `pBreakCallbackUserData`.
    break_callback_user_data: *mut c_void,
}

/// The layout of the info `begin` takes (a type that cannot be named: inferred from the function's signature).
fn info_layout<'a, T>(
    _begin: unsafe fn(&'a vk_mem::Allocator, &T) -> ash::prelude::VkResult<vk_mem::DefragmentationContext<'a>>,
) -> std::alloc::Layout {
    std::alloc::Layout::new::<T>()
}

/// A VMA allocation's handle as a number (its `VmaAllocation` pointer), to find it among VMA's proposed moves.
fn raw(allocation: vk_mem::Allocation) -> usize {
    // SAFETY: `vk_mem::Allocation` is a `Copy` wrapper of one `VmaAllocation` pointer (its only field; the sizes are
    // checked by `transmute`); the value is only compared, never dereferenced.
    let pointer: *mut c_void = unsafe { std::mem::transmute::<vk_mem::Allocation, *mut c_void>(allocation) };
    pointer as usize
}

/// A `VmaAllocation` pointer from a proposed move as vk-mem's handle (to ask VMA where it is).
fn from_raw(pointer: *mut c_void) -> vk_mem::Allocation {
    // SAFETY: the inverse of `raw`: a pointer VMA handed out in the pass, wrapped as vk-mem does; valid for the pass.
    unsafe { std::mem::transmute::<*mut c_void, vk_mem::Allocation>(pointer) }
}

/// Tells VMA not to make the proposed move `m`: it frees the temporary place and leaves the allocation where it is.
#[allow(clippy::missing_transmute_annotations, reason = "the target is vk-mem's private enum, inferred from the field")]
fn ignore(m: &mut vk_mem::DefragmentationMove) {
    // SAFETY: 1 is `VMA_DEFRAGMENTATION_MOVE_OPERATION_IGNORE` of the `repr(u32)` enum that is the field's type.
    m.operation = unsafe { std::mem::transmute::<u32, _>(1) };
}

/// The VMA block holding the allocation `info` describes, as memory a buffer can be put over (its size from the books).
fn block_span(book: &ExternalBook<vk_mem::Allocation>, info: &vk_mem::AllocationInfo) -> MemorySpan {
    let size_bytes = book.block(info.device_memory).map_or(0, |block| block.size_bytes);
    MemorySpan { memory: info.device_memory, type_index: info.memory_type, size_bytes, allocation_size_bytes: size_bytes }
}

/// One defragmentation's state across VMA's passes.
struct Pass<'l> {
    transfer: Transfer,
    /// The allocations the caller lets move, by their VMA pointer.
    listed: &'l HashMap<usize, ExternalHandle>,
    /// Those moved so far, with their handle before.
    moved: Vec<(usize, ExternalHandle)>,
    /// The first failure: every later move is ignored.
    failure: Option<Error>,
    /// The device's time for the copies, ns.
    nanos: u64,
}

impl Pass<'_> {
    /// One pass: ignores the moves of allocations not listed (and all of them after a failure), copies the others'
    /// bytes from their place to VMA's temporary one on the device, waited for.
    fn run(
        &mut self,
        allocator: &vk_mem::Allocator,
        book: &mut ExternalBook<vk_mem::Allocation>,
        moves: &mut [vk_mem::DefragmentationMove],
        callbacks: &CallbackLog,
    ) {
        // Blocks VMA made for the pass's destinations.
        for (allocated, memory, size_bytes) in callbacks.take() {
            if allocated {
                book.reserve_block(memory, size_bytes);
            } else {
                book.release_block(memory);
            }
        }
        let mut copies: Vec<(vk_mem::AllocationInfo, vk_mem::AllocationInfo)> = Vec::new();
        let mut moving = Vec::new();
        for m in moves.iter_mut() {
            let key = m.srcAllocation as usize;
            match self.listed.get(&key) {
                Some(handle) if self.failure.is_none() => {
                    let from = allocator.get_allocation_info(&from_raw(m.srcAllocation.cast()));
                    let to = allocator.get_allocation_info(&from_raw(m.dstTmpAllocation.cast()));
                    copies.push((from, to));
                    moving.push((key, *handle));
                }
                _ => ignore(m),
            }
        }
        let started = std::time::Instant::now();
        match self.copy(book, &copies) {
            Ok(()) => self.moved.extend(moving),
            Err(error) => {
                moves.iter_mut().for_each(ignore);
                self.failure = Some(error);
            }
        }
        self.nanos += u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    }

    /// Copies each `(from, to)` on the device through a buffer over each block involved (destroyed after).
    fn copy(
        &mut self,
        book: &ExternalBook<vk_mem::Allocation>,
        copies: &[(vk_mem::AllocationInfo, vk_mem::AllocationInfo)],
    ) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        let context = Arc::clone(book.context());
        let mut buffers: HashMap<vk::DeviceMemory, vk::Buffer> = HashMap::new();
        let mut made = Ok(());
        for (from, to) in copies {
            for info in [from, to] {
                if buffers.contains_key(&info.device_memory) || made.is_err() {
                    continue;
                }
                let span = block_span(book, info);
                match buffer_over_memory(&context, span, || "a VMA block".to_owned()) {
                    Ok(buffer) => {
                        buffers.insert(info.device_memory, buffer);
                    }
                    Err(error) => made = Err(error),
                }
            }
        }
        let copied = made.and_then(|()| {
            let recorded: Vec<BufferCopy> = copies
                .iter()
                .map(|(from, to)| BufferCopy {
                    source: buffers[&from.device_memory],
                    source_offset: from.offset,
                    destination: buffers[&to.device_memory],
                    destination_offset: to.offset,
                    size_bytes: from.size,
                })
                .collect();
            // SAFETY: each buffer is over a live VMA block (VMA frees none during a pass), with transfer usages; each
            // range is an allocation VMA placed inside its block; a destination is a place VMA reserved for the pass,
            // overlapping no live allocation, so no copy reads what another writes.
            unsafe { self.transfer.copy_in_order(&recorded) }
        });
        for buffer in buffers.into_values() {
            // SAFETY: made above for these copies, which were waited for (or never submitted).
            unsafe { context.device().destroy_buffer(buffer, None) };
        }
        copied.map_err(|error| Error::Source(format!("copying VMA's defragmentation moves: {error}")))
    }
}

/// What talks to VMA in a [`VmaHeap`]: the allocator, its device-memory callbacks' log and the allocation settings.
pub struct VmaBackend {
    // Declared first: dropped (its blocks freed) while the callback log and the device are alive.
    allocator: vk_mem::Allocator,
    callbacks: Box<CallbackLog>,
    context: Arc<VulkanContext>,
    config: VmaConfig,
    create_info: vk_mem::AllocationCreateInfo,
    /// Copies of defragmentation's moves (made at the first compaction).
    transfer: Option<Transfer>,
    /// The device's time for those copies so far, ns.
    copy_nanos: u64,
    /// The memory types a block's buffer may use ([`block_buffer_requirements`]): VMA allocates among them only, so a
    /// buffer can be laid over any of its blocks (defragmentation's copies, `read`, `write`).
    type_bits: u32,
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
    /// Writes `bytes` at the start of the live allocation `handle` on the device (a staging copy, waited for): with
    /// [`VmaHeap::read`], how a test proves that defragmentation kept an allocation's bytes.
    ///
    /// # Errors
    /// [`Error::DoubleFree`] or [`Error::ForeignAllocation`] for a handle not live here; [`Error::Source`] when the
    /// bytes do not fit the allocation or the device fails.
    pub fn write(&mut self, handle: &ExternalHandle, bytes: &[u8]) -> Result<()> {
        let mut bytes = bytes.to_vec();
        self.transfer_bytes(handle, &mut bytes, true)
    }

    /// The first `len` bytes of the live allocation `handle`, read back from the device.
    ///
    /// # Errors
    /// As [`VmaHeap::write`].
    pub fn read(&mut self, handle: &ExternalHandle, len: usize) -> Result<Vec<u8>> {
        let mut bytes = vec![0; len];
        self.transfer_bytes(handle, &mut bytes, false)?;
        Ok(bytes)
    }

    fn transfer_bytes(&mut self, handle: &ExternalHandle, bytes: &mut [u8], write: bool) -> Result<()> {
        let (backend, book) = self.parts();
        let inner = *book.live(handle.allocation()).ok_or_else(|| Error::DoubleFree {
            offset: handle.allocation().offset(),
            id: handle.allocation().id().0,
            owner: "vma",
        })?;
        if bytes.len() as u64 > handle.allocation().size_bytes() {
            return Err(Error::Source(format!(
                "{} bytes do not fit an allocation of {}",
                bytes.len(),
                handle.allocation().size_bytes()
            )));
        }
        let info = backend.allocator.get_allocation_info(&inner);
        let span = block_span(book, &info);
        let device_error = |error: crate::VulkanError| Error::Source(error.to_string());
        let buffer = buffer_over_memory(book.context(), span, || "a VMA block".to_owned()).map_err(device_error)?;
        let transfer = match &mut backend.transfer {
            Some(transfer) => Ok(transfer),
            slot => Transfer::new(Arc::clone(&backend.context), 1 << 20).map(|transfer| slot.insert(transfer)),
        };
        // For both copies: the buffer covers the allocation's block with transfer usages; the range is inside the live
        // allocation (checked above); the heap is borrowed mutably, so nothing else uses it until the copy returns.
        let done = transfer.and_then(|transfer| {
            if write {
                // SAFETY: as said above.
                unsafe { transfer.upload(buffer, info.offset, bytes) }
            } else {
                // SAFETY: as said above.
                unsafe { transfer.download(buffer, info.offset, bytes) }
            }
        });
        // SAFETY: made above; the copy was waited for (or never submitted).
        unsafe { book.context().device().destroy_buffer(buffer, None) };
        done.map_err(device_error)
    }

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
        book.verdict(request, usage, self.config.budget_cap_bytes, None)
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
        let type_bits = block_buffer_requirements(context)
            .map(|requirements| requirements.memory_type_bits)
            .map_err(|error| Error::Source(error.to_string()))?;
        Ok(Self {
            allocator,
            callbacks,
            context: Arc::clone(context),
            config,
            create_info,
            transfer: None,
            copy_nanos: 0,
            type_bits,
        })
    }

    fn config(&self) -> &ExternalConfig {
        &self.config
    }

    fn allocate(&mut self, book: &mut ExternalBook<vk_mem::Allocation>, request: Request) -> Result<Placed<vk_mem::Allocation>> {
        let requirements = vk::MemoryRequirements {
            size: request.size_bytes(),
            alignment: request.align_bytes(),
            memory_type_bits: self.type_bits,
        };
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

    const DEFRAGMENTS: bool = true;

    /// VMA's defragmentation (`vmaBeginDefragmentation`, passes until VMA has nothing more to move,
    /// `vmaEndDefragmentation`): in each pass VMA proposes moves into temporary allocations; those of allocations not
    /// listed are set to `IGNORE`, the others' bytes are copied on the device (`vkCmdCopyBuffer` through buffers over
    /// VMA's blocks, waited for) before the pass ends and VMA points each moved allocation at its new place and frees
    /// the blocks it emptied.
    fn compact(
        &mut self,
        book: &mut ExternalBook<vk_mem::Allocation>,
        movable: &[ExternalHandle],
        algorithm: Algorithm,
        budget: Budget,
    ) -> Result<Vec<(ExternalHandle, ExternalHandle)>> {
        let listed: HashMap<usize, ExternalHandle> =
            movable.iter().filter_map(|handle| Some((raw(*book.live(handle.allocation())?), *handle))).collect();
        if listed.is_empty() {
            return Ok(Vec::new());
        }
        let info = DefragmentationInfo {
            flags: match algorithm {
                Algorithm::Fast => 0x1,
                Algorithm::Balanced => 0x2,
                Algorithm::Full => 0x4,
            },
            pool: std::ptr::null_mut(),
            max_bytes_per_pass: if budget.max_bytes == u64::MAX { 0 } else { budget.max_bytes.max(1) },
            max_allocations_per_pass: u32::try_from(budget.max_moves).map_or(0, |moves| moves.max(1)),
            break_callback: None,
            break_callback_user_data: std::ptr::null_mut(),
        };
        if info_layout(vk_mem::Allocator::begin_defragmentation) != std::alloc::Layout::new::<DefragmentationInfo>() {
            return Err(Error::Source("VMA's defragmentation info has another layout than VMA 3's".into()));
        }
        let transfer = match self.transfer.take() {
            Some(transfer) => transfer,
            None => Transfer::new(Arc::clone(&self.context), 4096).map_err(|error| Error::Source(error.to_string()))?,
        };
        let mut pass = Pass { transfer, listed: &listed, moved: Vec::new(), failure: None, nanos: 0 };
        {
            // SAFETY: `DefragmentationInfo` has the layout of `VmaDefragmentationInfo` (checked above: the target type,
            // inferred, is vk-mem's private one): `repr(C)` flags, a null pool (the default pools), the two per-pass
            // limits (0: none), a null break callback and its null user data. VMA reads it during the call.
            let context = unsafe { self.allocator.begin_defragmentation(&*std::ptr::from_ref(&info).cast()) }
                .map_err(|result| failure("vmaBeginDefragmentation", result))?;
            while context.begin_pass(|moves| pass.run(&self.allocator, book, moves, &self.callbacks)) {}
            context.end();
        }
        self.apply_memory_calls(book);
        self.transfer = Some(pass.transfer);
        self.copy_nanos += pass.nanos;
        if let Some(error) = pass.failure {
            return Err(error);
        }
        // Each moved allocation, now where VMA put it: a new handle in the same slot.
        let mut moves = Vec::with_capacity(pass.moved.len());
        for (key, from) in pass.moved {
            let Some(inner) = book.live(from.allocation()).copied() else { continue };
            debug_assert_eq!(raw(inner), key);
            let info = self.allocator.get_allocation_info(&inner);
            let Some(block_base) = book.block(info.device_memory).map(|block| block.base_address) else {
                return Err(Error::Source("VMA moved an allocation to memory its callbacks never reported".into()));
            };
            let allocation = book.relocate(from.allocation(), info.offset)?;
            moves.push((from, ExternalHandle::new(allocation, block_base)));
        }
        Ok(moves)
    }

    fn copy_nanos(&self) -> u64 {
        self.copy_nanos
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
