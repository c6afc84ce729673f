//! Which physical device to use: `HEAPSCOPE_DEVICE` as an index, a vendor (`nvidia`, `0x10de`) or a
//! case-insensitive substring of the device name; without it, the first discrete GPU, else the first device.
//!
//! A pure function over [`DeviceCandidate`]s, so it is tested on tables of made-up device lists.

use ash::vk;

use crate::VulkanError;

/// What the selection knows about a physical device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCandidate {
    /// `VkPhysicalDeviceProperties::deviceName`.
    pub name: String,
    /// PCI vendor id (or a Khronos vendor id such as Mesa's `0x10005`).
    pub vendor_id: u32,
    /// Discrete, integrated, CPU, ...
    pub device_type: vk::PhysicalDeviceType,
}

/// Vendor names `HEAPSCOPE_DEVICE` understands, with their ids.
pub const VENDORS: [(&str, u32); 9] = [
    ("nvidia", 0x10de),
    ("amd", 0x1002),
    ("intel", 0x8086),
    ("arm", 0x13b5),
    ("qualcomm", 0x5143),
    ("imgtec", 0x1010),
    ("apple", 0x106b),
    ("microsoft", 0x1414),
    ("mesa", 0x10005),
];

/// The index of the device to use among `devices`, following `selector` (`HEAPSCOPE_DEVICE`) when set.
///
/// A selector is tried, in order, as a decimal index, a hexadecimal vendor id (`0x10de`), a vendor name from
/// [`VENDORS`], then a case-insensitive substring of the device name. An empty selector counts as unset.
///
/// # Errors
/// [`VulkanError::NoDevice`] for an empty list, [`VulkanError::NoMatchingDevice`] (listing the devices) when
/// the selector matches none.
pub fn select_device(devices: &[DeviceCandidate], selector: Option<&str>) -> Result<usize, VulkanError> {
    if devices.is_empty() {
        return Err(VulkanError::NoDevice);
    }
    let selector = selector.map(str::trim).filter(|text| !text.is_empty());
    let Some(selector) = selector else {
        let discrete = devices.iter().position(|device| device.device_type == vk::PhysicalDeviceType::DISCRETE_GPU);
        return Ok(discrete.unwrap_or(0));
    };
    let lower = selector.to_lowercase();
    let by_vendor = |vendor_id: u32| devices.iter().position(|device| device.vendor_id == vendor_id);
    let found = if let Ok(index) = lower.parse::<usize>() {
        (index < devices.len()).then_some(index)
    } else if let Some(hex) = lower.strip_prefix("0x") {
        u32::from_str_radix(hex, 16).ok().and_then(by_vendor)
    } else {
        let vendor = VENDORS.iter().find(|(name, _)| *name == lower).and_then(|&(_, id)| by_vendor(id));
        vendor.or_else(|| devices.iter().position(|device| device.name.to_lowercase().contains(&lower)))
    };
    found.ok_or_else(|| VulkanError::NoMatchingDevice { selector: selector.to_owned(), devices: describe(devices) })
}

/// `0: name (vendor 0x10de, DISCRETE_GPU), 1: ...`
fn describe(devices: &[DeviceCandidate]) -> String {
    let listed: Vec<String> = devices
        .iter()
        .enumerate()
        .map(|(index, device)| format!("{index}: {} (vendor {:#x}, {:?})", device.name, device.vendor_id, device.device_type))
        .collect();
    listed.join(", ")
}
