//! Memory types and heaps as plain data, and the choice of a memory type for a use.
//!
//! A Vulkan device publishes up to 32 memory types, each a set of property flags on one of up to 16 heaps, and every
//! resource says which of them it may live in (`memoryTypeBits`). This module turns that table into plain data
//! ([`MemoryProperties`], [`MemoryTypeInfo`], [`HeapInfo`]) and chooses a type for one of heapscope's three uses
//! ([`MemoryUsage`]), together with the order in which to fall back when an allocation in the chosen type fails with
//! out-of-memory ([`candidates`]).
//!
//! # How a type is chosen
//!
//! The design follows VMA's `vmaFindMemoryTypeIndex` (required flags, preferred flags, not-preferred flags, and the
//! lowest cost wins, ties to the lowest index) and gpu-allocator's `find_memorytype_index` (an upload first tries
//! device-local host-visible memory, then plain host-visible memory), with two changes that make the result easy to
//! predict and to test:
//!
//! 1. **Tiers.** Every allowed type falls into a tier; only the best non-empty tier is ever used, so a type of a worse
//!    tier is neither chosen nor offered as a fallback while a type of a better tier is allowed. This is how the hard
//!    rules are kept: "DeviceLocal requires DEVICE_LOCAL if any allowed type has it", "never LAZILY_ALLOCATED unless
//!    nothing else", and "the small BAR is kept for explicit requests".
//! 2. **Ordered preferences.** Inside a tier the cost is VMA's count of unmet preferences, except that each preference
//!    outweighs all the ones after it together (the preferences are compared in order, like a tuple). Ties go to the
//!    lowest index, which the Vulkan specification orders from the best performing type among equal flags.
//!
//! Types are *avoided* when they carry a flag that no plain allocation wants: [`vk::MemoryPropertyFlags::LAZILY_ALLOCATED`]
//! (transient attachments only), [`vk::MemoryPropertyFlags::PROTECTED`] (protected queues only),
//! [`vk::MemoryPropertyFlags::DEVICE_COHERENT_AMD`] and [`vk::MemoryPropertyFlags::DEVICE_UNCACHED_AMD`] (slow,
//! for debugging markers). An avoided type is used only when nothing else is allowed.
//!
//! A **BAR** type is `DEVICE_LOCAL | HOST_VISIBLE`: video memory that the CPU maps through the PCIe BAR. It is **large**
//! (resizable BAR / SAM, data-centre cards, unified memory) when its heap holds more than [`LARGE_BAR_MIN_BYTES`],
//! and **small** otherwise (the classic 256 MiB window; NVIDIA reports 246 MiB of it). A small BAR is scarce and is
//! kept for explicit requests ([`MemoryRequest`]): [`MemoryUsage::Upload`] and [`MemoryUsage::Readback`] use it only
//! when no other host-visible type is allowed. [`select_memory_type`] and [`candidates`] see no heap sizes, so they
//! treat every BAR as small; [`MemoryProperties::select_memory_type`] and [`MemoryProperties::candidates`] know the
//! heaps and let a large BAR serve uploads directly. On unified memory every type is device-local, so the BAR rule
//! changes nothing there.
//!
//! | usage | tiers, best first | preferences inside a tier, most important first |
//! |---|---|---|
//! | [`MemoryUsage::DeviceLocal`] | device-local; any other; avoided device-local; avoided other | not HOST_VISIBLE, not HOST_CACHED, not HOST_COHERENT, not RDMA_CAPABLE_NV |
//! | [`MemoryUsage::Upload`] | host-visible (no small BAR); small BAR; avoided; avoided small BAR — never a type that is not host-visible | DEVICE_LOCAL (a large BAR), HOST_COHERENT, not HOST_CACHED, not RDMA_CAPABLE_NV |
//! | [`MemoryUsage::Readback`] | as for Upload | HOST_CACHED, not DEVICE_LOCAL, HOST_COHERENT, not RDMA_CAPABLE_NV |
//!
//! Uploads prefer write-combined (not cached) memory because the CPU only writes it, sequentially; readbacks prefer
//! cached memory because uncached CPU reads are an order of magnitude slower, and avoid reading video memory over PCIe.

use ash::vk;

/// The usage of the buffers that blocks back: storage, and transfers both ways.
pub const BLOCK_BUFFER_USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw(),
);

/// A BAR heap (memory that is both device-local and host-visible) larger than this is "large" (resizable BAR, SAM, a
/// data-centre card, unified memory) and serves uploads directly; the classic 256 MiB window is not large.
pub const LARGE_BAR_MIN_BYTES: u64 = 256 << 20;

/// Flags that no plain allocation wants; a type carrying any of them is used only when nothing else is allowed.
pub const AVOIDED_FLAGS: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::from_raw(
    vk::MemoryPropertyFlags::LAZILY_ALLOCATED.as_raw()
        | vk::MemoryPropertyFlags::PROTECTED.as_raw()
        | vk::MemoryPropertyFlags::DEVICE_COHERENT_AMD.as_raw()
        | vk::MemoryPropertyFlags::DEVICE_UNCACHED_AMD.as_raw(),
);

const DL: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::DEVICE_LOCAL;
const HV: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_VISIBLE;
const HC: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_COHERENT;
const CACHED: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_CACHED;
const RDMA: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::RDMA_CAPABLE_NV;

/// What an allocation is for; each use has its own rule for the memory type (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryUsage {
    /// Read and written by the GPU only: video memory, not mapped. Requires DEVICE_LOCAL when any allowed type has
    /// it, and falls back to any allowed type otherwise (software rasterizers, some integrated GPUs).
    DeviceLocal,
    /// Written by the CPU, read by the GPU (staging buffers, uniforms): HOST_VISIBLE required, HOST_COHERENT and
    /// write-combined preferred, a large BAR preferred to system memory.
    Upload,
    /// Written by the GPU, read by the CPU: HOST_VISIBLE required, HOST_CACHED preferred.
    Readback,
}

impl MemoryUsage {
    /// All uses, in declaration order.
    pub const ALL: [Self; 3] = [Self::DeviceLocal, Self::Upload, Self::Readback];
}

/// One memory type of a device: its index in the device's table, its property flags and its heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryTypeInfo {
    /// The index in `VkPhysicalDeviceMemoryProperties::memoryTypes`, which is also the bit in `memoryTypeBits`.
    pub index: u32,
    /// The type's property flags.
    pub property_flags: vk::MemoryPropertyFlags,
    /// The index of the heap that the type allocates from.
    pub heap_index: u32,
}

impl MemoryTypeInfo {
    /// Whether the type carries every flag of `flags`.
    pub fn has(&self, flags: vk::MemoryPropertyFlags) -> bool {
        self.property_flags.contains(flags)
    }

    /// Whether the type is allowed by `type_bits` (a resource's `memoryTypeBits`).
    pub fn allowed_by(&self, type_bits: u32) -> bool {
        1u32.checked_shl(self.index).is_some_and(|bit| type_bits & bit != 0)
    }

    /// Whether the type carries a flag of [`AVOIDED_FLAGS`].
    pub fn is_avoided(&self) -> bool {
        self.property_flags.intersects(AVOIDED_FLAGS)
    }

    /// Whether the type is a BAR type: device-local and host-visible.
    pub fn is_bar(&self) -> bool {
        self.has(DL | HV)
    }
}

/// One memory heap of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeapInfo {
    /// The heap's size in bytes as the device reports it (not the budget).
    pub size_bytes: u64,
    /// The heap's flags.
    pub flags: vk::MemoryHeapFlags,
}

impl HeapInfo {
    /// Whether the heap is device memory (`VK_MEMORY_HEAP_DEVICE_LOCAL_BIT`).
    pub fn is_device_local(&self) -> bool {
        self.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL)
    }
}

/// A device's memory types and heaps as plain data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryProperties {
    /// The memory types, in the device's order (`types[i].index == i`).
    pub types: Vec<MemoryTypeInfo>,
    /// The memory heaps, in the device's order.
    pub heaps: Vec<HeapInfo>,
}

impl MemoryProperties {
    /// Copies the table that `vkGetPhysicalDeviceMemoryProperties` filled in. Counts beyond the arrays' lengths (a
    /// broken driver) are clamped rather than trusted.
    pub fn from_vk(props: &vk::PhysicalDeviceMemoryProperties) -> Self {
        let type_count = (props.memory_type_count as usize).min(props.memory_types.len());
        let heap_count = (props.memory_heap_count as usize).min(props.memory_heaps.len());
        let types = props.memory_types[..type_count]
            .iter()
            .zip(0u32..)
            .map(|(t, index)| MemoryTypeInfo { index, property_flags: t.property_flags, heap_index: t.heap_index })
            .collect();
        let heaps = props.memory_heaps[..heap_count].iter().map(|h| HeapInfo { size_bytes: h.size, flags: h.flags }).collect();
        Self { types, heaps }
    }

    /// Whether the device has unified memory: at least one heap, and every heap device-local (integrated GPUs, Apple
    /// silicon, software rasterizers). There, host-visible memory is as close to the GPU as any.
    pub fn is_unified_memory(&self) -> bool {
        !self.heaps.is_empty() && self.heaps.iter().all(HeapInfo::is_device_local)
    }

    /// The heap of a memory type, when both exist.
    pub fn heap_of(&self, type_index: u32) -> Option<&HeapInfo> {
        let t = self.types.get(type_index as usize)?;
        self.heaps.get(t.heap_index as usize)
    }

    /// Whether a type is a large BAR: device-local and host-visible on a heap of more than [`LARGE_BAR_MIN_BYTES`].
    pub fn is_large_bar(&self, type_index: u32) -> bool {
        self.types.get(type_index as usize).is_some_and(MemoryTypeInfo::is_bar)
            && self.heap_of(type_index).is_some_and(|h| h.size_bytes > LARGE_BAR_MIN_BYTES)
    }

    /// The memory type for `usage` among those allowed by `type_bits`, knowing the heap sizes (a large BAR serves
    /// uploads); `None` when no allowed type can serve the use. The first of [`Self::candidates`].
    pub fn select_memory_type(&self, type_bits: u32, usage: MemoryUsage) -> Option<u32> {
        self.candidates(type_bits, usage).first().copied()
    }

    /// The memory types for `usage` among those allowed by `type_bits`, best first, knowing the heap sizes: the order
    /// in which to retry an allocation that fails with out-of-memory. Empty when no allowed type can serve the use.
    pub fn candidates(&self, type_bits: u32, usage: MemoryUsage) -> Vec<u32> {
        rank_for_usage(&self.types, type_bits, usage, |t| self.is_large_bar(t.index))
    }
}

/// The memory type for `usage` among `types` allowed by `type_bits` (a resource's `memoryTypeBits`); `None` when no
/// allowed type can serve the use. The first of [`candidates`].
///
/// Without heap sizes every BAR type is treated as small; use [`MemoryProperties::select_memory_type`] to let a
/// large (resizable) BAR serve uploads.
pub fn select_memory_type(types: &[MemoryTypeInfo], type_bits: u32, usage: MemoryUsage) -> Option<u32> {
    candidates(types, type_bits, usage).first().copied()
}

/// The memory types for `usage` among `types` allowed by `type_bits`, best first: the order in which to retry an
/// allocation that fails with out-of-memory. Empty when no allowed type can serve the use.
///
/// Only the best non-empty tier is listed (see the [module docs](self)): an upload never falls back into the small BAR
/// while system memory is allowed, and a device-local allocation never into system memory while video memory is
/// allowed; spilling to system memory is the caller's decision (ask again with [`MemoryUsage::Upload`]).
pub fn candidates(types: &[MemoryTypeInfo], type_bits: u32, usage: MemoryUsage) -> Vec<u32> {
    rank_for_usage(types, type_bits, usage, |_| false)
}

/// An explicit request in VMA's terms, for what the three uses do not cover (the small BAR, protected or lazily
/// allocated memory): the required flags, and the flags preferred and not preferred, each unmet one costing 1.
///
/// Types carrying [`AVOIDED_FLAGS`] that the request does not require come after every other matching type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemoryRequest {
    /// Flags a type must carry.
    pub required: vk::MemoryPropertyFlags,
    /// Flags a type should carry; each missing one costs 1.
    pub preferred: vk::MemoryPropertyFlags,
    /// Flags a type should not carry; each present one costs 1.
    pub not_preferred: vk::MemoryPropertyFlags,
}

impl MemoryRequest {
    /// The matching types allowed by `type_bits`, best first: lowest cost, then lowest index. Unlike the uses' rules,
    /// every matching type is listed (the avoided ones last).
    pub fn candidates(&self, types: &[MemoryTypeInfo], type_bits: u32) -> Vec<u32> {
        let avoided = AVOIDED_FLAGS & !self.required;
        let mut ranked: Vec<(bool, u32, u32)> = types
            .iter()
            .filter(|t| t.allowed_by(type_bits) && t.has(self.required))
            .map(|t| {
                let f = t.property_flags;
                let cost = (self.preferred & !f).as_raw().count_ones() + (self.not_preferred & f).as_raw().count_ones();
                (f.intersects(avoided), cost, t.index)
            })
            .collect();
        ranked.sort_unstable();
        ranked.into_iter().map(|(_, _, index)| index).collect()
    }

    /// The best matching type allowed by `type_bits`, or `None`. The first of [`Self::candidates`].
    pub fn select(&self, types: &[MemoryTypeInfo], type_bits: u32) -> Option<u32> {
        self.candidates(types, type_bits).first().copied()
    }
}

/// One preference: the flag, and whether it is wanted (`true`) or unwanted (`false`).
type Preference = (vk::MemoryPropertyFlags, bool);

const DEVICE_LOCAL_PREFS: [Preference; 4] = [(HV, false), (CACHED, false), (HC, false), (RDMA, false)];
const UPLOAD_PREFS: [Preference; 4] = [(DL, true), (HC, true), (CACHED, false), (RDMA, false)];
const READBACK_PREFS: [Preference; 4] = [(CACHED, true), (DL, false), (HC, true), (RDMA, false)];

/// The tier of a type for a use (lower is better), or `None` when the type cannot serve the use at all.
fn tier(t: &MemoryTypeInfo, usage: MemoryUsage, large_bar: bool) -> Option<u8> {
    let avoided = u8::from(t.is_avoided());
    match usage {
        MemoryUsage::DeviceLocal => Some(2 * avoided + u8::from(!t.has(DL))),
        MemoryUsage::Upload | MemoryUsage::Readback => {
            let small_bar = t.is_bar() && !large_bar;
            t.has(HV).then_some(2 * avoided + u8::from(small_bar))
        }
    }
}

/// The cost of a type under ordered preferences: each unmet preference outweighs all the later ones together.
fn cost(flags: vk::MemoryPropertyFlags, prefs: &[Preference]) -> u32 {
    prefs.iter().fold(0, |acc, &(flag, wanted)| (acc << 1) | u32::from(flags.contains(flag) != wanted))
}

fn rank_for_usage(
    types: &[MemoryTypeInfo],
    type_bits: u32,
    usage: MemoryUsage,
    is_large_bar: impl Fn(&MemoryTypeInfo) -> bool,
) -> Vec<u32> {
    let prefs: &[Preference] = match usage {
        MemoryUsage::DeviceLocal => &DEVICE_LOCAL_PREFS,
        MemoryUsage::Upload => &UPLOAD_PREFS,
        MemoryUsage::Readback => &READBACK_PREFS,
    };
    let ranked: Vec<(u8, u32, u32)> = types
        .iter()
        .filter(|t| t.allowed_by(type_bits))
        .filter_map(|t| Some((tier(t, usage, is_large_bar(t))?, cost(t.property_flags, prefs), t.index)))
        .collect();
    let Some(best) = ranked.iter().map(|&(tier, _, _)| tier).min() else {
        return Vec::new();
    };
    let mut best_tier: Vec<(u32, u32)> =
        ranked.into_iter().filter(|&(tier, _, _)| tier == best).map(|(_, cost, index)| (cost, index)).collect();
    best_tier.sort_unstable();
    best_tier.into_iter().map(|(_, index)| index).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(index: u32, property_flags: vk::MemoryPropertyFlags) -> MemoryTypeInfo {
        MemoryTypeInfo { index, property_flags, heap_index: 0 }
    }

    #[test]
    fn cost_orders_preferences_lexicographically() {
        // Missing the first preference costs more than missing all the later ones.
        assert!(cost(HV | CACHED | HC | RDMA, &DEVICE_LOCAL_PREFS) > cost(CACHED | HC | RDMA, &DEVICE_LOCAL_PREFS));
        assert!(cost(HV, &DEVICE_LOCAL_PREFS) > cost(CACHED | HC | RDMA, &DEVICE_LOCAL_PREFS));
        assert_eq!(cost(DL, &DEVICE_LOCAL_PREFS), 0);
    }

    #[test]
    fn type_bits_beyond_32_types_are_never_allowed() {
        assert!(!ty(32, DL).allowed_by(u32::MAX));
        assert!(ty(31, DL).allowed_by(1 << 31));
        assert!(!ty(0, DL).allowed_by(0b10));
    }

    #[test]
    fn empty_table_and_empty_mask_give_none() {
        for usage in MemoryUsage::ALL {
            assert_eq!(select_memory_type(&[], u32::MAX, usage), None);
            assert_eq!(select_memory_type(&[ty(0, DL | HV | HC)], 0, usage), None);
        }
    }

    #[test]
    fn from_vk_clamps_broken_counts() {
        let props = vk::PhysicalDeviceMemoryProperties { memory_type_count: 99, memory_heap_count: 99, ..Default::default() };
        let p = MemoryProperties::from_vk(&props);
        assert_eq!((p.types.len(), p.heaps.len()), (32, 16));
    }
}
