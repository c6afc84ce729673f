// The push constants of the range kernels (fill, verify, copy), prepended to their sources before `common.wgsl`.

// The push constants (naga's `immediate` address space), 8 words, the same layout for every range kernel:
// `heapscope_kernels::Params` on the CPU side.
struct Params {
    // First word of the range in binding 0 (fill: the target; verify: the data; copy: the source).
    src_word: u32,
    // First word of the range in binding 1 (copy: the destination; unused otherwise).
    dst_word: u32,
    // Words in the range.
    len: u32,
    // Allocation id the pattern is derived from (fill, verify).
    id: u32,
    // Pattern index of the range's first word: the word's index from the start of the whole operation, so a
    // range split into several dispatches keeps one pattern.
    index_base: u32,
    // Verify: the result slot (in binding 1) the mismatches go to.
    slot: u32,
    pad0: u32,
    pad1: u32,
}

var<immediate> params: Params;
