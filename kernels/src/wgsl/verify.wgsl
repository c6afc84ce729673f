// verify: counts the words of `src_word .. src_word + len` in binding 0 that differ from
// `pattern_word(id, index_base + i)` into `results[slot].mismatches`, and keeps the smallest mismatching pattern
// index (`index_base + i`, the word's index from the start of the verified range) in `results[slot].first_mismatch`
// (which the host sets to 0xFFFFFFFF before the dispatch).

struct VerifyCounters {
    mismatches: atomic<u32>,
    first_mismatch: atomic<u32>,
}

@group(0) @binding(0) var<storage, read> data: array<u32>;
@group(0) @binding(1) var<storage, read_write> results: array<VerifyCounters>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let stride = groups.x * WORKGROUP_SIZE;
    var count = 0u;
    var first = 0xFFFFFFFFu;
    for (var i = gid.x; i < params.len; i += stride) {
        let index = params.index_base + i;
        if data[params.src_word + i] != pattern_word(params.id, index) {
            count += 1u;
            first = min(first, index);
        }
    }
    if count != 0u {
        atomicAdd(&results[params.slot].mismatches, count);
        atomicMin(&results[params.slot].first_mismatch, first);
    }
}
