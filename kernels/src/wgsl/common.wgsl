// Shared by every heapscope kernel: prepended to each kernel's source before naga parses it.

// The push constants (naga's `immediate` address space), 8 words, the same layout for every kernel:
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

// Threads per workgroup; every kernel loops with a stride of `num_workgroups.x * 64`.
const WORKGROUP_SIZE: u32 = 64u;

// The pattern word of allocation `id` at word `index` (heapscope_kernels::pattern_word is the CPU twin):
//   h = ((id + 1) * 0x9E3779B1) ^ (index * 0x85EBCA77)      (wrapping u32 arithmetic)
//   then murmur3's fmix32 finaliser: h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35; h ^= h >> 16.
// `id + 1` keeps allocation 0's first word from being 0, the value of fresh memory.
fn pattern_word(id: u32, index: u32) -> u32 {
    var h = ((id + 1u) * 0x9E3779B1u) ^ (index * 0x85EBCA77u);
    h = h ^ (h >> 16u);
    h = h * 0x85EBCA6Bu;
    h = h ^ (h >> 13u);
    h = h * 0xC2B2AE35u;
    h = h ^ (h >> 16u);
    return h;
}
