//! The crate's error type.

use ash::vk;
use heapscope_core::units::Bytes;

/// What went wrong bringing up Vulkan or creating a memory source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VulkanError {
    /// `libvulkan` could not be loaded.
    #[error("no Vulkan loader: {0}")]
    NoLoader(String),
    /// The loader found no driver (`vkCreateInstance` or `vkEnumeratePhysicalDevices` say so).
    #[error("no Vulkan driver: {0}")]
    NoDriver(String),
    /// The loader lists no physical device.
    #[error("no Vulkan device: the loader lists no physical device")]
    NoDevice,
    /// `HEAPSCOPE_DEVICE` matches none of the devices.
    #[error("no Vulkan device matches HEAPSCOPE_DEVICE={selector:?}; devices: {devices}")]
    NoMatchingDevice {
        /// The selector as given.
        selector: String,
        /// The devices there are, `index: name (vendor 0x....)`, comma-separated.
        devices: String,
    },
    /// A Vulkan call failed.
    #[error("{call} failed: {result}")]
    Vk {
        /// The Vulkan function.
        call: &'static str,
        /// What it returned.
        result: vk::Result,
    },
    /// A Vulkan layer asked for (the validation layer) is not installed.
    #[error("the Vulkan layer {0} is not installed")]
    MissingLayer(String),
    /// A sparse buffer's page pool has no page left under its capacity (or the device refused a new chunk).
    #[error(
        "out of device memory: {requested_pages} page(s) of {page_bytes} B needed, {available_pages} left under the pool's capacity of {capacity_bytes} B"
    )]
    OutOfPages {
        /// Pages the operation needed.
        requested_pages: u64,
        /// Pages still available (free pages plus pages the cap allows to allocate).
        available_pages: u64,
        /// The page size.
        page_bytes: u64,
        /// The pool's capacity (`u64::MAX` when uncapped).
        capacity_bytes: u64,
    },
    /// Binding would leave more scattered sparse mappings (plus memory chunks) live than the limit (each may cost
    /// the driver a host mapping, bounded by the process's `vm.max_map_count`).
    #[error(
        "too many sparse mappings: {needed} live mappings and memory chunks needed, the limit is {limit} (vm.max_map_count bounds them; bind contiguous runs)"
    )]
    TooManyMappings {
        /// Live mappings plus memory chunks after the bind.
        needed: u64,
        /// The limit ([`crate::SparseConfig::max_live_mappings`]).
        limit: u64,
    },
    /// A request needs one device allocation (a block, a segment) larger than the device makes
    /// ([`crate::DeviceLimits::largest_allocation`]): the contender cannot run on this device (heapscope's memory source
    /// refuses such a block as out of memory, which read as a verdict of fragmentation where the simulation served it).
    #[error("{0}")]
    AllocationTooLarge(heapscope_lab::contender::AllocationTooLarge),
    /// A trace needs a larger virtual range than one sparse buffer on this device can be (`paged`'s range, the
    /// expandable segments of `pytorch`): the contender cannot run on this device.
    #[error(
        "the {contender} contender needs a virtual range of at least {} for this trace ({need}), \
         but one sparse buffer on this device holds at most {} ({limit}): replay a smaller trace or with a lower --capacity, \
         use a device with more sparse address space, or run without --vulkan for the simulated {contender} contender",
        Bytes(*.needed_bytes),
        Bytes(*.limit_bytes)
    )]
    VirtualRangeTooSmall {
        /// The contender (`paged`, `pytorch`).
        contender: &'static str,
        /// What the range must hold, in words.
        need: &'static str,
        /// The bytes the trace needs at once.
        needed_bytes: u64,
        /// The largest sparse buffer the device allows the contender.
        limit_bytes: u64,
        /// Which device limits say so, with their values.
        limit: String,
    },
    /// An argument is out of range or misaligned (a page run outside the buffer, a page bound twice, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The heap over a sparse buffer refused an operation (out of memory, double free, ...).
    #[error(transparent)]
    Heap(#[from] heapscope_core::Error),
    /// The device or the instance lacks something heapscope needs (a layer, a queue, a memory type).
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl From<heapscope_core::selection::SelectionError> for VulkanError {
    fn from(error: heapscope_core::selection::SelectionError) -> Self {
        match error {
            heapscope_core::selection::SelectionError::NoDevice => Self::NoDevice,
            heapscope_core::selection::SelectionError::NoMatchingDevice { selector, devices } => {
                Self::NoMatchingDevice { selector, devices }
            }
        }
    }
}

impl VulkanError {
    /// Whether the machine has no usable Vulkan (no loader, no driver, no device): what tests skip on.
    pub fn means_no_vulkan(&self) -> bool {
        matches!(self, Self::NoLoader(_) | Self::NoDriver(_) | Self::NoDevice)
    }

    /// Whether this is an out-of-memory refusal: the pool ran out of pages, or the heap out of capacity or
    /// virtual range.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Self::OutOfPages { .. } | Self::Heap(heapscope_core::Error::OutOfMemory(_)))
    }

    /// Whether this says that a contender cannot run on this device at all (a virtual range beyond its sparse
    /// limits, a missing feature, memory it cannot hold): the others can, so `replay --vulkan` reports this one
    /// as not run and goes on.
    pub fn is_device_limit(&self) -> bool {
        matches!(
            self,
            Self::VirtualRangeTooSmall { .. }
                | Self::AllocationTooLarge(_)
                | Self::TooManyMappings { .. }
                | Self::Unsupported(_)
                | Self::Heap(heapscope_core::Error::DeviceLimit(_))
        )
    }

    /// This failure as the core's error, for a heap behind the core's `DeviceHeap`: the heap's own errors as they are
    /// (out of memory keeps its verdict), what the device cannot do at all a device limit (the replay reports the
    /// contender as not run), anything else a source failure.
    pub(crate) fn into_core(self) -> heapscope_core::Error {
        match self {
            Self::Heap(error) => error,
            other if other.is_device_limit() => heapscope_core::Error::DeviceLimit(other.to_string()),
            other => heapscope_core::Error::Source(other.to_string()),
        }
    }

    /// A closure turning a `vk::Result` into [`VulkanError::Vk`] for `call`, for `map_err`.
    pub(crate) fn vk(call: &'static str) -> impl FnOnce(vk::Result) -> Self {
        move |result| Self::Vk { call, result }
    }
}
