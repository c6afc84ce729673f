//! Shared by the integration tests: a wgpu device with validation on (plain wgpu, or wgpu on heapscope's Vulkan
//! device), or a skip when the machine has none; and the check that nothing was reported.

use std::sync::Arc;

use heapscope_wgpu::{DeviceOptions, WgpuDevice, WgpuError, hal_log};

pub fn required() -> bool {
    std::env::var("HEAPSCOPE_REQUIRE_GPU").is_ok_and(|value| value.trim() == "1")
}

fn skip_or_panic(error: &WgpuError) -> Option<Arc<WgpuDevice>> {
    if !required() && error.means_no_device() {
        eprintln!("skipped: no device to test on ({error}); set HEAPSCOPE_REQUIRE_GPU=1 to fail instead");
        return None;
    }
    panic!("device bring-up failed: {error}");
}

/// Plain wgpu (the adapter `HEAPSCOPE_DEVICE` names) with wgpu's backend validation on; `None` (skipped) without
/// an adapter unless `HEAPSCOPE_REQUIRE_GPU=1`.
pub fn device() -> Option<Arc<WgpuDevice>> {
    heapscope_vulkan::testing::validation_turn();
    hal_log::install();
    let options = DeviceOptions { validation: true, ..DeviceOptions::from_env() };
    match WgpuDevice::new(&options) {
        Ok(device) => Some(Arc::new(device)),
        Err(error) => skip_or_panic(&error),
    }
}

/// wgpu on heapscope's Vulkan device, the validation layer on (heapscope's messenger records it).
pub fn vulkan_device() -> Option<Arc<WgpuDevice>> {
    heapscope_vulkan::testing::validation_turn();
    let options = heapscope_vulkan::ContextOptions::from_env().with_validation(true);
    match WgpuDevice::from_vulkan(&options) {
        Ok(device) => Some(Arc::new(device)),
        Err(error) => skip_or_panic(&error),
    }
}

/// Both: every device test runs on each.
pub fn devices() -> Vec<(&'static str, Arc<WgpuDevice>)> {
    let mut devices = Vec::new();
    if let Some(device) = device() {
        devices.push(("wgpu", device));
    }
    if let Some(device) = vulkan_device() {
        devices.push(("wgpu on heapscope's Vulkan device", device));
    }
    devices
}

/// Drops the last handle of the device and asserts that wgpu reported no uncaptured error, the validation layer
/// nothing (heapscope's log for interop, wgpu-hal's log otherwise), and that nothing kept the Vulkan context.
pub fn finish(device: Arc<WgpuDevice>) {
    let errors = device.errors().clone();
    let backend = device.info().backend;
    let validation = device.vulkan_context().map(|context| (context.validation_log(), Arc::downgrade(context)));
    let device = Arc::into_inner(device).expect("every heap and runner was dropped before finish()");
    drop(device);
    let errors = errors.messages();
    assert!(errors.is_empty(), "wgpu errors:\n{}", errors.join("\n"));
    if let Some((log, context)) = validation {
        assert!(context.upgrade().is_none(), "wgpu kept the Vulkan context alive");
        let messages = log.messages();
        assert!(messages.is_empty(), "validation messages:\n{}", messages.join("\n"));
    }
    // Without what the backends wgpu probed but did not choose logged: not about this device's work.
    let logged = hal_log::messages(backend);
    assert!(logged.is_empty(), "wgpu-hal logged:\n{}", logged.join("\n"));
}
