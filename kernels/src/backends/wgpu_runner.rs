//! [`WgpuKernels`]: heapscope's WGSL kernels on a wgpu device (wgpu's safe API: the runner lives with the kernels,
//! the backend crate offers the device and its buffers).
//!
//! One compute pipeline per [`Kernel`], from the kernel's [`ParamsBinding::Uniform`] source: the same WGSL as the
//! Vulkan runner's, with the parameter block a uniform buffer at `@group(1) @binding(0)` instead of push
//! constants (an optional wgpu feature). Each dispatch's [`crate::Params`] take one slot of a uniform
//! buffer, chosen by a dynamic offset, so one bind group serves every dispatch. Storage bindings are group 0, one
//! bind group per dispatch (buffer, offset, size from [`crate::plan`]).
//!
//! [`WgpuKernels::run`] plans every op first (ranges split to fit `max_storage_buffer_binding_size` and start at
//! multiples of `min_storage_buffer_offset_alignment`), then records up to
//! [`WgpuKernels::DISPATCHES_PER_SUBMIT`] dispatches per compute pass and submit (wgpu orders dispatches that
//! share a buffer), copies verify results to a readback buffer, and waits for each submit. Every submit runs
//! inside wgpu error scopes: a validation, out-of-memory or internal error is returned as [`WgpuError::Device`].
//! It is a [`KernelRunner`], shared with the Vulkan runner: the runner keeps only its device code
//! (the buffer check, one submit and its readback), and the trait does the planning, the batches, the verify result
//! slots and their merging, the counts and the fill / verify / copy wrappers.

use std::fmt;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};

use heapscope_wgpu::{ArenaAllocation, KernelBuffer, WgpuDevice, WgpuError};

use crate::{
    BindingLimits, Dispatch, Kernel, KernelError, KernelRunner, Op, PARAMS_BYTES, ParamsBinding, RunnerState, SizedBuffer,
    SlottedDispatch, StorageBinding, VerifyResult,
};

/// What running kernels on wgpu fails with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WgpuKernelError {
    /// wgpu refused something (a pipeline, a buffer, a submit), or waiting failed.
    #[error(transparent)]
    Wgpu(#[from] WgpuError),
    /// A kernel did not compile, or an operation is invalid (misaligned, out of its buffer, another device's).
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

impl SizedBuffer for KernelBuffer<'_> {
    fn size_bytes(&self) -> u64 {
        self.buffer().size()
    }
}

/// The ops on a whole [`ArenaAllocation`] (its binding: offset and size rounded to 4).
pub trait ArenaOps {
    /// An op writing allocation `id`'s pattern over the whole binding.
    fn fill(&self, id: u32) -> Op<KernelBuffer<'_>>;

    /// An op verifying allocation `id`'s pattern over the whole binding.
    fn verify(&self, id: u32) -> Op<KernelBuffer<'_>>;
}

impl ArenaOps for ArenaAllocation {
    fn fill(&self, id: u32) -> Op<KernelBuffer<'_>> {
        Op::Fill { target: self.kernel_buffer(), offset_bytes: self.offset_bytes(), len_bytes: self.binding_bytes(), id }
    }

    fn verify(&self, id: u32) -> Op<KernelBuffer<'_>> {
        Op::Verify { target: self.kernel_buffer(), offset_bytes: self.offset_bytes(), len_bytes: self.binding_bytes(), id }
    }
}

/// A kernel's pipeline.
#[derive(Debug)]
struct KernelPipeline {
    kernel: Kernel,
    layout: wgpu::BindGroupLayout,
    pipeline: wgpu::ComputePipeline,
}

/// Runs heapscope's kernels on a [`WgpuDevice`]. See the module documentation.
pub struct WgpuKernels {
    device: Arc<WgpuDevice>,
    pipelines: Vec<KernelPipeline>,
    params_buffer: wgpu::Buffer,
    params_group: wgpu::BindGroup,
    params_stride_bytes: u64,
    results_buffer: wgpu::Buffer,
    readback_buffer: wgpu::Buffer,
    state: RunnerState,
}

impl fmt::Debug for WgpuKernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuKernels").field("state", &self.state).finish_non_exhaustive()
    }
}

/// Whether binding `binding` of `kernel` is writable on wgpu. Copy's source and matvec's inputs are too: a copy
/// within one arena, or a matvec whose A, x and y share an arena, binds one buffer several times in one dispatch,
/// and wgpu refuses a buffer both read-only and writable in one usage scope.
fn layout_writable(kernel: Kernel, binding: u32) -> bool {
    kernel.binding_writable(binding) || matches!(kernel, Kernel::Copy | Kernel::MatVec)
}

/// The WGSL wgpu compiles for `kernel`: its [`ParamsBinding::Uniform`] source, with copy's and matvec's read-only
/// bindings declared `read_write` (see [`layout_writable`]; the kernels never write them).
fn wgsl(kernel: Kernel) -> String {
    let source = kernel.source(ParamsBinding::Uniform);
    if matches!(kernel, Kernel::Copy | Kernel::MatVec) {
        source.replace("var<storage, read> ", "var<storage, read_write> ")
    } else {
        source
    }
}

/// naga's verdict on [`wgsl`] (what wgpu compiles), checked on the CPU before any pipeline is made.
fn validate_wgsl(kernel: Kernel) -> Result<(), KernelError> {
    use crate::naga;
    let source = wgsl(kernel);
    let module = naga::front::wgsl::parse_str(&source)
        .map_err(|error| KernelError::Parse { kernel, message: error.emit_to_string(&source) })?;
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty())
        .validate(&module)
        .map_err(|error| KernelError::Validation { kernel, message: error.emit_to_string(&source) })?;
    Ok(())
}

impl WgpuKernels {
    /// Builds a pipeline per kernel and the uniform, result and readback buffers.
    ///
    /// # Errors
    /// [`WgpuKernelError::Kernel`] when naga refuses a kernel's source (checked before wgpu sees it);
    /// [`WgpuError::Device`] when wgpu refuses a pipeline or a buffer.
    pub fn new(device: Arc<WgpuDevice>) -> Result<Self, WgpuKernelError> {
        for kernel in Kernel::ALL {
            validate_wgsl(kernel)?;
        }
        let limits = device.limits();
        let device_limits = BindingLimits::of_device(
            limits.max_storage_buffer_binding_size,
            u64::from(limits.min_storage_buffer_offset_alignment),
        );
        let params_stride_bytes = u64::from(limits.min_uniform_buffer_offset_alignment).max(u64::from(PARAMS_BYTES));
        let wgpu_device = device.device();
        let built = device.checked("creating the kernel pipelines", || {
            let params_layout = wgpu_device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("heapscope params"),
                entries: &[wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: true,
                        min_binding_size: NonZeroU64::new(u64::from(PARAMS_BYTES)),
                    },
                    count: None,
                }],
            });
            let pipelines: Vec<KernelPipeline> =
                Kernel::ALL.into_iter().map(|kernel| Self::pipeline(wgpu_device, kernel, &params_layout)).collect();
            let params_buffer = wgpu_device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("heapscope params"),
                size: params_stride_bytes * u64::from(Self::DISPATCHES_PER_SUBMIT),
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let params_group = wgpu_device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("heapscope params"),
                layout: &params_layout,
                entries: &[wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &params_buffer,
                        offset: 0,
                        size: NonZeroU64::new(u64::from(PARAMS_BYTES)),
                    }),
                }],
            });
            let results_bytes = u64::from(Self::DISPATCHES_PER_SUBMIT) * 8;
            let results_buffer = wgpu_device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("heapscope verify results"),
                size: results_bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let readback_buffer = wgpu_device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("heapscope verify readback"),
                size: results_bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            (pipelines, params_buffer, params_group, results_buffer, readback_buffer)
        })?;
        let (pipelines, params_buffer, params_group, results_buffer, readback_buffer) = built;
        Ok(Self {
            device,
            pipelines,
            params_buffer,
            params_group,
            params_stride_bytes,
            results_buffer,
            readback_buffer,
            state: RunnerState::new(device_limits),
        })
    }

    fn pipeline(device: &wgpu::Device, kernel: Kernel, params_layout: &wgpu::BindGroupLayout) -> KernelPipeline {
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(kernel.name()),
            source: wgpu::ShaderSource::Wgsl(wgsl(kernel).into()),
        });
        let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..kernel.storage_bindings())
            .map(|binding| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: !layout_writable(kernel, binding) },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let layout =
            device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(kernel.name()), entries: &entries });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(kernel.name()),
            bind_group_layouts: &[Some(&layout), Some(params_layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(kernel.name()),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some(crate::ENTRY_POINT),
            compilation_options: wgpu::PipelineCompilationOptions::default(),
            cache: None,
        });
        KernelPipeline { kernel, layout, pipeline }
    }

    /// The device.
    pub fn device(&self) -> &Arc<WgpuDevice> {
        &self.device
    }

    fn pipeline_of(&self, kernel: Kernel) -> Result<&KernelPipeline, WgpuKernelError> {
        self.pipelines
            .iter()
            .find(|pipeline| pipeline.kernel == kernel)
            .ok_or_else(|| KernelError::InvalidOp(format!("no pipeline for kernel {kernel}")).into())
    }

    /// Records `batch` into one submit, waits for it, and returns the counters of the first `verify_slots` result
    /// slots (two words each).
    fn submit_and_wait(
        &mut self,
        batch: &[SlottedDispatch<KernelBuffer<'_>>],
        verify_slots: u32,
    ) -> Result<Vec<u32>, WgpuKernelError> {
        let stride = self.params_stride_bytes;
        let mut params = vec![0u8; usize::try_from(stride * batch.len() as u64).unwrap_or(0)];
        for (SlottedDispatch { dispatch, slot, .. }, chunk) in batch.iter().zip(params.chunks_exact_mut(stride as usize)) {
            let words = match dispatch.matvec {
                Some(matvec) => matvec.words(),
                None => crate::Params { slot: *slot, ..dispatch.params }.words(),
            };
            // WGSL reads buffers little-endian, whatever the host.
            for (bytes, word) in chunk.chunks_exact_mut(4).zip(words) {
                bytes.copy_from_slice(&word.to_le_bytes());
            }
        }
        let verify_slots = u64::from(verify_slots);
        let device = Arc::clone(&self.device);
        let submission = device.checked("running kernels", || -> Result<wgpu::SubmissionIndex, WgpuKernelError> {
            let groups = batch.iter().map(|slotted| self.storage_group(&slotted.dispatch)).collect::<Result<Vec<_>, _>>()?;
            let queue = device.queue();
            queue.write_buffer(&self.params_buffer, 0, &params);
            if verify_slots > 0 {
                let reset: Vec<u8> = (0..verify_slots).flat_map(|_| [0u32, u32::MAX]).flat_map(u32::to_le_bytes).collect();
                queue.write_buffer(&self.results_buffer, 0, &reset);
            }
            let mut encoder =
                device.device().create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("heapscope kernels") });
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("heapscope kernels"),
                    timestamp_writes: None,
                });
                for (index, (SlottedDispatch { dispatch, .. }, group)) in batch.iter().zip(&groups).enumerate() {
                    let pipeline = self.pipeline_of(dispatch.kernel)?;
                    let offset = u32::try_from(index as u64 * stride)
                        .map_err(|_| KernelError::InvalidOp("uniform offset past u32".into()))?;
                    pass.set_pipeline(&pipeline.pipeline);
                    pass.set_bind_group(0, group, &[]);
                    pass.set_bind_group(1, &self.params_group, &[offset]);
                    pass.dispatch_workgroups(dispatch.workgroups, 1, 1);
                }
            }
            if verify_slots > 0 {
                encoder.copy_buffer_to_buffer(&self.results_buffer, 0, &self.readback_buffer, 0, verify_slots * 8);
            }
            Ok(device.queue().submit([encoder.finish()]))
        })??;
        device.wait(Some(submission))?;
        if verify_slots == 0 {
            return Ok(Vec::new());
        }
        Ok(self.read_results(verify_slots * 8)?)
    }

    /// The storage bind group of a dispatch ([`Dispatch::storage_bindings`]: the verify results are the runner's
    /// result buffer). Called inside the submit's error scopes.
    fn storage_group(&self, dispatch: &Dispatch<KernelBuffer<'_>>) -> Result<wgpu::BindGroup, WgpuKernelError> {
        let pipeline = self.pipeline_of(dispatch.kernel)?;
        fn binding(buffer: &wgpu::Buffer, offset: u64, size: u64) -> wgpu::BindingResource<'_> {
            wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer, offset, size: NonZeroU64::new(size) })
        }
        let entries: Vec<wgpu::BindGroupEntry<'_>> = dispatch
            .storage_bindings()
            .into_iter()
            .map(|(index, bound)| wgpu::BindGroupEntry {
                binding: index,
                resource: match bound {
                    StorageBinding::Range(range) => binding(range.buffer.buffer(), range.offset_bytes, range.size_bytes),
                    StorageBinding::VerifyResults => self.results_buffer.as_entire_binding(),
                },
            })
            .collect();
        Ok(self.device.device().create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(dispatch.kernel.name()),
            layout: &pipeline.layout,
            entries: &entries,
        }))
    }

    /// Maps the readback buffer's first `size_bytes` and returns them as words.
    fn read_results(&self, size_bytes: u64) -> Result<Vec<u32>, WgpuError> {
        let slice = self.readback_buffer.slice(..size_bytes);
        let outcome: Arc<Mutex<Option<Result<(), wgpu::BufferAsyncError>>>> = Arc::default();
        let sender = Arc::clone(&outcome);
        slice.map_async(wgpu::MapMode::Read, move |result| {
            if let Ok(mut slot) = sender.lock() {
                *slot = Some(result);
            }
        });
        self.device.wait(None)?;
        let mapped = outcome.lock().map_err(|_| WgpuError::Wait("the map callback panicked".into()))?.take();
        match mapped {
            Some(Ok(())) => {}
            Some(Err(error)) => return Err(WgpuError::Wait(format!("mapping verify results: {error}"))),
            None => return Err(WgpuError::Wait("mapping verify results did not complete".into())),
        }
        let words = {
            let view = slice.get_mapped_range().map_err(|error| WgpuError::Wait(format!("reading verify results: {error}")))?;
            view.chunks_exact(4).map(|chunk| u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]])).collect()
        };
        self.readback_buffer.unmap();
        Ok(words)
    }
}

/// The device code of the runner: planning, batching, result slots, counts and the one-op wrappers are the
/// trait's ([`KernelRunner::run`]).
impl KernelRunner for WgpuKernels {
    type Buffer<'a> = KernelBuffer<'a>;
    type Error = WgpuKernelError;

    /// Dispatches recorded into one submit at most; also the number of verify result slots and uniform slots.
    const DISPATCHES_PER_SUBMIT: u32 = 256;

    fn state(&self) -> &RunnerState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut RunnerState {
        &mut self.state
    }

    /// Refuses a buffer without `STORAGE` usage.
    fn check(&self, op: &Op<KernelBuffer<'_>>) -> Result<(), KernelError> {
        if let Some(buffer) =
            op.buffers().into_iter().find(|buffer| !buffer.buffer().usage().contains(wgpu::BufferUsages::STORAGE))
        {
            return Err(KernelError::InvalidOp(format!(
                "a buffer of {} B without STORAGE usage ({:?})",
                buffer.buffer().size(),
                buffer.buffer().usage()
            )));
        }
        Ok(())
    }

    /// Writes the batch's parameters to the uniform buffer and resets its result slots, records one compute pass
    /// inside wgpu error scopes, submits, waits, and reads the slots back.
    fn submit(
        &mut self,
        batch: &[SlottedDispatch<KernelBuffer<'_>>],
        verify_slots: u32,
    ) -> Result<Vec<VerifyResult>, WgpuKernelError> {
        let words = self.submit_and_wait(batch, verify_slots)?;
        Ok(words.chunks_exact(2).map(|counters| VerifyResult::from_counters(counters[0], counters[1])).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every WGSL variant wgpu gets is validated by naga on the CPU, and its storage access matches the layout
    /// (wgpu requires it exactly).
    #[test]
    fn every_wgpu_variant_validates_and_matches_its_layout() {
        for kernel in Kernel::ALL {
            validate_wgsl(kernel).unwrap_or_else(|error| panic!("{error}"));
            let source = wgsl(kernel);
            let uniform =
                if kernel == Kernel::MatVec { "var<uniform> mv: MatVecParams;" } else { "var<uniform> params: Params;" };
            assert!(source.contains(uniform), "{kernel}");
            let writable = (0..kernel.storage_bindings()).filter(|&binding| layout_writable(kernel, binding)).count();
            assert_eq!(source.matches("var<storage, read_write>").count(), writable, "{kernel}");
            assert_eq!(source.matches("var<storage, read>").count(), kernel.storage_bindings() as usize - writable, "{kernel}");
        }
    }
}
