// matvec: the compute payload, one step of `y = A x` over u32 words (wrapping arithmetic), so a workload does
// real work on the memory it allocates. A (binding 0) holds `rows x cols` words row-major from word `a_word`,
// x (binding 1) `cols` words from `x_word`, y (binding 2) `rows` words from `y_word`.
//
// The result is folded into y's own pattern: row `r` (global row `row = row_base + r`) gets
//   y[row] = pattern_word(output_id, row) + (sum_j A[row][j] * x[j] - sum_j pattern_word(matrix_id, row * cols + j)
//                                                                     * pattern_word(input_id, j))
// so when A and x hold their allocations' patterns, y holds exactly its own pattern and the verify kernel checks
// it like any filled allocation; a word of A or x that was overwritten (an overlapping allocation) shows up as a
// mismatch in y. `heapscope_kernels::matvec_words` is the CPU twin.

// The push constants (8 words, `heapscope_kernels::MatVecParams` on the CPU side).
struct MatVecParams {
    // First words of A, x and y in their bindings, 10 bits each: `a | x << 10 | y << 20` (binding offsets are
    // aligned to at most 4 KiB, so each lead is below 1024 words).
    leads: u32,
    // Rows in this dispatch.
    rows: u32,
    // Columns (words of x).
    cols: u32,
    // The global index of this dispatch's first row (a long matrix is split into several dispatches).
    row_base: u32,
    // Allocation ids of A, x and y (their patterns).
    matrix_id: u32,
    input_id: u32,
    output_id: u32,
    pad: u32,
}

var<immediate> mv: MatVecParams;

@group(0) @binding(0) var<storage, read> matrix: array<u32>;
@group(0) @binding(1) var<storage, read> input: array<u32>;
@group(0) @binding(2) var<storage, read_write> output: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let stride = groups.x * WORKGROUP_SIZE;
    let a_word = mv.leads & 0x3FFu;
    let x_word = (mv.leads >> 10u) & 0x3FFu;
    let y_word = (mv.leads >> 20u) & 0x3FFu;
    for (var r = gid.x; r < mv.rows; r += stride) {
        let row = mv.row_base + r;
        var dot = 0u;
        var expected = 0u;
        for (var j = 0u; j < mv.cols; j += 1u) {
            dot += matrix[a_word + r * mv.cols + j] * input[x_word + j];
            expected += pattern_word(mv.matrix_id, row * mv.cols + j) * pattern_word(mv.input_id, j);
        }
        output[y_word + r] = pattern_word(mv.output_id, row) + (dot - expected);
    }
}
