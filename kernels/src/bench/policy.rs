//! [`BenchPolicy`]: who a bench runs — the core's contenders (`pytorch`, a heap policy, `paged`, named as
//! `heapscope replay` names them) plus `pytorch-expandable` — and [`BenchSettings`], the rules they share, with
//! [`run_simulated`] running one of them without a device.

use std::fmt;
use std::str::FromStr;

use heapscope_core::compare::Contender;
use heapscope_core::pytorch::{AllocConf, CachingHeap};
use heapscope_core::{Heap, HeapConfig, PagedConfig, PagedHeap, PolicyKind, SimulatedSource};

use super::run::{RunError, RunReport, run};
use super::target::SimTarget;
use crate::workload::Workload;

/// A contender of `heapscope bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BenchPolicy {
    /// PyTorch's caching allocator (emulated placement), PyTorch's default settings.
    Pytorch,
    /// The same with `expandable_segments:True`.
    PytorchExpandable,
    /// A core policy inside a heap of blocks.
    Heap(PolicyKind),
    /// One virtual range backed by pages mapped on demand (sparse binding on a device).
    Paged,
}

impl BenchPolicy {
    /// The contenders a bench runs when none is named.
    pub const DEFAULT: [BenchPolicy; 7] = [
        BenchPolicy::Pytorch,
        BenchPolicy::PytorchExpandable,
        BenchPolicy::Heap(PolicyKind::Tlsf),
        BenchPolicy::Heap(PolicyKind::BestFit),
        BenchPolicy::Heap(PolicyKind::FirstFit),
        BenchPolicy::Heap(PolicyKind::Buddy),
        BenchPolicy::Paged,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            BenchPolicy::Pytorch => "pytorch",
            BenchPolicy::PytorchExpandable => "pytorch-expandable",
            BenchPolicy::Heap(kind) => kind.name(),
            BenchPolicy::Paged => "paged",
        }
    }
}

impl fmt::Display for BenchPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BenchPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text == "pytorch-expandable" {
            return Ok(BenchPolicy::PytorchExpandable);
        }
        match text.parse::<Contender>() {
            Ok(Contender::Pytorch) => Ok(BenchPolicy::Pytorch),
            Ok(Contender::Paged) => Ok(BenchPolicy::Paged),
            Ok(Contender::Heap(kind)) => Ok(BenchPolicy::Heap(kind)),
            Err(message) => Err(format!("{message}, pytorch-expandable")),
        }
    }
}

/// The rules every contender of a bench runs under.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchSettings {
    /// The most bytes of device memory a contender may reserve; `None`: no limit.
    pub budget_bytes: Option<u64>,
    /// The heap rules of the heap policies (the policy and capacity fields are replaced).
    pub heap: HeapConfig,
    /// Page size of `paged`.
    pub page_bytes: u64,
    /// Virtual range of `paged`.
    pub virtual_bytes: u64,
    /// PyTorch's settings for `pytorch` (`pytorch-expandable` adds expandable segments).
    pub alloc_conf: AllocConf,
    /// Alignment of every request (PyTorch's 512 B).
    pub align_bytes: u64,
    /// Block sizes of the heap policies are multiples of this on every backend (a device's own block alignment
    /// is usually smaller), so simulated and device runs reserve the same blocks.
    pub block_alignment_bytes: u64,
}

impl BenchSettings {
    /// The default page size of `paged`: 64 KiB, the sparse page of discrete GPUs (a multiple of lavapipe's 4 KiB).
    pub const DEFAULT_PAGE_BYTES: u64 = 64 << 10;
    /// The default block alignment of the heap policies: 64 KiB.
    pub const DEFAULT_BLOCK_ALIGNMENT_BYTES: u64 = 64 << 10;

    /// Defaults under `budget_bytes`: the core's heap rules in blocks aligned to 64 KiB, 64 KiB pages in a virtual
    /// range of four times the budget (1 GiB without one), PyTorch's default settings, 512-byte alignment.
    pub fn new(budget_bytes: Option<u64>) -> Self {
        Self {
            budget_bytes,
            heap: HeapConfig::new(PolicyKind::Tlsf),
            page_bytes: Self::DEFAULT_PAGE_BYTES,
            virtual_bytes: budget_bytes.map_or(1 << 30, |budget| budget.saturating_mul(4)),
            alloc_conf: AllocConf::default(),
            align_bytes: 512,
            block_alignment_bytes: Self::DEFAULT_BLOCK_ALIGNMENT_BYTES,
        }
    }

    /// The heap rules for `kind`, capped at the budget.
    pub fn heap_config(&self, kind: PolicyKind) -> HeapConfig {
        HeapConfig { policy: kind, capacity_bytes: self.budget_bytes, ..self.heap.clone() }
    }

    /// The paged heap's settings.
    pub fn paged_config(&self) -> PagedConfig {
        PagedConfig { page_bytes: self.page_bytes, virtual_bytes: self.virtual_bytes, ..PagedConfig::new(self.budget_bytes) }
    }

    /// PyTorch's settings, with expandable segments for `pytorch-expandable`.
    pub fn caching_conf(&self, expandable: bool) -> AllocConf {
        AllocConf { expandable_segments: expandable || self.alloc_conf.expandable_segments, ..self.alloc_conf.clone() }
    }
}

/// A simulated device with no practical limit (when there is no budget).
const UNLIMITED_DEVICE_BYTES: u64 = 1 << 56;

/// Runs `workload` through `policy` without a device (kernels skipped).
///
/// # Errors
/// [`RunError`] at step 0 for settings a heap refuses; what [`run`] returns.
pub fn run_simulated(workload: &Workload, policy: BenchPolicy, settings: &BenchSettings) -> Result<RunReport, RunError> {
    let invalid = |error: heapscope_core::Error| RunError { step: 0, message: format!("{policy}: {error}") };
    let align = settings.align_bytes;
    match policy {
        BenchPolicy::Heap(kind) => {
            let device = settings.budget_bytes.unwrap_or(UNLIMITED_DEVICE_BYTES);
            let source = SimulatedSource::new(device, settings.block_alignment_bytes);
            let heap = Heap::new(settings.heap_config(kind), source).map_err(invalid)?;
            run(workload, &mut SimTarget::new(heap, align))
        }
        BenchPolicy::Paged => {
            let heap = PagedHeap::new(settings.paged_config()).map_err(invalid)?;
            run(workload, &mut SimTarget::new(heap, align))
        }
        BenchPolicy::Pytorch | BenchPolicy::PytorchExpandable => {
            let conf = settings.caching_conf(policy == BenchPolicy::PytorchExpandable);
            run(workload, &mut SimTarget::new(CachingHeap::new(conf, settings.budget_bytes), align))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for policy in BenchPolicy::DEFAULT.into_iter().chain(PolicyKind::ALL.map(BenchPolicy::Heap)) {
            assert_eq!(policy.name().parse::<BenchPolicy>(), Ok(policy));
        }
        let error = "pytorch-expandible".parse::<BenchPolicy>().unwrap_err();
        assert!(error.contains("expected one of pytorch, paged, tlsf") && error.ends_with("pytorch-expandable"), "{error}");
    }

    #[test]
    fn settings_follow_the_budget() {
        let settings = BenchSettings::new(Some(100 << 20));
        assert_eq!(settings.heap_config(PolicyKind::Buddy).capacity_bytes, Some(100 << 20));
        let paged = settings.paged_config();
        assert_eq!((paged.page_bytes, paged.virtual_bytes, paged.capacity_bytes), (64 << 10, 400 << 20, Some(100 << 20)));
        assert!(settings.caching_conf(true).expandable_segments && !settings.caching_conf(false).expandable_segments);
    }
}
