//! [`Transfer`]: a host-visible staging buffer and one-time command buffers on the compute queue, to write
//! bytes into and read bytes out of device buffers (`vkCmdCopyBuffer`), waiting for each copy on the host.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;

use crate::memory_types::{BLOCK_BUFFER_USAGE, MemoryUsage};
use crate::{VulkanContext, VulkanError};

/// Where the writes of a submission's last command go, in the barrier that ends it: to the host, which reads them through
/// a mapping once the fence is waited for, and to the copies and dispatches of later submissions on the compute queue
/// (a fence wait between two submissions makes only host writes visible to the device).
pub(crate) const AFTER_SUBMISSION_STAGES: vk::PipelineStageFlags = vk::PipelineStageFlags::from_raw(
    vk::PipelineStageFlags::HOST.as_raw()
        | vk::PipelineStageFlags::TRANSFER.as_raw()
        | vk::PipelineStageFlags::COMPUTE_SHADER.as_raw(),
);

/// The accesses of [`AFTER_SUBMISSION_STAGES`].
pub(crate) const AFTER_SUBMISSION_ACCESS: vk::AccessFlags = vk::AccessFlags::from_raw(
    vk::AccessFlags::HOST_READ.as_raw()
        | vk::AccessFlags::TRANSFER_READ.as_raw()
        | vk::AccessFlags::TRANSFER_WRITE.as_raw()
        | vk::AccessFlags::SHADER_READ.as_raw()
        | vk::AccessFlags::SHADER_WRITE.as_raw(),
);

/// One buffer-to-buffer copy of [`Transfer::copy_in_order`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferCopy {
    /// Read from this buffer (`TRANSFER_SRC`),
    pub source: vk::Buffer,
    /// at this offset;
    pub source_offset: u64,
    /// written to this one (`TRANSFER_DST`),
    pub destination: vk::Buffer,
    /// at this offset;
    pub destination_offset: u64,
    /// this many bytes.
    pub size_bytes: u64,
}

/// A live `VkDeviceMemory` a buffer can be put over ([`buffer_over_memory`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemorySpan {
    /// The memory.
    pub(crate) memory: vk::DeviceMemory,
    /// Its memory type.
    pub(crate) type_index: u32,
    /// The bytes the buffer covers.
    pub(crate) size_bytes: u64,
    /// The bytes the memory holds (at least `size_bytes`).
    pub(crate) allocation_size_bytes: u64,
}

/// What a block's buffer ([`BLOCK_BUFFER_USAGE`]) asks of its memory on `context`'s device: the memory types it may be
/// bound to, what every heap's blocks are allocated from (heapscope's sources, VMA's and gpu-allocator's) so a buffer
/// can be laid over any block for copies in and out of it, and its alignment.
///
/// # Errors
/// [`VulkanError::Vk`] when the probe buffer cannot be created.
pub(crate) fn block_buffer_requirements(context: &VulkanContext) -> Result<vk::MemoryRequirements, VulkanError> {
    let device = context.device();
    let info = vk::BufferCreateInfo::default().size(64 << 10).usage(BLOCK_BUFFER_USAGE).sharing_mode(vk::SharingMode::EXCLUSIVE);
    // SAFETY: a valid create info on a live device; the buffer is destroyed below, never bound.
    let buffer = unsafe { device.create_buffer(&info, None) }.map_err(VulkanError::vk("vkCreateBuffer"))?;
    // SAFETY: the buffer was just created on this device.
    let requirements = unsafe { device.get_buffer_memory_requirements(buffer) };
    // SAFETY: the buffer is unused and unbound.
    unsafe { device.destroy_buffer(buffer, None) };
    Ok(requirements)
}

/// A new `VkBuffer` over the whole of `memory` ([`BLOCK_BUFFER_USAGE`], bound at offset 0), for copies in and out of
/// it: the caller's to destroy after its last use and before the memory is freed. `what` names the memory in errors.
///
/// # Errors
/// [`VulkanError::Unsupported`] when a buffer of that size needs more memory or another memory type;
/// [`VulkanError::Vk`] when creating or binding the buffer fails.
pub(crate) fn buffer_over_memory(
    context: &VulkanContext,
    memory: MemorySpan,
    what: impl FnOnce() -> String,
) -> Result<vk::Buffer, VulkanError> {
    context.check_buffer_size(memory.size_bytes, "a buffer over a block").map_err(VulkanError::Unsupported)?;
    let device = context.device();
    let info = vk::BufferCreateInfo::default()
        .size(memory.size_bytes)
        .usage(BLOCK_BUFFER_USAGE)
        .sharing_mode(vk::SharingMode::EXCLUSIVE);
    // SAFETY: a valid create info on a live device.
    let buffer = unsafe { device.create_buffer(&info, None) }.map_err(VulkanError::vk("vkCreateBuffer"))?;
    // SAFETY: the buffer was just created on this device.
    let requirements = unsafe { device.get_buffer_memory_requirements(buffer) };
    let type_index = memory.type_index;
    let bound = if requirements.memory_type_bits & (1 << type_index) == 0 || requirements.size > memory.allocation_size_bytes {
        Err(VulkanError::Unsupported(format!(
            "a buffer over {} needs {} bytes of type bits {:#b}; the memory has {} bytes of type {type_index}",
            what(),
            requirements.size,
            requirements.memory_type_bits,
            memory.allocation_size_bytes
        )))
    } else {
        // SAFETY: the memory is live (the caller's contract), of an allowed type and large enough; offset 0 satisfies
        // any alignment. The caller destroys the buffer before the memory is freed.
        unsafe { device.bind_buffer_memory(buffer, memory.memory, 0) }.map_err(VulkanError::vk("vkBindBufferMemory"))
    };
    match bound {
        Ok(()) => Ok(buffer),
        Err(error) => {
            // SAFETY: the buffer is ours and was never used.
            unsafe { device.destroy_buffer(buffer, None) };
            Err(error)
        }
    }
}

/// A staging buffer and a command pool for synchronous copies. See the module documentation.
pub struct Transfer {
    context: Arc<VulkanContext>,
    queue: vk::Queue,
    command_pool: vk::CommandPool,
    fence: vk::Fence,
    staging: vk::Buffer,
    memory: vk::DeviceMemory,
    mapped: NonNull<u8>,
    staging_bytes: u64,
    coherent: bool,
    /// A submission whose wait failed and never finished (a lost device): its fence and command buffer may still be
    /// pending, so nothing is submitted again.
    pending_forever: bool,
}

// SAFETY: the handles and the mapping are owned; every use goes through `&mut self`; submissions take the
// context's queue lock.
unsafe impl Send for Transfer {}

impl fmt::Debug for Transfer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transfer").field("staging_bytes", &self.staging_bytes).field("coherent", &self.coherent).finish()
    }
}

impl Transfer {
    /// A transfer helper with a staging buffer of `staging_bytes` in host-visible memory.
    ///
    /// # Errors
    /// [`VulkanError::Unsupported`] without a host-visible memory type for the staging buffer;
    /// [`VulkanError::Vk`] when a call fails.
    pub fn new(context: Arc<VulkanContext>, staging_bytes: u64) -> Result<Self, VulkanError> {
        let (family, queue) = context.compute_queue();
        let device = context.device().clone();
        let pool_info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(family)
            .flags(vk::CommandPoolCreateFlags::TRANSIENT | vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: a valid create info for a queue family of this device; destroyed on drop.
        let command_pool =
            unsafe { device.create_command_pool(&pool_info, None) }.map_err(VulkanError::vk("vkCreateCommandPool"))?;
        let mut this = Self {
            context,
            queue,
            command_pool,
            fence: vk::Fence::null(),
            staging: vk::Buffer::null(),
            memory: vk::DeviceMemory::null(),
            mapped: NonNull::dangling(),
            staging_bytes: staging_bytes.max(1),
            coherent: true,
            pending_forever: false,
        };
        // From here `this` owns what exists; `Drop` destroys whatever is not null.
        // SAFETY: a valid create info on this device; destroyed on drop.
        this.fence =
            unsafe { device.create_fence(&vk::FenceCreateInfo::default(), None) }.map_err(VulkanError::vk("vkCreateFence"))?;
        let buffer_info = vk::BufferCreateInfo::default()
            .size(this.staging_bytes)
            .usage(BLOCK_BUFFER_USAGE)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: as above.
        this.staging = unsafe { device.create_buffer(&buffer_info, None) }.map_err(VulkanError::vk("vkCreateBuffer"))?;
        // SAFETY: the buffer was just created on this device.
        let requirements = unsafe { device.get_buffer_memory_requirements(this.staging) };
        let properties = this.context.properties();
        let index = properties
            .memory_properties()
            .select_memory_type(requirements.memory_type_bits, MemoryUsage::Readback)
            .ok_or_else(|| VulkanError::Unsupported(format!("{}: no host-visible memory for staging", properties.name)))?;
        this.coherent = properties
            .memory_types
            .iter()
            .find(|info| info.index == index)
            .is_some_and(|info| info.property_flags.contains(vk::MemoryPropertyFlags::HOST_COHERENT));
        let allocate = vk::MemoryAllocateInfo::default().allocation_size(requirements.size).memory_type_index(index);
        this.context.take_allocation_slot().map_err(VulkanError::Unsupported)?;
        // SAFETY: a valid allocate info for a memory type the buffer accepts; freed on drop.
        let memory = unsafe { device.allocate_memory(&allocate, None) };
        if memory.is_err() {
            this.context.give_back_allocation_slot();
        }
        this.memory = memory.map_err(VulkanError::vk("vkAllocateMemory"))?;
        // SAFETY: the memory is fresh, of a type the buffer accepts, large enough; offset 0 is aligned.
        unsafe { device.bind_buffer_memory(this.staging, this.memory, 0) }.map_err(VulkanError::vk("vkBindBufferMemory"))?;
        // SAFETY: host-visible memory, not yet mapped; unmapped by freeing it on drop.
        let pointer = unsafe { device.map_memory(this.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) }
            .map_err(VulkanError::vk("vkMapMemory"))?;
        this.mapped = NonNull::new(pointer.cast::<u8>())
            .ok_or_else(|| VulkanError::Unsupported("vkMapMemory returned a null pointer".into()))?;
        Ok(this)
    }

    /// Copies `bytes` into `buffer` at `offset`, waiting for the copy.
    ///
    /// # Errors
    /// A failed Vulkan call.
    ///
    /// # Safety
    /// `buffer` is a live buffer of this context's device with `TRANSFER_DST` usage, `offset .. offset + bytes.len()`
    /// lies inside it and is backed by memory (bound, for a sparse buffer, with its binds waited for), and nothing
    /// else uses that range until the call returns. (Vulkan does not check a raw handle's range: outside it, the
    /// copy writes memory nobody gave it.)
    pub unsafe fn upload(&mut self, buffer: vk::Buffer, offset: u64, bytes: &[u8]) -> Result<(), VulkanError> {
        for (index, piece) in bytes.chunks(self.chunk_len()).enumerate() {
            // SAFETY: the mapping covers `staging_bytes` >= `piece.len()`; no copy is in flight (each waits).
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), self.mapped.as_ptr(), piece.len()) };
            self.flush(false)?;
            let at = offset + (index * self.chunk_len()) as u64;
            // SAFETY: the staging buffer is ours (`TRANSFER_SRC`, `staging_bytes` >= the piece); the destination range
            // is inside the caller's, under the caller's contract.
            unsafe { self.copy(self.staging, 0, buffer, at, piece.len() as u64) }?;
        }
        Ok(())
    }

    /// Copies `out.len()` bytes of `buffer` at `offset` into `out`, waiting for the copy.
    ///
    /// # Errors
    /// A failed Vulkan call.
    ///
    /// # Safety
    /// `buffer` is a live buffer of this context's device with `TRANSFER_SRC` usage, `offset .. offset + out.len()`
    /// lies inside it and is backed by memory (bound, for a sparse buffer, with its binds waited for), and nothing
    /// writes that range until the call returns.
    pub unsafe fn download(&mut self, buffer: vk::Buffer, offset: u64, out: &mut [u8]) -> Result<(), VulkanError> {
        let chunk_len = self.chunk_len();
        for (index, piece) in out.chunks_mut(chunk_len).enumerate() {
            let at = offset + (index * chunk_len) as u64;
            // SAFETY: the source range is inside the caller's, under the caller's contract; the staging buffer is ours
            // (`TRANSFER_DST`, `staging_bytes` >= the piece).
            unsafe { self.copy(buffer, at, self.staging, 0, piece.len() as u64) }?;
            self.flush(true)?;
            // SAFETY: the copy has completed (waited on its fence); the mapping covers `piece.len()` bytes.
            unsafe { std::ptr::copy_nonoverlapping(self.mapped.as_ptr(), piece.as_mut_ptr(), piece.len()) };
        }
        Ok(())
    }

    fn chunk_len(&self) -> usize {
        usize::try_from(self.staging_bytes).unwrap_or(usize::MAX)
    }

    /// Flushes (before a device read) or invalidates (after a device write) non-coherent staging memory.
    fn flush(&self, invalidate: bool) -> Result<(), VulkanError> {
        if self.coherent {
            return Ok(());
        }
        let range = [vk::MappedMemoryRange::default().memory(self.memory).offset(0).size(vk::WHOLE_SIZE)];
        let device = self.context.device();
        // SAFETY: the whole of mapped memory of this device, with no copy in flight.
        unsafe {
            if invalidate {
                device.invalidate_mapped_memory_ranges(&range).map_err(VulkanError::vk("vkInvalidateMappedMemoryRanges"))
            } else {
                device.flush_mapped_memory_ranges(&range).map_err(VulkanError::vk("vkFlushMappedMemoryRanges"))
            }
        }
    }

    /// Records and submits one `vkCmdCopyBuffer` and waits for it on the host.
    ///
    /// # Errors
    /// A failed Vulkan call.
    ///
    /// # Safety
    /// Both buffers are live buffers of this context's device (`TRANSFER_SRC` for `source`, `TRANSFER_DST` for
    /// `destination`), both ranges lie inside them and are backed by memory (bound, for a sparse buffer, with its
    /// binds waited for), they do not overlap within one buffer, and nothing else uses them until the call returns.
    pub unsafe fn copy(
        &mut self,
        source: vk::Buffer,
        source_offset: u64,
        destination: vk::Buffer,
        destination_offset: u64,
        size_bytes: u64,
    ) -> Result<(), VulkanError> {
        let copy = BufferCopy { source, source_offset, destination, destination_offset, size_bytes };
        // SAFETY: the caller's contract is `copy_in_order`'s for one copy.
        unsafe { self.copy_in_order(&[copy]) }
    }

    /// Records `copies` in one command buffer, in order, with a barrier between each (a later copy reads what an
    /// earlier one wrote, or overwrites what it read: compaction's moves), submits it and waits for it on the host.
    ///
    /// # Errors
    /// A failed Vulkan call.
    ///
    /// # Safety
    /// Every copy is as [`Transfer::copy`] asks (live buffers of this device with the usages, ranges inside them and
    /// backed by memory, a copy's own ranges not overlapping), and nothing else uses the buffers until the call
    /// returns.
    pub unsafe fn copy_in_order(&mut self, copies: &[BufferCopy]) -> Result<(), VulkanError> {
        if copies.is_empty() {
            return Ok(());
        }
        if self.pending_forever {
            return Err(VulkanError::Vk { call: "vkWaitForFences (an earlier copy)", result: vk::Result::ERROR_DEVICE_LOST });
        }
        let device = self.context.device();
        let allocate = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.command_pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is ours, used from `&mut self` only.
        let buffers =
            unsafe { device.allocate_command_buffers(&allocate) }.map_err(VulkanError::vk("vkAllocateCommandBuffers"))?;
        let command_buffer = buffers[0];
        let begin = vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        let submit = [vk::SubmitInfo::default().command_buffers(&buffers)];
        // Each copy's writes finish, and are visible, before the next copy reads or writes.
        let barrier = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE | vk::AccessFlags::TRANSFER_READ)
            .dst_access_mask(vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE)];
        // The last copy's writes are made visible to the host (a fence wait alone does not: `download` and VMA's
        // `read` read the destination through a mapping), and to the copies and dispatches of later submissions on
        // this queue (a fence wait between them makes only host writes visible to the device).
        let to_host = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(AFTER_SUBMISSION_ACCESS)];
        let mut submitted = false;
        // SAFETY: the command buffer is fresh; every buffer and range is valid for its copy (the caller's contract);
        // the submission holds the queue lock and is waited for before the command buffer is freed.
        let result = unsafe {
            device
                .begin_command_buffer(command_buffer, &begin)
                .and_then(|()| {
                    for (k, copy) in copies.iter().enumerate() {
                        if k > 0 {
                            device.cmd_pipeline_barrier(
                                command_buffer,
                                vk::PipelineStageFlags::TRANSFER,
                                vk::PipelineStageFlags::TRANSFER,
                                vk::DependencyFlags::empty(),
                                &barrier,
                                &[],
                                &[],
                            );
                        }
                        let region = [vk::BufferCopy::default()
                            .src_offset(copy.source_offset)
                            .dst_offset(copy.destination_offset)
                            .size(copy.size_bytes)];
                        device.cmd_copy_buffer(command_buffer, copy.source, copy.destination, &region);
                    }
                    device.cmd_pipeline_barrier(
                        command_buffer,
                        vk::PipelineStageFlags::TRANSFER,
                        AFTER_SUBMISSION_STAGES,
                        vk::DependencyFlags::empty(),
                        &to_host,
                        &[],
                        &[],
                    );
                    device.end_command_buffer(command_buffer)
                })
                .and_then(|()| {
                    let _queue = self.context.lock_queues();
                    device.queue_submit(self.queue, &submit, self.fence)
                })
                .and_then(|()| {
                    submitted = true;
                    device.wait_for_fences(&[self.fence], true, u64::MAX)
                })
                .and_then(|()| device.reset_fences(&[self.fence]))
        };
        // A wait that failed after the submission leaves the copy possibly in flight: the device is waited for as a
        // whole, and where even that fails (a lost device) the command buffer is left to its pool rather than freed
        // while pending.
        let settled = result.is_ok() || !submitted || self.context.wait_idle();
        if settled {
            if result.is_err() && submitted {
                // SAFETY: the device is idle: the fence is signalled and not in use.
                let _ = unsafe { device.reset_fences(&[self.fence]) };
            }
            // SAFETY: the command buffer is not in flight (waited for, the device idle, or never submitted).
            unsafe { device.free_command_buffers(self.command_pool, &buffers) };
        } else {
            self.pending_forever = true;
        }
        result.map_err(VulkanError::vk("vkCmdCopyBuffer submission"))
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        let device = self.context.device();
        // SAFETY: every copy was waited for; destroying null handles is a no-op; the memory is unmapped by
        // freeing it, after the buffer using it is destroyed.
        unsafe {
            device.destroy_buffer(self.staging, None);
            device.free_memory(self.memory, None);
        }
        if self.memory != vk::DeviceMemory::null() {
            self.context.give_back_allocation_slot();
        }
        // SAFETY: as above.
        unsafe {
            device.destroy_fence(self.fence, None);
            device.destroy_command_pool(self.command_pool, None);
        }
    }
}
