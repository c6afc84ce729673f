//! [`WgpuDevice`]: a wgpu device and queue, chosen like heapscope's Vulkan device, with every wgpu error recorded.

use std::fmt;
use std::sync::{Arc, Mutex};

use heapscope_core::selection::{DeviceCandidate, DeviceKind, SelectionError, select_device};

use crate::WgpuError;

/// How to bring up a device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Which adapter (the syntax of `HEAPSCOPE_DEVICE`: index, vendor, or name substring; see
    /// [`select_device`]); `None`: the first discrete GPU, else the first adapter.
    pub selector: Option<String>,
    /// Ask wgpu for backend validation (`InstanceFlags::VALIDATION`: the Vulkan validation layer where installed).
    /// Backend messages then go to the `log` crate; wgpu's own validation is always on.
    pub validation: bool,
}

impl DeviceOptions {
    /// Options from the environment: `HEAPSCOPE_DEVICE` and `HEAPSCOPE_VALIDATION=1`.
    pub fn from_env() -> Self {
        let validation = heapscope_core::selection::validation_asked(std::env::var("HEAPSCOPE_VALIDATION").ok().as_deref());
        Self { selector: std::env::var("HEAPSCOPE_DEVICE").ok(), validation }
    }
}

/// The errors wgpu reported outside any error scope (`Device::on_uncaptured_error`); shared, so it can be read
/// from anywhere and after the device is gone. Tests assert it empty.
#[derive(Clone, Debug, Default)]
pub struct ErrorLog {
    messages: Arc<Mutex<Vec<String>>>,
}

impl ErrorLog {
    /// The errors so far, as wgpu words them.
    pub fn messages(&self) -> Vec<String> {
        self.messages.lock().map_or_else(|poisoned| poisoned.into_inner().clone(), |messages| messages.clone())
    }

    fn push(&self, message: String) {
        match self.messages.lock() {
            Ok(mut messages) => messages.push(message),
            Err(poisoned) => poisoned.into_inner().push(message),
        }
    }
}

/// What an error scope caught.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caught {
    /// Whether it was an out-of-memory error.
    pub out_of_memory: bool,
    /// wgpu's message.
    pub message: String,
}

/// A wgpu device and queue (see the crate documentation). Shared through an `Arc` by the arena heaps and kernel
/// runners made on it.
pub struct WgpuDevice {
    // wgpu's handles before what keeps the Vulkan context (interop) alive.
    queue: wgpu::Queue,
    device: wgpu::Device,
    adapter: wgpu::Adapter,
    _instance: Option<wgpu::Instance>,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    errors: ErrorLog,
    #[cfg(feature = "vulkan")]
    vulkan: Option<heapscope_vulkan::wgpu_interop::WgpuVulkan>,
}

impl fmt::Debug for WgpuDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuDevice")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .field("interop", &self.is_vulkan_interop())
            .finish_non_exhaustive()
    }
}

/// What the selection knows of an adapter (its device type as the selection's kind).
fn candidate(info: &wgpu::AdapterInfo) -> DeviceCandidate {
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => DeviceKind::Discrete,
        wgpu::DeviceType::IntegratedGpu => DeviceKind::Integrated,
        wgpu::DeviceType::VirtualGpu => DeviceKind::Virtual,
        wgpu::DeviceType::Cpu => DeviceKind::Cpu,
        wgpu::DeviceType::Other => DeviceKind::Other,
    };
    DeviceCandidate { name: info.name.clone(), vendor_id: info.vendor, kind }
}

/// The index of the adapter `selector` names among `adapters` (the rules of [`select_device`]).
///
/// # Errors
/// [`WgpuError::NoAdapter`] for an empty list; [`WgpuError::NoMatchingAdapter`] listing the adapters.
pub fn select_adapter(adapters: &[wgpu::AdapterInfo], selector: Option<&str>) -> Result<usize, WgpuError> {
    let candidates: Vec<DeviceCandidate> = adapters.iter().map(candidate).collect();
    select_device(&candidates, selector).map_err(|error| match error {
        SelectionError::NoMatchingDevice { selector, .. } => {
            let listed: Vec<String> = adapters
                .iter()
                .enumerate()
                .map(|(index, info)| format!("{index}: {} (vendor {:#x}, {:?})", info.name, info.vendor, info.backend))
                .collect();
            WgpuError::NoMatchingAdapter { selector, adapters: listed.join(", ") }
        }
        SelectionError::NoDevice => WgpuError::NoAdapter,
    })
}

impl WgpuDevice {
    /// Opens the adapter `options` selects, with all its limits (so arenas can be as large as the device allows)
    /// and no optional feature.
    ///
    /// # Errors
    /// [`WgpuError::NoAdapter`], [`WgpuError::NoMatchingAdapter`], [`WgpuError::RequestDevice`].
    pub fn new(options: &DeviceOptions) -> Result<Self, WgpuError> {
        let (instance, adapters, index) = Self::enumerate(options)?;
        let adapter = adapters.into_iter().nth(index).ok_or(WgpuError::NoAdapter)?;
        let limits = adapter.limits();
        let descriptor = wgpu::DeviceDescriptor {
            label: Some("heapscope"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&descriptor))
            .map_err(|error| WgpuError::RequestDevice { adapter: adapter.get_info().name, message: error.to_string() })?;
        Ok(Self::assemble(Some(instance), adapter, device, queue))
    }

    /// The adapter [`WgpuDevice::new`] would open for `options` (its name, vendor and backend), without opening a
    /// device.
    ///
    /// # Errors
    /// [`WgpuError::NoAdapter`], [`WgpuError::NoMatchingAdapter`].
    pub fn selected_adapter(options: &DeviceOptions) -> Result<wgpu::AdapterInfo, WgpuError> {
        let (_, adapters, index) = Self::enumerate(options)?;
        adapters.get(index).map(wgpu::Adapter::get_info).ok_or(WgpuError::NoAdapter)
    }

    /// An instance for `options`, its adapters, and the index of the one `options` select.
    pub(crate) fn enumerate(options: &DeviceOptions) -> Result<(wgpu::Instance, Vec<wgpu::Adapter>, usize), WgpuError> {
        // Validation without `DEBUG`: with it wgpu writes the WGSL into the SPIR-V (`OpSource` language 10), which
        // validation layers older than that language value reject as invalid SPIR-V.
        let mut flags = if options.validation { wgpu::InstanceFlags::VALIDATION } else { wgpu::InstanceFlags::empty() };
        flags = flags.with_env();
        let descriptor = wgpu::InstanceDescriptor { flags, ..wgpu::InstanceDescriptor::new_without_display_handle() };
        let instance = wgpu::Instance::new(descriptor);
        let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        let infos: Vec<wgpu::AdapterInfo> = adapters.iter().map(wgpu::Adapter::get_info).collect();
        let index = select_adapter(&infos, options.selector.as_deref())?;
        Ok((instance, adapters, index))
    }

    /// The adapters wgpu lists, in the order `HEAPSCOPE_DEVICE` indices count them.
    pub fn adapters() -> Vec<wgpu::AdapterInfo> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
        let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        adapters.iter().map(wgpu::Adapter::get_info).collect()
    }

    fn assemble(instance: Option<wgpu::Instance>, adapter: wgpu::Adapter, device: wgpu::Device, queue: wgpu::Queue) -> Self {
        let errors = ErrorLog::default();
        let log = errors.clone();
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| log.push(error.to_string())));
        let info = adapter.get_info();
        let limits = device.limits();
        Self {
            queue,
            device,
            adapter,
            _instance: instance,
            info,
            limits,
            errors,
            #[cfg(feature = "vulkan")]
            vulkan: None,
        }
    }

    /// wgpu's device.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// wgpu's queue. With Vulkan interop, every queue operation wgpu makes takes the context's queue lock (the
    /// queue may be the one heapscope binds sparse pages on), so any thread may submit to it.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// wgpu's adapter.
    pub fn adapter(&self) -> &wgpu::Adapter {
        &self.adapter
    }

    /// The adapter's name, vendor, backend.
    pub fn info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// The device's limits (the adapter's, all of them asked for).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// The errors wgpu reported outside error scopes so far.
    pub fn errors(&self) -> &ErrorLog {
        &self.errors
    }

    /// Whether this device is heapscope's Vulkan device ([`WgpuDevice::from_vulkan`]).
    pub fn is_vulkan_interop(&self) -> bool {
        #[cfg(feature = "vulkan")]
        return self.vulkan.is_some();
        #[cfg(not(feature = "vulkan"))]
        false
    }

    /// Waits until `submission` (or, with `None`, everything submitted) has completed.
    ///
    /// # Errors
    /// [`WgpuError::Wait`] (device lost, timeout).
    pub fn wait(&self, submission: Option<wgpu::SubmissionIndex>) -> Result<(), WgpuError> {
        let poll = wgpu::PollType::Wait { submission_index: submission, timeout: None };
        self.device.poll(poll).map(drop).map_err(|error| WgpuError::Wait(error.to_string()))
    }

    /// Runs `work` inside error scopes for validation, out-of-memory and internal errors; returns its value, or
    /// the first error caught.
    pub(crate) fn scoped<T>(&self, work: impl FnOnce() -> T) -> Result<T, Caught> {
        let out_of_memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let value = work();
        let internal = pollster::block_on(internal.pop());
        let validation = pollster::block_on(validation.pop());
        let out_of_memory = pollster::block_on(out_of_memory.pop());
        match (out_of_memory, validation, internal) {
            (Some(error), _, _) => Err(Caught { out_of_memory: true, message: error.to_string() }),
            (None, Some(error), _) | (None, None, Some(error)) => {
                Err(Caught { out_of_memory: false, message: error.to_string() })
            }
            (None, None, None) => Ok(value),
        }
    }

    /// Runs `work` inside error scopes for validation, out-of-memory and internal errors: its value, or the first
    /// error caught as a [`WgpuError::Device`] for `during`.
    pub fn checked<T>(&self, during: &'static str, work: impl FnOnce() -> T) -> Result<T, WgpuError> {
        self.scoped(work).map_err(|caught| WgpuError::Device { during, message: caught.message })
    }
}

#[cfg(feature = "vulkan")]
impl WgpuDevice {
    /// wgpu on heapscope's own Vulkan device, brought up for `options` with wgpu-hal's extensions and features
    /// plus the sparse ones ([`heapscope_vulkan::wgpu_interop`]): heapscope's device memory and sparse buffers can
    /// then be wgpu buffers ([`crate::VulkanBlockBuffer`], [`crate::VulkanPagedHeap`]).
    ///
    /// # Errors
    /// [`WgpuError::Vulkan`] when the context cannot be brought up or wgpu-hal refuses it.
    pub fn from_vulkan(options: &heapscope_vulkan::ContextOptions) -> Result<Self, WgpuError> {
        Self::from_interop(heapscope_vulkan::wgpu_interop::WgpuVulkan::new(options)?)
    }

    /// wgpu over a context made for it (another device may share it, e.g. to run kernels on two wgpu devices).
    ///
    /// # Errors
    /// [`WgpuError::Vulkan`] for a context not made by [`WgpuDevice::from_vulkan`] or refused by wgpu-hal.
    pub fn from_vulkan_context(context: Arc<heapscope_vulkan::VulkanContext>) -> Result<Self, WgpuError> {
        Self::from_interop(heapscope_vulkan::wgpu_interop::WgpuVulkan::from_context(context)?)
    }

    fn from_interop(vulkan: heapscope_vulkan::wgpu_interop::WgpuVulkan) -> Result<Self, WgpuError> {
        let mut this = Self::assemble(None, vulkan.adapter().clone(), vulkan.device().clone(), vulkan.queue().clone());
        this.vulkan = Some(vulkan);
        Ok(this)
    }

    /// The interop (the Vulkan context and wgpu over it), for a device made by [`WgpuDevice::from_vulkan`].
    pub fn vulkan(&self) -> Option<&heapscope_vulkan::wgpu_interop::WgpuVulkan> {
        self.vulkan.as_ref()
    }

    /// The Vulkan context, for a device made by [`WgpuDevice::from_vulkan`].
    pub fn vulkan_context(&self) -> Option<&Arc<heapscope_vulkan::VulkanContext>> {
        self.vulkan.as_ref().map(heapscope_vulkan::wgpu_interop::WgpuVulkan::context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, vendor: u32, device_type: wgpu::DeviceType) -> wgpu::AdapterInfo {
        wgpu::AdapterInfo {
            name: name.into(),
            vendor,
            device: 0,
            device_type,
            device_pci_bus_id: String::new(),
            driver: String::new(),
            driver_info: String::new(),
            backend: wgpu::Backend::Vulkan,
            subgroup_min_size: 4,
            subgroup_max_size: 128,
            transient_saves_memory: Some(false),
            limit_bucket: None,
        }
    }

    /// The selection rules of the Vulkan crate, on wgpu's adapter descriptions.
    #[test]
    fn adapters_are_selected_like_vulkan_devices() {
        let adapters = [
            info("llvmpipe (LLVM 19.1.7, 256 bits)", 0x10005, wgpu::DeviceType::Cpu),
            info("NVIDIA H200", 0x10de, wgpu::DeviceType::DiscreteGpu),
            info("AMD Radeon 780M", 0x1002, wgpu::DeviceType::IntegratedGpu),
        ];
        let table: [(Option<&str>, Option<usize>); 8] = [
            (None, Some(1)),
            (Some(""), Some(1)),
            (Some("2"), Some(2)),
            (Some("0x1002"), Some(2)),
            (Some("mesa"), Some(0)),
            (Some("LLVMpipe"), Some(0)),
            (Some("nvidia"), Some(1)),
            (Some("3"), None),
        ];
        for (selector, expected) in table {
            let got = select_adapter(&adapters, selector);
            match expected {
                Some(index) => assert_eq!(got.ok(), Some(index), "{selector:?}"),
                None => {
                    let error = got.expect_err("no such adapter").to_string();
                    assert!(error.contains("HEAPSCOPE_DEVICE=\"3\"") && error.contains("1: NVIDIA H200"), "{error}");
                }
            }
        }
        assert!(matches!(select_adapter(&[], None), Err(WgpuError::NoAdapter)));
    }
}
