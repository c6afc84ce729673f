//! Which device to run on, for every backend alike: `HEAPSCOPE_DEVICE` as an index, a vendor (`nvidia`, `0x10de`)
//! or a case-insensitive substring of the device name; without it, the first discrete GPU, else the first device.
//!
//! A pure function over [`DeviceCandidate`]s (the Vulkan backend makes them from its physical devices, the wgpu
//! backend from its adapters), so one rule serves both and is tested here on tables of made-up device lists. So is
//! the reading of `HEAPSCOPE_VALIDATION` ([`validation_asked`]).

/// Whether `HEAPSCOPE_VALIDATION`'s value (`None`: unset) turns validation on: `1`, `true`, `yes` or `on` (any case,
/// spaces around). Anything else is off: `0`, `false`, empty (a `yes` read as off left a CI run unvalidated).
pub fn validation_asked(value: Option<&str>) -> bool {
    value.is_some_and(|value| ["1", "true", "yes", "on"].iter().any(|on| value.trim().eq_ignore_ascii_case(on)))
}

/// What kind of device it is (Vulkan's `VkPhysicalDeviceType`, wgpu's `DeviceType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// A GPU of its own.
    Discrete,
    /// A GPU sharing the host's memory.
    Integrated,
    /// A virtual GPU.
    Virtual,
    /// A software device on the CPU (lavapipe).
    Cpu,
    /// Anything else.
    Other,
}

/// What the selection knows about a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCandidate {
    /// The device's name (`VkPhysicalDeviceProperties::deviceName`, wgpu's adapter name).
    pub name: String,
    /// PCI vendor id (or a Khronos vendor id such as Mesa's `0x10005`).
    pub vendor_id: u32,
    /// Discrete, integrated, CPU, ...
    pub kind: DeviceKind,
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

/// Why no device was chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectionError {
    /// The list is empty.
    #[error("no device")]
    NoDevice,
    /// `HEAPSCOPE_DEVICE` matches none of the devices.
    #[error("no device matches HEAPSCOPE_DEVICE={selector:?}; devices: {devices}")]
    NoMatchingDevice {
        /// The selector as given.
        selector: String,
        /// The devices there are, `index: name (vendor 0x...., kind)`, comma-separated.
        devices: String,
    },
}

/// The index of the device to use among `devices`, following `selector` (`HEAPSCOPE_DEVICE`) when set.
///
/// A selector is tried, in order, as a decimal index, a hexadecimal vendor id (`0x10de`), a vendor name from
/// [`VENDORS`], then a case-insensitive substring of the device name. An empty selector counts as unset.
///
/// # Errors
/// [`SelectionError::NoDevice`] for an empty list, [`SelectionError::NoMatchingDevice`] (listing the devices) when
/// the selector matches none.
pub fn select_device(devices: &[DeviceCandidate], selector: Option<&str>) -> Result<usize, SelectionError> {
    if devices.is_empty() {
        return Err(SelectionError::NoDevice);
    }
    let selector = selector.map(str::trim).filter(|text| !text.is_empty());
    let Some(selector) = selector else {
        let discrete = devices.iter().position(|device| device.kind == DeviceKind::Discrete);
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
    found.ok_or_else(|| SelectionError::NoMatchingDevice { selector: selector.to_owned(), devices: describe(devices) })
}

/// `0: name (vendor 0x10de, Discrete), 1: ...`
fn describe(devices: &[DeviceCandidate]) -> String {
    let listed: Vec<String> = devices
        .iter()
        .enumerate()
        .map(|(index, device)| format!("{index}: {} (vendor {:#x}, {:?})", device.name, device.vendor_id, device.kind))
        .collect();
    listed.join(", ")
}

#[cfg(test)]
mod tests {
    use super::DeviceKind as Kind;
    use super::*;

    #[test]
    fn validation_is_asked_with_any_usual_yes() {
        let cases = [
            (None, false),
            (Some("1"), true),
            (Some(" TRUE "), true),
            (Some("yes"), true),
            (Some("On"), true),
            (Some("0"), false),
            (Some(""), false),
            (Some("false"), false),
            (Some("2"), false),
        ];
        for (value, on) in cases {
            assert_eq!(validation_asked(value), on, "{value:?}");
        }
    }

    fn device(name: &str, vendor_id: u32, kind: Kind) -> DeviceCandidate {
        DeviceCandidate { name: name.to_owned(), vendor_id, kind }
    }

    fn machines() -> [Vec<DeviceCandidate>; 3] {
        [
            // A laptop: integrated Intel first, then an NVIDIA discrete GPU, then lavapipe.
            vec![
                device("Intel(R) UHD Graphics 630", 0x8086, Kind::Integrated),
                device("NVIDIA GeForce RTX 4070 Laptop GPU", 0x10de, Kind::Discrete),
                device("llvmpipe (LLVM 15.0.6, 256 bits)", 0x10005, Kind::Cpu),
            ],
            // A CI runner: lavapipe only.
            vec![device("llvmpipe (LLVM 15.0.6, 256 bits)", 0x10005, Kind::Cpu)],
            // A workstation: two discrete GPUs.
            vec![
                device("AMD Radeon RX 7900 XTX", 0x1002, Kind::Discrete),
                device("NVIDIA H100 80GB HBM3", 0x10de, Kind::Discrete),
            ],
        ]
    }

    #[test]
    fn selector_table() {
        let [laptop, runner, workstation] = machines();
        let cases: [(&[DeviceCandidate], Option<&str>, Option<usize>); 22] = [
            // Unset (or blank): the first discrete GPU, else the first device.
            (&laptop, None, Some(1)),
            (&laptop, Some(""), Some(1)),
            (&laptop, Some("   "), Some(1)),
            (&runner, None, Some(0)),
            (&workstation, None, Some(0)),
            // An index.
            (&laptop, Some("0"), Some(0)),
            (&laptop, Some(" 2 "), Some(2)),
            (&laptop, Some("3"), None),
            // A vendor id in hexadecimal, any case.
            (&laptop, Some("0x10de"), Some(1)),
            (&workstation, Some("0X10DE"), Some(1)),
            (&laptop, Some("0x10005"), Some(2)),
            (&laptop, Some("0x1002"), None),
            (&laptop, Some("0xzz"), None),
            // A vendor name.
            (&laptop, Some("nvidia"), Some(1)),
            (&laptop, Some("NVIDIA"), Some(1)),
            (&workstation, Some("amd"), Some(0)),
            (&laptop, Some("intel"), Some(0)),
            (&runner, Some("mesa"), Some(0)),
            // A substring of the name, any case.
            (&laptop, Some("llvmpipe"), Some(2)),
            (&workstation, Some("h100"), Some(1)),
            (&laptop, Some("rtx 4070"), Some(1)),
            (&runner, Some("nvidia"), None),
        ];
        for (devices, selector, expected) in cases {
            let got = select_device(devices, selector).ok();
            assert_eq!(got, expected, "selector {selector:?} on {:?}", devices.iter().map(|d| &d.name).collect::<Vec<_>>());
        }
    }

    #[test]
    fn no_match_lists_the_devices() {
        let [laptop, ..] = machines();
        let error = select_device(&laptop, Some("radeon")).unwrap_err();
        let SelectionError::NoMatchingDevice { selector, devices } = &error else { panic!("{error}") };
        assert_eq!(selector, "radeon");
        assert!(devices.contains("0: Intel(R) UHD Graphics 630 (vendor 0x8086, Integrated)"), "{devices}");
        assert!(devices.contains("2: llvmpipe"), "{devices}");
        assert!(error.to_string().contains("HEAPSCOPE_DEVICE=\"radeon\""), "{error}");
        assert_eq!(select_device(&[], None), Err(SelectionError::NoDevice));
        assert_eq!(select_device(&[], Some("0")), Err(SelectionError::NoDevice));
    }
}
