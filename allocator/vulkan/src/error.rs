//! The crate's error type.

use ash::vk;

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
    /// The device or the instance lacks something heapscope needs (a layer, a queue, a memory type).
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl VulkanError {
    /// Whether the machine has no usable Vulkan (no loader, no driver, no device): what tests skip on.
    pub fn means_no_vulkan(&self) -> bool {
        matches!(self, Self::NoLoader(_) | Self::NoDriver(_) | Self::NoDevice)
    }

    /// A closure turning a `vk::Result` into [`VulkanError::Vk`] for `call`, for `map_err`.
    pub(crate) fn vk(call: &'static str) -> impl FnOnce(vk::Result) -> Self {
        move |result| Self::Vk { call, result }
    }
}
