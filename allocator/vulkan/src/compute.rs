//! [`Dispatcher`]: compute shaders on a [`VulkanContext`]'s compute queue, knowing nothing of what they compute.
//!
//! The backend offers compute as a device would: pipelines made from SPIR-V words ([`Shader`]: storage buffers in
//! set 0, push constants, entry point `main`), dispatches recorded into one command buffer per submit with a memory
//! barrier between them ([`Dispatcher::submit`]), every submit waited for, and a small host-visible, coherent buffer
//! of words ([`Dispatcher::host_words`], bound as [`Bound::HostWords`]) for results the host reads. What runs is the
//! caller's: heapscope's kernels (`heapscope-kernels`, its Vulkan runner) bring their SPIR-V and their plan of
//! dispatches. Every dispatch is checked before anything is recorded — its shader, its push constants' size, each
//! binding inside its buffer, aligned to `minStorageBufferOffsetAlignment` and within `maxStorageBufferRange`, its
//! buffer of this device — so no argument reaches the device unchecked.
//!
//! Buffers are [`ComputeBuffer`]s: a [`BlockBuffer`] wraps a [`DeviceMemorySource`] block in a `VkBuffer` (or
//! lends a dedicated block's own buffer); the paged and PyTorch heaps lend theirs; [`ComputeBuffer::from_raw`]
//! takes any buffer.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;

use crate::transfer::{AFTER_SUBMISSION_ACCESS, AFTER_SUBMISSION_STAGES};
use crate::{DeviceMemorySource, VulkanContext, VulkanError};

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
    /// way) for as long as the returned value, or a copy, is passed to a [`Dispatcher`].
    pub unsafe fn from_raw(buffer: vk::Buffer, size_bytes: u64) -> ComputeBuffer<'static> {
        ComputeBuffer { device: vk::Device::null(), buffer, size_bytes, _lifetime: PhantomData }
    }

    /// The buffer.
    pub fn buffer(&self) -> vk::Buffer {
        self.buffer
    }

    /// Its size.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// A buffer of `context`'s device that lives (bound to live memory, or sparse with only live ranges handed to
    /// the kernels) for `'a`, the borrow of its owner: for the crate's own heaps.
    pub(crate) fn borrowed<'a>(context: &VulkanContext, buffer: vk::Buffer, size_bytes: u64) -> ComputeBuffer<'a> {
        ComputeBuffer { device: context.device().handle(), buffer, size_bytes, _lifetime: PhantomData }
    }
}

/// A [`DeviceMemorySource`] block as a `VkBuffer` of the block's size ([`crate::BLOCK_BUFFER_USAGE`]), memory bound at
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
        let (buffer, size_bytes, owned) = source.buffer_over(handle)?;
        Ok(Self { context: Arc::clone(source.context()), buffer, size_bytes, owned, _source: PhantomData })
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
            // SAFETY: the buffer is ours; a `Dispatcher` waits for every submit before returning, so no GPU work
            // uses it any more.
            unsafe { self.context.device().destroy_buffer(self.buffer, None) };
        }
    }
}

/// A compute shader for a [`Dispatcher`]: SPIR-V words (entry point `main`), its storage buffers (bindings
/// `0..storage_bindings` of set 0) and its push constants' size.
#[derive(Clone, Copy, Debug)]
pub struct Shader<'a> {
    /// The SPIR-V module.
    pub spirv_words: &'a [u32],
    /// Storage buffer bindings in set 0.
    pub storage_bindings: u32,
    /// Bytes of push constants (a multiple of 4; 0 for none).
    pub push_constant_bytes: u32,
}

/// What a storage binding of a dispatch holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound<'a> {
    /// A range of a buffer.
    Range {
        /// The buffer.
        buffer: ComputeBuffer<'a>,
        /// Where the range starts (a multiple of `minStorageBufferOffsetAlignment`).
        offset_bytes: u64,
        /// Its length (at most `maxStorageBufferRange`).
        size_bytes: u64,
    },
    /// The dispatcher's host-visible words ([`Dispatcher::host_words`]), whole.
    HostWords,
}

/// One dispatch of a [`Dispatcher`]'s shader.
#[derive(Clone, Copy, Debug)]
pub struct ShaderDispatch<'a, 'b> {
    /// Index of the shader, as given to [`Dispatcher::new`].
    pub shader: usize,
    /// Binding number and what it holds, for some of the shader's storage bindings (each at most once).
    pub bindings: &'b [(u32, Bound<'a>)],
    /// The push constants: exactly the shader's size.
    pub push_constants: &'b [u8],
    /// Workgroups along x.
    pub workgroups: u32,
}

/// A shader's pipeline and layouts.
#[derive(Clone, Copy, Debug, Default)]
struct Pipeline {
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
    storage_bindings: u32,
    push_constant_bytes: u32,
}

/// Runs compute shaders on a [`VulkanContext`]'s compute queue. See the module documentation.
pub struct Dispatcher {
    context: Arc<VulkanContext>,
    pipelines: Vec<Pipeline>,
    dispatches_per_submit: u32,
    descriptor_pool: vk::DescriptorPool,
    command_pool: vk::CommandPool,
    command_buffer: vk::CommandBuffer,
    fence: vk::Fence,
    host_buffer: vk::Buffer,
    host_memory: vk::DeviceMemory,
    host_counted: bool,
    host_ptr: Option<NonNull<u32>>,
    host_words: usize,
    /// `maxStorageBufferRange`, `minStorageBufferOffsetAlignment`.
    storage_limits: (u64, u64),
    /// `maxComputeWorkGroupCount[0]`.
    max_workgroups: u32,
    /// A submission whose wait failed and never finished (a lost device): the command buffer may still be pending,
    /// so nothing is recorded again.
    pending_forever: bool,
}

// SAFETY: the handles may be used from any thread; every use goes through `&mut self` (or `&self` for plain
// data), and the mapped host words are only touched in `&mut self` methods, between fence waits.
unsafe impl Send for Dispatcher {}

impl fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatcher")
            .field("shaders", &self.pipelines.len())
            .field("dispatches_per_submit", &self.dispatches_per_submit)
            .field("host_words", &self.host_words)
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// Creates a pipeline per shader, a command buffer on the compute queue with room for `dispatches_per_submit`
    /// dispatches per submit, a fence, and `host_words` (at least one) host-visible, coherent words.
    ///
    /// # Errors
    /// [`VulkanError::InvalidArgument`] for no room (`dispatches_per_submit` or `host_words` 0) or push constants
    /// that are no whole words or exceed `maxPushConstantsSize`; [`VulkanError::Vk`] when a call fails (a module
    /// the driver refuses); [`VulkanError::Unsupported`] when no host-visible, coherent memory type holds the words.
    pub fn new(
        context: Arc<VulkanContext>,
        shaders: &[Shader<'_>],
        dispatches_per_submit: u32,
        host_words: usize,
    ) -> Result<Self, VulkanError> {
        if dispatches_per_submit == 0 || host_words == 0 {
            return Err(VulkanError::InvalidArgument(format!(
                "a dispatcher needs room: {dispatches_per_submit} dispatches per submit, {host_words} host words"
            )));
        }
        // SAFETY: the physical device belongs to the context's live instance.
        let raw = unsafe { context.instance().get_physical_device_properties(context.physical_device()) };
        if let Some(shader) = shaders
            .iter()
            .find(|shader| shader.push_constant_bytes % 4 != 0 || shader.push_constant_bytes > raw.limits.max_push_constants_size)
        {
            return Err(VulkanError::InvalidArgument(format!(
                "{} B of push constants: a multiple of 4 up to maxPushConstantsSize {} B",
                shader.push_constant_bytes, raw.limits.max_push_constants_size
            )));
        }
        let mut this = Self {
            context,
            pipelines: Vec::with_capacity(shaders.len()),
            dispatches_per_submit,
            descriptor_pool: vk::DescriptorPool::null(),
            command_pool: vk::CommandPool::null(),
            command_buffer: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
            host_buffer: vk::Buffer::null(),
            host_memory: vk::DeviceMemory::null(),
            host_counted: false,
            pending_forever: false,
            host_ptr: None,
            host_words,
            storage_limits: (u64::from(raw.limits.max_storage_buffer_range), raw.limits.min_storage_buffer_offset_alignment),
            max_workgroups: raw.limits.max_compute_work_group_count[0],
        };
        // Every step stores its handles in `this` at once: on an error, `Drop` destroys what exists.
        for shader in shaders {
            this.create_pipeline(shader)?;
        }
        this.create_command_objects()?;
        this.create_host_words()?;
        Ok(this)
    }

    fn create_pipeline(&mut self, shader: &Shader<'_>) -> Result<(), VulkanError> {
        let device = self.context.device();
        self.pipelines.push(Pipeline {
            storage_bindings: shader.storage_bindings,
            push_constant_bytes: shader.push_constant_bytes,
            ..Pipeline::default()
        });
        let Some(slot) = self.pipelines.last_mut() else { return Ok(()) };
        let bindings: Vec<vk::DescriptorSetLayoutBinding<'_>> = (0..shader.storage_bindings)
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
        let push = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(shader.push_constant_bytes)];
        let set_layouts = [slot.set_layout];
        let push = if shader.push_constant_bytes == 0 { &[][..] } else { &push[..] };
        let layout_info = vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts).push_constant_ranges(push);
        // SAFETY: a valid create info whose set layout is live; the push constant range was checked against the
        // device's limit.
        slot.layout =
            unsafe { device.create_pipeline_layout(&layout_info, None) }.map_err(VulkanError::vk("vkCreatePipelineLayout"))?;
        let module_info = vk::ShaderModuleCreateInfo::default().code(shader.spirv_words);
        // SAFETY: a valid create info (the words are the caller's SPIR-V; the driver checks the module).
        let module =
            unsafe { device.create_shader_module(&module_info, None) }.map_err(VulkanError::vk("vkCreateShaderModule"))?;
        let stage =
            vk::PipelineShaderStageCreateInfo::default().stage(vk::ShaderStageFlags::COMPUTE).module(module).name(c"main");
        let pipeline_info = [vk::ComputePipelineCreateInfo::default().stage(stage).layout(slot.layout)];
        // SAFETY: the module and the layout are live.
        let created = unsafe { device.create_compute_pipelines(vk::PipelineCache::null(), &pipeline_info, None) };
        // SAFETY: the module is not needed once the pipeline creation returned.
        unsafe { device.destroy_shader_module(module, None) };
        let pipelines = created.map_err(|(_, result)| VulkanError::Vk { call: "vkCreateComputePipelines", result })?;
        slot.pipeline = pipelines.first().copied().unwrap_or_default();
        Ok(())
    }

    fn create_command_objects(&mut self) -> Result<(), VulkanError> {
        let device = self.context.device();
        let (family, _) = self.context.compute_queue();
        let bindings_per_set = self.pipelines.iter().map(|pipeline| pipeline.storage_bindings).max().unwrap_or(0).max(1);
        let sizes = [vk::DescriptorPoolSize::default()
            .ty(vk::DescriptorType::STORAGE_BUFFER)
            .descriptor_count(bindings_per_set.saturating_mul(self.dispatches_per_submit))];
        let pool_info = vk::DescriptorPoolCreateInfo::default().max_sets(self.dispatches_per_submit).pool_sizes(&sizes);
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

    fn create_host_words(&mut self) -> Result<(), VulkanError> {
        let device = self.context.device();
        let size_bytes = (self.host_words as u64).saturating_mul(4);
        let info = vk::BufferCreateInfo::default()
            .size(size_bytes)
            .usage(vk::BufferUsageFlags::STORAGE_BUFFER)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a valid create info on a live device.
        self.host_buffer = unsafe { device.create_buffer(&info, None) }.map_err(VulkanError::vk("vkCreateBuffer"))?;
        // SAFETY: the buffer is live.
        let requirements = unsafe { device.get_buffer_memory_requirements(self.host_buffer) };
        let wanted = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let memory_type = self
            .context
            .properties()
            .memory_types
            .iter()
            .find(|info| requirements.memory_type_bits & (1 << info.index) != 0 && info.has(wanted))
            .ok_or_else(|| {
                VulkanError::Unsupported("no host-visible, coherent memory type for a dispatcher's host words".into())
            })?;
        let allocate = vk::MemoryAllocateInfo::default().allocation_size(requirements.size).memory_type_index(memory_type.index);
        self.context.take_allocation_slot().map_err(VulkanError::Unsupported)?;
        self.host_counted = true;
        // SAFETY: a valid allocate info with one of the device's memory types.
        self.host_memory = unsafe { device.allocate_memory(&allocate, None) }.map_err(VulkanError::vk("vkAllocateMemory"))?;
        // SAFETY: the memory fits the buffer (its requirements), offset 0.
        unsafe { device.bind_buffer_memory(self.host_buffer, self.host_memory, 0) }
            .map_err(VulkanError::vk("vkBindBufferMemory"))?;
        // SAFETY: host-visible memory, not mapped yet.
        let pointer = unsafe { device.map_memory(self.host_memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) }
            .map_err(VulkanError::vk("vkMapMemory"))?;
        self.host_ptr = NonNull::new(pointer.cast::<u32>());
        if self.host_ptr.is_none() {
            return Err(VulkanError::Unsupported("vkMapMemory returned a null pointer".into()));
        }
        self.host_words().fill(0);
        Ok(())
    }

    /// The context.
    pub fn context(&self) -> &Arc<VulkanContext> {
        &self.context
    }

    /// Dispatches one submit holds at most.
    pub fn dispatches_per_submit(&self) -> u32 {
        self.dispatches_per_submit
    }

    /// The device's storage binding limits: `(maxStorageBufferRange, minStorageBufferOffsetAlignment)`.
    pub fn storage_limits(&self) -> (u64, u64) {
        self.storage_limits
    }

    /// Whether `buffer` may be bound: a buffer of this device (or one vouched for: [`ComputeBuffer::from_raw`]).
    pub fn accepts(&self, buffer: &ComputeBuffer<'_>) -> bool {
        buffer.device == self.context.device().handle() || buffer.device == vk::Device::null()
    }

    /// The host-visible words, to read results from and to reset. No submit is in flight while they are
    /// borrowed: [`Dispatcher::submit`] waits for its work, and the memory is coherent.
    pub fn host_words(&mut self) -> &mut [u32] {
        match self.host_ptr {
            // SAFETY: the mapping holds `host_words` words (the buffer's size, at most the memory's), stays mapped
            // until drop, and no GPU work is in flight (every submit is waited for); `&mut self` makes this the
            // only reference.
            Some(base) => unsafe { std::slice::from_raw_parts_mut(base.as_ptr(), self.host_words) },
            None => &mut [],
        }
    }

    /// Records `dispatches` in order (each sees the writes of those before it) into one submit, submits it and waits
    /// for it; a barrier at the end makes the shaders' writes visible to the host.
    ///
    /// # Errors
    /// [`VulkanError::InvalidArgument`] before anything is recorded, for more dispatches than
    /// [`Dispatcher::dispatches_per_submit`], an unknown shader, push constants not of the shader's size, a binding
    /// the shader lacks (or given twice), a range outside its buffer, misaligned, empty, over `maxStorageBufferRange`
    /// or of a buffer of another device, or more workgroups than `maxComputeWorkGroupCount[0]`; [`VulkanError::Vk`]
    /// when a call fails.
    pub fn submit(&mut self, dispatches: &[ShaderDispatch<'_, '_>]) -> Result<(), VulkanError> {
        self.check(dispatches)?;
        self.begin()?;
        for (index, dispatch) in dispatches.iter().enumerate() {
            self.record(dispatch, index > 0)?;
        }
        self.submit_and_wait()
    }

    fn check(&self, dispatches: &[ShaderDispatch<'_, '_>]) -> Result<(), VulkanError> {
        let invalid = |what: String| Err(VulkanError::InvalidArgument(what));
        if dispatches.len() > self.dispatches_per_submit as usize {
            return invalid(format!("{} dispatches in one submit; at most {}", dispatches.len(), self.dispatches_per_submit));
        }
        let (max_range, alignment) = self.storage_limits();
        let max_groups = self.max_workgroups;
        for (index, dispatch) in dispatches.iter().enumerate() {
            let Some(pipeline) = self.pipelines.get(dispatch.shader) else {
                return invalid(format!("dispatch {index}: no shader {} (there are {})", dispatch.shader, self.pipelines.len()));
            };
            if dispatch.push_constants.len() != pipeline.push_constant_bytes as usize {
                return invalid(format!(
                    "dispatch {index}: {} B of push constants for a shader that takes {} B",
                    dispatch.push_constants.len(),
                    pipeline.push_constant_bytes
                ));
            }
            if dispatch.workgroups > max_groups {
                return invalid(format!("dispatch {index}: {} workgroups; the device allows {max_groups}", dispatch.workgroups));
            }
            let mut seen = 0u64;
            for &(binding, bound) in dispatch.bindings {
                if binding >= pipeline.storage_bindings.min(64) || seen & (1 << binding) != 0 {
                    return invalid(format!(
                        "dispatch {index}: binding {binding} (the shader has {}, each bound once)",
                        pipeline.storage_bindings
                    ));
                }
                seen |= 1 << binding;
                if let Bound::Range { buffer, offset_bytes, size_bytes } = bound {
                    let inside = offset_bytes.checked_add(size_bytes).is_some_and(|end| end <= buffer.size_bytes);
                    if !self.accepts(&buffer)
                        || !inside
                        || size_bytes == 0
                        || size_bytes > max_range
                        || offset_bytes % alignment.max(1) != 0
                    {
                        return invalid(format!(
                            "dispatch {index}, binding {binding}: {size_bytes} B at {offset_bytes} of a {} B buffer{} \
                             (ranges start at multiples of {alignment} B, hold at most {max_range} B, lie inside the buffer)",
                            buffer.size_bytes,
                            if self.accepts(&buffer) { "" } else { " of another device" }
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn begin(&mut self) -> Result<(), VulkanError> {
        if self.pending_forever {
            return Err(VulkanError::Vk { call: "vkWaitForFences (an earlier dispatch)", result: vk::Result::ERROR_DEVICE_LOST });
        }
        let device = self.context.device();
        // SAFETY: the previous submit (if any) was waited for (or the device was idle since), so the command buffer
        // and the sets are not in use.
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

    fn record(&mut self, dispatch: &ShaderDispatch<'_, '_>, barrier: bool) -> Result<(), VulkanError> {
        let device = self.context.device();
        let pipeline = self.pipelines[dispatch.shader];
        let layouts = [pipeline.set_layout];
        let allocate = vk::DescriptorSetAllocateInfo::default().descriptor_pool(self.descriptor_pool).set_layouts(&layouts);
        // SAFETY: the pool is live and has room: at most `dispatches_per_submit` sets of at most the largest
        // shader's bindings per reset (`check`).
        let sets = unsafe { device.allocate_descriptor_sets(&allocate) }.map_err(VulkanError::vk("vkAllocateDescriptorSets"))?;
        let set = sets.first().copied().unwrap_or_default();
        let infos: Vec<(u32, [vk::DescriptorBufferInfo; 1])> = dispatch
            .bindings
            .iter()
            .map(|&(binding, bound)| {
                let info = match bound {
                    Bound::Range { buffer, offset_bytes, size_bytes } => {
                        vk::DescriptorBufferInfo::default().buffer(buffer.buffer).offset(offset_bytes).range(size_bytes)
                    }
                    Bound::HostWords => {
                        vk::DescriptorBufferInfo::default().buffer(self.host_buffer).offset(0).range(vk::WHOLE_SIZE)
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
        let command_buffer = self.command_buffer;
        // SAFETY: the set was just allocated with the shader's layout; the buffers are live for the call's lifetime
        // (`ComputeBuffer<'_>`) and `check` kept every binding inside its buffer, aligned, within
        // `maxStorageBufferRange` and of this device; the command buffer is recording; the push constants are the
        // layout's size.
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
            if !dispatch.push_constants.is_empty() {
                device.cmd_push_constants(
                    command_buffer,
                    pipeline.layout,
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    dispatch.push_constants,
                );
            }
            device.cmd_dispatch(command_buffer, dispatch.workgroups, 1, 1);
        }
        Ok(())
    }

    fn submit_and_wait(&mut self) -> Result<(), VulkanError> {
        let device = self.context.device();
        let (_, queue) = self.context.compute_queue();
        let command_buffer = self.command_buffer;
        let memory = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE)
            .dst_access_mask(AFTER_SUBMISSION_ACCESS)];
        let command_buffers = [command_buffer];
        let submit = [vk::SubmitInfo::default().command_buffers(&command_buffers)];
        // SAFETY: the command buffer is recording (begun by `begin`) and only this dispatcher records into it.
        unsafe {
            device.cmd_pipeline_barrier(
                command_buffer,
                vk::PipelineStageFlags::COMPUTE_SHADER,
                AFTER_SUBMISSION_STAGES,
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
            // while the shaders run.
            let _queue = self.context.lock_queues();
            // SAFETY: the command buffer is executable (ended above); the fence is unsignalled (reset after each
            // wait). The queue's external synchronisation is the context's queue lock, held by every submission to
            // it (heapscope's compute, transfer and sparse binding; wgpu's through `queue_guard`).
            unsafe { device.queue_submit(queue, &submit, self.fence) }.map_err(VulkanError::vk("vkQueueSubmit"))?;
        }
        // SAFETY: the fence belongs to this device and was submitted above; it is reset once signalled.
        let waited = unsafe { device.wait_for_fences(&[self.fence], true, u64::MAX) };
        if let Err(result) = waited {
            // The dispatch may still be in flight: the device is waited for as a whole; where even that fails (a lost
            // device) the command buffer counts as pending for good.
            if self.context.wait_idle() {
                // SAFETY: the device is idle: the fence is signalled and not in use.
                unsafe { device.reset_fences(&[self.fence]) }.map_err(VulkanError::vk("vkResetFences"))?;
            } else {
                self.pending_forever = true;
            }
            return Err(VulkanError::Vk { call: "vkWaitForFences", result });
        }
        // SAFETY: the fence is signalled and not in use.
        unsafe { device.reset_fences(&[self.fence]) }.map_err(VulkanError::vk("vkResetFences"))?;
        Ok(())
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        let device = self.context.device();
        // SAFETY: every submit was waited for, so nothing is in use (or the device is lost, `pending_forever`, where
        // nothing runs any more); null handles (a failed `new`) are ignored by the destroy functions; children go
        // before their pools.
        unsafe {
            for pipeline in &self.pipelines {
                device.destroy_pipeline(pipeline.pipeline, None);
                device.destroy_pipeline_layout(pipeline.layout, None);
                device.destroy_descriptor_set_layout(pipeline.set_layout, None);
            }
            device.destroy_descriptor_pool(self.descriptor_pool, None);
            device.destroy_command_pool(self.command_pool, None);
            device.destroy_fence(self.fence, None);
            device.destroy_buffer(self.host_buffer, None);
            if self.host_ptr.is_some() {
                device.unmap_memory(self.host_memory);
            }
            device.free_memory(self.host_memory, None);
        }
        if self.host_counted {
            self.context.give_back_allocation_slot();
        }
    }
}
