//! Memory types and heaps as plain data, and the choice of a memory type for a use.
//!
//! TEMPORARY minimal version on branch `vk-device` so the crate compiles; the lead keeps the other
//! engineer's file (same items, same signatures) at merge.

use ash::vk;

/// What memory is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryUsage {
    /// Device-only memory (fastest for the GPU).
    DeviceLocal,
    /// Host-visible memory the CPU writes and the GPU reads.
    Upload,
    /// Host-visible memory the GPU writes and the CPU reads.
    Readback,
}

/// One memory type of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryTypeInfo {
    /// Its index in the device's memory types.
    pub index: u32,
    /// Its properties.
    pub property_flags: vk::MemoryPropertyFlags,
    /// The heap it draws from.
    pub heap_index: u32,
}

/// One memory heap of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapInfo {
    /// Its size.
    pub size_bytes: u64,
    /// Its flags.
    pub flags: vk::MemoryHeapFlags,
}

/// The memory type for `usage` among those allowed by `type_bits`, with fallbacks; `None` when none fits.
pub fn select_memory_type(types: &[MemoryTypeInfo], type_bits: u32, usage: MemoryUsage) -> Option<u32> {
    use vk::MemoryPropertyFlags as F;
    let (required, preferred) = match usage {
        MemoryUsage::DeviceLocal => (F::empty(), F::DEVICE_LOCAL),
        MemoryUsage::Upload => (F::HOST_VISIBLE, F::HOST_COHERENT),
        MemoryUsage::Readback => (F::HOST_VISIBLE, F::HOST_CACHED),
    };
    let allowed = || types.iter().filter(|info| info.index < 32 && type_bits & (1 << info.index) != 0);
    allowed()
        .find(|info| info.property_flags.contains(required | preferred))
        .or_else(|| allowed().find(|info| info.property_flags.contains(required)))
        .map(|info| info.index)
}
