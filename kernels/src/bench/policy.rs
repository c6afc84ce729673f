//! Who a bench runs is a core [`Contender`] (the one name table of every command; [`Contender::BENCH`] when none is
//! named); [`BenchSettings`] are the rules they share, and [`run_simulated`] runs one of them without a device.

use heapscope_core::{Heap, HeapConfig, LARGEST_DEVICE_BYTES, PagedConfig, PagedHeap, PolicyKind, SimulatedSource};
use heapscope_lab::compaction::CompactRule;
use heapscope_lab::contender::Contender;
use heapscope_pytorch::{AllocConf, CachingHeap};

use super::run::{RunError, RunReport, run};
use super::target::SimTarget;
use crate::workload::Workload;

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
    /// When the heap policies compact (their moves copied on the device) and `paged` (its pages remapped), each
    /// moved allocation then verified by the kernels like every allocation; see [`Self::compact_rule`].
    pub compact: CompactRule,
}

impl BenchSettings {
    /// The default page size of `paged`: 64 KiB, the sparse page of discrete GPUs (a multiple of lavapipe's 4 KiB).
    pub const DEFAULT_PAGE_BYTES: u64 = 64 << 10;
    /// The default block alignment of the heap policies: 64 KiB.
    pub const DEFAULT_BLOCK_ALIGNMENT_BYTES: u64 = 64 << 10;

    /// Defaults under `budget_bytes`: the core's heap rules in blocks aligned to 64 KiB, 64 KiB pages in a virtual
    /// range of four times the budget (at most [`PagedConfig::MAX_DEFAULT_VIRTUAL_BYTES`]; 1 GiB without one: `heapscope bench` sizes it to the workload), PyTorch's default settings, 512-byte alignment.
    pub fn new(budget_bytes: Option<u64>) -> Self {
        Self {
            budget_bytes,
            heap: HeapConfig::new(PolicyKind::Tlsf),
            page_bytes: Self::DEFAULT_PAGE_BYTES,
            virtual_bytes: budget_bytes
                .map_or(1 << 30, |budget| budget.saturating_mul(4).min(PagedConfig::MAX_DEFAULT_VIRTUAL_BYTES)),
            alloc_conf: AllocConf::default(),
            align_bytes: 512,
            block_alignment_bytes: Self::DEFAULT_BLOCK_ALIGNMENT_BYTES,
            compact: CompactRule::Never,
        }
    }

    /// PyTorch's emulation on a device under these settings: expandable segments backed over twice the budget, or
    /// without one over `paged`'s virtual range (sized to the workload where no budget bounds it).
    pub fn pytorch_device_config(&self, expandable: bool) -> heapscope_vulkan::PytorchDeviceConfig {
        let mut config = heapscope_vulkan::PytorchDeviceConfig::new(self.caching_conf(expandable), self.budget_bytes);
        if self.budget_bytes.is_none() {
            config.expandable_virtual_bytes = self.virtual_bytes;
        }
        config
    }

    /// The heap rules for `kind`, capped at the budget.
    pub fn heap_config(&self, kind: PolicyKind) -> HeapConfig {
        HeapConfig { policy: kind, capacity_bytes: self.budget_bytes, ..self.heap.clone() }
    }

    /// The paged heap's settings.
    pub fn paged_config(&self) -> PagedConfig {
        PagedConfig { page_bytes: self.page_bytes, virtual_bytes: self.virtual_bytes, ..PagedConfig::new(self.budget_bytes) }
    }

    /// When `policy` compacts, on every backend: as `compact` says, but never for PyTorch's emulations (PyTorch
    /// moves no live block; their rows say no compaction).
    pub fn compact_rule(&self, policy: Contender) -> CompactRule {
        match policy {
            Contender::Pytorch { .. } => CompactRule::Never,
            Contender::Heap(_) | Contender::Paged | Contender::GpuAllocator | Contender::Vma => self.compact,
        }
    }

    /// PyTorch's settings, with expandable segments for `pytorch-expandable`.
    pub fn caching_conf(&self, expandable: bool) -> AllocConf {
        AllocConf { expandable_segments: expandable || self.alloc_conf.expandable_segments, ..self.alloc_conf.clone() }
    }
}

/// Runs `workload` through `policy` without a device (kernels skipped).
///
/// # Errors
/// [`RunError`] at step 0 for settings a heap refuses; what [`run`] returns.
pub fn run_simulated(workload: &Workload, policy: Contender, settings: &BenchSettings) -> Result<RunReport, RunError> {
    let invalid = |error: heapscope_core::Error| RunError::at(0, error.to_string());
    let align = settings.align_bytes;
    match policy {
        Contender::Heap(kind) => {
            let device = settings.budget_bytes.unwrap_or(LARGEST_DEVICE_BYTES);
            let source = SimulatedSource::new(device, settings.block_alignment_bytes);
            let heap = Heap::new(settings.heap_config(kind), source).map_err(invalid)?;
            run(workload, &mut SimTarget::new(heap, align).compacting(settings.compact_rule(policy)))
        }
        Contender::Paged => {
            let heap = PagedHeap::new(settings.paged_config()).map_err(invalid)?;
            run(workload, &mut SimTarget::new(heap, align).compacting(settings.compact_rule(policy)))
        }
        Contender::Pytorch { expandable } => {
            let heap = CachingHeap::new(settings.caching_conf(expandable), settings.budget_bytes);
            run(workload, &mut SimTarget::new(heap, align).compacting(settings.compact_rule(policy)))
        }
        Contender::GpuAllocator | Contender::Vma => {
            Err(RunError::at(0, format!("{policy} is no bench contender: it replays recordings on a Vulkan device")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_follow_the_budget() {
        let settings = BenchSettings::new(Some(100 << 20));
        assert_eq!(settings.heap_config(PolicyKind::Buddy).capacity_bytes, Some(100 << 20));
        let paged = settings.paged_config();
        assert_eq!((paged.page_bytes, paged.virtual_bytes, paged.capacity_bytes), (64 << 10, 400 << 20, Some(100 << 20)));
        assert!(settings.caching_conf(true).expandable_segments && !settings.caching_conf(false).expandable_segments);
    }

    /// One rule for every backend: the heaps and `paged` compact as asked, PyTorch's emulations never.
    #[test]
    fn pytorch_never_compacts() {
        let settings = BenchSettings { compact: CompactRule::OnOom, ..BenchSettings::new(None) };
        let cases = [
            (Contender::Heap(PolicyKind::Tlsf), CompactRule::OnOom),
            (Contender::Paged, CompactRule::OnOom),
            (Contender::Pytorch { expandable: false }, CompactRule::Never),
            (Contender::Pytorch { expandable: true }, CompactRule::Never),
        ];
        for (policy, rule) in cases {
            assert_eq!(settings.compact_rule(policy), rule, "{policy}");
        }
    }
}
