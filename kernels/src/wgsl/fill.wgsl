// fill: words `src_word .. src_word + len` of binding 0 get `pattern_word(id, index_base + i)`.

@group(0) @binding(0) var<storage, read_write> data: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let stride = groups.x * WORKGROUP_SIZE;
    for (var i = gid.x; i < params.len; i += stride) {
        data[params.src_word + i] = pattern_word(params.id, params.index_base + i);
    }
}
