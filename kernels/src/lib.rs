//! # heapscope-kernels
//!
//! heapscope's GPU compute kernels as data, the workloads that use them, and the device-free bench runner.
//!
//! - **Kernels**: WGSL sources (fill, verify, copy, and the matvec compute payload), their compilation to SPIR-V
//!   words with naga (parsed, validated, written; no external compiler), the CPU twins ([`pattern_word`],
//!   [`verify_words`], [`matvec_words`]), and the pure description of a workload ([`Op`]) and of the dispatches that
//!   run it ([`plan`]: ranges split to fit a storage buffer binding).
//! - **Runners** (`backends`): [`VulkanKernels`] (through the Vulkan backend's generic `Dispatcher`) and
//!   [`WgpuKernels`] (wgpu's compute API) run the dispatches; both are a [`KernelRunner`] (`runner`), which keeps only
//!   their device code (check an op's buffers, record and wait for one submit) and does the rest once — the op
//!   wrappers (fill, verify, copy), a whole run planned before any of it runs ([`RunPlan`], `run`, in batches of
//!   one submit), the verify result slots of a submit and the merging of their counters ([`VerifySlots`]), the
//!   counts, and lowered binding limits ([`BindingLimits::lowered`]).
//! - **Workloads** ([`workload`]): deterministic streams of alloc / free / compute steps that behave like GPU
//!   programs — `train`, `serve`, `churn`, `replay` of a recording — with their knobs and default budgets.
//! - **Bench runner** ([`mod@bench`]): plays a workload on a [`bench::Target`] (allocate, free, run ops on handles,
//!   say what is reserved; no device types), filling every allocation with its pattern, running the payload,
//!   verifying before each free, in batches ordered so that no memory is freed or unmapped under a pending kernel;
//!   the simulated target runs the core's heaps with no device, [`VulkanTarget`] and [`WgpuTarget`] real memory
//!   on a device; `bench::conformance` (feature `testing`) is what every device target must do (verify clean, count
//!   what the simulation counts), run by this crate's device tests.
//!
//! ## The pattern
//! Word `index` of allocation `id` holds [`pattern_word`]`(id, index)`:
//! `h = ((id + 1) * 0x9E3779B1) ^ (index * 0x85EBCA77)` (wrapping), then murmur3's `fmix32` finaliser
//! (`h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35; h ^= h >> 16`). Neighbouring words and
//! neighbouring allocations differ, so a fill that lands on another allocation's bytes is seen by its verify.
//!
//! ## The payload
//! The matvec kernel computes one step of `y = A x` over u32 words (wrapping) and folds the result into y's own
//! pattern: `y[row] = pattern_word(y, row) + (sum_j A[row][j] x[j] - sum_j pattern_word(A, row * cols + j)
//! pattern_word(x, j))`. With A and x intact, y holds exactly its pattern, so the verify kernel checks the result
//! like any fill; a word of A or x overwritten by an overlapping allocation shows up in y.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backends;
pub mod bench;
mod plan;
mod run;
mod runner;

pub mod workload;

pub use backends::{
    ArenaOps, VulkanHandle, VulkanKernelError, VulkanKernels, VulkanTarget, WgpuHandle, WgpuKernelError, WgpuKernels, WgpuTarget,
    paged_config, sparse_refusal,
};
pub use naga;
pub use plan::{
    Binding, BindingLimits, Dispatch, MAX_WORKGROUPS, MatVecIds, MatVecParams, Op, Params, SizedBuffer, StorageBinding,
    VerifyResult, plan, verify_words,
};
pub use run::{PlannedDispatch, RunPlan, VerifySlots};
pub use runner::{KernelRunner, RunnerState, SlottedDispatch};

use std::fmt;

/// Threads per workgroup of every kernel (`@workgroup_size(64)`).
pub const WORKGROUP_SIZE: u32 = 64;

/// The push constant block's size in bytes ([`Params`]: 8 words).
pub const PARAMS_BYTES: u32 = 32;

/// The entry point of every kernel.
pub const ENTRY_POINT: &str = "main";

const COMMON_WGSL: &str = include_str!("wgsl/common.wgsl");
const PARAMS_WGSL: &str = include_str!("wgsl/params.wgsl");

/// How a kernel's source declares its parameters as push constants, which [`ParamsBinding::Uniform`] replaces.
const IMMEDIATE: &str = "var<immediate> ";

/// The bind group of the uniform parameter block in [`ParamsBinding::Uniform`] sources (binding 0 of it).
pub const UNIFORM_PARAMS_GROUP: u32 = 1;

/// How a kernel receives its [`Params`]: the same WGSL, only the declaration of `params` differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamsBinding {
    /// Push constants (`var<immediate>`): the Vulkan runner.
    PushConstants,
    /// A uniform buffer at `@group(1) @binding(0)` ([`UNIFORM_PARAMS_GROUP`]), bound with a dynamic offset per
    /// dispatch: portable to every wgpu backend (push constants are an optional wgpu feature).
    Uniform,
}

impl ParamsBinding {
    /// Both ways.
    pub const ALL: [ParamsBinding; 2] = [ParamsBinding::PushConstants, ParamsBinding::Uniform];
}

/// A compute kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Writes the pattern of an allocation id into a range (binding 0, read-write).
    Fill,
    /// Counts the words of a range (binding 0, read) that differ from the pattern into a result slot (binding 1,
    /// read-write, `{mismatches, first_mismatch}` pairs of `u32`).
    Verify,
    /// Copies a range (binding 0, read) to another (binding 1, read-write).
    Copy,
    /// The compute payload: one step of `y = A x` over u32 words, A (binding 0) and x (binding 1) read, y
    /// (binding 2) written, the result folded into y's pattern (see [`matvec_words`]).
    MatVec,
}

impl Kernel {
    /// Every kernel.
    pub const ALL: [Kernel; 4] = [Kernel::Fill, Kernel::Verify, Kernel::Copy, Kernel::MatVec];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Fill => "fill",
            Kernel::Verify => "verify",
            Kernel::Copy => "copy",
            Kernel::MatVec => "matvec",
        }
    }

    /// Its own WGSL source (without the shared part: [`Kernel::full_source`]).
    pub fn wgsl(self) -> &'static str {
        match self {
            Kernel::Fill => include_str!("wgsl/fill.wgsl"),
            Kernel::Verify => include_str!("wgsl/verify.wgsl"),
            Kernel::Copy => include_str!("wgsl/copy.wgsl"),
            Kernel::MatVec => include_str!("wgsl/matvec.wgsl"),
        }
    }

    /// The WGSL naga compiles: the range kernels' push constants (`params.wgsl`; matvec declares its own), the
    /// shared part (`common.wgsl`: workgroup size, pattern), then the kernel.
    pub fn full_source(self) -> String {
        self.source(ParamsBinding::PushConstants)
    }

    /// The whole WGSL with the parameters declared as `params` says: [`Kernel::full_source`] for push
    /// constants; for a uniform buffer, the one `var<immediate>` declaration (of [`Params`] in `params.wgsl` for
    /// the range kernels, of [`MatVecParams`] in `matvec.wgsl`) replaced by `@group(1) @binding(0) var<uniform>`
    /// (the rest is the same text).
    pub fn source(self, params: ParamsBinding) -> String {
        let text = match self {
            Kernel::Fill | Kernel::Verify | Kernel::Copy => format!("{PARAMS_WGSL}\n{COMMON_WGSL}\n{}", self.wgsl()),
            Kernel::MatVec => format!("{COMMON_WGSL}\n{}", self.wgsl()),
        };
        match params {
            ParamsBinding::PushConstants => text,
            ParamsBinding::Uniform => {
                text.replacen(IMMEDIATE, &format!("@group({UNIFORM_PARAMS_GROUP}) @binding(0) var<uniform> "), 1)
            }
        }
    }

    /// Its storage buffer bindings in set 0 (bindings `0..n`).
    pub fn storage_bindings(self) -> u32 {
        match self {
            Kernel::Fill => 1,
            Kernel::Verify | Kernel::Copy => 2,
            Kernel::MatVec => 3,
        }
    }

    /// Whether binding `binding` is written by the kernel.
    pub fn binding_writable(self, binding: u32) -> bool {
        match self {
            Kernel::Fill => binding == 0,
            Kernel::Verify | Kernel::Copy => binding == 1,
            Kernel::MatVec => binding == 2,
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a kernel could not be compiled, or a workload not planned.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// naga could not parse the WGSL.
    #[error("{kernel}: WGSL parse error: {message}")]
    Parse {
        /// The kernel.
        kernel: Kernel,
        /// naga's message, with the source location.
        message: String,
    },
    /// naga's validator refused the module.
    #[error("{kernel}: validation error: {message}")]
    Validation {
        /// The kernel.
        kernel: Kernel,
        /// naga's message.
        message: String,
    },
    /// naga could not write SPIR-V.
    #[error("{kernel}: SPIR-V output error: {message}")]
    SpirV {
        /// The kernel.
        kernel: Kernel,
        /// naga's message.
        message: String,
    },
    /// A workload that cannot run as asked (misaligned, out of the buffer, too long, overlapping copy).
    #[error("invalid workload: {0}")]
    InvalidOp(String),
}

/// The kernel's SPIR-V words (SPIR-V 1.0, entry point [`ENTRY_POINT`]): WGSL parsed and validated by naga
/// (with the push-constant capability, `immediate` in naga's WGSL), written with bounds checks: out of the bound
/// range, fill and copy read zero and skip writes, verify clamps indices into the binding (naga cannot skip
/// atomics).
///
/// # Errors
/// [`KernelError::Parse`], [`KernelError::Validation`] or [`KernelError::SpirV`] with naga's message: a bug in
/// the sources, which the unit tests catch.
pub fn spirv(kernel: Kernel) -> Result<Vec<u32>, KernelError> {
    let (module, info) = validate(kernel, ParamsBinding::PushConstants)?;
    // naga cannot skip atomics out of range: the verify kernel (whose only writes are its atomics) clamps indices
    // into the binding instead; fill and copy skip writes and read zero out of range.
    let checks = match kernel {
        Kernel::Verify => naga::proc::BoundsCheckPolicy::Restrict,
        Kernel::Fill | Kernel::Copy | Kernel::MatVec => naga::proc::BoundsCheckPolicy::ReadZeroSkipWrite,
    };
    let mut flags = naga::back::spv::WriterFlags::empty();
    if cfg!(debug_assertions) {
        flags |= naga::back::spv::WriterFlags::DEBUG;
    }
    let options = naga::back::spv::Options {
        lang_version: (1, 0),
        flags,
        // Bindings as the WGSL declares them (`@group(0) @binding(n)`).
        fake_missing_bindings: true,
        bounds_check_policies: naga::proc::BoundsCheckPolicies { index: checks, buffer: checks, ..Default::default() },
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: ENTRY_POINT.into() };
    naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|error| KernelError::SpirV { kernel, message: error.to_string() })
}

/// The kernel's WGSL ([`Kernel::source`]) parsed and validated by naga (all validation flags; the push-constant
/// capability only for [`ParamsBinding::PushConstants`]): what any backend gets is checked here, on the CPU.
///
/// # Errors
/// [`KernelError::Parse`] or [`KernelError::Validation`] with naga's message.
pub fn validate(kernel: Kernel, params: ParamsBinding) -> Result<(naga::Module, naga::valid::ModuleInfo), KernelError> {
    let source = kernel.source(params);
    let module = naga::front::wgsl::parse_str(&source)
        .map_err(|error| KernelError::Parse { kernel, message: error.emit_to_string(&source) })?;
    let capabilities = match params {
        ParamsBinding::PushConstants => naga::valid::Capabilities::IMMEDIATES,
        ParamsBinding::Uniform => naga::valid::Capabilities::empty(),
    };
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), capabilities)
        .validate(&module)
        .map_err(|error| KernelError::Validation { kernel, message: error.emit_to_string(&source) })?;
    Ok((module, info))
}

/// The CPU twin of the WGSL `pattern_word`: the word `index` of allocation `id` (see the crate documentation).
pub fn pattern_word(id: u32, index: u32) -> u32 {
    let mut h = id.wrapping_add(1).wrapping_mul(0x9E37_79B1) ^ index.wrapping_mul(0x85EB_CA77);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^= h >> 16;
    h
}

/// The CPU twin of the matvec kernel: the `rows` words of y that `y = A x` writes, given A's words (`rows x
/// cols`, row-major, `matrix.len() >= rows * cols`) and x's (`input.len() >= cols`) as they are in memory, with
/// `row_base` the global index of the first row (0 for a whole matrix):
/// `y[r] = pattern_word(output_id, row) + (sum_j A[r][j] * x[j] - sum_j pattern_word(matrix_id, row * cols + j) *
/// pattern_word(input_id, j))`, `row = row_base + r`, all wrapping. With A and x holding their patterns, y is
/// exactly `output_id`'s pattern.
pub fn matvec_words(matrix: &[u32], input: &[u32], cols: u32, row_base: u32, ids: MatVecIds) -> Vec<u32> {
    let cols_usize = cols as usize;
    let rows = matrix.len().checked_div(cols_usize).unwrap_or(0);
    (0..rows)
        .map(|r| {
            let row = row_base.wrapping_add(r as u32);
            let mut dot = 0u32;
            let mut expected = 0u32;
            for j in 0..cols {
                let a = matrix[r * cols_usize + j as usize];
                dot = dot.wrapping_add(a.wrapping_mul(input[j as usize]));
                let pattern_a = pattern_word(ids.matrix, row.wrapping_mul(cols).wrapping_add(j));
                expected = expected.wrapping_add(pattern_a.wrapping_mul(pattern_word(ids.input, j)));
            }
            pattern_word(ids.output, row).wrapping_add(dot.wrapping_sub(expected))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_compiles_and_validates() {
        for kernel in Kernel::ALL {
            let words = spirv(kernel).unwrap_or_else(|error| panic!("{error}"));
            assert_eq!(words[0], 0x0723_0203, "{kernel}: SPIR-V magic");
            assert!(words.len() > 50, "{kernel}: {} words", words.len());
        }
    }

    /// The uniform variant is the same text with one declaration changed, and validates without the push-constant
    /// capability (so it runs on any wgpu backend).
    #[test]
    fn every_params_binding_validates() {
        for kernel in Kernel::ALL {
            assert_eq!(kernel.full_source().matches(IMMEDIATE).count(), 1, "{kernel} declares its push constants once");
            for params in ParamsBinding::ALL {
                validate(kernel, params).unwrap_or_else(|error| panic!("{kernel} {params:?}: {error}"));
            }
            let uniform = kernel.source(ParamsBinding::Uniform);
            assert!(!uniform.contains("var<immediate>"), "{kernel}");
            let declaration = match kernel {
                Kernel::MatVec => "@group(1) @binding(0) var<uniform> mv: MatVecParams;",
                _ => "@group(1) @binding(0) var<uniform> params: Params;",
            };
            assert!(uniform.contains(declaration), "{kernel}");
            assert_eq!(uniform.lines().count(), kernel.full_source().lines().count(), "{kernel}: one line differs");
        }
    }

    /// The kernels' bindings are what [`Kernel::storage_bindings`] says: every binding is used in the source.
    #[test]
    fn bindings_match_the_sources() {
        for kernel in Kernel::ALL {
            for binding in 0..kernel.storage_bindings() {
                assert!(kernel.wgsl().contains(&format!("@binding({binding})")), "{kernel} binding {binding}");
            }
            assert!(!kernel.wgsl().contains(&format!("@binding({})", kernel.storage_bindings())));
            let writable = (0..kernel.storage_bindings()).filter(|&binding| kernel.binding_writable(binding)).count();
            assert_eq!(writable, kernel.wgsl().matches("read_write").count(), "{kernel}");
        }
    }

    /// A table computed by hand from the formula (and shared with the WGSL through the same constants).
    #[test]
    fn cpu_pattern_matches_a_table() {
        let table: [(u32, u32, u32); 6] = [
            (0, 0, fmix32(0x9E37_79B1)),
            (0, 1, fmix32(0x9E37_79B1 ^ 0x85EB_CA77)),
            (1, 0, fmix32(0x9E37_79B1_u32.wrapping_mul(2))),
            (7, 3, fmix32(0x9E37_79B1_u32.wrapping_mul(8) ^ 0x85EB_CA77_u32.wrapping_mul(3))),
            (u32::MAX, 5, fmix32(0x85EB_CA77_u32.wrapping_mul(5))),
            (0x1234, u32::MAX, fmix32(0x9E37_79B1_u32.wrapping_mul(0x1235) ^ 0x85EB_CA77_u32.wrapping_mul(u32::MAX))),
        ];
        for (id, index, expected) in table {
            assert_eq!(pattern_word(id, index), expected, "id {id} index {index}");
        }
        // Literal values, so a change of formula is seen here and in the WGSL review.
        assert_eq!(pattern_word(0, 0), fmix32(0x9E37_79B1));
        let literals = [pattern_word(0, 0), pattern_word(0, 1), pattern_word(1, 0), pattern_word(42, 1000)];
        assert_eq!(literals, LITERALS);
    }

    const LITERALS: [u32; 4] = [0x11fd_02eb, 0xc01a_3282, 0xbb2a_afde, 0xa60f_24fa]; // computed independently (Python)

    fn fmix32(mut h: u32) -> u32 {
        h ^= h >> 16;
        h = h.wrapping_mul(0x85EB_CA6B);
        h ^= h >> 13;
        h = h.wrapping_mul(0xC2B2_AE35);
        h ^ (h >> 16)
    }

    /// The CPU twin by hand: a 2 x 2 matrix, the dot product and its expected value written out.
    #[test]
    fn matvec_twin_by_hand() {
        let ids = MatVecIds { matrix: 1, input: 2, output: 3 };
        let (matrix, input) = ([1_u32, 2, 3, 4], [5_u32, u32::MAX]);
        let p = pattern_word;
        let y = matvec_words(&matrix, &input, 2, 10, ids);
        // Rows 10 and 11: A's pattern indices 20, 21 and 22, 23.
        let row = |r: u32, dot: u32| {
            let expected = p(1, 2 * r).wrapping_mul(p(2, 0)).wrapping_add(p(1, 2 * r + 1).wrapping_mul(p(2, 1)));
            p(3, r).wrapping_add(dot.wrapping_sub(expected))
        };
        assert_eq!(y, [row(10, 5_u32.wrapping_sub(2)), row(11, 15_u32.wrapping_sub(4))]);
        // Inputs holding their patterns give the output's pattern.
        let a: Vec<u32> = (0..12).map(|index| p(1, index)).collect();
        let x: Vec<u32> = (0..4).map(|index| p(2, index)).collect();
        assert_eq!(matvec_words(&a, &x, 4, 0, ids), [p(3, 0), p(3, 1), p(3, 2)]);
        assert!(matvec_words(&[], &x, 4, 0, ids).is_empty());
    }

    #[test]
    fn pattern_differs_between_neighbours() {
        for id in 0..64 {
            for index in 0..256 {
                let word = pattern_word(id, index);
                assert_ne!(word, pattern_word(id, index + 1));
                assert_ne!(word, pattern_word(id + 1, index));
            }
        }
        assert_ne!(pattern_word(0, 0), 0);
    }
}
