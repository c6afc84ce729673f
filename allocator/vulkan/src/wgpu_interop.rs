//! wgpu on heapscope's own Vulkan device (feature `wgpu`): [`WgpuVulkan`], [`WgpuBlockBuffer`], [`WgpuPagedHeap`].
//!
//! - **The device.** [`WgpuVulkan::new`] brings up a [`VulkanContext`] whose instance has wgpu-hal's desired
//!   extensions and whose device has wgpu-hal's required extensions and features (for no optional wgpu feature)
//!   *plus* heapscope's: the sparse features, `timelineSemaphore`, `VK_EXT_memory_budget`. wgpu-hal is then handed
//!   the raw instance (`vulkan::Instance::from_raw`) and device (`Adapter::device_from_raw`, on the compute
//!   queue), and wgpu wraps them (`Instance::from_hal`, `create_adapter_from_hal`, `create_device_from_hal`).
//! - **Lifetimes.** heapscope owns the `VkInstance` and the `VkDevice`: wgpu-hal gets them with drop callbacks
//!   (so it destroys neither) that each hold an `Arc` of the context. The context, and so the device, goes when
//!   the last of heapscope's and wgpu's handles does, after wgpu-hal has destroyed its own objects.
//! - **The queue.** wgpu-hal submits and presents on the context's compute queue, which may also be the
//!   sparse-binding queue (lavapipe has one queue). Vulkan wants every use of a queue externally synchronised:
//!   heapscope's submissions take [`VulkanContext::lock_queues`], and wgpu-hal is handed an instance and a device
//!   whose queue entry points take the same lock (`queue_guard`). So any holder of the `wgpu::Queue` — egui-wgpu
//!   rendering and presenting a frame, a test thread — may submit at any time, with no lock of its own; a wgpu
//!   call must not be made while holding [`VulkanContext::lock_queues`] (the lock is not re-entrant).
//! - **Buffers.** A [`WgpuBlockBuffer`] is a `DeviceMemorySource` block's `VkBuffer` ([`BlockBuffer`]) and a
//!   [`WgpuPagedHeap`] a [`DevicePagedHeap`]'s sparse `VkBuffer`, each wrapped as a `wgpu::Buffer`
//!   (`vulkan::Buffer::from_raw_externally_owned` + `Device::create_buffer_from_hal`): wgpu never destroys them.
//!   On drop the `wgpu::Buffer` is destroyed first (wgpu refuses any further use of a clone), wgpu's work is
//!   waited for, then heapscope destroys the `VkBuffer`.
//!   A [`WgpuSegmentBuffer`] is a [`PytorchDeviceHeap`] segment's `VkBuffer` (a dedicated block's, or an expandable
//!   segment's sparse buffer) wrapped the same way; it borrows the heap, so no segment is released and no page
//!   unbound while it lives.
//! - **Ordering.** Sparse binds are `vkQueueBindSparse` batches ordered by the sparse buffer's timeline
//!   semaphore. After [`WgpuPagedHeap::allocate`] binds pages, the next wgpu submission waits for the last bind's
//!   timeline value (`vulkan::Queue::add_wait_semaphore`), so no wgpu work sees a page before it is bound. Before
//!   [`WgpuPagedHeap::free`] may unbind pages, it waits until every wgpu submission has completed, so no unbind
//!   overtakes work that still uses its pages.

use std::ffi::CStr;
use std::fmt;
use std::sync::Arc;

use ash::vk;
use heapscope_core::{Allocation, Request};
use wgpu::hal;
use wgpu::hal::api::Vulkan;

use heapscope_pytorch::CachingAllocation;

use crate::compute::BlockBuffer;
use crate::context::{DeviceHook, DeviceRequest};
use crate::{
    ContextOptions, DeviceMemorySource, DevicePagedConfig, DevicePagedHeap, PytorchDeviceHeap, VulkanContext, VulkanError,
};

/// The usage every wrapped buffer has in wgpu: what [`crate::BLOCK_BUFFER_USAGE`] gives it in Vulkan.
pub const WGPU_BUFFER_USAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

/// The wgpu features interop asks for: none (the kernels need none), so wgpu-hal's required extensions are those
/// of its base feature set.
const FEATURES: wgpu::Features = wgpu::Features::empty();

fn hal_error(what: &str, error: impl fmt::Display) -> VulkanError {
    VulkanError::Unsupported(format!("wgpu-hal: {what}: {error}"))
}

/// A non-owning wgpu-hal instance over the context's instance; `keep` is held until wgpu-hal drops it.
///
/// # Safety
/// `instance` must have been created from `entry` with Vulkan 1.3 asked for and `extensions` enabled, a superset
/// of wgpu-hal's `desired_extensions`, and stay alive while the returned instance (or anything made from it)
/// lives: `keep` is what guarantees it.
unsafe fn hal_instance(
    entry: &ash::Entry,
    instance: &ash::Instance,
    extensions: &[&'static CStr],
    keep: Option<Arc<VulkanContext>>,
) -> Result<hal::vulkan::Instance, VulkanError> {
    let on_drop: hal::DropCallback = Box::new(move || drop(keep));
    // SAFETY: the caller's contract; the drop callback keeps wgpu-hal from destroying the instance, and no debug
    // messenger is asked of wgpu-hal (heapscope's own records validation messages).
    unsafe {
        hal::vulkan::Instance::from_raw(
            entry.clone(),
            instance.clone(),
            vk::API_VERSION_1_3,
            0,
            None,
            extensions.to_vec(),
            wgpu::InstanceFlags::empty(),
            wgpu::MemoryBudgetThresholds::default(),
            false,
            Some(on_drop),
        )
    }
    .map_err(|error| hal_error("Instance::from_raw", error))
}

/// Creates the device with wgpu-hal's extensions and features plus heapscope's.
#[derive(Debug, Default)]
struct WgpuHook;

impl DeviceHook for WgpuHook {
    fn instance_extensions(&mut self, entry: &ash::Entry) -> Result<Vec<&'static CStr>, VulkanError> {
        hal::vulkan::Instance::desired_extensions(entry, vk::API_VERSION_1_3, wgpu::InstanceFlags::empty())
            .map_err(|error| hal_error("desired instance extensions", error))
    }

    fn create_device(
        &mut self,
        entry: &ash::Entry,
        instance: &ash::Instance,
        instance_extensions: &[&'static CStr],
        physical_device: vk::PhysicalDevice,
        request: &DeviceRequest<'_>,
    ) -> Result<(ash::Device, Vec<&'static CStr>), VulkanError> {
        // SAFETY: the instance was created from `entry` by `create_instance` with Vulkan 1.3 and these extensions
        // (wgpu-hal's desired ones among them, added by `instance_extensions`); the hal instance is dropped at the
        // end of this function, while the instance lives.
        let hal = unsafe { hal_instance(entry, instance, instance_extensions, None) }?;
        let exposed = hal
            .expose_adapter(physical_device)
            .ok_or_else(|| VulkanError::Unsupported("wgpu-hal does not expose this device (Vulkan 1.1 needed)".into()))?;
        let adapter = &exposed.adapter;
        let mut extensions = adapter.required_device_extensions(FEATURES);
        for &extension in request.extensions {
            if !extensions.contains(&extension) {
                extensions.push(extension);
            }
        }
        let mut features = adapter.physical_device_features(&extensions, FEATURES);
        // wgpu-hal's core features, plus heapscope's sparse bits.
        let hal_core = features.get_core();
        let wanted = request.core_features;
        let core = hal_core
            .sparse_binding(hal_core.sparse_binding == vk::TRUE || wanted.sparse_binding == vk::TRUE)
            .sparse_residency_buffer(hal_core.sparse_residency_buffer == vk::TRUE || wanted.sparse_residency_buffer == vk::TRUE)
            .sparse_residency_aliased(
                hal_core.sparse_residency_aliased == vk::TRUE || wanted.sparse_residency_aliased == vk::TRUE,
            );
        let names: Vec<*const std::ffi::c_char> = extensions.iter().map(|name| name.as_ptr()).collect();
        let info = vk::DeviceCreateInfo::default().queue_create_infos(request.queue_infos).enabled_extension_names(&names);
        // wgpu-hal chains its feature structures (timeline semaphores among them, where the device has them) and
        // sets its core features; heapscope's core set replaces them, a superset.
        let info = features.add_to_device_create(info).enabled_features(&core);
        // SAFETY: the physical device belongs to the instance; the extensions are wgpu-hal's required ones (each
        // supported: `required_device_extensions` keeps only those) and heapscope's (reported supported by the
        // context); the features are wgpu-hal's for them plus sparse bits the context found supported; every
        // pointer in `info` outlives the call.
        let device =
            unsafe { instance.create_device(physical_device, &info, None) }.map_err(VulkanError::vk("vkCreateDevice"))?;
        Ok((device, extensions))
    }
}

/// wgpu on heapscope's Vulkan device: the context and wgpu's instance, adapter, device and queue over it. See the
/// module documentation.
pub struct WgpuVulkan {
    // wgpu's handles first: they go before the context's last `Arc` held here.
    queue: wgpu::Queue,
    device: wgpu::Device,
    adapter: wgpu::Adapter,
    instance: wgpu::Instance,
    context: Arc<VulkanContext>,
}

impl fmt::Debug for WgpuVulkan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuVulkan").field("context", &self.context).finish_non_exhaustive()
    }
}

impl WgpuVulkan {
    /// A context for `options` whose device wgpu can use (see the module documentation), and wgpu over it.
    ///
    /// # Errors
    /// What [`VulkanContext::new`] returns; [`VulkanError::Unsupported`] when wgpu-hal refuses the instance or the
    /// device, or when the device lacks what wgpu needs.
    pub fn new(options: &ContextOptions) -> Result<Self, VulkanError> {
        let context = Arc::new(VulkanContext::create(options, Some(&mut WgpuHook))?);
        Self::from_context(context)
    }

    /// wgpu over a context made for it by [`WgpuVulkan::new`] (another `WgpuVulkan` may share it).
    ///
    /// # Errors
    /// [`VulkanError::InvalidArgument`] for a context not made for wgpu (its device lacks wgpu-hal's extensions);
    /// [`VulkanError::Unsupported`] when wgpu-hal refuses it.
    pub fn from_context(context: Arc<VulkanContext>) -> Result<Self, VulkanError> {
        if !context.is_prepared_for_wgpu() {
            return Err(VulkanError::InvalidArgument(
                "the context was not created for wgpu (use WgpuVulkan::new): its device lacks wgpu-hal's extensions".into(),
            ));
        }
        let mut queues = vec![context.compute_queue().1];
        queues.extend(context.sparse_queue().map(|(_, queue)| queue).filter(|queue| !queues.contains(queue)));
        let queues = crate::queue_guard::Queues {
            instance: context.instance(),
            device: context.device(),
            queues,
            lock: context.queue_lock(),
        };
        // SAFETY: wgpu-hal's drop callbacks below hold the context, so it outlives every use of these handles.
        let (guarded_instance, guarded_device) = unsafe { crate::queue_guard::guarded(queues) };
        // SAFETY: the context's instance (the handle of `guarded_instance`) was created by `create_instance` with
        // Vulkan 1.3 and wgpu-hal's desired extensions (the context is prepared for wgpu); the `Arc` the callback
        // holds keeps it alive as long as wgpu-hal's instance.
        let hal = unsafe {
            hal_instance(context.entry(), &guarded_instance, context.instance_extensions(), Some(Arc::clone(&context)))
        }?;
        let exposed = hal
            .expose_adapter(context.physical_device())
            .ok_or_else(|| VulkanError::Unsupported("wgpu-hal does not expose this device".into()))?;
        let limits = exposed.capabilities.limits.clone();
        // SAFETY: a valid wgpu-hal Vulkan instance; wgpu takes it over (and drops it, which runs the callback).
        let instance = unsafe { wgpu::Instance::from_hal::<Vulkan>(hal) };
        // SAFETY: the adapter was exposed by the hal instance `instance` now owns.
        let adapter = unsafe { instance.create_adapter_from_hal(exposed) };
        let (family, _) = context.compute_queue();
        let keep = Arc::clone(&context);
        let on_drop: hal::DropCallback = Box::new(move || drop(keep));
        // SAFETY: the adapter is a wgpu-hal Vulkan adapter (made above).
        let hal_adapter = unsafe { adapter.as_hal::<Vulkan>() }
            .ok_or_else(|| VulkanError::Unsupported("the wgpu adapter is not a Vulkan one".into()))?;
        // SAFETY: the device was created from this physical device by `WgpuHook::create_device` with one queue of
        // the compute family, wgpu-hal's required extensions for `FEATURES` (and more), and its
        // `physical_device_features` for them (and more); the drop callback keeps wgpu-hal from destroying it and
        // holds the context, so the device lives as long as wgpu-hal's. `guarded_device` is that device with its
        // queue entry points taking the context's queue lock.
        let open = unsafe {
            hal_adapter.device_from_raw(
                guarded_device,
                Some(on_drop),
                context.device_extensions(),
                FEATURES,
                &limits,
                &wgpu::MemoryHints::Performance,
                family,
                0,
            )
        }
        .map_err(|error| hal_error("Adapter::device_from_raw", error))?;
        drop(hal_adapter);
        let descriptor = wgpu::DeviceDescriptor {
            label: Some("heapscope"),
            required_features: FEATURES,
            required_limits: limits,
            ..Default::default()
        };
        // SAFETY: the hal device was opened from this adapter's hal adapter, with exactly `FEATURES`.
        let (device, queue) = unsafe { adapter.create_device_from_hal(open, &descriptor) }
            .map_err(|error| hal_error("create_device_from_hal", error))?;
        Ok(Self { queue, device, adapter, instance, context })
    }

    /// The Vulkan context.
    pub fn context(&self) -> &Arc<VulkanContext> {
        &self.context
    }

    /// wgpu's instance.
    pub fn instance(&self) -> &wgpu::Instance {
        &self.instance
    }

    /// wgpu's adapter (the context's physical device).
    pub fn adapter(&self) -> &wgpu::Adapter {
        &self.adapter
    }

    /// wgpu's device (the context's device).
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// wgpu's queue (the context's compute queue).
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// Waits until every wgpu submission so far has completed.
    ///
    /// # Errors
    /// [`VulkanError::Unsupported`] with wgpu's message when the wait fails (device lost).
    pub fn wait_idle(&self) -> Result<(), VulkanError> {
        self.device.poll(wgpu::PollType::wait_indefinitely()).map(drop).map_err(|error| hal_error("poll", error))
    }

    /// Makes the next wgpu submission wait on the device until `semaphore` (a timeline semaphore of this device)
    /// reaches `value`; a wait staged earlier on the same semaphore is replaced.
    fn wait_before_next_submit(&self, semaphore: vk::Semaphore, value: u64) -> Result<(), VulkanError> {
        // SAFETY: the queue is a wgpu-hal Vulkan queue (made in `from_context`); the guard is dropped at the end
        // of this function and nothing is destroyed through it.
        let queue = unsafe { self.queue.as_hal::<Vulkan>() }
            .ok_or_else(|| VulkanError::Unsupported("the wgpu queue is not a Vulkan one".into()))?;
        queue.remove_wait_semaphore(semaphore);
        queue.add_wait_semaphore(semaphore, Some(value), vk::PipelineStageFlags::ALL_COMMANDS);
        Ok(())
    }

    /// `buffer` (of the context's device, `size_bytes` long, [`crate::BLOCK_BUFFER_USAGE`], bound to memory) as a
    /// `wgpu::Buffer` that wgpu never destroys.
    ///
    /// # Safety
    /// The buffer must stay alive, bound to live memory, until the returned buffer is destroyed
    /// (`wgpu::Buffer::destroy`) and every wgpu submission that used it has completed.
    unsafe fn wrap(&self, buffer: vk::Buffer, size_bytes: u64, label: &str) -> wgpu::Buffer {
        // SAFETY: the caller's contract; the callback does nothing: heapscope destroys the buffer itself.
        let hal_buffer = unsafe { hal::vulkan::Buffer::from_raw_externally_owned(buffer, Box::new(|| {})) };
        let descriptor =
            wgpu::BufferDescriptor { label: Some(label), size: size_bytes, usage: WGPU_BUFFER_USAGE, mapped_at_creation: false };
        // SAFETY: the buffer is of this device (the caller's contract), created with storage and transfer usage
        // both ways (the descriptor's), `size_bytes` long (not zero: heapscope makes no empty buffers), and its
        // memory is bound (initialised as far as wgpu is concerned: wgpu never clears or maps it).
        unsafe { self.device.create_buffer_from_hal::<Vulkan>(hal_buffer, &descriptor) }
    }

    /// Destroys a wrapped buffer in wgpu and waits until no wgpu work uses it.
    fn unwrap_buffer(&self, buffer: &wgpu::Buffer) {
        buffer.destroy();
        // A lost device cannot be waited on; the buffer is not used by wgpu any more either way.
        let _ = self.wait_idle();
    }
}

/// A [`DeviceMemorySource`] block's `VkBuffer` as a `wgpu::Buffer` (see the module documentation): it borrows the
/// source, so the block cannot be freed while it lives.
pub struct WgpuBlockBuffer<'a> {
    wgpu: &'a WgpuVulkan,
    buffer: wgpu::Buffer,
    _block: BlockBuffer<'a>,
}

impl fmt::Debug for WgpuBlockBuffer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuBlockBuffer").field("size_bytes", &self.buffer.size()).finish_non_exhaustive()
    }
}

impl<'a> WgpuBlockBuffer<'a> {
    /// Block `handle` of `source` as a wgpu buffer of `wgpu`'s device.
    ///
    /// # Errors
    /// [`VulkanError::InvalidArgument`] when the source is of another context than `wgpu`'s; what
    /// [`BlockBuffer::new`] returns.
    pub fn new(wgpu: &'a WgpuVulkan, source: &'a DeviceMemorySource, handle: u64) -> Result<Self, VulkanError> {
        if !Arc::ptr_eq(source.context(), &wgpu.context) {
            return Err(VulkanError::InvalidArgument("the memory source belongs to another context than wgpu's".into()));
        }
        let block = BlockBuffer::new(source, handle)?;
        let compute = block.as_compute();
        // SAFETY: the buffer is of wgpu's device (same context), made with BLOCK_BUFFER_USAGE over the whole
        // block, memory bound; `self` keeps it (and, by the borrow, the block's memory) alive until `drop`, which
        // destroys the wgpu buffer and waits for wgpu's work before the `BlockBuffer` goes.
        let buffer = unsafe { wgpu.wrap(compute.buffer(), block.size_bytes(), "heapscope device-memory block") };
        Ok(Self { wgpu, buffer, _block: block })
    }

    /// The buffer, for wgpu.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

impl Drop for WgpuBlockBuffer<'_> {
    fn drop(&mut self) {
        self.wgpu.unwrap_buffer(&self.buffer);
    }
}

/// The segment of a [`PytorchDeviceHeap`] allocation — a dedicated block's `VkBuffer`, or an expandable segment's
/// sparse buffer — as a `wgpu::Buffer` (see the module documentation). The allocation's bytes are at
/// `CachingAllocation::offset` in it. It borrows the heap, so the segment cannot be released, nor a page of it
/// unbound, while it lives; wait for the heap's binds ([`PytorchDeviceHeap::wait_binds`]) before wgpu's kernels
/// read pages bound since.
pub struct WgpuSegmentBuffer<'a> {
    wgpu: &'a WgpuVulkan,
    buffer: wgpu::Buffer,
    _heap: std::marker::PhantomData<&'a PytorchDeviceHeap>,
}

impl fmt::Debug for WgpuSegmentBuffer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuSegmentBuffer").field("size_bytes", &self.buffer.size()).finish_non_exhaustive()
    }
}

impl<'a> WgpuSegmentBuffer<'a> {
    /// The segment holding `allocation` (an allocation of `heap`) as a wgpu buffer of `wgpu`'s device.
    ///
    /// # Errors
    /// [`VulkanError::InvalidArgument`] when the heap is on another context than `wgpu`'s, or `allocation` is not
    /// a live allocation of it with device memory behind it.
    pub fn new(wgpu: &'a WgpuVulkan, heap: &'a PytorchDeviceHeap, allocation: &CachingAllocation) -> Result<Self, VulkanError> {
        if !Arc::ptr_eq(heap.context(), &wgpu.context) {
            return Err(VulkanError::InvalidArgument("the PyTorch heap belongs to another context than wgpu's".into()));
        }
        let (segment, _) = heap.compute_target(allocation).ok_or_else(|| {
            VulkanError::InvalidArgument(format!(
                "no segment with device memory holds the allocation at {:#x}",
                allocation.address()
            ))
        })?;
        // SAFETY: the buffer is of wgpu's device (same context), made with BLOCK_BUFFER_USAGE (a dedicated block's
        // buffer, bound to its memory, or a sparse buffer, whose unbound pages may be used: reads give zero or
        // undefined values, never a fault), `size_bytes()` long; `self` borrows the heap, which releases a segment
        // or unbinds pages only through `&mut` methods, and `drop` destroys the wgpu buffer and waits for wgpu's
        // work before that borrow ends.
        let buffer = unsafe { wgpu.wrap(segment.buffer(), segment.size_bytes(), "heapscope PyTorch segment") };
        Ok(Self { wgpu, buffer, _heap: std::marker::PhantomData })
    }

    /// The buffer, for wgpu.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

impl Drop for WgpuSegmentBuffer<'_> {
    fn drop(&mut self) {
        self.wgpu.unwrap_buffer(&self.buffer);
    }
}

/// A [`DevicePagedHeap`] whose sparse buffer is a `wgpu::Buffer`, with binds ordered before wgpu's submissions
/// and unbinds after them (see the module documentation).
pub struct WgpuPagedHeap<'a> {
    wgpu: &'a WgpuVulkan,
    buffer: wgpu::Buffer,
    paged: DevicePagedHeap,
    /// The timeline value the next wgpu submission was last told to wait for.
    staged_value: u64,
}

impl fmt::Debug for WgpuPagedHeap<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuPagedHeap").field("paged", &self.paged).finish_non_exhaustive()
    }
}

impl<'a> WgpuPagedHeap<'a> {
    /// A paged heap on `wgpu`'s context (see [`DevicePagedHeap::new`]), its sparse buffer wrapped for wgpu.
    ///
    /// # Errors
    /// What [`DevicePagedHeap::new`] returns.
    pub fn new(wgpu: &'a WgpuVulkan, config: DevicePagedConfig) -> Result<Self, VulkanError> {
        let paged = DevicePagedHeap::new(Arc::clone(&wgpu.context), config)?;
        let size_bytes = paged.sparse().size_bytes();
        // SAFETY: the sparse buffer is of wgpu's device, made with BLOCK_BUFFER_USAGE, `size_bytes` long; sparse
        // residency lets unbound pages be used (reads give zero or undefined values, never a fault); `self` owns
        // the paged heap and destroys the wgpu buffer and waits for wgpu's work before it goes (`drop`).
        let buffer = unsafe { wgpu.wrap(paged.buffer(), size_bytes, "heapscope sparse buffer") };
        Ok(Self { wgpu, buffer, paged, staged_value: 0 })
    }

    /// The sparse buffer, for wgpu.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// The paged heap (its stats, page size, sparse buffer).
    pub fn paged(&self) -> &DevicePagedHeap {
        &self.paged
    }

    /// Places `request` and binds the pages it needs; the next wgpu submission waits for the binds on the device.
    ///
    /// # Errors
    /// What [`DevicePagedHeap::allocate`] returns.
    pub fn allocate(&mut self, request: Request) -> Result<Allocation, VulkanError> {
        let allocation = self.paged.allocate(request)?;
        self.order_binds()?;
        Ok(allocation)
    }

    /// Frees `allocation`; pages left wholly free are unbound once every wgpu submission has completed.
    ///
    /// # Errors
    /// What [`DevicePagedHeap::free`] returns; a failed wait.
    pub fn free(&mut self, allocation: Allocation) -> Result<(), VulkanError> {
        self.wgpu.wait_idle()?;
        self.paged.free(allocation)?;
        self.order_binds()
    }

    /// Compacts `movable` by remapping their pages (nothing copied), once every wgpu submission that may use the old
    /// places has completed; the next wgpu submission waits for the binds. Returns each moved allocation's index in
    /// `movable` and where it is now ([`heapscope_core::DeviceHeap::compact`]).
    ///
    /// # Errors
    /// What the paged heap's compaction returns; a failed wait.
    pub fn compact(
        &mut self,
        movable: &[(Allocation, Request)],
        algorithm: heapscope_core::compaction::Algorithm,
        budget: heapscope_core::compaction::Budget,
    ) -> Result<Vec<(usize, Allocation)>, VulkanError> {
        self.wgpu.wait_idle()?;
        let moved =
            heapscope_core::DeviceHeap::compact(&mut self.paged, movable, algorithm, budget).map_err(VulkanError::Heap)?;
        self.order_binds()?;
        Ok(moved)
    }

    /// Stages a wait for the last bind batch on wgpu's next submission, when there is a new one.
    fn order_binds(&mut self) -> Result<(), VulkanError> {
        let (semaphore, value) = self.paged.sparse().timeline();
        if value > self.staged_value {
            self.wgpu.wait_before_next_submit(semaphore, value)?;
            self.staged_value = value;
        }
        Ok(())
    }
}

impl Drop for WgpuPagedHeap<'_> {
    fn drop(&mut self) {
        // A wait staged and not yet consumed would name the sparse buffer's semaphore after it is destroyed: it goes
        // first, so no submission can take it after the wait for wgpu's work below (one that did would still be
        // pending when the semaphore goes, on a device whose sparse queue is not wgpu's).
        let (semaphore, _) = self.paged.sparse().timeline();
        // SAFETY: the queue is a wgpu-hal Vulkan queue; the guard only lives for this statement.
        if let Some(queue) = unsafe { self.wgpu.queue.as_hal::<Vulkan>() } {
            queue.remove_wait_semaphore(semaphore);
        }
        self.wgpu.unwrap_buffer(&self.buffer);
    }
}
