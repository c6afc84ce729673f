// copy: words `dst_word .. dst_word + len` of binding 1 get words `src_word .. src_word + len` of binding 0.

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let stride = groups.x * WORKGROUP_SIZE;
    for (var i = gid.x; i < params.len; i += stride) {
        dst[params.dst_word + i] = src[params.src_word + i];
    }
}
