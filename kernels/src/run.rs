//! What every device runner of the kernels does the same way, with no device: [`RunPlan`] (every op of a run
//! planned before any runs, its dispatches in order, each with the verify it adds to), [`VerifySlots`] (the
//! verify result slots of one submit, and the merging of their counters into one [`VerifyResult`] per verify
//! op), and [`BindingLimits::lowered`] (a runner's limits lowered to exercise the splitting).
//!
//! A runner records each batch of [`RunPlan::batches`] into one submit, takes each dispatch's result slot from
//! [`VerifySlots::slot_for`] (resetting a fresh slot when its buffer needs it), and after waiting for the submit
//! hands each slot's counters to [`VerifySlots::merge`].

use crate::{BindingLimits, Dispatch, KernelError, Op, SizedBuffer, VerifyResult, plan};

impl BindingLimits {
    /// Limits of a device that binds at most `max_range_bytes` from offsets that are multiples of
    /// `offset_alignment_bytes` (at least a word: the kernels address words).
    pub fn of_device(max_range_bytes: u64, offset_alignment_bytes: u64) -> Self {
        Self { max_range_bytes, offset_alignment_bytes: offset_alignment_bytes.max(4) }
    }

    /// These limits with bindings of at most `max_range_bytes`, clamped to at most these limits' range and at
    /// least the offset alignment plus a word (so every range still splits): to exercise the splitting with small
    /// buffers.
    pub fn lowered(self, max_range_bytes: u64) -> Self {
        let floor = self.offset_alignment_bytes + 4;
        Self { max_range_bytes: max_range_bytes.clamp(floor, self.max_range_bytes.max(floor)), ..self }
    }
}

/// One dispatch of a run, and the verify op (its index among the run's verifies) it adds to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedDispatch<B> {
    /// The dispatch.
    pub dispatch: Dispatch<B>,
    /// The index of its op among the run's [`Op::Verify`]s; `None` for another kernel.
    pub verify: Option<usize>,
}

/// Every dispatch of a run of ops, in order. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunPlan<B> {
    dispatches: Vec<PlannedDispatch<B>>,
    verifies: usize,
}

impl<B: SizedBuffer + Copy + PartialEq> RunPlan<B> {
    /// Plans `ops` under `limits`, each after `check` accepted it (the runner's test of its buffers): none runs if
    /// one is refused.
    ///
    /// # Errors
    /// The first error of `check` or of [`plan`](crate::plan), in op order.
    pub fn new<E: From<KernelError>>(
        ops: &[Op<B>],
        limits: BindingLimits,
        mut check: impl FnMut(&Op<B>) -> Result<(), E>,
    ) -> Result<Self, E> {
        let mut dispatches = Vec::new();
        let mut verifies = 0;
        for op in ops {
            check(op)?;
            let verify = matches!(op, Op::Verify { .. }).then(|| {
                verifies += 1;
                verifies - 1
            });
            dispatches.extend(plan(op, 0, limits)?.into_iter().map(|dispatch| PlannedDispatch { dispatch, verify }));
        }
        Ok(Self { dispatches, verifies })
    }
}

impl<B> RunPlan<B> {
    /// The dispatches in order.
    pub fn dispatches(&self) -> &[PlannedDispatch<B>] {
        &self.dispatches
    }

    /// The number of [`Op::Verify`]s: the run returns one result each.
    pub fn verifies(&self) -> usize {
        self.verifies
    }

    /// The dispatches in batches of at most `per_submit` (at least 1), one submit each.
    pub fn batches(&self, per_submit: u32) -> std::slice::Chunks<'_, PlannedDispatch<B>> {
        self.dispatches.chunks((per_submit as usize).max(1))
    }
}

/// A verify op's result being gathered: its index in the output, and its slot in the current submit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PendingVerify {
    output: usize,
    slot: u32,
}

/// The verify result slots of the submit being recorded, and the results so far. See the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifySlots {
    pending: Vec<PendingVerify>,
    results: Vec<VerifyResult>,
}

impl VerifySlots {
    /// Clean results for `verifies` verify ops, no slot taken.
    pub fn new(verifies: usize) -> Self {
        Self { pending: Vec::new(), results: vec![VerifyResult::default(); verifies] }
    }

    /// The result slot of a dispatch adding to verify `verify` (`None`: not a verify; slot 0, unused), and
    /// whether the slot is new in this submit (its counters must start at "nothing found"). The dispatches of one
    /// verify in a row share a slot; slots count from 0 in each submit, at most one per dispatch.
    pub fn slot_for(&mut self, verify: Option<usize>) -> (u32, bool) {
        let Some(output) = verify else { return (0, false) };
        match self.pending.last() {
            Some(last) if last.output == output => (last.slot, false),
            _ => {
                let slot = u32::try_from(self.pending.len()).unwrap_or(u32::MAX);
                self.pending.push(PendingVerify { output, slot });
                (slot, true)
            }
        }
    }

    /// Slots taken in this submit.
    pub fn slots_in_use(&self) -> u32 {
        u32::try_from(self.pending.len()).unwrap_or(u32::MAX)
    }

    /// After the submit completed: adds what each slot found (`read`: its counters) to its verify's result (the
    /// mismatches summed, the first mismatch the lowest), and frees the slots for the next submit.
    pub fn merge(&mut self, mut read: impl FnMut(u32) -> VerifyResult) {
        for verify in self.pending.drain(..) {
            let found = read(verify.slot);
            if let Some(result) = self.results.get_mut(verify.output) {
                result.mismatches = result.mismatches.saturating_add(found.mismatches);
                result.first_mismatch = match (result.first_mismatch, found.first_mismatch) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
    }

    /// One result per verify op, in order.
    pub fn into_results(self) -> Vec<VerifyResult> {
        self.results
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Buf(u64);

    impl SizedBuffer for Buf {
        fn size_bytes(&self) -> u64 {
            self.0
        }
    }

    const LIMITS: BindingLimits = BindingLimits { max_range_bytes: 1024, offset_alignment_bytes: 64 };

    #[test]
    fn limits_are_lowered_within_the_device_and_the_floor() {
        // (device range, alignment, asked) -> range
        for (device, alignment, asked, range) in
            [(1024, 64, 256, 256), (1024, 64, 1 << 40, 1024), (1024, 64, 0, 68), (32, 64, 256, 68), (1024, 1, 0, 8)]
        {
            let lowered = BindingLimits::of_device(device, alignment).lowered(asked);
            assert_eq!(lowered.max_range_bytes, range, "{device} {alignment} {asked}");
            assert_eq!(lowered.offset_alignment_bytes, alignment.max(4));
        }
    }

    #[test]
    fn plans_number_verifies_and_batch() {
        let buf = Buf(4096);
        let ops = [
            Op::Fill { target: buf, offset_bytes: 0, len_bytes: 4096, id: 1 },
            Op::Verify { target: buf, offset_bytes: 0, len_bytes: 4096, id: 1 },
            Op::Verify { target: buf, offset_bytes: 0, len_bytes: 512, id: 1 },
        ];
        let run = RunPlan::new(&ops, LIMITS, |_| Ok::<(), KernelError>(())).unwrap();
        let verifies: Vec<Option<usize>> = run.dispatches().iter().map(|planned| planned.verify).collect();
        assert_eq!(verifies, [None, None, None, None, Some(0), Some(0), Some(0), Some(0), Some(1)]);
        assert_eq!(run.verifies(), 2);
        let sizes: Vec<usize> = run.batches(4).map(<[_]>::len).collect();
        assert_eq!(sizes, [4, 4, 1]);
        // The check sees each op before it is planned; its refusal stops the run.
        let mut seen = 0;
        let refused = RunPlan::new(&ops, LIMITS, |_| {
            seen += 1;
            if seen == 2 { Err(KernelError::InvalidOp("second".into())) } else { Ok(()) }
        });
        assert!(matches!(refused, Err(KernelError::InvalidOp(message)) if message == "second"));
        let misaligned = [Op::Fill { target: buf, offset_bytes: 2, len_bytes: 4, id: 1 }];
        assert!(RunPlan::new(&misaligned, LIMITS, |_| Ok::<(), KernelError>(())).is_err());
    }

    #[test]
    fn slots_are_shared_per_verify_and_merged() {
        let mut slots = VerifySlots::new(2);
        // (verify, slot, fresh) per dispatch of one submit.
        let steps = [(None, 0, false), (Some(0), 0, true), (Some(0), 0, false), (Some(1), 1, true), (None, 0, false)];
        for (verify, slot, fresh) in steps {
            assert_eq!(slots.slot_for(verify), (slot, fresh), "{verify:?}");
        }
        assert_eq!(slots.slots_in_use(), 2);
        slots.merge(|slot| if slot == 0 { VerifyResult::from_counters(3, 40) } else { VerifyResult::default() });
        assert_eq!(slots.slots_in_use(), 0);
        // The next submit: verify 1 goes on, numbered from slot 0 again, and finds an earlier mismatch.
        assert_eq!(slots.slot_for(Some(1)), (0, true));
        slots.merge(|_| VerifyResult::from_counters(2, 7));
        assert_eq!(slots.slot_for(Some(0)), (0, true));
        slots.merge(|_| VerifyResult::from_counters(1, 5));
        let results = slots.into_results();
        assert_eq!(results[0], VerifyResult { mismatches: 4, first_mismatch: Some(5) });
        assert_eq!(results[1], VerifyResult { mismatches: 2, first_mismatch: Some(7) });
    }
}
