//! The window's GPU device, shared with live mode: heapscope's own Vulkan device, which the window draws with
//! and live runs allocate on, so the live mode shows the heap of the very device that draws it.
//!
//! ## Design
//!
//! - [`SharedDevice::open`] brings up heapscope's Vulkan context prepared for wgpu
//!   ([`heapscope_vulkan::wgpu_interop::WgpuVulkan`]: wgpu-hal's extensions and features plus heapscope's sparse
//!   binding, timeline semaphores and memory budget), and [`SharedDevice::wgpu_setup`] hands wgpu's instance,
//!   adapter, device and queue over it to eframe or egui_kittest (`egui_wgpu::WgpuSetup::Existing`).
//! - The renderer (egui-wgpu: submits and presents every frame) and a live run (compute submits and
//!   `vkQueueBindSparse` on a worker thread) use one `VkQueue` on a device with one queue (lavapipe). Vulkan wants
//!   every use of a queue externally synchronised; egui-wgpu knows nothing of heapscope's lock, so the interop hands
//!   wgpu-hal queue entry points that take the context's queue lock themselves (`heapscope_vulkan`'s
//!   `queue_guard`): the renderer and the worker never touch the queue at once, with no change to eframe.
//! - Where the device cannot be shared (no Vulkan, wgpu-hal refuses the device, its compute queue is not of family
//!   0 with graphics: wgpu-hal checks presentation on family 0, and every major vendor's family 0 draws and computes),
//!   [`SharedDevice::open`] says why; the window then draws with eframe's own choice of adapter, and live runs open a
//!   device of their own ([`crate::device_live::open_device`]).

use std::fmt;
use std::sync::Arc;

use eframe::egui_wgpu::{WgpuSetup, WgpuSetupExisting};
use heapscope_vulkan::ash::vk;
use heapscope_vulkan::wgpu_interop::WgpuVulkan;
use heapscope_vulkan::{ContextOptions, VulkanContext};

/// heapscope's Vulkan device with wgpu over it, for the window and live runs alike. See the module documentation.
pub struct SharedDevice {
    wgpu: WgpuVulkan,
}

impl fmt::Debug for SharedDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedDevice").field("device", &self.name()).finish_non_exhaustive()
    }
}

impl SharedDevice {
    /// heapscope's device for `options` (`ContextOptions::from_env()`: `HEAPSCOPE_DEVICE`, `HEAPSCOPE_VALIDATION`),
    /// with wgpu over it.
    ///
    /// # Errors
    /// Why it cannot be shared: no Vulkan device, wgpu-hal refuses it, or its compute queue is not of family 0 with
    /// graphics (wgpu-hal checks presentation on family 0).
    pub fn open(options: &ContextOptions) -> anyhow::Result<Self> {
        let wgpu =
            WgpuVulkan::new(options).map_err(|error| anyhow::anyhow!("no Vulkan device to share with the window: {error}"))?;
        let context = wgpu.context();
        let (family, _) = context.compute_queue();
        let flags = context
            .properties()
            .queue_families
            .iter()
            .find(|info| info.index == family)
            .map_or(vk::QueueFlags::empty(), |info| info.flags);
        // wgpu-hal asks whether a surface can be presented from queue family 0 (whatever family the device's queue
        // is of): only a queue of that family, with graphics, draws and presents as wgpu expects.
        if family != 0 || !flags.contains(vk::QueueFlags::GRAPHICS) {
            anyhow::bail!(
                "{}: its compute queue is of family {family} ({flags:?}), not of family 0 with graphics, which \
                 wgpu draws and presents with, so the window draws elsewhere",
                context.properties().name
            );
        }
        Ok(Self { wgpu })
    }

    /// The device for the window: [`SharedDevice::open`] with `ContextOptions::from_env()`, unless
    /// `HEAPSCOPE_SHARE_DEVICE=0` asks the window to draw with eframe's own choice of adapter.
    ///
    /// # Errors
    /// Why the window does not draw with heapscope's device (it works either way).
    pub fn for_window() -> anyhow::Result<Self> {
        if std::env::var("HEAPSCOPE_SHARE_DEVICE").is_ok_and(|value| value.trim() == "0") {
            anyhow::bail!("HEAPSCOPE_SHARE_DEVICE=0: the window draws with eframe's own adapter");
        }
        Self::open(&ContextOptions::from_env())
    }

    /// The Vulkan context: live runs allocate on it.
    pub fn context(&self) -> &Arc<VulkanContext> {
        self.wgpu.context()
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.wgpu.context().properties().name
    }

    /// wgpu's instance, adapter, device and queue over it, for eframe (`NativeOptions::wgpu_options`) or
    /// egui_kittest (`WgpuTestRenderer::from_setup`).
    pub fn wgpu_setup(&self) -> WgpuSetup {
        WgpuSetup::Existing(WgpuSetupExisting {
            instance: self.wgpu.instance().clone(),
            adapter: self.wgpu.adapter().clone(),
            device: self.wgpu.device().clone(),
            queue: self.wgpu.queue().clone(),
        })
    }

    /// What the Vulkan validation layer said on this device so far (empty without `HEAPSCOPE_VALIDATION=1`).
    pub fn validation_messages(&self) -> Vec<String> {
        self.wgpu.context().validation_messages()
    }
}
