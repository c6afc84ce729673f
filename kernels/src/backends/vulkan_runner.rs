//! [`VulkanKernels`]: heapscope's kernels on a Vulkan device, through the backend's [`Dispatcher`].
//!
//! One shader per [`Kernel`] (SPIR-V from naga, push constants [`crate::Params`], storage buffers in set 0). The
//! backend knows nothing of the kernels: it makes pipelines from the words, checks and records dispatches, and
//! waits for each submit. This runner is a [`KernelRunner`], shared with the wgpu runner: it keeps only the device
//! code — the buffer check, one batch turned into the dispatcher's dispatches, the verify result slots in the
//! dispatcher's host words (two per slot: mismatches, first mismatching word) — and the trait does the planning
//! (ranges split to fit `maxStorageBufferRange`, starting at multiples of `minStorageBufferOffsetAlignment`), the
//! batches of [`VulkanKernels::DISPATCHES_PER_SUBMIT`] dispatches, the merging of the slots, the counts and the
//! fill / verify / copy wrappers.

use std::sync::Arc;

use heapscope_vulkan::compute::{Bound, ComputeBuffer, Dispatcher, Shader, ShaderDispatch};
use heapscope_vulkan::{VulkanContext, VulkanError};

use crate::{
    BindingLimits, Kernel, KernelError, KernelRunner, Op, PARAMS_BYTES, RunnerState, SizedBuffer, SlottedDispatch,
    StorageBinding, VerifyResult, spirv,
};

/// What running kernels on Vulkan fails with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VulkanKernelError {
    /// A Vulkan call failed, or the device lacks something.
    #[error(transparent)]
    Vulkan(#[from] VulkanError),
    /// A kernel did not compile, or an operation is invalid (misaligned, out of its buffer, overlapping).
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

impl SizedBuffer for ComputeBuffer<'_> {
    fn size_bytes(&self) -> u64 {
        ComputeBuffer::size_bytes(self)
    }
}

/// Runs heapscope's kernels on a [`VulkanContext`]'s compute queue. See the module documentation.
#[derive(Debug)]
pub struct VulkanKernels {
    dispatcher: Dispatcher,
    state: RunnerState,
}

/// The dispatcher's shader index of `kernel`: [`Kernel::ALL`]'s order.
fn shader_of(kernel: Kernel) -> usize {
    Kernel::ALL.iter().position(|&each| each == kernel).unwrap_or(0)
}

impl VulkanKernels {
    /// Compiles the kernels (naga) and makes the dispatcher: a pipeline per kernel, a command buffer on the compute
    /// queue, the verify result words.
    ///
    /// # Errors
    /// [`VulkanKernelError::Kernel`] when a kernel does not compile; [`VulkanKernelError::Vulkan`] when a call fails
    /// or no host-visible, coherent memory type holds the results.
    pub fn new(context: Arc<VulkanContext>) -> Result<Self, VulkanKernelError> {
        let words = Kernel::ALL.into_iter().map(spirv).collect::<Result<Vec<_>, _>>()?;
        let shaders: Vec<Shader<'_>> = Kernel::ALL
            .into_iter()
            .zip(&words)
            .map(|(kernel, words)| Shader {
                spirv_words: words,
                storage_bindings: kernel.storage_bindings(),
                push_constant_bytes: PARAMS_BYTES,
            })
            .collect();
        let slots = Self::DISPATCHES_PER_SUBMIT as usize;
        let dispatcher = Dispatcher::new(context, &shaders, Self::DISPATCHES_PER_SUBMIT, 2 * slots)?;
        let (max_range_bytes, offset_alignment_bytes) = dispatcher.storage_limits();
        Ok(Self { state: RunnerState::new(BindingLimits::of_device(max_range_bytes, offset_alignment_bytes)), dispatcher })
    }

    /// The context.
    pub fn context(&self) -> &Arc<VulkanContext> {
        self.dispatcher.context()
    }
}

/// The device code of the runner: planning, batching, result slots, counts and the one-op wrappers are the
/// trait's ([`KernelRunner::run`]).
impl KernelRunner for VulkanKernels {
    type Buffer<'a> = ComputeBuffer<'a>;
    type Error = VulkanKernelError;

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
        if op.buffers().into_iter().any(|buffer| !self.dispatcher.accepts(buffer)) {
            return Err(KernelError::InvalidOp("a buffer of another device than the kernels'".into()));
        }
        Ok(())
    }

    /// Resets the batch's fresh result slots to "nothing found", hands its dispatches to the dispatcher (which
    /// records them with a barrier between each, submits and waits), and reads the slots.
    fn submit(
        &mut self,
        batch: &[SlottedDispatch<ComputeBuffer<'_>>],
        verify_slots: u32,
    ) -> Result<Vec<VerifyResult>, VulkanKernelError> {
        let words = self.dispatcher.host_words();
        for slotted in batch.iter().filter(|slotted| slotted.fresh) {
            let at = slotted.slot as usize * 2;
            if let Some(counters) = words.get_mut(at..at + 2) {
                counters.copy_from_slice(&[0, u32::MAX]);
            }
        }
        let push_constants: Vec<[u8; PARAMS_BYTES as usize]> =
            batch.iter().map(|slotted| slotted.dispatch.push_constant_bytes(slotted.slot)).collect();
        let bindings: Vec<Vec<(u32, Bound<'_>)>> = batch
            .iter()
            .map(|slotted| {
                slotted
                    .dispatch
                    .storage_bindings()
                    .into_iter()
                    .map(|(binding, bound)| {
                        let bound = match bound {
                            StorageBinding::Range(range) => Bound::Range {
                                buffer: range.buffer,
                                offset_bytes: range.offset_bytes,
                                size_bytes: range.size_bytes,
                            },
                            StorageBinding::VerifyResults => Bound::HostWords,
                        };
                        (binding, bound)
                    })
                    .collect()
            })
            .collect();
        let dispatches: Vec<ShaderDispatch<'_, '_>> = batch
            .iter()
            .zip(&push_constants)
            .zip(&bindings)
            .map(|((slotted, push_constants), bindings)| ShaderDispatch {
                shader: shader_of(slotted.dispatch.kernel),
                bindings,
                push_constants,
                workgroups: slotted.dispatch.workgroups,
            })
            .collect();
        self.dispatcher.submit(&dispatches)?;
        let words = self.dispatcher.host_words();
        Ok((0..verify_slots as usize)
            .map(|slot| match words.get(slot * 2..slot * 2 + 2) {
                Some(&[mismatches, first]) => VerifyResult::from_counters(mismatches, first),
                _ => VerifyResult::default(),
            })
            .collect())
    }
}
