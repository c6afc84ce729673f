//! `HEAPSCOPE_DEVICE` matching on made-up device lists: a pure function, no Vulkan needed.

use heapscope_vulkan::ash::vk::PhysicalDeviceType as Type;
use heapscope_vulkan::{DeviceCandidate, VulkanError, select_device};

fn device(name: &str, vendor_id: u32, device_type: Type) -> DeviceCandidate {
    DeviceCandidate { name: name.to_owned(), vendor_id, device_type }
}

fn machines() -> [Vec<DeviceCandidate>; 3] {
    [
        // A laptop: integrated Intel first, then an NVIDIA discrete GPU, then lavapipe.
        vec![
            device("Intel(R) UHD Graphics 630", 0x8086, Type::INTEGRATED_GPU),
            device("NVIDIA GeForce RTX 4070 Laptop GPU", 0x10de, Type::DISCRETE_GPU),
            device("llvmpipe (LLVM 15.0.6, 256 bits)", 0x10005, Type::CPU),
        ],
        // A CI runner: lavapipe only.
        vec![device("llvmpipe (LLVM 15.0.6, 256 bits)", 0x10005, Type::CPU)],
        // A workstation: two discrete GPUs.
        vec![
            device("AMD Radeon RX 7900 XTX", 0x1002, Type::DISCRETE_GPU),
            device("NVIDIA H100 80GB HBM3", 0x10de, Type::DISCRETE_GPU),
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
    let VulkanError::NoMatchingDevice { selector, devices } = &error else { panic!("{error}") };
    assert_eq!(selector, "radeon");
    assert!(devices.contains("0: Intel(R) UHD Graphics 630 (vendor 0x8086"), "{devices}");
    assert!(devices.contains("2: llvmpipe"), "{devices}");
    assert!(error.to_string().contains("HEAPSCOPE_DEVICE=\"radeon\""), "{error}");
    assert!(matches!(select_device(&[], None), Err(VulkanError::NoDevice)));
    assert!(matches!(select_device(&[], Some("0")), Err(VulkanError::NoDevice)));
}
