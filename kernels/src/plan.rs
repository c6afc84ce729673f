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
}

impl<B> Op<B> {
    /// The kernel that runs it.
    pub fn kernel(&self) -> Kernel {
        match self {
            Op::Fill { .. } => Kernel::Fill,
            Op::Verify { .. } => Kernel::Verify,
            Op::Copy { .. } => Kernel::Copy,
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
        let mut bytes = [0; 32];
        for (chunk, word) in bytes.chunks_exact_mut(4).zip(self.words()) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        bytes
    }
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
    /// Binding 0 (fill, verify: the data; copy: the source).
    pub data: Binding<B>,
    /// Binding 1 for a copy (the destination); a verify binds its result buffer there itself.
    pub dst: Option<Binding<B>>,
    /// The push constants (`slot` as given to [`plan`]).
    pub params: Params,
    /// Workgroups along x: enough for one word per thread, at most [`MAX_WORKGROUPS`].
    pub workgroups: u32,
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
/// `limits.offset_alignment_bytes` and covers at most `limits.max_range_bytes`. A verify's dispatches all add to
/// result slot `slot`. An empty range needs no dispatch.
///
/// # Errors
/// [`KernelError::InvalidOp`] for an offset or length not a multiple of 4, a range past the end of its buffer,
/// a range of more than `u32::MAX` words, overlapping copy ranges in one buffer, or limits that leave no room
/// (`max_range_bytes < offset_alignment_bytes + 4`).
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
    };
    let total_words = u32::try_from(len_bytes / 4)
        .map_err(|_| KernelError::InvalidOp(format!("{len_bytes} bytes: more than u32::MAX words in one operation")))?;
    let max_range = limits.max_range_bytes;
    let mut dispatches = Vec::new();
    let mut done: u32 = 0;
    while done < total_words {
        let at = src_offset + u64::from(done) * 4;
        let (src_start, src_lead) = bind_start(at, alignment);
        let mut room_words = (max_range - src_lead) / 4;
        let dst_part = dst.map(|(dst, dst_offset)| {
            let (dst_start, dst_lead) = bind_start(dst_offset + u64::from(done) * 4, alignment);
            room_words = room_words.min((max_range - dst_lead) / 4);
            (dst, dst_start, dst_lead)
        });
        let count = u32::try_from(room_words.min(u64::from(total_words - done))).unwrap_or(u32::MAX);
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
            index_base: done,
            slot,
        };
        let workgroups = count.div_ceil(WORKGROUP_SIZE).clamp(1, MAX_WORKGROUPS);
        dispatches.push(Dispatch { kernel: op.kernel(), data, dst: dst_binding, params, workgroups });
        done += count;
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

    /// Runs the dispatches on CPU buffers, as the kernels would.
    fn simulate(dispatches: &[Dispatch<Buf>], memory: &mut [Vec<u32>], results: &mut [(u32, u32)]) {
        for dispatch in dispatches {
            assert_eq!(dispatch.data.offset_bytes % LIMITS.offset_alignment_bytes, 0);
            assert!(dispatch.data.size_bytes <= LIMITS.max_range_bytes);
            assert!(dispatch.data.offset_bytes + dispatch.data.size_bytes <= dispatch.data.buffer.1);
            let p = dispatch.params;
            let base = (dispatch.data.offset_bytes / 4) as usize + p.src_word as usize;
            assert!(u64::from(p.src_word + p.len_words) * 4 <= dispatch.data.size_bytes);
            for i in 0..p.len_words {
                let at = base + i as usize;
                match dispatch.kernel {
                    Kernel::Fill => memory[dispatch.data.buffer.0 as usize][at] = pattern_word(p.id, p.index_base + i),
                    Kernel::Verify => {
                        if memory[dispatch.data.buffer.0 as usize][at] != pattern_word(p.id, p.index_base + i) {
                            let slot = &mut results[p.slot as usize];
                            slot.0 += 1;
                            slot.1 = slot.1.min(p.index_base + i);
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

    #[test]
    fn params_bytes_are_the_words_in_order() {
        let params = Params { src_word: 1, dst_word: 2, len_words: 3, id: 4, index_base: 5, slot: 6 };
        let bytes = params.bytes();
        let words: Vec<u32> = bytes.chunks_exact(4).map(|chunk| u32::from_ne_bytes(chunk.try_into().unwrap())).collect();
        assert_eq!(words, [1, 2, 3, 4, 5, 6, 0, 0]);
        assert_eq!(bytes.len() as u32, crate::PARAMS_BYTES);
    }
}
