//! The runner on a CPU target that really keeps the words (each allocation its own buffer, ops executed by the
//! kernels' CPU twins), and on the simulated heaps.

use std::collections::HashMap;

use heapscope_core::OomCause;

use super::*;
use crate::workload::{
    ChurnConfig, KvLayout, ServeConfig, ServeModel, Step, TrainConfig, TrainModel, Workload, churn, serve, train,
};
use crate::{Op, VerifyResult, matvec_words, pattern_word, verify_words};
use heapscope_lab::compaction::CompactRule;
use heapscope_lab::contender::Contender;

/// Words on the CPU. With `alias_every = Some(n)`, every n-th allocation is handed the words of the previous one
/// still live (a broken allocator: two live allocations overlap). An op on a freed allocation is a failure, so
/// the tests see the runner's order.
#[derive(Debug, Default)]
struct CpuTarget {
    buffers: HashMap<usize, Vec<u32>>,
    /// Allocation handle -> buffer.
    handles: HashMap<usize, (usize, u64)>,
    next: usize,
    alias_every: Option<usize>,
    reserved_bytes: u64,
    runs: u64,
    /// The target fails every run after this many (a device lost mid-run).
    runs_before_failing: Option<u64>,
    /// Mismatches its verifies found so far.
    mismatches: u64,
    /// Calls of `finish`, and whether it fails.
    finished: u64,
    finish_fails: bool,
    /// When it compacts: each pass moves every live allocation to a new buffer, its words copied (with the first
    /// word of each copy damaged when `broken_copy`).
    compact: CompactRule,
    broken_copy: bool,
}

impl CpuTarget {
    fn words(&mut self, handle: usize) -> Result<&mut Vec<u32>, TargetError> {
        let (buffer, _) =
            *self.handles.get(&handle).ok_or_else(|| TargetError::Failed(format!("op on freed allocation {handle}")))?;
        self.buffers.get_mut(&buffer).ok_or_else(|| TargetError::Failed(format!("buffer {buffer} is gone")))
    }
}

impl Target for CpuTarget {
    type Handle = usize;

    fn allocate(&mut self, size_bytes: u64) -> Result<usize, TargetError> {
        let handle = self.next;
        self.next += 1;
        // Its last word whole, as every heap's footprint covers it (see `Target`).
        let words = size_bytes.div_ceil(4) as usize;
        let alias = self.alias_every.is_some_and(|n| handle % n == n - 1);
        let shared = alias
            .then(|| {
                self.handles.values().filter(|(buffer, _)| self.buffers[buffer].len() >= words).map(|&(buffer, _)| buffer).max()
            })
            .flatten();
        let buffer = shared.unwrap_or_else(|| {
            self.buffers.insert(handle, vec![0; words]);
            handle
        });
        self.handles.insert(handle, (buffer, size_bytes));
        self.reserved_bytes += size_bytes;
        Ok(handle)
    }

    fn free(&mut self, handle: usize) -> Result<(), TargetError> {
        let (buffer, size) =
            self.handles.remove(&handle).ok_or_else(|| TargetError::Failed(format!("double free of {handle}")))?;
        if !self.handles.values().any(|&(other, _)| other == buffer) {
            self.buffers.remove(&buffer);
        }
        self.reserved_bytes -= size;
        Ok(())
    }

    fn run(&mut self, ops: &[Op<usize>]) -> Result<Vec<VerifyResult>, TargetError> {
        if self.runs_before_failing.is_some_and(|runs| self.runs >= runs) {
            return Err(TargetError::Failed("the device was lost".into()));
        }
        self.runs += 1;
        let mut results = Vec::new();
        for op in ops {
            match *op {
                Op::Fill { target, offset_bytes, len_bytes, id } => {
                    let at = (offset_bytes / 4) as usize;
                    let words = self.words(target)?;
                    for (index, word) in (0..).zip(&mut words[at..at + (len_bytes / 4) as usize]) {
                        *word = pattern_word(id, index);
                    }
                }
                Op::Verify { target, offset_bytes, len_bytes, id } => {
                    let at = (offset_bytes / 4) as usize;
                    let words = self.words(target)?;
                    let result = verify_words(id, &words[at..at + (len_bytes / 4) as usize]);
                    self.mismatches += u64::from(result.mismatches);
                    results.push(result);
                }
                Op::Copy { src, src_offset_bytes, dst, dst_offset_bytes, len_bytes } => {
                    let (from, len) = ((src_offset_bytes / 4) as usize, (len_bytes / 4) as usize);
                    let copied = self.words(src)?[from..from + len].to_vec();
                    let to = (dst_offset_bytes / 4) as usize;
                    self.words(dst)?[to..to + len].copy_from_slice(&copied);
                }
                Op::MatVec { matrix, input, output, rows, cols, ids, .. } => {
                    let a = self.words(matrix)?[..(rows * cols) as usize].to_vec();
                    let x = self.words(input)?[..cols as usize].to_vec();
                    let y = matvec_words(&a, &x, cols, 0, ids);
                    self.words(output)?[..rows as usize].copy_from_slice(&y);
                }
            }
        }
        Ok(results)
    }

    fn reserved_bytes(&self) -> u64 {
        self.reserved_bytes
    }

    fn runs_kernels(&self) -> bool {
        true
    }

    fn compact_rule(&self) -> CompactRule {
        self.compact
    }

    fn compact(&mut self, live: &[(usize, u64)], _for_refused: bool) -> Result<Vec<(usize, usize)>, TargetError> {
        let mut moves = Vec::new();
        for (index, &(handle, size_bytes)) in live.iter().enumerate() {
            let mut words = self.words(handle)?.clone();
            if self.broken_copy
                && let Some(first) = words.first_mut()
            {
                *first ^= 1;
            }
            self.free(handle)?;
            let moved = self.allocate(size_bytes)?;
            *self.words(moved)? = words;
            moves.push((index, moved));
        }
        Ok(moves)
    }

    fn finish(&mut self) -> Result<(), TargetError> {
        self.finished += 1;
        if self.finish_fails { Err(TargetError::Failed("device lost while waiting for binds".into())) } else { Ok(()) }
    }
}

fn small_serve(kv: KvLayout) -> Workload {
    let model = ServeModel { weights_bytes: 1 << 20, kv_bytes_per_token: 1024, vocab: 512, hidden: 64, ..ServeModel::default() };
    serve(&ServeConfig { steps: 120, kv, seed: 3, model })
}

fn small_train(checkpointing: bool) -> Workload {
    let model = TrainModel { layers: 2, hidden: 32, heads: 2, vocab: 256, seq_range: (16, 48), element_bytes: 4 };
    train(&TrainConfig { steps: 2, batch: 2, checkpointing, seed: 4, model })
}

/// Every workload kind on real words: nothing damaged, every allocation verified before its free, copies and
/// matvecs checked through what they leave behind.
#[test]
fn workloads_on_the_cpu_target_verify_clean() {
    let churned = churn(&ChurnConfig { steps: 300, size_range: (256, 64 << 10), ..ChurnConfig::new(2) });
    for workload in
        [small_serve(KvLayout::Paged), small_serve(KvLayout::Contiguous), small_train(false), small_train(true), churned]
    {
        let stats = workload.check().unwrap();
        let mut target = CpuTarget::default();
        let report = run(&workload, &mut target).unwrap();
        assert_eq!(report.mismatches, 0, "{}: {:?}", workload.name, report.first_mismatch);
        assert!(report.kernels_ran);
        assert_eq!((report.allocs, report.frees, report.ooms), (stats.allocs, stats.frees, 0), "{}", workload.name);
        assert_eq!(report.peak_live_bytes, stats.peak_live_bytes);
        assert_eq!(report.ops.matvecs, stats.matvecs, "{}", workload.name);
        assert_eq!(report.ops.copies, stats.copies, "{}", workload.name);
        // One fill per allocation, one more per copy that leaves a tail; at least one verify per allocation.
        assert_eq!(report.ops.fills, stats.allocs + stats.copies, "{}", workload.name);
        assert!(report.ops.verifies >= stats.allocs, "{}", workload.name);
        assert!(target.handles.is_empty() && target.buffers.is_empty(), "{}: everything freed", workload.name);
        assert!(report.batches < report.allocs, "{}: batched ({} batches)", workload.name, report.batches);
    }
}

/// A compaction inside a run of frees (verified in one batch when the run opens) moves allocations the run frees later:
/// each moved allocation is verified at its new place, so a copy that damages it is caught (it was freed unchecked).
#[test]
fn allocations_moved_inside_a_run_of_frees_are_verified_where_they_moved() {
    let mut steps: Vec<Step> = (0..6).map(|id| Step::Alloc { id, size_bytes: 1 << 20, forever: false }).collect();
    steps.extend((0..6).map(|id| Step::Free { id }));
    let workload = Workload { name: "six then their frees".into(), steps, moments: Vec::new() };
    for broken_copy in [false, true] {
        let mut target = CpuTarget { compact: CompactRule::Every(1), broken_copy, ..CpuTarget::default() };
        let report = run(&workload, &mut target).unwrap();
        let compaction = report.compaction.unwrap();
        assert!(compaction.moves > 6, "broken copy {broken_copy}: moves inside the run of frees ({})", compaction.moves);
        assert!(report.ops.bytes_verified > 6 << 20, "broken copy {broken_copy}: moved allocations verified again");
        assert_eq!(report.mismatches > 0, broken_copy, "broken copy {broken_copy}: {:?}", report.first_mismatch);
        if broken_copy {
            let (_, _, result) = report.first_mismatch.unwrap();
            assert_eq!(result.first_mismatch, Some(0), "the damaged word, from the allocation's start");
        }
    }
}

/// A broken allocator (two live allocations share words) is caught by the verifies.
/// What a target queued and nothing waited for (a paged run's last unbinds) is waited for once, before the run's wall
/// time is taken (it was not: a paged run finished long after its timer stopped); a failure there fails the run.
#[test]
fn the_run_waits_for_what_the_target_queued() {
    let workload = small_serve(KvLayout::Contiguous);
    let mut target = CpuTarget::default();
    run(&workload, &mut target).unwrap();
    assert_eq!(target.finished, 1);
    let mut failing = CpuTarget { finish_fails: true, ..CpuTarget::default() };
    let error = run(&workload, &mut failing).unwrap_err();
    assert!(error.to_string().contains("device lost while waiting for binds"), "{error}");
}

#[test]
fn overlapping_allocations_are_caught() {
    let workload = small_serve(KvLayout::Contiguous);
    let mut target = CpuTarget { alias_every: Some(7), ..CpuTarget::default() };
    let report = run(&workload, &mut target).unwrap();
    assert!(report.mismatches > 0, "{report:?}");
    let (id, step, result) = report.first_mismatch.unwrap();
    assert!(!result.is_clean());
    assert!(matches!(workload.steps[step as usize], Step::Free { .. }) || step == workload.steps.len() as u64, "{id} at {step}");
}

/// Sizes that are no multiple of 4 are filled and verified to their last byte: the word holding it is the kernels' too
/// (a 3-byte allocation was never filled nor verified, and the last 1 to 3 bytes of any other were left out), so two
/// 3-byte allocations handed the same word are caught, and the bytes verified are the bytes requested.
#[test]
fn the_last_bytes_of_odd_sizes_are_verified() {
    let steps = vec![
        Step::Alloc { id: 0, size_bytes: 3, forever: false },
        Step::Alloc { id: 1, size_bytes: 3, forever: false },
        Step::Alloc { id: 2, size_bytes: 4099, forever: false },
        Step::Free { id: 0 },
        Step::Free { id: 1 },
        Step::Free { id: 2 },
    ];
    let workload = Workload { name: "odd sizes".into(), steps, moments: Vec::new() };
    let clean = run(&workload, &mut CpuTarget::default()).unwrap();
    assert_eq!((clean.mismatches, clean.ops.fills, clean.ops.bytes_verified), (0, 3, 3 + 3 + 4099));
    // The second allocation is handed the first's word: its fill overwrites the first's 3 bytes.
    let report = run(&workload, &mut CpuTarget { alias_every: Some(2), ..CpuTarget::default() }).unwrap();
    assert!(report.mismatches > 0, "{report:?}");
    assert_eq!(report.first_mismatch.map(|(id, _, result)| (id, result.first_mismatch)), Some((0, Some(0))));
}

/// A run that fails after verifies found mismatches says how many they found (live mode shows a stopped or failed
/// run's count): the broken allocator's run, failing at each later batch in turn, reports exactly what the batches
/// before the failure found.
#[test]
fn a_failed_run_keeps_the_mismatches_found_before_it() {
    let workload = small_serve(KvLayout::Contiguous);
    let mut whole = CpuTarget { alias_every: Some(7), ..CpuTarget::default() };
    let report = run(&workload, &mut whole).unwrap();
    let mut checked = 0;
    for runs in [whole.runs / 4, whole.runs / 2, whole.runs - 1] {
        let mut target = CpuTarget { alias_every: Some(7), runs_before_failing: Some(runs), ..CpuTarget::default() };
        let error = run(&workload, &mut target).unwrap_err();
        assert!(error.message.contains("the device was lost"), "{error}");
        assert_eq!(error.mismatches, target.mismatches, "failing after {runs} runs");
        assert!(error.mismatches <= report.mismatches);
        checked += u64::from(error.mismatches > 0);
    }
    assert!(checked > 0, "some failure came after a mismatch: {report:?}");
}

/// Simulated heaps: the same stream through every contender; no kernels, so no mismatch, said as such.
#[test]
fn simulated_runs_skip_the_kernels() {
    let workload = small_train(false);
    let stats = workload.check().unwrap();
    for policy in Contender::BENCH {
        let report = run_simulated(&workload, policy, &BenchSettings::new(None)).unwrap();
        assert!(!report.kernels_ran && report.mismatches == 0, "{policy}");
        assert_eq!((report.allocs, report.ooms, report.peak_live_bytes), (stats.allocs, 0, stats.peak_live_bytes), "{policy}");
        assert!(report.peak_reserved_bytes >= report.peak_live_bytes, "{policy}: {report:?}");
    }
}

/// Under a budget too small, allocations are refused with a verdict, the steps on them skipped, the run goes on.
#[test]
fn refused_allocations_are_counted_and_skipped() {
    let workload = small_serve(KvLayout::Paged);
    let peak = workload.check().unwrap().peak_live_bytes;
    let settings = BenchSettings::new(Some(peak / 2));
    let report = run_simulated(&workload, Contender::Heap(heapscope_core::PolicyKind::Tlsf), &settings).unwrap();
    assert!(report.ooms > 0 && report.skipped_steps >= report.ooms, "{report:?}");
    let (step, verdict) = report.first_oom.as_ref().unwrap();
    assert!(matches!(workload.steps[*step as usize], Step::Alloc { .. }));
    assert!(verdict.reserved_bytes <= peak / 2, "{verdict}");
}

/// A request refused, compacted for and refused again is one refusal: every allocation of the stream is served or
/// refused once, whatever the compaction rule (it was counted twice when the retry failed too).
#[test]
fn a_refusal_that_compaction_does_not_save_is_counted_once() {
    let workload = churn(&ChurnConfig { steps: 300, ..ChurnConfig::new(1) });
    let requests = workload.check().unwrap().allocs;
    for kind in [heapscope_core::PolicyKind::Tlsf, heapscope_core::PolicyKind::BestFit, heapscope_core::PolicyKind::FirstFit] {
        let mut refusals_by_rule = Vec::new();
        for compact in [CompactRule::Never, CompactRule::OnOom, CompactRule::Every(7)] {
            let settings = BenchSettings { compact, ..BenchSettings::new(Some(64 << 20)) };
            let report = run_simulated(&workload, Contender::Heap(kind), &settings).unwrap();
            assert_eq!(report.allocs + report.ooms, requests, "{kind:?}, {compact:?}: {report:?}");
            let avoided = report.compaction.as_ref().map_or(0, |compaction| compaction.ooms_avoided);
            refusals_by_rule.push((compact, report.ooms, avoided));
        }
        // Compacting on a refusal refuses no more than never compacting, and some refusal happens at this budget.
        let [(_, never, _), (_, on_oom, avoided), _] = refusals_by_rule[..] else { unreachable!() };
        assert!(never > 0 && on_oom <= never && avoided <= never, "{kind:?}: {refusals_by_rule:?}");
    }
}

/// The serve story under its default budget, without a device: `pytorch` runs out of memory from internal waste (a
/// 2 MiB block needs a new 20 MiB segment where 18 MiB are left), `paged` completes.
#[test]
fn serve_default_budget_tells_its_story() {
    let workload = serve(&ServeConfig::new(1));
    let settings = BenchSettings::new(Some(ServeConfig::DEFAULT_BUDGET_BYTES));
    let pytorch = run_simulated(&workload, Contender::Pytorch { expandable: false }, &settings).unwrap();
    let paged = run_simulated(&workload, Contender::Paged, &settings).unwrap();
    assert!(pytorch.ooms > 0, "{pytorch:?}");
    let (_, verdict) = pytorch.first_oom.as_ref().unwrap();
    assert_eq!((verdict.cause, verdict.needed_bytes), (OomCause::InternalWaste, 20 << 20), "{verdict:?}");
    assert_eq!(paged.ooms, 0, "{:?}", paged.first_oom);
    assert!(paged.peak_reserved_bytes <= ServeConfig::DEFAULT_BUDGET_BYTES);
}
