//! Workloads that behave like GPU programs: deterministic streams of alloc / free / compute steps, device-free.
//!
//! A [`Workload`] is a list of [`Step`]s over allocation ids (`u32`, never reused, also the id each allocation's
//! pattern is derived from). The generators — [`train`], [`serve`], [`churn`] and [`replay`] — build them from a
//! seed and a few knobs; [`Workload::check`] says whether a stream is well formed (no step on a dead id, nothing
//! left live at the end but what is marked to live forever) and what it asks of memory ([`StreamStats`]). The
//! bench runner (`crate::bench`) plays a stream on a target: allocations filled with their pattern, computed on,
//! copied, verified before they are freed.

mod churn;
mod replay;
mod serve;
mod train;

use std::collections::HashMap;
use std::fmt;

use heapscope_core::trace::{Trace, TraceBuilder};
use heapscope_lab::recording::Moment;

pub use churn::{ChurnConfig, churn};
pub use heapscope_core::rng::Rng;
pub use replay::replay;
pub use serve::{KvLayout, ServeConfig, ServeModel, serve};
pub use train::{TrainConfig, TrainModel, train};

/// One step of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Allocate `size_bytes` as allocation `id`.
    Alloc {
        /// The new allocation's id (never used before).
        id: u32,
        /// Bytes.
        size_bytes: u64,
        /// It stays live to the end (model weights, optimizer state).
        forever: bool,
    },
    /// Free allocation `id`.
    Free {
        /// A live allocation.
        id: u32,
    },
    /// The compute payload `output = matrix x input` (the matvec kernel) over the first `rows x cols` words of
    /// `matrix`, `cols` words of `input` and `rows` words of `output`.
    MatVec {
        /// A (read).
        matrix: u32,
        /// x (read).
        input: u32,
        /// y (written; not `matrix` or `input`).
        output: u32,
        /// Rows.
        rows: u32,
        /// Columns.
        cols: u32,
    },
    /// Copy the first `len_bytes` of `src` to the start of `dst` (a KV cache moved into a larger one).
    Copy {
        /// The source.
        src: u32,
        /// The destination (not `src`).
        dst: u32,
        /// Bytes, a multiple of 4.
        len_bytes: u64,
    },
}

/// A named stream of steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// What it is, with its knobs (`serve (paged KV, 16 tokens a block), 200 steps, seed 1`).
    pub name: String,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// A replay's: the recording's moment of each step (the entry it replays; the frees of what the recording left
    /// live, its last entry). Empty for a workload of its own, whose moments are its steps ([`Workload::moment_of`]).
    pub moments: Vec<Moment>,
}

impl Workload {
    /// Step `step`'s moment: in the recording a replay comes from, else the step itself as an entry.
    pub fn moment_of(&self, step: u64) -> Moment {
        usize::try_from(step).ok().and_then(|index| self.moments.get(index)).copied().unwrap_or(Moment::Entry(step))
    }
}

/// What a well-formed stream asks of memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Allocation steps.
    pub allocs: u64,
    /// Free steps.
    pub frees: u64,
    /// Matvec steps.
    pub matvecs: u64,
    /// Copy steps.
    pub copies: u64,
    /// The most bytes live at once.
    pub peak_live_bytes: u64,
    /// Bytes of the allocations that live forever.
    pub forever_bytes: u64,
    /// Bytes allocated over the whole stream.
    pub allocated_bytes: u64,
}

/// Why a stream is not well formed: the step and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("step {step}: {what}")]
pub struct StreamError {
    /// Index of the step.
    pub step: usize,
    /// What is wrong.
    pub what: String,
}

impl Workload {
    /// Checks the stream and sums it up: every id allocated once with a non-zero size, every free and compute
    /// step on live ids, a matvec's shape inside its operands and its output distinct from them, a copy between
    /// two live allocations within both, and at the end exactly the allocations marked `forever` still live.
    ///
    /// # Errors
    /// The first step that breaks a rule (the end of the stream is step `steps.len()`).
    pub fn check(&self) -> Result<StreamStats, StreamError> {
        let mut stats = StreamStats::default();
        let mut live: HashMap<u32, (u64, bool)> = HashMap::new();
        let mut seen = std::collections::HashSet::new();
        let mut live_bytes = 0u64;
        for (index, step) in self.steps.iter().enumerate() {
            let fail = |what: String| StreamError { step: index, what };
            let size_of =
                |id: u32| live.get(&id).map(|&(size, _)| size).ok_or_else(|| fail(format!("allocation {id} is not live")));
            match *step {
                Step::Alloc { id, size_bytes, forever } => {
                    if !seen.insert(id) {
                        return Err(fail(format!("allocation {id} allocated twice")));
                    }
                    if size_bytes == 0 {
                        return Err(fail(format!("allocation {id} of 0 bytes")));
                    }
                    live.insert(id, (size_bytes, forever));
                    // Saturated: a recording may hold requests near 2^64 bytes (they are refused, not summed wide).
                    live_bytes = live_bytes.saturating_add(size_bytes);
                    stats.allocs += 1;
                    stats.allocated_bytes = stats.allocated_bytes.saturating_add(size_bytes);
                    stats.peak_live_bytes = stats.peak_live_bytes.max(live_bytes);
                    if forever {
                        stats.forever_bytes = stats.forever_bytes.saturating_add(size_bytes);
                    }
                }
                Step::Free { id } => {
                    let (size, forever) = live.remove(&id).ok_or_else(|| fail(format!("free of allocation {id}, not live")))?;
                    if forever {
                        return Err(fail(format!("free of allocation {id}, which lives forever")));
                    }
                    live_bytes = live_bytes.saturating_sub(size);
                    stats.frees += 1;
                }
                Step::MatVec { matrix, input, output, rows, cols } => {
                    let (a, x, y) = (size_of(matrix)?, size_of(input)?, size_of(output)?);
                    if output == matrix || output == input {
                        return Err(fail(format!("matvec writes {output}, one of its inputs")));
                    }
                    let (rows, cols) = (u64::from(rows), u64::from(cols));
                    if rows * cols * 4 > a || cols * 4 > x || rows * 4 > y {
                        return Err(fail(format!("matvec {rows} x {cols} runs past {matrix}, {input} or {output}")));
                    }
                    stats.matvecs += 1;
                }
                Step::Copy { src, dst, len_bytes } => {
                    let (from, to) = (size_of(src)?, size_of(dst)?);
                    if src == dst || len_bytes % 4 != 0 || len_bytes > from.min(to) {
                        return Err(fail(format!("copy of {len_bytes} bytes from {src} ({from} B) to {dst} ({to} B)")));
                    }
                    stats.copies += 1;
                }
            }
        }
        if let Some((&id, _)) = live.iter().find(|(_, (_, forever))| !*forever) {
            return Err(StreamError { step: self.steps.len(), what: format!("allocation {id} is still live at the end") });
        }
        Ok(stats)
    }
}

/// A workload's allocations and frees as a trace ([`Workload::trace`]), with where each event comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadTrace {
    /// The events: the steps' allocations and frees, then a free of every allocation still live at the end (in id
    /// order). Slot `n` is the `n`-th allocation.
    pub trace: Trace,
    /// The step of each event (the final frees: the number of steps).
    pub steps: Vec<u64>,
    /// The allocation id of each event.
    pub ids: Vec<u32>,
}

impl Workload {
    /// The stream's allocations and frees as a trace the lab's driver replays (the bench runner does: see
    /// `crate::bench`), then the frees of what is still live at the end, in id order.
    ///
    /// # Errors
    /// A free of an allocation that is not live, an allocation of a live id or of 0 bytes: the step and what is
    /// wrong.
    pub fn trace(&self) -> Result<WorkloadTrace, StreamError> {
        let mut builder = TraceBuilder::new(self.name.clone());
        let (mut steps, mut ids) = (Vec::new(), Vec::new());
        let mut live = std::collections::BTreeSet::new();
        for (index, step) in self.steps.iter().enumerate() {
            let fail = |error: heapscope_core::BadEvent| StreamError { step: index, what: error.to_string() };
            let id = match *step {
                Step::Alloc { id, size_bytes, .. } => {
                    builder.alloc(u64::from(id), size_bytes).map_err(fail)?;
                    live.insert(id);
                    id
                }
                Step::Free { id } => {
                    builder.free(u64::from(id)).map_err(fail)?;
                    live.remove(&id);
                    id
                }
                Step::MatVec { .. } | Step::Copy { .. } => continue,
            };
            steps.push(index as u64);
            ids.push(id);
        }
        for id in live {
            builder.free(u64::from(id)).map_err(|error| StreamError { step: self.steps.len(), what: error.to_string() })?;
            steps.push(self.steps.len() as u64);
            ids.push(id);
        }
        Ok(WorkloadTrace { trace: builder.finish(), steps, ids })
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Columns and rows of a matvec at most: 16 Ki multiply-adds a step, real work that stays quick on a CPU
/// device.
pub const MATVEC_MAX_SIDE: u32 = 128;

/// Builds a stream: fresh ids, sizes remembered for matvec shapes.
#[derive(Debug, Default)]
pub(crate) struct StreamBuilder {
    steps: Vec<Step>,
    next_id: u32,
    sizes: HashMap<u32, u64>,
}

impl StreamBuilder {
    /// A new allocation of `size_bytes`.
    pub(crate) fn alloc(&mut self, size_bytes: u64) -> u32 {
        self.push_alloc(size_bytes, false)
    }

    /// A new allocation that lives to the end.
    pub(crate) fn alloc_forever(&mut self, size_bytes: u64) -> u32 {
        self.push_alloc(size_bytes, true)
    }

    fn push_alloc(&mut self, size_bytes: u64, forever: bool) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.sizes.insert(id, size_bytes);
        self.steps.push(Step::Alloc { id, size_bytes, forever });
        id
    }

    pub(crate) fn free(&mut self, id: u32) {
        self.sizes.remove(&id);
        self.steps.push(Step::Free { id });
    }

    /// `output = matrix x input`, as large as the three allow up to [`MATVEC_MAX_SIDE`] rows and columns.
    pub(crate) fn matvec(&mut self, matrix: u32, input: u32, output: u32) {
        let words = |id: u32| self.sizes.get(&id).map_or(0, |&size| size / 4);
        let cols = words(input).min(u64::from(MATVEC_MAX_SIDE));
        let rows = words(output).min(u64::from(MATVEC_MAX_SIDE)).min(words(matrix).checked_div(cols).unwrap_or(0));
        if rows > 0 && cols > 0 && output != matrix && output != input {
            // Both are at most MATVEC_MAX_SIDE.
            self.steps.push(Step::MatVec { matrix, input, output, rows: rows as u32, cols: cols as u32 });
        }
    }

    /// Copies the first `len_bytes` of `src` into `dst`.
    pub(crate) fn copy(&mut self, src: u32, dst: u32, len_bytes: u64) {
        self.steps.push(Step::Copy { src, dst, len_bytes });
    }

    pub(crate) fn finish(self, name: String) -> Workload {
        Workload { name, steps: self.steps, moments: Vec::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(steps: Vec<Step>) -> Workload {
        Workload { name: "test".into(), steps, moments: Vec::new() }
    }

    #[test]
    fn check_sums_up_a_good_stream() {
        let mut builder = StreamBuilder::default();
        let weights = builder.alloc_forever(4096);
        let x = builder.alloc(1024);
        let y = builder.alloc(2048);
        builder.matvec(weights, x, y);
        builder.copy(x, y, 1024);
        builder.free(x);
        builder.free(y);
        let stats = builder.finish("good".into()).check().unwrap();
        assert_eq!(
            stats,
            StreamStats {
                allocs: 3,
                frees: 2,
                matvecs: 1,
                copies: 1,
                peak_live_bytes: 7168,
                forever_bytes: 4096,
                allocated_bytes: 7168
            }
        );
    }

    #[test]
    fn check_finds_the_bad_step() {
        let alloc = |id, size_bytes| Step::Alloc { id, size_bytes, forever: false };
        let cases = [
            (vec![alloc(0, 64), Step::Free { id: 0 }, Step::Free { id: 0 }], 2, "not live"),
            (vec![alloc(0, 64), alloc(0, 64)], 1, "twice"),
            (vec![alloc(0, 0)], 0, "0 bytes"),
            (vec![alloc(0, 64)], 1, "still live"),
            (vec![Step::Alloc { id: 0, size_bytes: 64, forever: true }, Step::Free { id: 0 }], 1, "forever"),
            (vec![alloc(0, 64), alloc(1, 64), Step::MatVec { matrix: 0, input: 1, output: 1, rows: 1, cols: 1 }], 2, "inputs"),
            (vec![alloc(0, 64), alloc(1, 64), Step::MatVec { matrix: 0, input: 1, output: 2, rows: 1, cols: 1 }], 2, "2 is not"),
            (vec![alloc(0, 64), alloc(1, 8), Step::MatVec { matrix: 0, input: 1, output: 1, rows: 4, cols: 4 }], 2, "inputs"),
            (
                vec![alloc(0, 64), alloc(1, 64), alloc(2, 8), Step::MatVec { matrix: 0, input: 1, output: 2, rows: 4, cols: 4 }],
                3,
                "past",
            ),
            (vec![alloc(0, 64), alloc(1, 32), Step::Copy { src: 0, dst: 1, len_bytes: 64 }], 2, "copy"),
            (vec![alloc(0, 64), Step::Copy { src: 0, dst: 0, len_bytes: 4 }], 1, "copy"),
        ];
        for (steps, at, what) in cases {
            let error = workload(steps.clone()).check().unwrap_err();
            assert_eq!(error.step, at, "{steps:?}: {error}");
            assert!(error.to_string().contains(what), "{steps:?}: {error}");
        }
    }

    #[test]
    fn matvec_shapes_fit_their_operands() {
        let mut builder = StreamBuilder::default();
        let (a, x, y) = (builder.alloc(100 * 4), builder.alloc(1000 * 4), builder.alloc(3 * 4));
        builder.matvec(a, x, y);
        let (big_a, big_x, big_y) = (builder.alloc(1 << 24), builder.alloc(1 << 20), builder.alloc(1 << 20));
        builder.matvec(big_a, big_x, big_y);
        builder.matvec(a, x, a);
        let steps = builder.finish("shapes".into()).steps;
        let shapes: Vec<_> = steps
            .iter()
            .filter_map(|step| if let Step::MatVec { rows, cols, .. } = *step { Some((rows, cols)) } else { None })
            .collect();
        // 100 words of A over 256 columns leave no full row: that matvec is dropped; a matvec into its own matrix too.
        assert_eq!(shapes, [(MATVEC_MAX_SIDE, MATVEC_MAX_SIDE)]);
    }
}
