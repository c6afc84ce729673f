//! The crate's error type.

/// What went wrong bringing up wgpu, allocating in arenas or running kernels.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WgpuError {
    /// wgpu lists no adapter (no backend with a device on this machine).
    #[error("no wgpu adapter: wgpu lists no device on any backend")]
    NoAdapter,
    /// `HEAPSCOPE_DEVICE` matches none of the adapters.
    #[error("no wgpu adapter matches HEAPSCOPE_DEVICE={selector:?}; adapters: {adapters}")]
    NoMatchingAdapter {
        /// The selector as given.
        selector: String,
        /// The adapters there are, `index: name (vendor 0x...., backend)`, comma-separated.
        adapters: String,
    },
    /// The adapter refused the device (features or limits it lacks).
    #[error("requesting a device of {adapter} failed: {message}")]
    RequestDevice {
        /// The adapter's name.
        adapter: String,
        /// wgpu's message.
        message: String,
    },
    /// wgpu reported a validation, out-of-memory or internal error for an operation.
    #[error("wgpu error during {during}: {message}")]
    Device {
        /// What heapscope was doing.
        during: &'static str,
        /// wgpu's message.
        message: String,
    },
    /// Waiting for the device, or reading results back, failed (device lost, timeout).
    #[error("waiting for the device failed: {0}")]
    Wait(String),
    /// An allocation no storage binding can cover, or no buffer can hold.
    #[error(
        "an allocation of {size_bytes} B cannot be bound whole: the device binds at most {limit_bytes} B per storage binding ({limit})"
    )]
    TooLargeToBind {
        /// The size asked for.
        size_bytes: u64,
        /// The limit it exceeds.
        limit_bytes: u64,
        /// Which limit (`max_storage_buffer_binding_size`, `max_buffer_size`, or heapscope's own binding cap).
        limit: &'static str,
    },
    /// An arena setting that cannot work (zero sizes, alignments that are not powers of two).
    #[error("invalid arena configuration: {0}")]
    InvalidConfig(String),
    /// What was asked cannot run on this device or backend: why, and what to use instead (a bench contender that
    /// needs sparse binding on a wgpu device that is not heapscope's Vulkan device).
    #[error("{0}")]
    Unsupported(String),
    /// The heap of arenas refused (out of memory with its verdict, a double free, a foreign allocation).
    #[error(transparent)]
    Heap(#[from] heapscope_core::Error),
    /// Bringing up Vulkan for interop, or a Vulkan call of the interop, failed.
    #[cfg(feature = "vulkan")]
    #[error(transparent)]
    Vulkan(#[from] heapscope_vulkan::VulkanError),
}

impl WgpuError {
    /// Whether the machine has no usable device (no adapter, or no Vulkan for interop): what tests skip on.
    pub fn means_no_device(&self) -> bool {
        match self {
            Self::NoAdapter => true,
            #[cfg(feature = "vulkan")]
            Self::Vulkan(error) => error.means_no_vulkan() || matches!(error, heapscope_vulkan::VulkanError::MissingLayer(_)),
            _ => false,
        }
    }

    /// Whether this is an out-of-memory refusal of the heap of arenas.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Self::Heap(heapscope_core::Error::OutOfMemory(_)))
    }
}
