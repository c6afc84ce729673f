//! [`run`]: a workload played on a [`Target`], through the lab's one replay driver.
//!
//! A workload's allocations and frees are a stream like a recording's ([`Workload::trace`]: the steps' allocations
//! and frees, then the frees of what lives to the end), replayed by [`heapscope_lab::driver::drive`] with the runner
//! as the driver's target ([`KernelDriver`], over the bench [`Target`]); so the driver's observers (live mode's view
//! of the heap) hear every allocation, refusal, free and device event of a run as they hear a replay's. What a
//! workload does besides allocating and freeing, the runner does before each event of the stream
//! ([`heapscope_lab::driver::Target::before_event`]):
//!
//! Every allocation is filled with its id's pattern as soon as it exists; matvec and copy steps become kernel ops;
//! before an allocation is freed it is verified. The runner tracks what each allocation should hold as regions
//! `(offset, length, id)`, each holding `id`'s pattern from its own start: one region after the fill; a copy puts
//! the source's regions at the front of the destination and refills the rest with the destination's own pattern;
//! a matvec writes exactly the output's pattern when its inputs are intact. A verify checks every region.
//!
//! Ops are batched: they go to the target in one [`Target::run`] when a free needs them done (a run of frees is
//! verified in one batch, then freed in order), when [`MAX_PENDING_OPS`] are waiting, and at the end. A step on an
//! allocation the target refused (out of memory) is skipped. Allocations still live at the end (those meant to
//! live forever) are verified and freed last.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use heapscope_core::units::ReservedOverLive;
use heapscope_core::{Allocation, AllocationId, DeviceEvent, OomVerdict, OwnerId, Request, ResourceKind};
use heapscope_lab::compaction::{CompactRule, CompactionFigures};
use heapscope_lab::driver::{Observer, Stream, Target as DriverTarget, drive};

use super::target::{Target, TargetError};
use crate::workload::{Step, Workload};
use crate::{MatVecIds, Op, VerifyResult};

/// Ops waiting at most before the runner hands them to the target.
pub const MAX_PENDING_OPS: usize = 512;

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunReport {
    /// Steps played.
    pub steps: u64,
    /// Allocations served.
    pub allocs: u64,
    /// Frees of the workload's steps (what lives to the end is freed after them, uncounted).
    pub frees: u64,
    /// Allocations refused (out of memory).
    pub ooms: u64,
    /// The first refusal: its step and verdict.
    pub first_oom: Option<(u64, OomVerdict)>,
    /// Steps skipped because they use an allocation that was refused.
    pub skipped_steps: u64,
    /// The most bytes live at once (requested sizes of the allocations served).
    pub peak_live_bytes: u64,
    /// The most bytes the target had reserved at once (sampled after every allocation).
    pub peak_reserved_bytes: u64,
    /// Whether the target ran the kernels (a simulated one does not: no mismatch by construction).
    pub kernels_ran: bool,
    /// Kernel ops: fills, verifies, matvecs, copies.
    pub ops: OpCounts,
    /// Words that differed from what they should hold, over every verify.
    pub mismatches: u64,
    /// The first allocation found damaged: its id, the step of its verify, what the verify found (its first
    /// mismatching word counted from the allocation's start).
    pub first_mismatch: Option<(u32, u64, VerifyResult)>,
    /// Batches of ops handed to the target.
    pub batches: u64,
    /// What compacting did, when the target compacts ([`Target::compact_rule`]); `None` otherwise. Moved allocations
    /// are verified at their new place right after the move, and again when they are freed, like every allocation.
    pub compaction: Option<CompactionFigures>,
    /// Time of the whole run.
    pub wall: Duration,
}

impl RunReport {
    /// Allocations served per second of the whole run.
    pub fn allocs_per_sec(&self) -> f64 {
        self.allocs as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Peak reserved over peak live (1.0 is no waste; none when nothing was live).
    pub fn reserved_over_live(&self) -> ReservedOverLive {
        ReservedOverLive::new(self.peak_reserved_bytes, self.peak_live_bytes)
    }
}

/// Kernel ops of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Fills (one per allocation, one per copy that leaves a tail).
    pub fills: u64,
    /// Verify ops (one per region of a freed allocation).
    pub verifies: u64,
    /// Matvecs.
    pub matvecs: u64,
    /// Copies.
    pub copies: u64,
    /// Bytes verified.
    pub bytes_verified: u64,
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
#[error("step {step}: {message}")]
pub struct RunError {
    /// The step (the number of steps for the final verification).
    pub step: u64,
    /// What failed.
    pub message: String,
    /// Kernel mismatches the verifies that ran before the failure found (a stopped or failed run says how clean it
    /// was so far).
    pub mismatches: u64,
    /// Whether it is something the device cannot do at all ([`TargetError::DeviceLimit`]): the contender is one this
    /// device cannot run, not a failure of the run.
    pub device_limit: bool,
}

impl RunError {
    /// A failure at `step`, before any verify (the run's own count is added where it stops: [`run_observed`]).
    pub fn at(step: u64, message: impl Into<String>) -> Self {
        Self { step, message: message.into(), mismatches: 0, device_limit: false }
    }

    /// What `error` stops at `step`: a device limit stays one.
    pub fn of_target(step: u64, error: &TargetError) -> Self {
        let device_limit = matches!(error, TargetError::DeviceLimit(_));
        Self { device_limit, ..Self::at(step, error.to_string()) }
    }
}

/// Bytes of an allocation that hold `id`'s pattern from `offset_bytes` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Region {
    offset_bytes: u64,
    len_bytes: u64,
    id: u32,
}

#[derive(Debug)]
struct Live<H> {
    handle: H,
    size_bytes: u64,
    regions: Vec<Region>,
}

/// Plays `workload` on `target`. See the module documentation.
///
/// # Errors
/// [`RunError`] when the target fails for another reason than running out of memory.
pub fn run<T: Target>(workload: &Workload, target: &mut T) -> Result<RunReport, RunError> {
    run_observed(workload, target, &mut [])
}

/// [`run`], with `observers` of the driver hearing every allocation, refusal, free and device event (live mode).
///
/// # Errors
/// [`RunError`] when the target fails for another reason than running out of memory, or an observer stops the run
/// (its error is the run's).
pub fn run_observed<'t, T: Target>(
    workload: &'t Workload,
    target: &'t mut T,
    observers: &mut [&mut dyn Observer<KernelDriver<'t, T>>],
) -> Result<RunReport, RunError> {
    let started = Instant::now();
    let stream = workload.trace().map_err(|error| RunError::at(error.step as u64, error.what))?;
    let kernels_ran = target.runs_kernels();
    let compaction = (target.compact_rule() != CompactRule::Never).then(CompactionFigures::default);
    let mut runner = KernelDriver {
        target,
        steps: &workload.steps,
        event_steps: stream.steps,
        event_ids: stream.ids,
        owner: OwnerId::fresh(),
        next_step: 0,
        event: 0,
        live: HashMap::new(),
        refused: HashSet::new(),
        pending: Vec::new(),
        checks: Vec::new(),
        live_bytes: 0,
        failure: None,
        retrying: None,
        report: RunReport { kernels_ran, compaction, ..RunReport::default() },
    };
    let driven = drive(Stream::of_trace(&stream.trace), &mut runner, 1, observers);
    let end = workload.steps.len() as u64;
    let finished = match (runner.failure.take(), driven) {
        (Some(failure), _) => Err(failure),
        (None, Err(error)) => Err(RunError::at(runner.step(), error.to_string())),
        (None, Ok(())) => runner.ops_until(workload.steps.len()).and_then(|()| runner.flush(end)),
    };
    if let Err(mut error) = finished {
        error.mismatches = runner.report.mismatches;
        return Err(error);
    }
    runner.report.steps = end;
    // The binds and unbinds the last steps queued are part of the run (a paged run's finished long after its timer did).
    if let Err(error) = runner.target.finish() {
        return Err(RunError::of_target(end, &error));
    }
    runner.report.wall = started.elapsed();
    let device_copy_ns = runner.target.device_copy_ns();
    if let Some(compaction) = &mut runner.report.compaction {
        compaction.device_copy_ns = device_copy_ns;
    }
    Ok(runner.report)
}

/// An allocation the runner handed out: the target's handle, and the allocation it stands for as the driver's
/// observers see it (offset 0, its size, its id).
#[derive(Clone, Copy, Debug)]
pub struct Placed<H> {
    /// The target's handle.
    pub handle: H,
    /// The workload's id of the allocation.
    pub id: u32,
    allocation: Allocation,
}

/// The bench runner as the driver's target: the bench [`Target`] allocates and frees, and before each event the
/// runner queues the kernel ops of the steps before it and, before a run of frees, the verifies of what they free,
/// and hands the ops to the target. See the module documentation.
#[derive(Debug)]
pub struct KernelDriver<'a, T: Target> {
    target: &'a mut T,
    steps: &'a [Step],
    /// The workload step of each event of the stream (the final frees: the number of steps).
    event_steps: Vec<u64>,
    /// The allocation id of each event.
    event_ids: Vec<u32>,
    owner: OwnerId,
    /// The first step whose ops are not queued yet.
    next_step: usize,
    /// The event being played.
    event: usize,
    live: HashMap<u32, Live<T::Handle>>,
    refused: HashSet<u32>,
    pending: Vec<Op<T::Handle>>,
    /// For each pending verify, in order: the allocation, the step and the region's first word in the allocation.
    checks: Vec<(u32, u64, u32)>,
    live_bytes: u64,
    /// A failure of the bench target, with its step, that stopped the driver.
    failure: Option<RunError>,
    /// The allocation refused at this event, which compacting may serve on a second try, and whether its refusal
    /// was the run's first.
    retrying: Option<(u32, bool)>,
    report: RunReport,
}

impl<T: Target> KernelDriver<'_, T> {
    /// The bench target (live mode reads where an allocation sits and what the device holds).
    pub fn target(&self) -> &T {
        self.target
    }

    /// What the run measured so far.
    pub fn report(&self) -> &RunReport {
        &self.report
    }

    /// The step of the event being played.
    fn step(&self) -> u64 {
        self.event_steps.get(self.event).copied().unwrap_or(self.steps.len() as u64)
    }

    /// Notes a failure of the bench target at the current step; the driver stops with it.
    fn fail(&mut self, error: RunError) -> heapscope_core::Error {
        let message = error.message.clone();
        self.failure = Some(error);
        heapscope_core::Error::Source(message)
    }

    /// Queues the ops of the steps before `step` not queued yet (matvecs and copies; allocations and frees are the
    /// stream's events), handing them to the target whenever [`MAX_PENDING_OPS`] are waiting.
    fn ops_until(&mut self, step: usize) -> Result<(), RunError> {
        while self.next_step < step.min(self.steps.len()) {
            let at = self.next_step as u64;
            match self.steps[self.next_step] {
                Step::MatVec { matrix, input, output, rows, cols } => self.matvec([matrix, input, output], rows, cols),
                Step::Copy { src, dst, len_bytes } => self.copy(src, dst, len_bytes),
                Step::Alloc { .. } | Step::Free { .. } => {}
            }
            self.next_step += 1;
            if self.pending.len() >= MAX_PENDING_OPS {
                self.flush(at)?;
            }
        }
        Ok(())
    }

    /// Whether event `event` frees.
    fn frees(&self, event: usize) -> bool {
        match self.event_steps.get(event) {
            Some(&step) => self.steps.get(step as usize).is_none_or(|step| matches!(step, Step::Free { .. })),
            None => false,
        }
    }

    /// Whether event `event` is a free that follows another with no step between them. The frees after the last
    /// step (what lived to the end) are a run of their own.
    fn continues_a_run_of_frees(&self, event: usize) -> bool {
        let end = self.steps.len() as u64;
        event > 0
            && self.frees(event)
            && self.frees(event - 1)
            && (self.event_steps[event - 1] + 1 == self.event_steps[event]
                || self.event_steps[event - 1] == end && self.event_steps[event] == end)
    }

    /// Queues the verifies of every region of allocation `id` (freed at step `at`).
    fn queue_verify(&mut self, id: u32, at: u64) {
        let Some(live) = self.live.get(&id) else { return };
        for region in &live.regions {
            // The requested bytes it covers (its last word may reach into the footprint past them).
            let requested_bytes = region.len_bytes.min(live.size_bytes.saturating_sub(region.offset_bytes));
            self.pending.push(Op::Verify {
                target: live.handle,
                offset_bytes: region.offset_bytes,
                len_bytes: region.len_bytes,
                id: region.id,
            });
            self.checks.push((id, at, u32::try_from(region.offset_bytes / 4).unwrap_or(u32::MAX)));
            self.report.ops.verifies += 1;
            self.report.ops.bytes_verified = self.report.ops.bytes_verified.saturating_add(requested_bytes);
        }
    }

    /// Hands the pending ops to the target and sums up their verifies.
    fn flush(&mut self, at: u64) -> Result<(), RunError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let results = self.target.run(&self.pending).map_err(|error| RunError::of_target(at, &error))?;
        if results.len() != self.checks.len() {
            return Err(RunError::at(
                at,
                format!("the target returned {} verify results for {} verifies", results.len(), self.checks.len()),
            ));
        }
        for (&(id, step, region_word), result) in self.checks.iter().zip(&results) {
            self.report.mismatches += u64::from(result.mismatches);
            if !result.is_clean() && self.report.first_mismatch.is_none() {
                // The kernel counts from the region's start; a region of a copied allocation starts further in.
                let first_mismatch = result.first_mismatch.map(|word| word.saturating_add(region_word));
                self.report.first_mismatch = Some((id, step, VerifyResult { first_mismatch, ..*result }));
            }
        }
        self.pending.clear();
        self.checks.clear();
        self.report.batches += 1;
        Ok(())
    }

    /// `output = matrix x input` over what the three hold in their first regions.
    fn matvec(&mut self, [matrix, input, output]: [u32; 3], rows: u32, cols: u32) {
        let first = |id: u32| self.live.get(&id).map(|live| (live.handle, live.regions.first().copied()));
        let (Some(a), Some(x), Some(y)) = (first(matrix), first(input), first(output)) else {
            self.report.skipped_steps += 1;
            return;
        };
        let (Some(a_region), Some(x_region), Some(y_region)) = (a.1, x.1, y.1) else { return };
        let words = |region: Region| u32::try_from(region.len_bytes / 4).unwrap_or(u32::MAX);
        let cols = cols.min(words(x_region));
        let rows = rows.min(words(y_region)).min(words(a_region).checked_div(cols).unwrap_or(0));
        if rows == 0 || cols == 0 {
            return;
        }
        self.pending.push(Op::MatVec {
            matrix: a.0,
            matrix_offset_bytes: 0,
            input: x.0,
            input_offset_bytes: 0,
            output: y.0,
            output_offset_bytes: 0,
            rows,
            cols,
            ids: MatVecIds { matrix: a_region.id, input: x_region.id, output: y_region.id },
        });
        self.report.ops.matvecs += 1;
    }

    /// Copies the front of `src` into `dst`; the rest of `dst` is refilled with its own pattern.
    fn copy(&mut self, src: u32, dst: u32, len_bytes: u64) {
        let (Some(from), Some(to)) = (self.live.get(&src), self.live.get(&dst)) else {
            self.report.skipped_steps += 1;
            return;
        };
        let (src_handle, dst_handle) = (from.handle, to.handle);
        let dst_words_bytes = whole_words_bytes(to.size_bytes);
        let len = whole_words_bytes(len_bytes.min(from.size_bytes).min(to.size_bytes));
        let mut regions: Vec<Region> = from
            .regions
            .iter()
            .filter(|region| region.offset_bytes < len)
            .map(|region| Region { len_bytes: region.len_bytes.min(len - region.offset_bytes), ..*region })
            .collect();
        if len > 0 {
            self.pending.push(Op::Copy {
                src: src_handle,
                src_offset_bytes: 0,
                dst: dst_handle,
                dst_offset_bytes: 0,
                len_bytes: len,
            });
            self.report.ops.copies += 1;
        }
        if dst_words_bytes > len {
            let tail = Region { offset_bytes: len, len_bytes: dst_words_bytes - len, id: dst };
            self.pending.push(Op::Fill {
                target: dst_handle,
                offset_bytes: tail.offset_bytes,
                len_bytes: tail.len_bytes,
                id: dst,
            });
            self.report.ops.fills += 1;
            regions.push(tail);
        }
        if let Some(to) = self.live.get_mut(&dst) {
            to.regions = regions;
        }
    }
}

impl<T: Target> DriverTarget for KernelDriver<'_, T> {
    type Handle = Placed<T::Handle>;

    fn before_event(&mut self, event: u64) -> heapscope_core::Result<()> {
        let event = usize::try_from(event).unwrap_or(usize::MAX);
        self.event = event;
        self.retrying = None;
        let step = self.step();
        self.ops_until(usize::try_from(step).unwrap_or(usize::MAX)).map_err(|error| self.fail(error))?;
        if self.pending.len() >= MAX_PENDING_OPS {
            self.flush(step).map_err(|error| self.fail(error))?;
        }
        if !self.frees(event) {
            return Ok(());
        }
        if self.refused.remove(&self.event_ids[event]) && step < self.steps.len() as u64 {
            // The free step of an allocation the target refused: nothing to free (one meant to live to the end
            // has no free step).
            self.report.skipped_steps += 1;
        }
        if !self.continues_a_run_of_frees(event) {
            // A run of frees opens: everything it frees is verified in one batch first.
            let mut next = event;
            while next == event || self.continues_a_run_of_frees(next) {
                self.queue_verify(self.event_ids[next], self.event_steps[next]);
                next += 1;
            }
            self.flush(step).map_err(|error| self.fail(error))?;
        }
        Ok(())
    }

    fn allocate(&mut self, request: Request) -> heapscope_core::Result<Result<Self::Handle, Option<OomVerdict>>> {
        let (id, at, size_bytes) = (self.event_ids[self.event], self.step(), request.size_bytes());
        match self.target.allocate(size_bytes) {
            Ok(handle) => {
                if let Some((refused, was_first)) = self.retrying.take()
                    && refused == id
                {
                    // Served on the second try, after compacting: no refusal after all.
                    self.report.ooms -= 1;
                    self.refused.remove(&id);
                    if was_first {
                        self.report.first_oom = None;
                    }
                    if let Some(compaction) = &mut self.report.compaction {
                        compaction.ooms_avoided += 1;
                    }
                }
                self.live_bytes = self.live_bytes.saturating_add(size_bytes);
                self.report.allocs += 1;
                self.report.peak_live_bytes = self.report.peak_live_bytes.max(self.live_bytes);
                self.report.peak_reserved_bytes = self.report.peak_reserved_bytes.max(self.target.reserved_bytes());
                // Whole words, the last one reaching past the requested bytes into the footprint (every target's
                // allocations cover their last word: see `Target`), so that every requested byte is filled and verified.
                let words_bytes = whole_words_bytes(size_bytes);
                let mut regions = Vec::new();
                if words_bytes > 0 {
                    self.pending.push(Op::Fill { target: handle, offset_bytes: 0, len_bytes: words_bytes, id });
                    self.report.ops.fills += 1;
                    regions.push(Region { offset_bytes: 0, len_bytes: words_bytes, id });
                }
                self.live.insert(id, Live { handle, size_bytes, regions });
                let allocation = Allocation::from_parts(
                    self.owner,
                    AllocationId(u64::from(id)),
                    0,
                    size_bytes,
                    (0, size_bytes),
                    ResourceKind::Linear,
                );
                Ok(Ok(Placed { handle, id, allocation }))
            }
            Err(TargetError::OutOfMemory(verdict)) => {
                match self.retrying {
                    // Refused again after compacting: the same refusal, counted once (as a replay's statistics count
                    // it), with the verdict of the heap as the compaction left it.
                    Some((refused, was_first)) if refused == id => {
                        if was_first {
                            self.report.first_oom = Some((at, (*verdict).clone()));
                        }
                    }
                    _ => {
                        self.retrying = Some((id, self.report.first_oom.is_none()));
                        self.report.ooms += 1;
                        self.report.first_oom.get_or_insert((at, (*verdict).clone()));
                        self.refused.insert(id);
                    }
                }
                Ok(Err(Some(*verdict)))
            }
            Err(error @ (TargetError::Failed(_) | TargetError::DeviceLimit(_))) => {
                Err(self.fail(RunError::of_target(at, &error)))
            }
        }
    }

    fn free(&mut self, placed: Self::Handle) -> heapscope_core::Result<()> {
        let at = self.step();
        let Some(live) = self.live.remove(&placed.id) else {
            return Err(self.fail(RunError::at(at, format!("free of allocation {}, which is not live", placed.id))));
        };
        if let Err(error) = self.target.free(live.handle) {
            return Err(self.fail(RunError::of_target(at, &error)));
        }
        self.live_bytes = self.live_bytes.saturating_sub(live.size_bytes);
        if at < self.steps.len() as u64 {
            // The workload's frees (what lives to the end is freed after the last step, not counted).
            self.report.frees += 1;
        }
        Ok(())
    }

    fn allocation(placed: &Self::Handle) -> &Allocation {
        &placed.allocation
    }

    fn footprint_end(_placed: &Self::Handle) -> u64 {
        0
    }

    fn take_device_events(&mut self) -> Vec<DeviceEvent> {
        self.target.take_device_events()
    }

    fn compact_rule(&self) -> CompactRule {
        self.target.compact_rule()
    }

    /// Every pending op runs first (nothing may touch an allocation while it moves); the target moves and copies;
    /// each moved allocation keeps its id and what it should hold, at its new place.
    fn compact(
        &mut self,
        live: &[(Self::Handle, Request)],
        for_refused: bool,
    ) -> heapscope_core::Result<Vec<(usize, Self::Handle)>> {
        let at = self.step();
        self.flush(at).map_err(|error| self.fail(error))?;
        let handles: Vec<(T::Handle, u64)> = live.iter().map(|(placed, request)| (placed.handle, request.size_bytes())).collect();
        let moves = match self.target.compact(&handles, for_refused) {
            Ok(moves) => moves,
            Err(error) => return Err(self.fail(RunError::of_target(at, &error))),
        };
        let mut moved = Vec::with_capacity(moves.len());
        for (index, handle) in moves {
            let Some((before, request)) = live.get(index) else { continue };
            let placed = Placed { handle, ..*before };
            if let Some(entry) = self.live.get_mut(&placed.id) {
                entry.handle = handle;
            }
            if let Some(compaction) = &mut self.report.compaction {
                compaction.moves += 1;
                if self.target.moves_by_remap() {
                    compaction.bytes_remapped = compaction.bytes_remapped.saturating_add(request.size_bytes());
                } else {
                    compaction.bytes_moved = compaction.bytes_moved.saturating_add(request.size_bytes());
                }
            }
            moved.push((index, placed));
        }
        // Each moved allocation is verified where it now is: one freed in a run of frees opened before the move was
        // verified at its old place only.
        for (_, placed) in &moved {
            self.queue_verify(placed.id, at);
        }
        self.flush(at).map_err(|error| self.fail(error))?;
        Ok(moved)
    }
}

/// `size_bytes` in whole 4-byte words, the kernels' unit: rounded up (past 2^64 - 4, down).
fn whole_words_bytes(size_bytes: u64) -> u64 {
    size_bytes.checked_next_multiple_of(4).unwrap_or(size_bytes / 4 * 4)
}
