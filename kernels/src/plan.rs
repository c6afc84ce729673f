//! Workloads as data ([`Op`]) and the dispatches that run them ([`plan`]).

use crate::{Kernel, KernelError, WORKGROUP_SIZE, pattern_word};

/// Workgroups per dispatch at most: each thread loops over the range with a stride, so a dispatch of a long range
/// needs no more (and stays far below `maxComputeWorkGroupCount[0]`, at least 65,535).
pub const MAX_WORKGROUPS: u32 = 4096;

/// A buffer whose size is known.
pub trait SizedBuffer {
    /// Its size in bytes.
    fn size_bytes(&self) -> u64;
}

/// One operation of a workload, on buffers `B`. Offsets and lengths are in bytes, multiples of 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op<B> {
    /// Write allocation `id`'s pattern into `len_bytes` at `offset_bytes` of `target` (word `i` of the range gets
    /// [`pattern_word`]`(id, i)`).
    Fill {
        /// The buffer.
        target: B,
        /// Where the range starts.
        offset_bytes: u64,
        /// Its length.
        len_bytes: u64,
        /// The allocation id.
        id: u32,
    },
    /// Count the words of the range that differ from allocation `id`'s pattern: a [`VerifyResult`].
    Verify {
        /// The buffer.
        target: B,
        /// Where the range starts.
        offset_bytes: u64,
        /// Its length.
        len_bytes: u64,
        /// The allocation id.
        id: u32,
    },
    /// Copy `len_bytes` from `src` at `src_offset_bytes` to `dst` at `dst_offset_bytes` (the ranges must not
    /// overlap when `src == dst`).
    Copy {
        /// The source buffer.
        src: B,
        /// Where the source range starts.
        src_offset_bytes: u64,
        /// The destination buffer.
        dst: B,
        /// Where the destination range starts.
        dst_offset_bytes: u64,
        /// The length.
        len_bytes: u64,
    },
    /// The compute payload, one step of `y = A x` over u32 words ([`crate::matvec_words`] is its CPU twin): A is
    /// `rows x cols` words row-major at `matrix_offset_bytes` of `matrix`, x `cols` words at `input_offset_bytes`
    /// of `input`, y `rows` words at `output_offset_bytes` of `output` (y must not overlap A or x). With A and x
    /// holding the patterns of `ids.matrix` and `ids.input`, y gets exactly `ids.output`'s pattern.
    MatVec {
        /// The buffer holding A.
        matrix: B,
        /// Where A starts.
        matrix_offset_bytes: u64,
        /// The buffer holding x.
        input: B,
        /// Where x starts.
        input_offset_bytes: u64,
        /// The buffer holding y.
        output: B,
        /// Where y starts.
        output_offset_bytes: u64,
        /// Rows of A (words of y).
        rows: u32,
        /// Columns of A (words of x).
        cols: u32,
        /// The pattern ids of A, x and y.
        ids: MatVecIds,
    },
}

/// The allocation ids whose patterns a matvec's A, x and y hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MatVecIds {
    /// A's id.
    pub matrix: u32,
    /// x's id.
    pub input: u32,
    /// y's id.
    pub output: u32,
}

impl<B> Op<B> {
    /// The kernel that runs it.
    pub fn kernel(&self) -> Kernel {
        match self {
            Op::Fill { .. } => Kernel::Fill,
            Op::Verify { .. } => Kernel::Verify,
            Op::Copy { .. } => Kernel::Copy,
            Op::MatVec { .. } => Kernel::MatVec,
        }
    }

    /// The same op on other buffers: `place` turns each buffer into a buffer and the offset its bytes start at
    /// there (an allocation handle into its block's buffer and its offset in the block), added to the op's offsets.
    pub fn placed<C>(self, mut place: impl FnMut(B) -> (C, u64)) -> Op<C> {
        match self {
            Op::Fill { target, offset_bytes, len_bytes, id } => {
                let (target, base) = place(target);
                Op::Fill { target, offset_bytes: base + offset_bytes, len_bytes, id }
            }
            Op::Verify { target, offset_bytes, len_bytes, id } => {
                let (target, base) = place(target);
                Op::Verify { target, offset_bytes: base + offset_bytes, len_bytes, id }
            }
            Op::Copy { src, src_offset_bytes, dst, dst_offset_bytes, len_bytes } => {
                let (src, src_base) = place(src);
                let (dst, dst_base) = place(dst);
                Op::Copy {
                    src,
                    src_offset_bytes: src_base + src_offset_bytes,
                    dst,
                    dst_offset_bytes: dst_base + dst_offset_bytes,
                    len_bytes,
                }
            }
            Op::MatVec {
                matrix,
                matrix_offset_bytes,
                input,
                input_offset_bytes,
                output,
                output_offset_bytes,
                rows,
                cols,
                ids,
            } => {
                let (matrix, matrix_base) = place(matrix);
                let (input, input_base) = place(input);
                let (output, output_base) = place(output);
                Op::MatVec {
                    matrix,
                    matrix_offset_bytes: matrix_base + matrix_offset_bytes,
                    input,
                    input_offset_bytes: input_base + input_offset_bytes,
                    output,
                    output_offset_bytes: output_base + output_offset_bytes,
                    rows,
                    cols,
                    ids,
                }
            }
        }
    }

    /// The buffers it reads or writes, in binding order.
    pub fn buffers(&self) -> Vec<&B> {
        match self {
            Op::Fill { target, .. } | Op::Verify { target, .. } => vec![target],
            Op::Copy { src, dst, .. } => vec![src, dst],
            Op::MatVec { matrix, input, output, .. } => vec![matrix, input, output],
        }
    }
}

/// What a verify found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VerifyResult {
    /// Words that differ from the pattern.
    pub mismatches: u32,
    /// The index (in words, from the start of the verified range) of the first word that differs.
    pub first_mismatch: Option<u32>,
}

impl VerifyResult {
    /// No word differs.
    pub fn is_clean(&self) -> bool {
        self.mismatches == 0
    }

    /// From the kernel's result slot: `first_mismatch` is `0xFFFFFFFF` when nothing differed.
    pub fn from_counters(mismatches: u32, first_mismatch: u32) -> Self {
        Self { mismatches, first_mismatch: (first_mismatch != u32::MAX).then_some(first_mismatch) }
    }
}

/// What the verify kernel finds in `words` (the CPU twin, for tests): words that differ from `id`'s pattern,
/// word `i` compared with `pattern_word(id, i)`.
pub fn verify_words(id: u32, words: &[u32]) -> VerifyResult {
    let mut result = VerifyResult::default();
    for (index, &word) in (0..).zip(words) {
        if word != pattern_word(id, index) {
            result.mismatches += 1;
            result.first_mismatch.get_or_insert(index);
        }
    }
    result
}

/// The push constants of a dispatch (`Params` in `common.wgsl`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Params {
    /// First word of the range in binding 0.
    pub src_word: u32,
    /// First word of the range in binding 1 (copy).
    pub dst_word: u32,
    /// Words in the range.
    pub len_words: u32,
    /// The allocation id (fill, verify).
    pub id: u32,
    /// The pattern index of the range's first word.
    pub index_base: u32,
    /// The verify result slot.
    pub slot: u32,
}

impl Params {
    /// The 8 words of the push constant block.
    pub fn words(&self) -> [u32; 8] {
        [self.src_word, self.dst_word, self.len_words, self.id, self.index_base, self.slot, 0, 0]
    }

    /// The push constant block's bytes: the words in the host's byte order, as `vkCmdPushConstants` takes them.
    pub fn bytes(&self) -> [u8; 32] {
        words_to_bytes(self.words())
    }
}

/// The push constants of a matvec dispatch (`MatVecParams` in `matvec.wgsl`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatVecParams {
    /// First word of A in binding 0 (below 1024).
    pub matrix_word: u32,
    /// First word of x in binding 1 (below 1024).
    pub input_word: u32,
    /// First word of y in binding 2 (below 1024).
    pub output_word: u32,
    /// Rows in this dispatch.
    pub rows: u32,
    /// Columns.
    pub cols: u32,
    /// The global index of the dispatch's first row.
    pub row_base: u32,
    /// The pattern ids.
    pub ids: MatVecIds,
}

impl MatVecParams {
    /// The 8 words of the push constant block: the three leads packed 10 bits each, then rows, cols, row base
    /// and the ids.
    pub fn words(&self) -> [u32; 8] {
        let leads = (self.matrix_word & 0x3FF) | (self.input_word & 0x3FF) << 10 | (self.output_word & 0x3FF) << 20;
        [leads, self.rows, self.cols, self.row_base, self.ids.matrix, self.ids.input, self.ids.output, 0]
    }
}

/// The words of a push constant block in the host's byte order, as `vkCmdPushConstants` takes them.
fn words_to_bytes(words: [u32; 8]) -> [u8; 32] {
    let mut bytes = [0; 32];
    for (chunk, word) in bytes.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
    bytes
}

/// What a storage buffer binding may cover on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindingLimits {
    /// `maxStorageBufferRange`: the most bytes one binding covers.
    pub max_range_bytes: u64,
    /// `minStorageBufferOffsetAlignment`: binding offsets are multiples of this.
    pub offset_alignment_bytes: u64,
}

/// A storage buffer binding: `size_bytes` of a buffer from `offset_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding<B> {
    /// The buffer.
    pub buffer: B,
    /// Where the binding starts (a multiple of the offset alignment).
    pub offset_bytes: u64,
    /// Its length (at most the maximum range).
    pub size_bytes: u64,
}

/// One dispatch: a kernel over one piece of an [`Op`], its bindings, push constants and workgroup count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch<B> {
    /// The kernel.
    pub kernel: Kernel,
    /// Binding 0 (fill, verify: the data; copy: the source; matvec: A).
    pub data: Binding<B>,
    /// Binding 1 for a copy (the destination) or a matvec (x); a verify binds its result buffer there itself.
    pub dst: Option<Binding<B>>,
    /// Binding 2 for a matvec (y).
    pub output: Option<Binding<B>>,
    /// The push constants of a range kernel (`slot` as given to [`plan`]); unused by a matvec.
    pub params: Params,
    /// The push constants of a matvec.
    pub matvec: Option<MatVecParams>,
    /// Workgroups along x: enough for one word (matvec: one row) per thread, at most [`MAX_WORKGROUPS`].
    pub workgroups: u32,
}

impl<B> Dispatch<B> {
    /// The push constant block to record, with the verify result slot `slot` (the runner's own numbering).
    pub fn push_constant_bytes(&self, slot: u32) -> [u8; 32] {
        match self.matvec {
            Some(matvec) => words_to_bytes(matvec.words()),
            None => Params { slot, ..self.params }.bytes(),
        }
    }

    /// The storage bindings a runner makes for it, `(binding, what)` in binding order: 0 the data (a copy's
    /// source, a matvec's A); 1 a copy's destination, a matvec's x or a verify's result slots; 2 a matvec's y.
    pub fn storage_bindings(&self) -> Vec<(u32, StorageBinding<B>)>
    where
        B: Copy,
    {
        let mut bindings = vec![(0, StorageBinding::Range(self.data))];
        match (self.kernel, self.dst) {
            (Kernel::Verify, _) => bindings.push((1, StorageBinding::VerifyResults)),
            (_, Some(dst)) => bindings.push((1, StorageBinding::Range(dst))),
            (_, None) => {}
        }
        if let Some(output) = self.output {
            bindings.push((2, StorageBinding::Range(output)));
        }
        bindings
    }
}

/// What a dispatch binds at one storage binding ([`Dispatch::storage_bindings`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageBinding<B> {
    /// A range of a buffer.
    Range(Binding<B>),
    /// The runner's own verify result buffer, whole (the dispatch's slot in it is in its push constants).
    VerifyResults,
}

fn check_range(what: &str, size_bytes: u64, offset_bytes: u64, len_bytes: u64) -> Result<(), KernelError> {
    if !offset_bytes.is_multiple_of(4) || !len_bytes.is_multiple_of(4) {
        return Err(KernelError::InvalidOp(format!(
            "{what}: offset {offset_bytes} and length {len_bytes} must be multiples of 4"
        )));
    }
    if offset_bytes.checked_add(len_bytes).is_none_or(|end| end > size_bytes) {
        return Err(KernelError::InvalidOp(format!(
            "{what}: {len_bytes} bytes at {offset_bytes} run past the end of the buffer ({size_bytes} bytes)"
        )));
    }
    Ok(())
}

/// The start of the binding that holds byte `at`, and how far `at` lies into it.
fn bind_start(at: u64, alignment: u64) -> (u64, u64) {
    let lead = at % alignment;
    (at - lead, lead)
}

/// The dispatches that run `op`, in order: the range split so that every binding starts at a multiple of
/// `limits.offset_alignment_bytes` and covers at most `limits.max_range_bytes` (a matvec is split by rows, its
/// input bound whole). A verify's dispatches all add to result slot `slot`. An empty range needs no dispatch.
///
/// # Errors
/// [`KernelError::InvalidOp`] for an offset or length not a multiple of 4, a range past the end of its buffer,
/// a range of more than `u32::MAX` words, overlapping copy ranges in one buffer, limits that leave no room
/// (`max_range_bytes < offset_alignment_bytes + 4`); for a matvec, an output overlapping its matrix or input, an
/// input or a row longer than a binding, or an offset alignment above 4 KiB.
pub fn plan<B: SizedBuffer + Copy + PartialEq>(
    op: &Op<B>,
    slot: u32,
    limits: BindingLimits,
) -> Result<Vec<Dispatch<B>>, KernelError> {
    let alignment = limits.offset_alignment_bytes.max(1);
    if limits.max_range_bytes < alignment + 4 {
        return Err(KernelError::InvalidOp(format!(
            "a binding of at most {} bytes with offsets aligned to {alignment} bytes cannot hold a word",
            limits.max_range_bytes
        )));
    }
    let (src, src_offset, dst, len_bytes, id) = match *op {
        Op::Fill { target, offset_bytes, len_bytes, id } | Op::Verify { target, offset_bytes, len_bytes, id } => {
            check_range("target", target.size_bytes(), offset_bytes, len_bytes)?;
            (target, offset_bytes, None, len_bytes, id)
        }
        Op::Copy { src, src_offset_bytes, dst, dst_offset_bytes, len_bytes } => {
            check_range("copy source", src.size_bytes(), src_offset_bytes, len_bytes)?;
            check_range("copy destination", dst.size_bytes(), dst_offset_bytes, len_bytes)?;
            if src == dst && src_offset_bytes < dst_offset_bytes + len_bytes && dst_offset_bytes < src_offset_bytes + len_bytes {
                return Err(KernelError::InvalidOp(format!(
                    "copy of {len_bytes} bytes from {src_offset_bytes} to {dst_offset_bytes} in one buffer: the ranges overlap"
                )));
            }
            (src, src_offset_bytes, Some((dst, dst_offset_bytes)), len_bytes, 0)
        }
        Op::MatVec { matrix, matrix_offset_bytes, input, input_offset_bytes, output, output_offset_bytes, rows, cols, ids } => {
            let operands = MatVecOperands {
                matrix: (matrix, matrix_offset_bytes),
                input: (input, input_offset_bytes),
                output: (output, output_offset_bytes),
                rows,
                cols,
                ids,
            };
            return plan_matvec(operands, limits, alignment);
        }
    };
    // An operation of 2^32 words or more (16 GiB, one tensor of a large model) is split like any other; the pattern's
    // word index wraps at 2^32 (`index_base`), so a region repeats its pattern every 16 GiB.
    let total_words = len_bytes / 4;
    let max_range = limits.max_range_bytes;
    let mut dispatches = Vec::new();
    let mut done: u64 = 0;
    while done < total_words {
        let at = src_offset + done * 4;
        let (src_start, src_lead) = bind_start(at, alignment);
        let mut room_words = (max_range - src_lead) / 4;
        let dst_part = dst.map(|(dst, dst_offset)| {
            let (dst_start, dst_lead) = bind_start(dst_offset + done * 4, alignment);
            room_words = room_words.min((max_range - dst_lead) / 4);
            (dst, dst_start, dst_lead)
        });
        let count = u32::try_from(room_words.min(total_words - done)).unwrap_or(u32::MAX);
        let count_bytes = u64::from(count) * 4;
        let data = Binding { buffer: src, offset_bytes: src_start, size_bytes: src_lead + count_bytes };
        let dst_binding =
            dst_part.map(|(buffer, start, lead)| Binding { buffer, offset_bytes: start, size_bytes: lead + count_bytes });
        // Leads are below the alignment, itself below `max_range`; words of the lead fit in u32 whenever the
        // binding does (`maxStorageBufferRange` is a u32).
        let word_of = |lead: u64| u32::try_from(lead / 4).unwrap_or(u32::MAX);
        let params = Params {
            src_word: word_of(src_lead),
            dst_word: dst_part.map_or(0, |(_, _, lead)| word_of(lead)),
            len_words: count,
            id,
            index_base: done as u32,
            slot,
        };
        let workgroups = count.div_ceil(WORKGROUP_SIZE).clamp(1, MAX_WORKGROUPS);
        dispatches.push(Dispatch { kernel: op.kernel(), data, dst: dst_binding, output: None, params, matvec: None, workgroups });
        done += u64::from(count);
    }
    Ok(dispatches)
}

/// A matvec's operands: buffers and byte offsets of A, x and y.
#[derive(Clone, Copy)]
struct MatVecOperands<B> {
    matrix: (B, u64),
    input: (B, u64),
    output: (B, u64),
    rows: u32,
    cols: u32,
    ids: MatVecIds,
}

/// Whether `[a, a + a_len)` and `[b, b + b_len)` share a byte.
fn overlaps(a: u64, a_len: u64, b: u64, b_len: u64) -> bool {
    a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

/// The dispatches of a matvec: rows split so that each piece of A and y fits a binding; x is bound whole.
fn plan_matvec<B: SizedBuffer + Copy + PartialEq>(
    op: MatVecOperands<B>,
    limits: BindingLimits,
    alignment: u64,
) -> Result<Vec<Dispatch<B>>, KernelError> {
    if alignment > 4096 {
        return Err(KernelError::InvalidOp(format!(
            "matvec: binding offsets aligned to {alignment} bytes leave leads above the 10 bits its push constants hold"
        )));
    }
    let (rows, cols) = (u64::from(op.rows), u64::from(op.cols));
    let matrix_words = rows
        .checked_mul(cols)
        .filter(|&words| words <= u64::from(u32::MAX))
        .ok_or_else(|| KernelError::InvalidOp(format!("matvec of {rows} x {cols}: more than u32::MAX words in the matrix")))?;
    let (matrix, matrix_offset) = op.matrix;
    let (input, input_offset) = op.input;
    let (output, output_offset) = op.output;
    check_range("matvec matrix", matrix.size_bytes(), matrix_offset, matrix_words * 4)?;
    check_range("matvec input", input.size_bytes(), input_offset, cols * 4)?;
    check_range("matvec output", output.size_bytes(), output_offset, rows * 4)?;
    let y_overlaps = |(buffer, offset, len): (B, u64, u64)| buffer == output && overlaps(offset, len, output_offset, rows * 4);
    if y_overlaps((matrix, matrix_offset, matrix_words * 4)) || y_overlaps((input, input_offset, cols * 4)) {
        return Err(KernelError::InvalidOp("matvec: the output overlaps the matrix or the input".into()));
    }
    if rows == 0 || cols == 0 {
        return Ok(Vec::new());
    }
    let max_range = limits.max_range_bytes;
    let (input_start, input_lead) = bind_start(input_offset, alignment);
    if input_lead + cols * 4 > max_range {
        return Err(KernelError::InvalidOp(format!(
            "matvec: an input of {cols} words does not fit one binding of {max_range} bytes"
        )));
    }
    let input_binding = Binding { buffer: input, offset_bytes: input_start, size_bytes: input_lead + cols * 4 };
    let word_of = |lead: u64| u32::try_from(lead / 4).unwrap_or(u32::MAX);
    let mut dispatches = Vec::new();
    let mut done: u64 = 0;
    while done < rows {
        let (matrix_start, matrix_lead) = bind_start(matrix_offset + done * cols * 4, alignment);
        let (output_start, output_lead) = bind_start(output_offset + done * 4, alignment);
        let room = ((max_range - matrix_lead) / 4 / cols).min((max_range - output_lead) / 4).min(rows - done);
        if room == 0 {
            return Err(KernelError::InvalidOp(format!(
                "matvec: a row of {cols} words does not fit one binding of {max_range} bytes"
            )));
        }
        let data = Binding { buffer: matrix, offset_bytes: matrix_start, size_bytes: matrix_lead + room * cols * 4 };
        let output_binding = Binding { buffer: output, offset_bytes: output_start, size_bytes: output_lead + room * 4 };
        // `rows`, `done` and `room` are at most `op.rows`, a u32.
        let (room_u32, done_u32) = (room as u32, done as u32);
        let matvec = MatVecParams {
            matrix_word: word_of(matrix_lead),
            input_word: word_of(input_lead),
            output_word: word_of(output_lead),
            rows: room_u32,
            cols: op.cols,
            row_base: done_u32,
            ids: op.ids,
        };
        dispatches.push(Dispatch {
            kernel: Kernel::MatVec,
            data,
            dst: Some(input_binding),
            output: Some(output_binding),
            params: Params::default(),
            matvec: Some(matvec),
            workgroups: room_u32.div_ceil(WORKGROUP_SIZE).clamp(1, MAX_WORKGROUPS),
        });
        done += room;
    }
    Ok(dispatches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Buf(u32, u64);

    impl SizedBuffer for Buf {
        fn size_bytes(&self) -> u64 {
            self.1
        }
    }

    const LIMITS: BindingLimits = BindingLimits { max_range_bytes: 1024, offset_alignment_bytes: 64 };

    /// Each kernel's dispatch binds what its shader declares, in order: ranges of the op's buffers, and a verify's
    /// result slots at binding 1.
    #[test]
    fn storage_bindings_per_kernel() {
        let (a, b, c) = (Buf(1, 4096), Buf(2, 4096), Buf(3, 4096));
        let range =
            |buffer: Buf, offset_bytes: u64, size_bytes: u64| StorageBinding::Range(Binding { buffer, offset_bytes, size_bytes });
        let ids = MatVecIds { matrix: 1, input: 2, output: 3 };
        // (op, its first dispatch's bindings)
        let table = [
            (Op::Fill { target: a, offset_bytes: 64, len_bytes: 128, id: 1 }, vec![(0, range(a, 64, 128))]),
            (
                Op::Verify { target: a, offset_bytes: 64, len_bytes: 128, id: 1 },
                vec![(0, range(a, 64, 128)), (1, StorageBinding::VerifyResults)],
            ),
            (
                Op::Copy { src: a, src_offset_bytes: 0, dst: b, dst_offset_bytes: 128, len_bytes: 64 },
                vec![(0, range(a, 0, 64)), (1, range(b, 128, 64))],
            ),
            (
                Op::MatVec {
                    matrix: a,
                    matrix_offset_bytes: 0,
                    input: b,
                    input_offset_bytes: 0,
                    output: c,
                    output_offset_bytes: 0,
                    rows: 4,
                    cols: 4,
                    ids,
                },
                vec![(0, range(a, 0, 64)), (1, range(b, 0, 16)), (2, range(c, 0, 16))],
            ),
        ];
        for (op, expected) in table {
            let dispatches = plan(&op, 0, LIMITS).unwrap();
            let bindings = dispatches[0].storage_bindings();
            assert_eq!(bindings.len(), op.kernel().storage_bindings() as usize, "{op:?}");
            assert_eq!(bindings, expected, "{op:?}");
        }
    }

    /// Checks a binding against the limits and returns its words' start in the buffer.
    fn bound(binding: Binding<Buf>) -> usize {
        assert_eq!(binding.offset_bytes % LIMITS.offset_alignment_bytes, 0);
        assert!(binding.size_bytes <= LIMITS.max_range_bytes);
        assert!(binding.offset_bytes + binding.size_bytes <= binding.buffer.1);
        (binding.offset_bytes / 4) as usize
    }

    /// Runs a matvec dispatch on CPU buffers through the CPU twin.
    fn simulate_matvec(dispatch: &Dispatch<Buf>, memory: &mut [Vec<u32>]) {
        let p = dispatch.matvec.unwrap();
        let (input, output) = (dispatch.dst.unwrap(), dispatch.output.unwrap());
        let (rows, cols) = (p.rows as usize, p.cols as usize);
        assert!(u64::from(p.matrix_word) * 4 + (rows * cols * 4) as u64 <= dispatch.data.size_bytes);
        assert!(u64::from(p.input_word) * 4 + (cols * 4) as u64 <= input.size_bytes);
        assert!(u64::from(p.output_word) * 4 + (rows * 4) as u64 <= output.size_bytes);
        let a = bound(dispatch.data) + p.matrix_word as usize;
        let x = bound(input) + p.input_word as usize;
        let y = bound(output) + p.output_word as usize;
        let matrix = memory[dispatch.data.buffer.0 as usize][a..a + rows * cols].to_vec();
        let vector = memory[input.buffer.0 as usize][x..x + cols].to_vec();
        let words = crate::matvec_words(&matrix, &vector, p.cols, p.row_base, p.ids);
        memory[output.buffer.0 as usize][y..y + rows].copy_from_slice(&words);
    }

    /// Runs the dispatches on CPU buffers, as the kernels would.
    fn simulate(dispatches: &[Dispatch<Buf>], memory: &mut [Vec<u32>], results: &mut [(u32, u32)]) {
        for dispatch in dispatches {
            if dispatch.kernel == Kernel::MatVec {
                simulate_matvec(dispatch, memory);
                continue;
            }
            assert_eq!(dispatch.data.offset_bytes % LIMITS.offset_alignment_bytes, 0);
            assert!(dispatch.data.size_bytes <= LIMITS.max_range_bytes);
            assert!(dispatch.data.offset_bytes + dispatch.data.size_bytes <= dispatch.data.buffer.1);
            let p = dispatch.params;
            let base = (dispatch.data.offset_bytes / 4) as usize + p.src_word as usize;
            assert!(u64::from(p.src_word + p.len_words) * 4 <= dispatch.data.size_bytes);
            for i in 0..p.len_words {
                let at = base + i as usize;
                match dispatch.kernel {
                    Kernel::Fill => {
                        memory[dispatch.data.buffer.0 as usize][at] = pattern_word(p.id, p.index_base.wrapping_add(i));
                    }
                    Kernel::Verify => {
                        if memory[dispatch.data.buffer.0 as usize][at] != pattern_word(p.id, p.index_base.wrapping_add(i)) {
                            let slot = &mut results[p.slot as usize];
                            slot.0 += 1;
                            slot.1 = slot.1.min(p.index_base.wrapping_add(i));
                        }
                    }
                    Kernel::Copy => {
                        let dst = dispatch.dst.unwrap();
                        assert_eq!(dst.offset_bytes % LIMITS.offset_alignment_bytes, 0);
                        assert!(dst.size_bytes <= LIMITS.max_range_bytes);
                        assert!(u64::from(p.dst_word + p.len_words) * 4 <= dst.size_bytes);
                        let to = (dst.offset_bytes / 4) as usize + (p.dst_word + i) as usize;
                        let word = memory[dispatch.data.buffer.0 as usize][at];
                        memory[dst.buffer.0 as usize][to] = word;
                    }
                    Kernel::MatVec => unreachable!("simulated above"),
                }
            }
        }
    }

    #[test]
    fn split_ranges_fill_verify_and_copy_like_one_range() {
        let (a, b) = (Buf(0, 8192), Buf(1, 8192));
        let mut memory = vec![vec![0u32; 2048], vec![0u32; 2048]];
        let mut results = vec![(0, u32::MAX); 2];
        let fill = plan(&Op::Fill { target: a, offset_bytes: 36, len_bytes: 5000, id: 9 }, 0, LIMITS).unwrap();
        assert!(fill.len() > 4, "{} dispatches", fill.len());
        simulate(&fill, &mut memory, &mut results);
        assert_eq!(verify_words(9, &memory[0][9..9 + 1250]), VerifyResult::default());
        assert_eq!((memory[0][8], memory[0][9 + 1250]), (0, 0));
        let copy =
            plan(&Op::Copy { src: a, src_offset_bytes: 36, dst: b, dst_offset_bytes: 1000, len_bytes: 5000 }, 0, LIMITS).unwrap();
        simulate(&copy, &mut memory, &mut results);
        assert_eq!(verify_words(9, &memory[1][250..250 + 1250]), VerifyResult::default());
        memory[1][250 + 700] ^= 1;
        memory[1][250 + 900] ^= 1;
        let verify = plan(&Op::Verify { target: b, offset_bytes: 1000, len_bytes: 5000, id: 9 }, 1, LIMITS).unwrap();
        simulate(&verify, &mut memory, &mut results);
        assert_eq!(results[1], (2, 700));
        assert_eq!(VerifyResult::from_counters(results[1].0, results[1].1).first_mismatch, Some(700));
        assert_eq!(VerifyResult::from_counters(0, u32::MAX), VerifyResult::default());
    }

    /// A matvec whose matrix needs several bindings computes what one pass of the CPU twin does: with A and x
    /// holding their patterns, y is exactly its own pattern; a word of x overwritten shows up in y.
    #[test]
    fn split_matvec_computes_like_one_pass() {
        let (a, b) = (Buf(0, 8192), Buf(1, 8192));
        let mut memory = vec![vec![0u32; 2048], vec![0u32; 2048]];
        let mut results = vec![(0, u32::MAX); 1];
        let (rows, cols) = (40_u32, 20_u32);
        let ids = MatVecIds { matrix: 5, input: 6, output: 7 };
        let fills = [
            Op::Fill { target: a, offset_bytes: 100, len_bytes: u64::from(rows * cols) * 4, id: ids.matrix },
            Op::Fill { target: b, offset_bytes: 12, len_bytes: u64::from(cols) * 4, id: ids.input },
            Op::Fill { target: b, offset_bytes: 4000, len_bytes: u64::from(rows) * 4, id: 99 },
        ];
        for op in &fills {
            simulate(&plan(op, 0, LIMITS).unwrap(), &mut memory, &mut results);
        }
        let matvec = Op::MatVec {
            matrix: a,
            matrix_offset_bytes: 100,
            input: b,
            input_offset_bytes: 12,
            output: b,
            output_offset_bytes: 4000,
            rows,
            cols,
            ids,
        };
        let dispatches = plan(&matvec, 0, LIMITS).unwrap();
        assert!(dispatches.len() >= 4, "3200 bytes of matrix in 1 KiB bindings: {} dispatches", dispatches.len());
        assert_eq!(dispatches.iter().map(|dispatch| dispatch.matvec.unwrap().rows).sum::<u32>(), rows);
        simulate(&dispatches, &mut memory, &mut results);
        assert_eq!(verify_words(ids.output, &memory[1][1000..1040]), VerifyResult::default());
        // One word of x overwritten: every row of y differs (no pattern word of A here is a multiple of 2^32 / delta).
        memory[1][3 + 7] ^= 0x10;
        let expected = crate::matvec_words(&memory[0][25..25 + 800], &memory[1][3..3 + 20], cols, 0, ids);
        simulate(&dispatches, &mut memory, &mut results);
        assert_eq!(memory[1][1000..1040], expected[..]);
        let damaged = verify_words(ids.output, &memory[1][1000..1040]);
        assert_eq!((damaged.mismatches, damaged.first_mismatch), (rows, Some(0)));
    }

    #[test]
    fn invalid_matvecs_are_refused() {
        let (a, b) = (Buf(0, 4096), Buf(1, 4096));
        let ids = MatVecIds::default();
        let matvec = |output_offset_bytes, rows, cols| Op::MatVec {
            matrix: a,
            matrix_offset_bytes: 0,
            input: b,
            input_offset_bytes: 0,
            output: a,
            output_offset_bytes,
            rows,
            cols,
            ids,
        };
        assert_eq!(plan(&matvec(2048, 16, 16), 0, LIMITS).unwrap().len(), 1);
        for (op, why) in [
            (matvec(512, 16, 16), "overlap"),
            (matvec(2048, 2, 512), "input"),
            (matvec(2048, 16, 1024), "past the end"),
            (matvec(2050, 16, 16), "multiples of 4"),
        ] {
            let error = plan(&op, 0, LIMITS).unwrap_err().to_string();
            assert!(error.contains(why) || (why == "input" && error.contains("binding")), "{op:?}: {error}");
        }
        let wide = BindingLimits { max_range_bytes: 1 << 20, offset_alignment_bytes: 8192 };
        assert!(plan(&matvec(2048, 16, 16), 0, wide).unwrap_err().to_string().contains("10 bits"));
        assert!(plan(&matvec(2048, 0, 16), 0, LIMITS).unwrap().is_empty());
    }

    #[test]
    fn placed_ops_add_their_base() {
        let op = Op::Copy { src: 1_u8, src_offset_bytes: 4, dst: 2_u8, dst_offset_bytes: 8, len_bytes: 16 };
        let placed = op.placed(|handle| (Buf(u32::from(handle), 1 << 20), u64::from(handle) * 1000));
        assert_eq!(
            placed,
            Op::Copy {
                src: Buf(1, 1 << 20),
                src_offset_bytes: 1004,
                dst: Buf(2, 1 << 20),
                dst_offset_bytes: 2008,
                len_bytes: 16
            }
        );
        let fill = Op::Fill { target: 3_u8, offset_bytes: 0, len_bytes: 4, id: 1 }.placed(|handle| (handle, 64));
        assert_eq!(fill, Op::Fill { target: 3, offset_bytes: 64, len_bytes: 4, id: 1 });
        assert_eq!(fill.buffers(), [&3]);
    }

    #[test]
    fn invalid_ops_are_refused() {
        let a = Buf(0, 4096);
        let bad = [
            Op::Fill { target: a, offset_bytes: 2, len_bytes: 4, id: 0 },
            Op::Fill { target: a, offset_bytes: 0, len_bytes: 6, id: 0 },
            Op::Verify { target: a, offset_bytes: 4000, len_bytes: 100, id: 0 },
            Op::Copy { src: a, src_offset_bytes: 0, dst: a, dst_offset_bytes: 64, len_bytes: 128 },
        ];
        for op in bad {
            assert!(matches!(plan(&op, 0, LIMITS), Err(KernelError::InvalidOp(_))), "{op:?}");
        }
        let tiny = BindingLimits { max_range_bytes: 64, offset_alignment_bytes: 64 };
        assert!(plan(&Op::Fill { target: a, offset_bytes: 0, len_bytes: 4, id: 0 }, 0, tiny).is_err());
        assert!(plan(&Op::Fill { target: a, offset_bytes: 0, len_bytes: 0, id: 0 }, 0, LIMITS).unwrap().is_empty());
        let ok = Op::Copy { src: a, src_offset_bytes: 0, dst: a, dst_offset_bytes: 128, len_bytes: 128 };
        assert_eq!(plan(&ok, 0, LIMITS).unwrap().len(), 1);
    }

    /// One tensor of 16 GiB or more (2^32 words: an H200 holds several) is split like any other, every word once; the
    /// pattern's index wraps at 2^32 words.
    #[test]
    fn operations_past_two_to_the_32_words_are_split() {
        let len_bytes = (1u64 << 34) + 8;
        let big = Buf(0, len_bytes + 64);
        let limits = BindingLimits { max_range_bytes: 128 << 20, offset_alignment_bytes: 256 };
        for op in [
            Op::Fill { target: big, offset_bytes: 64, len_bytes, id: 7 },
            Op::Verify { target: big, offset_bytes: 64, len_bytes, id: 7 },
        ] {
            let dispatches = plan(&op, 0, limits).unwrap();
            let mut next_word = 0u64;
            for dispatch in &dispatches {
                let p = dispatch.params;
                assert_eq!(dispatch.data.offset_bytes + u64::from(p.src_word) * 4, 64 + next_word * 4, "{op:?}");
                assert_eq!(p.index_base, next_word as u32, "{op:?}: the index wraps at 2^32");
                assert!(dispatch.data.size_bytes <= limits.max_range_bytes);
                next_word += u64::from(p.len_words);
            }
            assert_eq!(next_word, len_bytes / 4, "{op:?}: every word once");
        }
    }

    #[test]
    fn params_bytes_are_the_words_in_order() {
        let params = Params { src_word: 1, dst_word: 2, len_words: 3, id: 4, index_base: 5, slot: 6 };
        let bytes = params.bytes();
        let words: Vec<u32> = bytes.chunks_exact(4).map(|chunk| u32::from_ne_bytes(chunk.try_into().unwrap())).collect();
        assert_eq!(words, [1, 2, 3, 4, 5, 6, 0, 0]);
        assert_eq!(bytes.len() as u32, crate::PARAMS_BYTES);
        let matvec = MatVecParams {
            matrix_word: 3,
            input_word: 1023,
            output_word: 1,
            rows: 7,
            cols: 8,
            row_base: 9,
            ids: MatVecIds { matrix: 10, input: 11, output: 12 },
        };
        assert_eq!(matvec.words(), [3 | 1023 << 10 | 1 << 20, 7, 8, 9, 10, 11, 12, 0]);
    }
}
