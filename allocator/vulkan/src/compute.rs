//! [`ComputeKernels`]: heapscope's WGSL kernels (fill, verify, copy, the matvec payload; `heapscope_kernels`) run
//! on the device.
//!
//! One compute pipeline per kernel (SPIR-V from naga, push constants [`heapscope_kernels::Params`], storage
//! buffers in set 0), a command buffer and a fence on the compute queue. [`ComputeKernels::run`] records a list
//! of [`Op`]s, each split into dispatches whose bindings fit `maxStorageBufferRange` (and start at multiples of
//! `minStorageBufferOffsetAlignment`), with a memory barrier between dispatches, up to
//! [`ComputeKernels::DISPATCHES_PER_SUBMIT`] dispatches per submit, and waits for each submit's fence. Verify
//! results go to slots of a host-visible, coherent buffer of the runner's own. It is a
//! [`heapscope_kernels::KernelRunner`], shared with the wgpu runner: the runner keeps only its device code (the
//! buffer check, recording and submitting one batch, the result slots' memory), and the trait does the planning,
//! the batches, the verify result slots and their merging, the counts and the fill / verify / copy wrappers.
//!
//! Buffers are [`ComputeBuffer`]s: a [`BlockBuffer`] wraps a [`DeviceMemorySource`] block in a `VkBuffer` (or
//! lends a dedicated block's own buffer); [`ComputeBuffer::from_raw`] takes any buffer.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ash::vk;
use heapscope_kernels::{
    BindingLimits, Dispatch, Kernel, KernelError, KernelRunner, Op, PARAMS_BYTES, RunnerState, SizedBuffer, SlottedDispatch,
    StorageBinding, VerifyResult,
};

use crate::{BLOCK_BUFFER_USAGE, DeviceMemorySource, VulkanContext, VulkanError};

/// What went wrong running kernels.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ComputeError {
    /// A Vulkan call failed, or the device lacks something.
    #[error(transparent)]
    Vulkan(#[from] VulkanError),
    /// A kernel did not compile, or an operation is invalid (misaligned, out of its buffer, overlapping).
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// A storage buffer the kernels may use, and its size; valid for `'a`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ComputeBuffer<'a> {
    /// The device the buffer belongs to; null for [`ComputeBuffer::from_raw`] (the caller vouches for it).
    device: vk::Device,
    buffer: vk::Buffer,
    size_bytes: u64,
    _lifetime: PhantomData<&'a ()>,
}

impl ComputeBuffer<'_> {
    /// A buffer made elsewhere.
    ///
    /// # Safety
    /// `buffer` must be a buffer of the device the kernels run on, created with `STORAGE_BUFFER` usage, at least
    /// `size_bytes` long, bound to live memory, and stay so (and not be used by anything else in a conflicting
    /// way) for as long as the returned value, or a copy, is passed to [`ComputeKernels`].
    pub unsafe fn from_raw(buffer: vk::Buffer, size_bytes: u64) -> ComputeBuffer<'static> {
        ComputeBuffer { device: vk::Device::null(), buffer, size_bytes, _lifetime: PhantomData }
    }

    /// The buffer.
    pub fn buffer(&self) -> vk::Buffer {
        self.buffer
    }

    /// A buffer of `context`'s device that lives (bound to live memory, or sparse with only live ranges handed to
    /// the kernels) for `'a`, the borrow of its owner: for the crate's own heaps.
    pub(crate) fn borrowed<'a>(context: &VulkanContext, buffer: vk::Buffer, size_bytes: u64) -> ComputeBuffer<'a> {
        ComputeBuffer { device: context.device().handle(), buffer, size_bytes, _lifetime: PhantomData }
    }
}

impl SizedBuffer for ComputeBuffer<'_> {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
}

/// A [`DeviceMemorySource`] block as a `VkBuffer` of the block's size ([`BLOCK_BUFFER_USAGE`]), memory bound at
/// offset 0; a dedicated block's own buffer is lent instead. It borrows the source, so the block cannot be freed
/// while the buffer lives; the buffer is destroyed on drop.
pub struct BlockBuffer<'a> {
    context: Arc<VulkanContext>,
    buffer: vk::Buffer,
    size_bytes: u64,
    owned: bool,
    _source: PhantomData<&'a DeviceMemorySource>,
}

impl fmt::Debug for BlockBuffer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockBuffer")
            .field("buffer", &self.buffer)
            .field("size_bytes", &self.size_bytes)
            .field("owned", &self.owned)
            .finish_non_exhaustive()
    }
}

impl<'a> BlockBuffer<'a> {
    /// The buffer over block `handle` of `source`.
    ///
    /// # Errors
    /// [`VulkanError::Unsupported`] when there is no such live block, or a buffer of its size needs more memory
    /// or another memory type; [`VulkanError::Vk`] when creating or binding the buffer fails.
    pub fn new(source: &'a DeviceMemorySource, handle: u64) -> Result<Self, VulkanError> {
        let block = source.block(handle).ok_or_else(|| VulkanError::Unsupported(format!("no live block #{handle}")))?;
        let context = Arc::clone(source.context());
        if let Some(buffer) = block.dedicated_buffer {
            return Ok(Self { context, buffer, size_bytes: block.size_bytes, owned: false, _source: PhantomData });
        }
        let device = context.device();
        let info = vk::BufferCreateInfo::default()
            .size(block.size_bytes)
            .usage(BLOCK_BUFFER_USAGE)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a valid create info on a live device.
        let buffer = unsafe { device.create_buffer(&info, None) }.map_err(VulkanError::vk("vkCreateBuffer"))?;
        // From here on, `this` destroys the buffer on any way out.
        let this =
            Self { context: Arc::clone(&context), buffer, size_bytes: block.size_bytes, owned: true, _source: PhantomData };
        // SAFETY: the buffer was just created on this device.
        let requirements = unsafe { device.get_buffer_memory_requirements(buffer) };
        let type_index = source.memory_type().index;
        if requirements.memory_type_bits & (1 << type_index) == 0 || requirements.size > block.allocation_size_bytes {
            return Err(VulkanError::Unsupported(format!(
                "a buffer over block #{handle} needs {} bytes of type bits {:#b}; the block has {} bytes of type {type_index}",
                requirements.size, requirements.memory_type_bits, block.allocation_size_bytes
            )));
        }
        // SAFETY: the memory is live (the source is borrowed for `'a`, so the block is not freed before the buffer
        // is destroyed), of an allowed type and large enough; offset 0 satisfies any alignment.
        unsafe { device.bind_buffer_memory(buffer, block.memory, 0) }.map_err(VulkanError::vk("vkBindBufferMemory"))?;
        Ok(this)
    }

    /// The buffer, for the kernels.
    pub fn as_compute(&self) -> ComputeBuffer<'_> {
        ComputeBuffer {
            device: self.context.device().handle(),
            buffer: self.buffer,
            size_bytes: self.size_bytes,
            _lifetime: PhantomData,
        }
    }

    /// Its size: the block's.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
}

impl Drop for BlockBuffer<'_> {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: the buffer is ours; `ComputeKernels` waits for every submit before returning, so no GPU work
            // uses it any more.
            unsafe { self.context.device().destroy_buffer(self.buffer, None) };
        }
    }
}

/// A kernel's pipeline and layouts.
#[derive(Clone, Copy, Debug, Default)]
struct KernelPipeline {
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
}

/// Runs heapscope's kernels on a [`VulkanContext`]'s compute queue. See the module documentation.
pub struct ComputeKernels {
    context: Arc<VulkanContext>,
    pipelines: [KernelPipeline; Kernel::ALL.len()],
    descriptor_pool: vk::DescriptorPool,
    command_pool: vk::CommandPool,
    command_buffer: vk::CommandBuffer,
    fence: vk::Fence,
    results_buffer: vk::Buffer,
    results_memory: vk::DeviceMemory,
    results_counted: bool,
    results_ptr: Option<NonNull<u32>>,
    state: RunnerState,
}

// SAFETY: the handles may be used from any thread; every use goes through `&mut self` (or `&self` for plain
// data), and the mapped result pointer is only touched in `&mut self` methods between fence waits.
unsafe impl Send for ComputeKernels {}

impl fmt::Debug for ComputeKernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ComputeKernels").field("state", &self.state).finish_non_exhaustive()
    }
}

fn index_of(kernel: Kernel) -> usize {
    match kernel {
        Kernel::Fill => 0,
        Kernel::Verify => 1,
        Kernel::Copy => 2,
        Kernel::MatVec => 3,
    }
}

impl ComputeKernels {
    /// Compiles the kernels (naga) and creates their pipelines, a command buffer on the compute queue, a fence and
    /// the verify result buffer.
    ///
    /// # Errors
    /// [`ComputeError::Kernel`] when a kernel does not compile; [`ComputeError::Vulkan`] when a call fails or no
    /// host-visible, coherent memory type holds the result buffer.
    pub fn new(context: Arc<VulkanContext>) -> Result<Self, ComputeError> {
        // SAFETY: the physical device belongs to the context's live instance.
        let raw = unsafe { context.instance().get_physical_device_properties(context.physical_device()) };
        let device_limits = BindingLimits::of_device(
            u64::from(raw.limits.max_storage_buffer_range),
            raw.limits.min_storage_buffer_offset_alignment,
        );
        let mut this = Self {
            context,
            pipelines: [KernelPipeline::default(); Kernel::ALL.len()],
            descriptor_pool: vk::DescriptorPool::null(),
            command_pool: vk::CommandPool::null(),
            command_buffer: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
            results_buffer: vk::Buffer::null(),
            results_memory: vk::DeviceMemory::null(),
            results_counted: false,
            results_ptr: None,
            state: RunnerState::new(device_limits),
        };
        // Every step stores its handles in `this` at once: on an error, `Drop` destroys what exists.
        for kernel in Kernel::ALL {
            this.create_pipeline(kernel)?;
        }
        this.create_command_objects()?;
        this.create_results()?;
        Ok(this)
    }

    fn create_pipeline(&mut self, kernel: Kernel) -> Result<(), ComputeError> {
        let words = heapscope_kernels::spirv(kernel)?;
        let device = self.context.device();
        let slot = &mut self.pipelines[index_of(kernel)];
        let bindings: Vec<vk::DescriptorSetLayoutBinding<'_>> = (0..kernel.storage_bindings())
            .map(|binding| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(binding)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let set_info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
        // SAFETY: a valid create info on a live device.
        slot.set_layout = unsafe { device.create_descriptor_set_layout(&set_info, None) }
            .map_err(VulkanError::vk("vkCreateDescriptorSetLayout"))?;
        let push = [vk::PushConstantRange::default().stage_flags(vk::ShaderStageFlags::COMPUTE).offset(0).size(PARAMS_BYTES)];
        let set_layouts = [slot.set_layout];
        let layout_info = vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts).push_constant_ranges(&push);
        // SAFETY: a valid create info whose set layout is live.
        slot.layout =
            unsafe { device.create_pipeline_layout(&layout_info, None) }.map_err(VulkanError::vk("vkCreatePipelineLayout"))?;
        let module_info = vk::ShaderModuleCreateInfo::default().code(&words);
        // SAFETY: the words are SPIR-V naga wrote from a validated module.
        let module =
            unsafe { device.create_shader_module(&module_info, None) }.map_err(VulkanError::vk("vkCreateShaderModule"))?;
        let entry = c"main";
        let stage = vk::PipelineShaderStageCreateInfo::default().stage(vk::ShaderStageFlags::COMPUTE).module(module).name(entry);
        let pipeline_info = [vk::ComputePipelineCreateInfo::default().stage(stage).layout(slot.layout)];
        // SAFETY: the module and the layout are live; the layout matches the shader's bindings and push constants.
        let created = unsafe { device.create_compute_pipelines(vk::PipelineCache::null(), &pipeline_info, None) };
        // SAFETY: the module is not needed once the pipeline creation returned.
        unsafe { device.destroy_shader_module(module, None) };
        let pipelines = created.map_err(|(_, result)| VulkanError::Vk { call: "vkCreateComputePipelines", result })?;
        slot.pipeline = pipelines.first().copied().unwrap_or_default();
        Ok(())
    }

    fn create_command_objects(&mut self) -> Result<(), ComputeError> {
        let device = self.context.device();
        let (family, _) = self.context.compute_queue();
        let sizes = [vk::DescriptorPoolSize::default()
            .ty(vk::DescriptorType::STORAGE_BUFFER)
            .descriptor_count(3 * Self::DISPATCHES_PER_SUBMIT)];
        let pool_info = vk::DescriptorPoolCreateInfo::default().max_sets(Self::DISPATCHES_PER_SUBMIT).pool_sizes(&sizes);
        // SAFETY: valid create infos on a live device (and below).
        self.descriptor_pool =
            unsafe { device.create_descriptor_pool(&pool_info, None) }.map_err(VulkanError::vk("vkCreateDescriptorPool"))?;
        let command_pool_info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER | vk::CommandPoolCreateFlags::TRANSIENT);
        // SAFETY: as above; the family is the context's compute family.
        self.command_pool =
            unsafe { device.create_command_pool(&command_pool_info, None) }.map_err(VulkanError::vk("vkCreateCommandPool"))?;
        let allocate_info = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.command_pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is live.
        let buffers =
            unsafe { device.allocate_command_buffers(&allocate_info) }.map_err(VulkanError::vk("vkAllocateCommandBuffers"))?;
        self.command_buffer = buffers.first().copied().unwrap_or_default();
        // SAFETY: as above.
        self.fence =
            unsafe { device.create_fence(&vk::FenceCreateInfo::default(), None) }.map_err(VulkanError::vk("vkCreateFence"))?;
        Ok(())
    }

    fn create_results(&mut self) -> Result<(), ComputeError> {
        let device = self.context.device();
        let size_bytes = u64::from(Self::DISPATCHES_PER_SUBMIT) * 8;
        let info = vk::BufferCreateInfo::default()
            .size(size_bytes)
            .usage(vk::BufferUsageFlags::STORAGE_BUFFER)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a valid create info on a live device.
        self.results_buffer = unsafe { device.create_buffer(&info, None) }.map_err(VulkanError::vk("vkCreateBuffer"))?;
        // SAFETY: the buffer is live.
        let requirements = unsafe { device.get_buffer_memory_requirements(self.results_buffer) };
        let wanted = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let memory_type = self
            .context
            .properties()
            .memory_types
            .iter()
            .find(|info| requirements.memory_type_bits & (1 << info.index) != 0 && info.has(wanted))
            .ok_or_else(|| VulkanError::Unsupported("no host-visible, coherent memory type for the verify results".into()))?;
        let allocate = vk::MemoryAllocateInfo::default().allocation_size(requirements.size).memory_type_index(memory_type.index);
        let live = &self.context.live_allocations;
        let limit = self.context.properties().limits.max_memory_allocation_count;
        live.fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| (count < limit).then_some(count + 1))
            .map_err(|_| VulkanError::Unsupported(format!("maxMemoryAllocationCount ({limit}) allocations are live")))?;
        self.results_counted = true;
        // SAFETY: a valid allocate info with one of the device's memory types.
        self.results_memory = unsafe { device.allocate_memory(&allocate, None) }.map_err(VulkanError::vk("vkAllocateMemory"))?;
        // SAFETY: the memory fits the buffer (its requirements), offset 0.
        unsafe { device.bind_buffer_memory(self.results_buffer, self.results_memory, 0) }
            .map_err(VulkanError::vk("vkBindBufferMemory"))?;
        // SAFETY: host-visible memory, not mapped yet.
        let pointer = unsafe { device.map_memory(self.results_memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) }
            .map_err(VulkanError::vk("vkMapMemory"))?;
        self.results_ptr = NonNull::new(pointer.cast::<u32>());
        if self.results_ptr.is_none() {
            return Err(VulkanError::Unsupported("vkMapMemory returned a null pointer".into()).into());
        }
        Ok(())
    }

    /// The context.
    pub fn context(&self) -> &Arc<VulkanContext> {
        &self.context
    }

    /// Sets result slot `slot` to "nothing found" (no GPU work is in flight: every submit is waited for).
    fn reset_slot(&mut self, slot: u32) {
        if let Some(base) = self.results_ptr {
            let at = slot as usize * 2;
            // SAFETY: `slot < DISPATCHES_PER_SUBMIT` (one slot per verify in a submit, at most one per dispatch), so
            // both words lie in the mapping; no submit is in flight, and the memory is host-coherent (the submit
            // makes host writes before it visible).
            unsafe {
                base.add(at).write(0);
                base.add(at + 1).write(u32::MAX);
            }
        }
    }

    fn read_slot(&self, slot: u32) -> VerifyResult {
        let Some(base) = self.results_ptr else { return VerifyResult::default() };
        let at = slot as usize * 2;
        // SAFETY: as in `reset_slot`; the fence was waited for and the command buffer ends with a shader-write to
        // host-read barrier, so the words are the kernels' results.
        let (mismatches, first) = unsafe { (base.add(at).read(), base.add(at + 1).read()) };
        VerifyResult::from_counters(mismatches, first)
    }

    fn begin(&mut self) -> Result<(), ComputeError> {
        let device = self.context.device();
        // SAFETY: the previous submit (if any) was waited for, so the command buffer and the sets are not in use.
        unsafe {
            device
                .reset_descriptor_pool(self.descriptor_pool, vk::DescriptorPoolResetFlags::empty())
                .map_err(VulkanError::vk("vkResetDescriptorPool"))?;
            device
                .reset_command_buffer(self.command_buffer, vk::CommandBufferResetFlags::empty())
                .map_err(VulkanError::vk("vkResetCommandBuffer"))?;
            let info = vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
            device.begin_command_buffer(self.command_buffer, &info).map_err(VulkanError::vk("vkBeginCommandBuffer"))?;
        }
        Ok(())
    }

    fn record(&mut self, dispatch: &Dispatch<ComputeBuffer<'_>>, slot: u32, barrier: bool) -> Result<(), ComputeError> {
        let device = self.context.device();
        let pipeline = self.pipelines[index_of(dispatch.kernel)];
        let layouts = [pipeline.set_layout];
        let allocate = vk::DescriptorSetAllocateInfo::default().descriptor_pool(self.descriptor_pool).set_layouts(&layouts);
        // SAFETY: the pool is live and has room: at most DISPATCHES_PER_SUBMIT sets of at most 3 buffers per reset.
        let sets = unsafe { device.allocate_descriptor_sets(&allocate) }.map_err(VulkanError::vk("vkAllocateDescriptorSets"))?;
        let set = sets.first().copied().unwrap_or_default();
        let infos: Vec<(u32, [vk::DescriptorBufferInfo; 1])> = dispatch
            .storage_bindings()
            .into_iter()
            .map(|(binding, bound)| {
                let info = match bound {
                    StorageBinding::Range(range) => vk::DescriptorBufferInfo::default()
                        .buffer(range.buffer.buffer)
                        .offset(range.offset_bytes)
                        .range(range.size_bytes),
                    StorageBinding::VerifyResults => {
                        vk::DescriptorBufferInfo::default().buffer(self.results_buffer).offset(0).range(vk::WHOLE_SIZE)
                    }
                };
                (binding, [info])
            })
            .collect();
        let writes: Vec<vk::WriteDescriptorSet<'_>> = infos
            .iter()
            .map(|(binding, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(*binding)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(info)
            })
            .collect();
        let params = dispatch.push_constant_bytes(slot);
        let command_buffer = self.command_buffer;
        // SAFETY: the set was just allocated with the kernel's layout; the buffers are live for the call's
        // lifetime (`ComputeBuffer<'_>`) and the plan keeps every binding inside its buffer, aligned and within
        // `maxStorageBufferRange`; the command buffer is recording; the push constants match the layout's range.
        unsafe {
            device.update_descriptor_sets(&writes, &[]);
            if barrier {
                let memory = [vk::MemoryBarrier::default()
                    .src_access_mask(vk::AccessFlags::SHADER_WRITE)
                    .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE)];
                device.cmd_pipeline_barrier(
                    command_buffer,
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::DependencyFlags::empty(),
                    &memory,
                    &[],
                    &[],
                );
            }
            device.cmd_bind_pipeline(command_buffer, vk::PipelineBindPoint::COMPUTE, pipeline.pipeline);
            device.cmd_bind_descriptor_sets(command_buffer, vk::PipelineBindPoint::COMPUTE, pipeline.layout, 0, &[set], &[]);
            device.cmd_push_constants(command_buffer, pipeline.layout, vk::ShaderStageFlags::COMPUTE, 0, &params);
            device.cmd_dispatch(command_buffer, dispatch.workgroups, 1, 1);
        }
        Ok(())
    }

    fn submit_and_wait(&mut self) -> Result<(), ComputeError> {
        let device = self.context.device();
        let (_, queue) = self.context.compute_queue();
        let command_buffer = self.command_buffer;
        let memory = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ)];
        let command_buffers = [command_buffer];
        let submit = [vk::SubmitInfo::default().command_buffers(&command_buffers)];
        // SAFETY: the command buffer is recording (begun by `begin`) and only this runner records into it.
        unsafe {
            device.cmd_pipeline_barrier(
                command_buffer,
                vk::PipelineStageFlags::COMPUTE_SHADER,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &memory,
                &[],
                &[],
            );
            device.end_command_buffer(command_buffer).map_err(VulkanError::vk("vkEndCommandBuffer"))?;
        }
        {
            // The compute queue may also be the sparse-binding queue, and wgpu's (a window drawing on this device):
            // the submission, and only it, holds the context's queue lock — not the wait, so others submit
            // while the kernels run.
            let _queue = self.context.lock_queues();
            // SAFETY: the command buffer is executable (ended above); the fence is unsignalled (reset after each
            // wait). The queue's external synchronisation is the context's queue lock, held by every submission to
            // it (heapscope's compute, transfer and sparse binding; wgpu's through `queue_guard`).
            unsafe { device.queue_submit(queue, &submit, self.fence) }.map_err(VulkanError::vk("vkQueueSubmit"))?;
        }
        // SAFETY: the fence belongs to this device and was submitted above; it is reset once signalled.
        unsafe {
            device.wait_for_fences(&[self.fence], true, u64::MAX).map_err(VulkanError::vk("vkWaitForFences"))?;
            device.reset_fences(&[self.fence]).map_err(VulkanError::vk("vkResetFences"))?;
        }
        Ok(())
    }
}

/// The device code of the runner: planning, batching, result slots, counts and the one-op wrappers are the
/// trait's ([`KernelRunner::run`]).
impl KernelRunner for ComputeKernels {
    type Buffer<'a> = ComputeBuffer<'a>;
    type Error = ComputeError;

    /// Dispatches (and descriptor sets) recorded into one submit at most; also the number of verify result slots.
    const DISPATCHES_PER_SUBMIT: u32 = 256;

    fn state(&self) -> &RunnerState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut RunnerState {
        &mut self.state
    }

    /// Refuses a buffer of another device than the kernels' ([`ComputeBuffer::from_raw`] buffers are vouched for).
    fn check(&self, op: &Op<ComputeBuffer<'_>>) -> Result<(), KernelError> {
        let device = self.context.device().handle();
        if op.buffers().into_iter().any(|buffer| buffer.device != device && buffer.device != vk::Device::null()) {
            return Err(KernelError::InvalidOp("a buffer of another device than the kernels'".into()));
        }
        Ok(())
    }

    /// Records the batch into the command buffer (a memory barrier between dispatches, fresh result slots reset
    /// through the mapping first), submits it, waits for its fence and reads the slots.
    fn submit(
        &mut self,
        batch: &[SlottedDispatch<ComputeBuffer<'_>>],
        verify_slots: u32,
    ) -> Result<Vec<VerifyResult>, ComputeError> {
        self.begin()?;
        for (index, slotted) in batch.iter().enumerate() {
            if slotted.fresh {
                self.reset_slot(slotted.slot);
            }
            self.record(&slotted.dispatch, slotted.slot, index > 0)?;
        }
        self.submit_and_wait()?;
        Ok((0..verify_slots).map(|slot| self.read_slot(slot)).collect())
    }
}

impl Drop for ComputeKernels {
    fn drop(&mut self) {
        let device = self.context.device();
        // SAFETY: every submit was waited for, so nothing is in use; null handles (a failed `new`) are ignored by
        // the destroy functions; children go before their pools.
        unsafe {
            for pipeline in self.pipelines {
                device.destroy_pipeline(pipeline.pipeline, None);
                device.destroy_pipeline_layout(pipeline.layout, None);
                device.destroy_descriptor_set_layout(pipeline.set_layout, None);
            }
            device.destroy_descriptor_pool(self.descriptor_pool, None);
            device.destroy_command_pool(self.command_pool, None);
            device.destroy_fence(self.fence, None);
            device.destroy_buffer(self.results_buffer, None);
            if self.results_ptr.is_some() {
                device.unmap_memory(self.results_memory);
            }
            device.free_memory(self.results_memory, None);
        }
        if self.results_counted {
            self.context.live_allocations.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
