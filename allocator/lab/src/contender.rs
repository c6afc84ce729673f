//! [`Contender`]: who replays a recording — the one name table of every command, report and pane.
//!
//! A contender is PyTorch's caching allocator (emulated; in its default mode or with expandable segments), a
//! [`Heap`](heapscope_core::Heap) of blocks with one of the core policies inside, a [`PagedHeap`](heapscope_core::PagedHeap), or
//! one of today's allocators that exist only on a Vulkan device (gpu-allocator, VMA). `replay`, `compare`,
//! `export`, `summary`, `gui`, `render` and `bench` all take these names, and every report prints them with
//! [`Contender::name`]; where a contender cannot run (a device-only one without a device) its outcome says
//! so instead of the command refusing the name.

use std::fmt;
use std::str::FromStr;

use heapscope_core::PolicyKind;
use heapscope_core::units::exact_size;
use heapscope_pytorch::AllocConf;

/// Who replays a recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Contender {
    /// The emulation of PyTorch's CUDA caching allocator; `expandable`: with `expandable_segments:True` over the
    /// recording's own settings.
    Pytorch {
        /// Expandable segments on.
        expandable: bool,
    },
    /// A heap of blocks with this policy inside each.
    Heap(PolicyKind),
    /// A virtual range backed by pages mapped on demand.
    Paged,
    /// gpu-allocator 0.28, on a Vulkan device only.
    GpuAllocator,
    /// VMA (vk-mem 0.5), on a Vulkan device only.
    Vma,
}

/// PyTorch's caching allocator with the recording's own settings.
pub const PYTORCH: Contender = Contender::Pytorch { expandable: false };
/// PyTorch's caching allocator with `expandable_segments:True`.
pub const PYTORCH_EXPANDABLE: Contender = Contender::Pytorch { expandable: true };

impl Contender {
    /// What `replay` and `compare` run when none is named (`--vulkan` adds [`Contender::DEVICE_ONLY`]).
    pub const DEFAULT: [Contender; 6] = [
        PYTORCH,
        Contender::Heap(PolicyKind::Tlsf),
        Contender::Heap(PolicyKind::BestFit),
        Contender::Heap(PolicyKind::FirstFit),
        Contender::Heap(PolicyKind::Buddy),
        Contender::Paged,
    ];

    /// What `bench` runs when none is named: the default set with PyTorch's expandable mode.
    pub const BENCH: [Contender; 7] = [
        PYTORCH,
        PYTORCH_EXPANDABLE,
        Contender::Heap(PolicyKind::Tlsf),
        Contender::Heap(PolicyKind::BestFit),
        Contender::Heap(PolicyKind::FirstFit),
        Contender::Heap(PolicyKind::Buddy),
        Contender::Paged,
    ];

    /// The four that show the most side by side in the app: PyTorch's two modes, TLSF in blocks, and paging.
    pub const SIDE_BY_SIDE: [Contender; 4] = [PYTORCH, PYTORCH_EXPANDABLE, Contender::Heap(PolicyKind::Tlsf), Contender::Paged];

    /// The allocators that exist only on a Vulkan device.
    pub const DEVICE_ONLY: [Contender; 2] = [Contender::GpuAllocator, Contender::Vma];

    /// Every contender, in the order of the name table: both PyTorch modes, each core policy in a heap, paging,
    /// then the device-only allocators.
    pub fn all() -> Vec<Contender> {
        let mut all = vec![PYTORCH, PYTORCH_EXPANDABLE];
        all.extend(PolicyKind::ALL.map(Contender::Heap));
        all.push(Contender::Paged);
        all.extend(Contender::DEVICE_ONLY);
        all
    }

    /// The name on the command line, in menus and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Pytorch { expandable: false } => "pytorch",
            Contender::Pytorch { expandable: true } => "pytorch-expandable",
            Contender::Heap(kind) => kind.name(),
            Contender::Paged => "paged",
            Contender::GpuAllocator => "gpu-allocator",
            Contender::Vma => "vma",
        }
    }

    /// Whether it exists only on a Vulkan device.
    pub fn needs_device(self) -> bool {
        Contender::DEVICE_ONLY.contains(&self)
    }

    /// Whether it keeps one pool per CUDA stream (PyTorch's allocator does; the others serve every stream alike).
    pub fn pools_per_stream(self) -> bool {
        matches!(self, Contender::Pytorch { .. })
    }

    /// The one device allocation it makes for a request of `request_bytes` that nothing it holds can take, and how it
    /// comes to that size: a buddy's power of two, PyTorch's segment (of the request rounded by `pytorch`, the settings
    /// PyTorch's emulation runs with: `roundup_power2_divisions`), else a block (a heap's, or gpu-allocator's and VMA's)
    /// aligned to [`DEVICE_BLOCK_ALIGN_BYTES`]; `u64::MAX` past 2^64 B. `None` for a contender that maps pages into a
    /// virtual range instead (`paged`; PyTorch with expandable segments). What a device's largest allocation and buffer
    /// (`maxMemoryAllocationSize`, `maxBufferSize`) are held to.
    pub fn device_allocation_bytes(self, request_bytes: u64, pytorch: &AllocConf) -> Option<(u64, &'static str)> {
        match self {
            Contender::Paged => None,
            Contender::Pytorch { expandable } if expandable || pytorch.expandable_segments => None,
            Contender::Heap(PolicyKind::Buddy) => {
                Some((request_bytes.checked_next_power_of_two().unwrap_or(u64::MAX), "as a buddy's power of two"))
            }
            Contender::Pytorch { .. } => {
                let rounded_bytes = heapscope_pytorch::caching::round_size(request_bytes, pytorch);
                Some((heapscope_pytorch::caching::get_allocation_size(rounded_bytes), "as PyTorch's segment"))
            }
            Contender::Heap(_) | Contender::GpuAllocator | Contender::Vma => {
                Some((request_bytes.checked_next_multiple_of(DEVICE_BLOCK_ALIGN_BYTES).unwrap_or(u64::MAX), "as a block"))
            }
        }
    }

    /// Why it cannot serve a request of `request_bytes` on a device whose largest allocation is `largest`: the one
    /// allocation it makes for it ([`Contender::device_allocation_bytes`]) is larger. `None`: it fits, or the
    /// contender maps pages instead.
    pub fn allocation_too_large(
        self,
        request_bytes: u64,
        pytorch: &AllocConf,
        largest: LargestAllocation,
    ) -> Option<AllocationTooLarge> {
        let (needed_bytes, how) = self.device_allocation_bytes(request_bytes, pytorch)?;
        (needed_bytes > largest.bytes).then_some(AllocationTooLarge { request_bytes, needed_bytes, how, largest })
    }
}

/// A device's largest single allocation for a block or a segment, and the limit that says it (Vulkan's
/// `maxMemoryAllocationSize` or `maxBufferSize`, wgpu's `max_buffer_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LargestAllocation {
    /// The bytes.
    pub bytes: u64,
    /// The limit's name.
    pub limit: &'static str,
    /// What it bounds, in words: `allocation` or `buffer`.
    pub what: &'static str,
}

/// A request whose one device allocation is past the device's largest ([`Contender::allocation_too_large`]): the
/// contender cannot run on that device. Its words are what a row that did not run says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationTooLarge {
    /// The request.
    pub request_bytes: u64,
    /// The allocation it needs (`u64::MAX`: past 2^64 B).
    pub needed_bytes: u64,
    /// How the contender comes to that size ("as a block", ...).
    pub how: &'static str,
    /// The device's largest.
    pub largest: LargestAllocation,
}

impl fmt::Display for AllocationTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let needed = match self.needed_bytes {
            u64::MAX => "past 2^64 B".to_owned(),
            bytes => exact_size(bytes),
        };
        let LargestAllocation { bytes, limit, what } = self.largest;
        write!(
            f,
            "its largest request, {} ({needed} {}), exceeds the device's largest {what} ({limit} {})",
            exact_size(self.request_bytes),
            self.how,
            exact_size(bytes)
        )
    }
}

/// The alignment [`Contender::device_allocation_bytes`] takes a block to: the coarsest a device asks of a buffer's memory.
pub const DEVICE_BLOCK_ALIGN_BYTES: u64 = 64 << 10;

impl fmt::Display for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no contender.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy {name:?}: expected one of {}", expected_names())]
pub struct UnknownContender {
    /// The name given.
    pub name: String,
}

fn expected_names() -> String {
    Contender::all().into_iter().map(Contender::name).collect::<Vec<_>>().join(", ")
}

impl FromStr for Contender {
    type Err = UnknownContender;

    fn from_str(text: &str) -> Result<Self, UnknownContender> {
        Contender::all()
            .into_iter()
            .find(|contender| contender.name() == text)
            .ok_or_else(|| UnknownContender { name: text.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_device_allocation_of_a_request() {
        const MIB: u64 = 1 << 20;
        // (contender, request, PyTorch's settings, the allocation)
        let cases = [
            (Contender::Heap(PolicyKind::Tlsf), 3 * MIB + 1, "", Some((3 * MIB + DEVICE_BLOCK_ALIGN_BYTES, "as a block"))),
            (Contender::Heap(PolicyKind::Buddy), 3 * MIB, "", Some((4 * MIB, "as a buddy's power of two"))),
            (Contender::Heap(PolicyKind::Buddy), u64::MAX - 1, "", Some((u64::MAX, "as a buddy's power of two"))),
            (PYTORCH, 100, "", Some((2 * MIB, "as PyTorch's segment"))),
            (PYTORCH, 3 * MIB, "", Some((20 * MIB, "as PyTorch's segment"))),
            (PYTORCH, 1100 * MIB, "", Some((1100 * MIB, "as PyTorch's segment"))),
            // Rounded first: 1100 MiB to a quarter past 1 GiB.
            (PYTORCH, 1100 * MIB, "roundup_power2_divisions:4", Some((1280 * MIB, "as PyTorch's segment"))),
            (Contender::Heap(PolicyKind::Tlsf), 1100 * MIB, "roundup_power2_divisions:4", Some((1100 * MIB, "as a block"))),
            (PYTORCH, 3 * MIB, "expandable_segments:True", None),
            (PYTORCH_EXPANDABLE, 3 * MIB, "", None),
            (Contender::Paged, 3 * MIB, "", None),
            (Contender::Vma, 2560 * MIB, "", Some((2560 * MIB, "as a block"))),
        ];
        for (contender, request_bytes, settings, expected) in cases {
            let mut pytorch = AllocConf::default();
            pytorch.parse_overrides(settings).unwrap();
            assert_eq!(
                contender.device_allocation_bytes(request_bytes, &pytorch),
                expected,
                "{contender} {request_bytes} {settings}"
            );
        }
    }

    #[test]
    fn every_name_round_trips_and_a_typo_lists_them_all() {
        let all = Contender::all();
        for contender in &all {
            assert_eq!(contender.name().parse::<Contender>(), Ok(*contender));
        }
        let names: std::collections::HashSet<_> = all.iter().map(|contender| contender.name()).collect();
        assert_eq!(names.len(), all.len(), "one name per contender");
        let message = "tlfs".parse::<Contender>().unwrap_err().to_string();
        assert!(message.starts_with("unknown policy \"tlfs\": expected one of pytorch, pytorch-expandable, tlsf"), "{message}");
        assert!(message.ends_with("paged, gpu-allocator, vma"), "{message}");
    }

    #[test]
    fn the_sets_are_drawn_from_the_table() {
        // (set, contenders that need a device)
        let cases: [(&[Contender], usize); 4] =
            [(&Contender::DEFAULT, 0), (&Contender::BENCH, 0), (&Contender::SIDE_BY_SIDE, 0), (&Contender::DEVICE_ONLY, 2)];
        let all = Contender::all();
        for (set, on_device) in cases {
            assert!(set.iter().all(|contender| all.contains(contender)), "{set:?}");
            assert_eq!(set.iter().filter(|contender| contender.needs_device()).count(), on_device, "{set:?}");
        }
        assert!(PYTORCH.pools_per_stream() && !Contender::Paged.pools_per_stream());
    }
}
