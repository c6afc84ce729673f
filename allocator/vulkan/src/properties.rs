//! What heapscope knows about a physical device, as plain data with public fields (the CLI's `probe` prints it).

use ash::vk;

use heapscope_lab::contender::LargestAllocation;

use crate::memory_types::{HeapInfo, MemoryProperties, MemoryTypeInfo};

/// The limits heapscope needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// `maxMemoryAllocationCount`: live `vkAllocateMemory` allocations at most, device-wide.
    pub max_memory_allocation_count: u32,
    /// `bufferImageGranularity`: linear and optimal resources must not share a page of this size.
    pub buffer_image_granularity_bytes: u64,
    /// `nonCoherentAtomSize`: flush and invalidate ranges of non-coherent memory are multiples of this.
    pub non_coherent_atom_size_bytes: u64,
    /// `sparseAddressSpaceSize`: the most bytes of sparse resources at once.
    pub sparse_address_space_size_bytes: u64,
    /// `maxBufferSize` (Vulkan 1.3, `VkPhysicalDeviceMaintenance4Properties`): the largest buffer; `None` on
    /// devices below Vulkan 1.3.
    pub max_buffer_size_bytes: Option<u64>,
    /// `maxMemoryAllocationSize` (Vulkan 1.1, `VkPhysicalDeviceMaintenance3Properties`): the largest
    /// `vkAllocateMemory` (NVIDIA about 4 GiB, AMD and Intel 2–4 GiB, whatever the heap); `None` below Vulkan 1.1.
    pub max_memory_allocation_size_bytes: Option<u64>,
}

impl DeviceLimits {
    /// The largest single allocation the device makes for a block or a segment (one buffer over one
    /// `vkAllocateMemory`): the smaller of `maxBufferSize` and `maxMemoryAllocationSize`, with the limit's name; `None`
    /// where it says neither.
    pub fn largest_allocation(&self) -> Option<LargestAllocation> {
        let buffer = self.max_buffer_size_bytes.map(|bytes| LargestAllocation { bytes, limit: "maxBufferSize", what: "buffer" });
        let allocation = self.max_memory_allocation_size_bytes.map(|bytes| LargestAllocation {
            bytes,
            limit: "maxMemoryAllocationSize",
            what: "allocation",
        });
        buffer.into_iter().chain(allocation).min_by_key(|largest| largest.bytes)
    }
}

/// `VkPhysicalDeviceSparseProperties`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparseProperties {
    /// `residencyStandard2DBlockShape`.
    pub residency_standard_2d_block_shape: bool,
    /// `residencyStandard2DMultisampleBlockShape`.
    pub residency_standard_2d_multisample_block_shape: bool,
    /// `residencyStandard3DBlockShape`.
    pub residency_standard_3d_block_shape: bool,
    /// `residencyAlignedMipSize`.
    pub residency_aligned_mip_size: bool,
    /// `residencyNonResidentStrict`: reads of unbound pages return zero.
    pub residency_non_resident_strict: bool,
}

/// The features heapscope uses: what the device supports, or what a context enabled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceFeatures {
    /// `sparseBinding`.
    pub sparse_binding: bool,
    /// `sparseResidencyBuffer`.
    pub sparse_residency_buffer: bool,
    /// `sparseResidencyAliased`.
    pub sparse_residency_aliased: bool,
    /// `timelineSemaphore` (Vulkan 1.2).
    pub timeline_semaphore: bool,
    /// The device extension `VK_EXT_memory_budget`.
    pub memory_budget: bool,
}

/// One queue family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueFamilyInfo {
    /// Its index.
    pub index: u32,
    /// Graphics, compute, transfer, sparse binding, ...
    pub flags: vk::QueueFlags,
    /// How many queues it has.
    pub queue_count: u32,
}

/// A physical device's identity, memory and limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProperties {
    /// `deviceName`.
    pub name: String,
    /// PCI vendor id.
    pub vendor_id: u32,
    /// Device id.
    pub device_id: u32,
    /// Discrete, integrated, CPU, ...
    pub device_type: vk::PhysicalDeviceType,
    /// The device's Vulkan version (`vk::make_api_version` encoding); see [`DeviceProperties::api_version_text`].
    pub api_version: u32,
    /// The driver's version, vendor-encoded.
    pub driver_version: u32,
    /// Memory types, by index.
    pub memory_types: Vec<MemoryTypeInfo>,
    /// Memory heaps, by index.
    pub memory_heaps: Vec<HeapInfo>,
    /// Limits.
    pub limits: DeviceLimits,
    /// Sparse residency properties.
    pub sparse: SparseProperties,
    /// Features the device supports (those heapscope uses).
    pub supported_features: DeviceFeatures,
    /// Queue families.
    pub queue_families: Vec<QueueFamilyInfo>,
}

impl DeviceProperties {
    /// The memory types and heaps together, for choosing a memory type with heap sizes known.
    pub fn memory_properties(&self) -> MemoryProperties {
        MemoryProperties { types: self.memory_types.clone(), heaps: self.memory_heaps.clone() }
    }

    /// `major.minor.patch` of [`DeviceProperties::api_version`].
    pub fn api_version_text(&self) -> String {
        let version = self.api_version;
        format!("{}.{}.{}", vk::api_version_major(version), vk::api_version_minor(version), vk::api_version_patch(version))
    }

    /// The heap a memory type draws from.
    pub fn heap_of_type(&self, memory_type_index: u32) -> Option<&HeapInfo> {
        let info = self.memory_types.iter().find(|info| info.index == memory_type_index)?;
        self.memory_heaps.get(info.heap_index as usize)
    }
}

/// How much of a heap the process may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapBudget {
    /// The heap's index.
    pub heap_index: u32,
    /// Bytes the process may allocate from it in all (`VK_EXT_memory_budget`'s budget, else the heap's size).
    pub budget_bytes: u64,
    /// Bytes the process uses from it now, when `VK_EXT_memory_budget` says.
    pub usage_bytes: Option<u64>,
    /// Whether the numbers come from `VK_EXT_memory_budget`.
    pub from_extension: bool,
}

impl HeapBudget {
    /// Bytes left under the budget (the whole budget when usage is unknown).
    pub fn available_bytes(&self) -> u64 {
        self.budget_bytes.saturating_sub(self.usage_bytes.unwrap_or(0))
    }
}

/// Plain-data properties from the raw Vulkan structures.
pub(crate) fn device_properties(
    properties: &vk::PhysicalDeviceProperties,
    (max_buffer_size_bytes, max_memory_allocation_size_bytes): (Option<u64>, Option<u64>),
    memory: &vk::PhysicalDeviceMemoryProperties,
    queue_families: &[vk::QueueFamilyProperties],
    supported_features: DeviceFeatures,
) -> DeviceProperties {
    let name =
        properties.device_name_as_c_str().map_or_else(|_| "<unnamed>".to_owned(), |name| name.to_string_lossy().into_owned());
    let MemoryProperties { types: memory_types, heaps: memory_heaps } = MemoryProperties::from_vk(memory);
    let limits = &properties.limits;
    let sparse = &properties.sparse_properties;
    DeviceProperties {
        name,
        vendor_id: properties.vendor_id,
        device_id: properties.device_id,
        device_type: properties.device_type,
        api_version: properties.api_version,
        driver_version: properties.driver_version,
        memory_types,
        memory_heaps,
        limits: DeviceLimits {
            max_memory_allocation_count: limits.max_memory_allocation_count,
            buffer_image_granularity_bytes: limits.buffer_image_granularity,
            non_coherent_atom_size_bytes: limits.non_coherent_atom_size,
            sparse_address_space_size_bytes: limits.sparse_address_space_size,
            max_buffer_size_bytes,
            max_memory_allocation_size_bytes,
        },
        sparse: SparseProperties {
            residency_standard_2d_block_shape: sparse.residency_standard2_d_block_shape == vk::TRUE,
            residency_standard_2d_multisample_block_shape: sparse.residency_standard2_d_multisample_block_shape == vk::TRUE,
            residency_standard_3d_block_shape: sparse.residency_standard3_d_block_shape == vk::TRUE,
            residency_aligned_mip_size: sparse.residency_aligned_mip_size == vk::TRUE,
            residency_non_resident_strict: sparse.residency_non_resident_strict == vk::TRUE,
        },
        supported_features,
        queue_families: (0..)
            .zip(queue_families)
            .map(|(index, family)| QueueFamilyInfo { index, flags: family.queue_flags, queue_count: family.queue_count })
            .collect(),
    }
}
