//! [`KernelRunner`]: a device runner of the kernels, with everything but its device code written once here —
//! the whole run planned before any of it runs ([`RunPlan`]: each op checked by the runner, split to fit its
//! binding limits), cut into submits of at most [`KernelRunner::DISPATCHES_PER_SUBMIT`] dispatches, each dispatch
//! given its verify result slot ([`VerifySlots`]), the slots' counters merged into one [`VerifyResult`] per verify
//! op, the submit and dispatch counts, lowered binding limits, and the one-op wrappers ([`KernelRunner::fill`],
//! [`KernelRunner::verify`], [`KernelRunner::copy`]).
//!
//! A runner ([`RunnerState`] for its limits and counts) keeps only what talks to its device:
//! [`KernelRunner::check`] (can the device use an op's buffers) and [`KernelRunner::submit`] (record a batch of
//! [`SlottedDispatch`]es into one submit, reset the fresh result slots, wait, read the slots back).
//! [`crate::VulkanKernels`] and [`crate::WgpuKernels`] are the two.

use crate::{BindingLimits, Dispatch, KernelError, Op, RunPlan, SizedBuffer, VerifyResult, VerifySlots};

/// One dispatch of a submit with its verify result slot (slot 0, unused, for another kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlottedDispatch<B> {
    /// The dispatch.
    pub dispatch: Dispatch<B>,
    /// Its verify result slot in this submit.
    pub slot: u32,
    /// Whether the slot is new in this submit: its counters must be reset to "nothing found" before the dispatch.
    pub fresh: bool,
}

/// A runner's binding limits (the device's, and those ranges are split by) and its submits and dispatches so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunnerState {
    limits: BindingLimits,
    device_limits: BindingLimits,
    submits: u64,
    dispatches: u64,
}

impl RunnerState {
    /// A runner on a device with `device_limits`, nothing run yet.
    pub fn new(device_limits: BindingLimits) -> Self {
        Self { limits: device_limits, device_limits, submits: 0, dispatches: 0 }
    }
}

/// A device that runs the kernels. See the module documentation.
pub trait KernelRunner {
    /// A buffer the kernels may use, borrowed for `'a`.
    type Buffer<'a>: SizedBuffer + Copy + PartialEq;

    /// What a run fails with.
    type Error: From<KernelError>;

    /// Dispatches recorded into one submit at most: the runner has this many verify result slots.
    const DISPATCHES_PER_SUBMIT: u32;

    /// The limits and counts.
    fn state(&self) -> &RunnerState;

    /// The limits and counts, to change.
    fn state_mut(&mut self) -> &mut RunnerState;

    /// Refuses an op whose buffers the device cannot use (of another device, without storage usage, ...); called
    /// for every op of a run before anything is recorded.
    ///
    /// # Errors
    /// [`KernelError::InvalidOp`] saying what is wrong with the buffer.
    fn check(&self, op: &Op<Self::Buffer<'_>>) -> Result<(), KernelError>;

    /// Records `batch` (at most [`KernelRunner::DISPATCHES_PER_SUBMIT`] dispatches, in order, each seeing the
    /// writes of those before it) into one submit, the fresh slots reset first, waits for it, and returns the
    /// counters of result slots `0..verify_slots`.
    ///
    /// # Errors
    /// The device's failure.
    fn submit(
        &mut self,
        batch: &[SlottedDispatch<Self::Buffer<'_>>],
        verify_slots: u32,
    ) -> Result<Vec<VerifyResult>, Self::Error>;

    /// The binding limits ranges are split by (the device's, unless lowered).
    fn binding_limits(&self) -> BindingLimits {
        self.state().limits
    }

    /// Splits ranges as if bindings could cover at most `max_range_bytes` (at most the device's limit, at least
    /// the offset alignment plus a word: [`BindingLimits::lowered`]): to exercise the splitting with small buffers.
    fn set_max_binding_bytes(&mut self, max_range_bytes: u64) {
        let state = self.state_mut();
        state.limits = state.device_limits.lowered(max_range_bytes);
    }

    /// Submits and dispatches so far.
    fn counts(&self) -> (u64, u64) {
        (self.state().submits, self.state().dispatches)
    }

    /// Runs `ops` in order (each sees the writes of those before it) and returns one [`VerifyResult`] per
    /// [`Op::Verify`], in order. Ops are checked and planned first (none runs if one is refused), then submitted
    /// [`KernelRunner::DISPATCHES_PER_SUBMIT`] dispatches at a time; each submit is waited for.
    ///
    /// # Errors
    /// An invalid op (misaligned, out of its buffer, overlapping, refused by [`KernelRunner::check`]) as a
    /// [`KernelError`]; the device's failure.
    fn run(&mut self, ops: &[Op<Self::Buffer<'_>>]) -> Result<Vec<VerifyResult>, Self::Error> {
        let run = RunPlan::new(ops, self.binding_limits(), |op| self.check(op).map_err(Self::Error::from))?;
        let mut slots = VerifySlots::new(run.verifies());
        for batch in run.batches(Self::DISPATCHES_PER_SUBMIT) {
            let slotted: Vec<SlottedDispatch<Self::Buffer<'_>>> = batch
                .iter()
                .map(|planned| {
                    let (slot, fresh) = slots.slot_for(planned.verify);
                    SlottedDispatch { dispatch: planned.dispatch, slot, fresh }
                })
                .collect();
            let found = self.submit(&slotted, slots.slots_in_use())?;
            let state = self.state_mut();
            state.submits += 1;
            state.dispatches += slotted.len() as u64;
            slots.merge(|slot| found.get(slot as usize).copied().unwrap_or_default());
        }
        Ok(slots.into_results())
    }

    /// Writes allocation `id`'s pattern into `len_bytes` at `offset_bytes` of `buffer`.
    ///
    /// # Errors
    /// As [`KernelRunner::run`].
    fn fill(&mut self, buffer: Self::Buffer<'_>, offset_bytes: u64, len_bytes: u64, id: u32) -> Result<(), Self::Error> {
        self.run(&[Op::Fill { target: buffer, offset_bytes, len_bytes, id }]).map(drop)
    }

    /// Compares `len_bytes` at `offset_bytes` of `buffer` with allocation `id`'s pattern.
    ///
    /// # Errors
    /// As [`KernelRunner::run`].
    fn verify(
        &mut self,
        buffer: Self::Buffer<'_>,
        offset_bytes: u64,
        len_bytes: u64,
        id: u32,
    ) -> Result<VerifyResult, Self::Error> {
        let results = self.run(&[Op::Verify { target: buffer, offset_bytes, len_bytes, id }])?;
        Ok(results.first().copied().unwrap_or_default())
    }

    /// Copies `len_bytes` from `src` at `src_offset_bytes` to `dst` at `dst_offset_bytes`.
    ///
    /// # Errors
    /// As [`KernelRunner::run`].
    fn copy<'a>(
        &mut self,
        src: Self::Buffer<'a>,
        src_offset_bytes: u64,
        dst: Self::Buffer<'a>,
        dst_offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(), Self::Error> {
        self.run(&[Op::Copy { src, src_offset_bytes, dst, dst_offset_bytes, len_bytes }]).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kernel;

    /// A buffer of the fake device: its id and size.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Buf {
        id: u32,
        size_bytes: u64,
    }

    impl SizedBuffer for Buf {
        fn size_bytes(&self) -> u64 {
            self.size_bytes
        }
    }

    /// A runner that records what it is given and finds, in every fresh slot, `found` mismatches at word
    /// `10 * submit + slot`; it refuses buffer 99.
    struct Recorder {
        state: RunnerState,
        submits: Vec<Vec<(Kernel, u32, bool)>>,
        slots_read: Vec<u32>,
        found: u32,
    }

    impl KernelRunner for Recorder {
        type Buffer<'a> = Buf;
        type Error = KernelError;
        const DISPATCHES_PER_SUBMIT: u32 = 3;

        fn state(&self) -> &RunnerState {
            &self.state
        }

        fn state_mut(&mut self) -> &mut RunnerState {
            &mut self.state
        }

        fn check(&self, op: &Op<Buf>) -> Result<(), KernelError> {
            match op.buffers().into_iter().find(|buffer| buffer.id == 99) {
                Some(_) => Err(KernelError::InvalidOp("buffer 99".into())),
                None => Ok(()),
            }
        }

        fn submit(&mut self, batch: &[SlottedDispatch<Buf>], verify_slots: u32) -> Result<Vec<VerifyResult>, KernelError> {
            let submit = u32::try_from(self.submits.len()).unwrap_or(u32::MAX);
            self.submits.push(batch.iter().map(|slotted| (slotted.dispatch.kernel, slotted.slot, slotted.fresh)).collect());
            self.slots_read.push(verify_slots);
            Ok((0..verify_slots).map(|slot| VerifyResult::from_counters(self.found, 10 * submit + slot)).collect())
        }
    }

    fn recorder(found: u32) -> Recorder {
        let limits = BindingLimits { max_range_bytes: 1024, offset_alignment_bytes: 64 };
        Recorder { state: RunnerState::new(limits), submits: Vec::new(), slots_read: Vec::new(), found }
    }

    const BUF: Buf = Buf { id: 1, size_bytes: 4096 };

    #[test]
    fn runs_are_planned_batched_slotted_and_merged() {
        let mut runner = recorder(2);
        let ops = [
            Op::Fill { target: BUF, offset_bytes: 0, len_bytes: 2048, id: 1 },
            Op::Verify { target: BUF, offset_bytes: 0, len_bytes: 3072, id: 1 },
            Op::Verify { target: BUF, offset_bytes: 0, len_bytes: 4, id: 1 },
        ];
        let results = runner.run(&ops).unwrap();
        // Fill: 2 dispatches; the first verify 3, the second 1: 6 in submits of 3.
        let expected: [&[(Kernel, u32, bool)]; 2] = [
            &[(Kernel::Fill, 0, false), (Kernel::Fill, 0, false), (Kernel::Verify, 0, true)],
            &[(Kernel::Verify, 0, true), (Kernel::Verify, 0, false), (Kernel::Verify, 1, true)],
        ];
        assert_eq!(runner.submits, expected);
        assert_eq!(runner.slots_read, [1, 2]);
        // Verify 0 spans both submits: its counters are summed, its first mismatch the lowest.
        assert_eq!(results, [VerifyResult::from_counters(4, 0), VerifyResult::from_counters(2, 11)]);
        assert_eq!(runner.counts(), (2, 6));
    }

    #[test]
    fn wrappers_and_limits() {
        let mut runner = recorder(0);
        runner.fill(BUF, 64, 128, 3).unwrap();
        assert!(runner.verify(BUF, 64, 128, 3).unwrap().is_clean());
        runner.copy(BUF, 0, Buf { id: 2, size_bytes: 256 }, 0, 256).unwrap();
        let kernels: Vec<Kernel> = runner.submits.iter().flatten().map(|&(kernel, _, _)| kernel).collect();
        assert_eq!(kernels, [Kernel::Fill, Kernel::Verify, Kernel::Copy]);
        assert_eq!(runner.counts(), (3, 3));
        // Lowered limits split ranges further, and are clamped to the device's.
        runner.set_max_binding_bytes(256);
        assert_eq!(runner.binding_limits().max_range_bytes, 256);
        runner.fill(BUF, 0, 1024, 3).unwrap();
        assert_eq!(runner.counts(), (5, 7));
        runner.set_max_binding_bytes(1 << 40);
        assert_eq!(runner.binding_limits(), runner.state.device_limits);
    }

    #[test]
    fn a_refused_or_invalid_op_runs_nothing() {
        let mut runner = recorder(0);
        let refused = Op::Fill { target: Buf { id: 99, size_bytes: 64 }, offset_bytes: 0, len_bytes: 64, id: 1 };
        let ops = [Op::Fill { target: BUF, offset_bytes: 0, len_bytes: 64, id: 1 }, refused];
        assert!(matches!(runner.run(&ops), Err(KernelError::InvalidOp(message)) if message == "buffer 99"));
        assert!(runner.fill(BUF, 2, 8, 1).is_err());
        assert!(runner.verify(BUF, 4096, 4, 1).is_err());
        assert!(runner.submits.is_empty());
        assert_eq!(runner.counts(), (0, 0));
    }
}
