// Shared by every heapscope kernel: prepended to each kernel's source before naga parses it (after
// `params.wgsl` for the range kernels: fill, verify, copy).

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
