//! Instance and device bring-up: [`VulkanContext`].
//!
//! Vulkan 1.3 is requested; the physical device is chosen by [`select_device`] (`HEAPSCOPE_DEVICE`); the
//! sparse features, `timelineSemaphore` and `VK_EXT_memory_budget` are enabled where the device has them; one
//! queue of a compute family and one of a sparse-binding family (often the same family) are created. With
//! validation on, `VK_LAYER_KHRONOS_validation` is enabled and a `VK_EXT_debug_utils` messenger records every
//! warning and error into a [`ValidationLog`] that tests assert empty.

use std::ffi::{CStr, c_void};
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ash::vk;

use crate::VulkanError;
use crate::properties::{self, DeviceFeatures, DeviceProperties, HeapBudget};
use heapscope_core::selection::{DeviceCandidate, DeviceKind, select_device};

/// The Khronos validation layer.
pub const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// How to bring up a context.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContextOptions {
    /// Enable the validation layer and record its warnings and errors.
    pub validation: bool,
    /// Which device (the syntax of `HEAPSCOPE_DEVICE`, see [`select_device`]); `None`: the first discrete GPU.
    pub device_selector: Option<String>,
}

impl ContextOptions {
    /// Options from the environment: `HEAPSCOPE_VALIDATION=1` and `HEAPSCOPE_DEVICE`.
    pub fn from_env() -> Self {
        let validation = heapscope_core::selection::validation_asked(std::env::var("HEAPSCOPE_VALIDATION").ok().as_deref());
        Self { validation, device_selector: std::env::var("HEAPSCOPE_DEVICE").ok() }
    }

    /// The same options with validation on or off.
    #[must_use]
    pub fn with_validation(self, validation: bool) -> Self {
        Self { validation, ..self }
    }
}

/// The warnings and errors the validation layer reported; shared, so it can be read after the context is gone
/// (messages about objects leaked at `vkDestroyDevice` arrive then).
#[derive(Clone, Debug, Default)]
pub struct ValidationLog {
    messages: Arc<Mutex<Vec<String>>>,
}

impl ValidationLog {
    /// The messages so far, `"[ERROR] text"`.
    pub fn messages(&self) -> Vec<String> {
        self.messages.lock().map_or_else(|poisoned| poisoned.into_inner().clone(), |messages| messages.clone())
    }
}

/// The debug messenger's callback: records warnings and errors into the [`ValidationLog`] behind `user_data` (not the
/// loader's own messages, which are about the machine).
unsafe extern "system" fn record_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    callback_data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user_data: *mut c_void,
) -> vk::Bool32 {
    if user_data.is_null() || callback_data.is_null() {
        return vk::FALSE;
    }
    // SAFETY: `user_data` is the `Arc<Mutex<Vec<String>>>` payload of the context's `ValidationLog`
    // (`Arc::as_ptr`), which the context keeps alive until after the messenger and the instance are destroyed.
    let messages = unsafe { &*user_data.cast::<Mutex<Vec<String>>>() };
    // SAFETY: the layer passes a valid callback data structure for the duration of the call.
    let data = unsafe { &*callback_data };
    // The loader's own messages (an implicit layer of an older API version, a stale driver manifest) are about the
    // machine, not about heapscope's use of Vulkan: a desktop with Mesa, RenderDoc or Steam installed has some.
    // SAFETY: `p_message_id_name` is null or a NUL-terminated string valid for the call (the spec of the callback).
    if unsafe { data.message_id_name_as_c_str() } == Some(c"Loader Message") {
        return vk::FALSE;
    }
    // SAFETY: `p_message` is null or a NUL-terminated string valid for the call (the spec of the callback).
    let text = unsafe { data.message_as_c_str() }.map_or_else(|| "<no message>".into(), CStr::to_string_lossy);
    let level = if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) { "ERROR" } else { "WARNING" };
    match messages.lock() {
        Ok(mut messages) => messages.push(format!("[{level}] {text}")),
        Err(poisoned) => poisoned.into_inner().push(format!("[{level}] {text}")),
    }
    vk::FALSE
}

struct Debug {
    loader: ash::ext::debug_utils::Instance,
    messenger: vk::DebugUtilsMessengerEXT,
}

/// What heapscope asks of a device, for a [`DeviceHook`] that creates it instead (wgpu interop). `timelineSemaphore`
/// is not in it: the hook's library enables it where the device has it (wgpu-hal does).
#[cfg_attr(not(feature = "wgpu"), expect(dead_code, reason = "read by the hook of `wgpu_interop` only"))]
pub(crate) struct DeviceRequest<'a> {
    /// The queues: one of the compute family, one of the sparse family when it differs.
    pub queue_infos: &'a [vk::DeviceQueueCreateInfo<'a>],
    /// The core features heapscope enables (the sparse bits).
    pub core_features: vk::PhysicalDeviceFeatures,
    /// The device extensions heapscope enables (`VK_EXT_memory_budget` when present).
    pub extensions: &'a [&'static CStr],
}

/// Another library's needs merged into heapscope's bring-up: more instance extensions, and the device created
/// with that library's extensions and features as well as heapscope's ([`DeviceRequest`]).
pub(crate) trait DeviceHook {
    /// Instance extensions to enable beyond heapscope's own (each one available).
    fn instance_extensions(&mut self, entry: &ash::Entry) -> Result<Vec<&'static CStr>, VulkanError>;

    /// Creates the device on `physical_device` with at least what `request` asks; returns it and every device
    /// extension it enabled.
    fn create_device(
        &mut self,
        entry: &ash::Entry,
        instance: &ash::Instance,
        instance_extensions: &[&'static CStr],
        physical_device: vk::PhysicalDevice,
        request: &DeviceRequest<'_>,
    ) -> Result<(ash::Device, Vec<&'static CStr>), VulkanError>;
}

/// A Vulkan instance and logical device, with what heapscope needs to know about them.
pub struct VulkanContext {
    entry: ash::Entry,
    instance: ash::Instance,
    /// The instance extensions enabled (for wgpu interop, which must be told).
    instance_extensions: Vec<&'static CStr>,
    /// The device extensions enabled.
    device_extensions: Vec<&'static CStr>,
    /// Whether a [`DeviceHook`] created the device (with wgpu-hal's extensions and features).
    hooked: bool,
    debug: Option<Debug>,
    validation_log: ValidationLog,
    physical_device: vk::PhysicalDevice,
    device: ash::Device,
    properties: DeviceProperties,
    enabled_features: DeviceFeatures,
    compute_queue_family: u32,
    compute_queue: vk::Queue,
    sparse_queue: Option<(u32, vk::Queue)>,
    /// Held around every submission to the compute or sparse queue: they may be the same `VkQueue`, which
    /// Vulkan requires to be externally synchronised.
    /// (An `Arc`: wgpu-hal's queue operations take it too, see `queue_guard`.)
    queue_lock: Arc<Mutex<()>>,
    /// Live `vkAllocateMemory` allocations heapscope made on this device, for `maxMemoryAllocationCount`.
    pub(crate) live_allocations: AtomicU32,
    /// Bytes of `sparseAddressSpaceSize` the live sparse buffers hold: a limit on all of them together.
    sparse_bytes: AtomicU64,
}

impl fmt::Debug for VulkanContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanContext")
            .field("device", &self.properties.name)
            .field("api_version", &self.properties.api_version_text())
            .field("enabled_features", &self.enabled_features)
            .field("compute_queue_family", &self.compute_queue_family)
            .field("sparse_queue_family", &self.sparse_queue_family())
            .field("validation", &self.debug.is_some())
            .finish_non_exhaustive()
    }
}

impl VulkanContext {
    /// Loads `libvulkan`, creates an instance and a device following `options`.
    ///
    /// # Errors
    /// [`VulkanError::NoLoader`] / [`VulkanError::NoDriver`] / [`VulkanError::NoDevice`] when there is no Vulkan
    /// ([`VulkanError::means_no_vulkan`]),
    /// [`VulkanError::NoMatchingDevice`] for a selector that matches nothing, [`VulkanError::MissingLayer`] when
    /// validation is asked for but the layer is missing, [`VulkanError::Unsupported`] for a device without a
    /// compute queue, and
    /// [`VulkanError::Vk`] when a call fails.
    pub fn new(options: &ContextOptions) -> Result<Self, VulkanError> {
        Self::create(options, None)
    }

    /// [`VulkanContext::new`], with `hook` adding instance extensions and creating the device.
    pub(crate) fn create(options: &ContextOptions, mut hook: Option<&mut dyn DeviceHook>) -> Result<Self, VulkanError> {
        // SAFETY: loading libvulkan runs its initialisers; the Vulkan loader is designed to be loaded so.
        let entry = unsafe { ash::Entry::load() }.map_err(|error| VulkanError::NoLoader(error.to_string()))?;
        let extra = match hook.as_deref_mut() {
            Some(hook) => hook.instance_extensions(&entry)?,
            None => Vec::new(),
        };
        let validation_log = ValidationLog::default();
        let (instance, debug, instance_extensions) = create_instance(&entry, options.validation, &validation_log, &extra)?;
        // From here on, a failure must destroy the instance (before the loader is unloaded and the log freed):
        // `Partial` does so on drop.
        let partial = Partial { entry, instance, debug, validation_log, instance_extensions };
        partial.device(options, hook)
    }

    /// Every physical device the loader lists, in order (the indices `HEAPSCOPE_DEVICE` and
    /// [`ContextOptions::device_selector`] take), from a short-lived instance without validation.
    ///
    /// # Errors
    /// [`VulkanError::NoLoader`] / [`VulkanError::NoDriver`] when there is no Vulkan, [`VulkanError::Vk`] when
    /// a call fails. No device is an empty list.
    pub fn enumerate_devices() -> Result<Vec<DeviceCandidate>, VulkanError> {
        // SAFETY: loading libvulkan runs its initialisers; the Vulkan loader is designed to be loaded so.
        let entry = unsafe { ash::Entry::load() }.map_err(|error| VulkanError::NoLoader(error.to_string()))?;
        let validation_log = ValidationLog::default();
        let (instance, debug, instance_extensions) = create_instance(&entry, false, &validation_log, &[])?;
        let partial = Partial { entry, instance, debug, validation_log, instance_extensions };
        partial.candidates().map(|(_, candidates)| candidates)
    }

    /// `ash`'s instance.
    pub fn instance(&self) -> &ash::Instance {
        &self.instance
    }

    /// The loader's entry points.
    pub fn entry(&self) -> &ash::Entry {
        &self.entry
    }

    /// The instance extensions enabled.
    pub fn instance_extensions(&self) -> &[&'static CStr] {
        &self.instance_extensions
    }

    /// The device extensions enabled.
    pub fn device_extensions(&self) -> &[&'static CStr] {
        &self.device_extensions
    }

    /// Whether the device was created for wgpu interop (with wgpu-hal's extensions and features).
    pub fn is_prepared_for_wgpu(&self) -> bool {
        self.hooked
    }

    /// `ash`'s device.
    pub fn device(&self) -> &ash::Device {
        &self.device
    }

    /// The physical device in use.
    pub fn physical_device(&self) -> vk::PhysicalDevice {
        self.physical_device
    }

    /// Its properties, memory types and limits.
    pub fn properties(&self) -> &DeviceProperties {
        &self.properties
    }

    /// The features this context enabled.
    pub fn enabled_features(&self) -> DeviceFeatures {
        self.enabled_features
    }

    /// The queue family with compute, and its queue.
    pub fn compute_queue(&self) -> (u32, vk::Queue) {
        (self.compute_queue_family, self.compute_queue)
    }

    /// The queue family with sparse binding (may be the compute family), when `sparseBinding` is enabled.
    pub fn sparse_queue(&self) -> Option<(u32, vk::Queue)> {
        self.sparse_queue
    }

    /// Holds the lock every submission to [`VulkanContext::compute_queue`] or [`VulkanContext::sparse_queue`]
    /// takes (`vkQueueSubmit`, `vkQueueBindSparse`): the two may be one `VkQueue`, which must not be used from
    /// two threads at once. A poisoned lock is taken over (it guards no data).
    pub fn lock_queues(&self) -> std::sync::MutexGuard<'_, ()> {
        self.queue_lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until the whole device is idle, every queue locked for the wait (what a fence wait that failed after a
    /// submission falls back on); whether it went idle (not on a lost device, where submitted work may count as
    /// pending for good).
    pub(crate) fn wait_idle(&self) -> bool {
        let _queues = self.lock_queues();
        // SAFETY: every queue of the device is locked for the wait.
        unsafe { self.device.device_wait_idle() }.is_ok()
    }

    /// The lock [`VulkanContext::lock_queues`] takes, for wgpu-hal's guarded queue operations.
    #[cfg(feature = "wgpu")]
    pub(crate) fn queue_lock(&self) -> Arc<Mutex<()>> {
        Arc::clone(&self.queue_lock)
    }

    /// The sparse-binding queue family's index.
    pub fn sparse_queue_family(&self) -> Option<u32> {
        self.sparse_queue.map(|(family, _)| family)
    }

    /// Whether the validation layer is on.
    pub fn validation_enabled(&self) -> bool {
        self.debug.is_some()
    }

    /// The validation layer's warnings and errors so far (always empty without validation).
    pub fn validation_messages(&self) -> Vec<String> {
        self.validation_log.messages()
    }

    /// The shared log behind [`VulkanContext::validation_messages`], readable after the context is dropped.
    pub fn validation_log(&self) -> ValidationLog {
        self.validation_log.clone()
    }

    /// Live `vkAllocateMemory` allocations heapscope made on this device (sources' blocks, sparse page chunks, staging
    /// and host words, VMA's and gpu-allocator's blocks).
    pub fn live_allocation_count(&self) -> u32 {
        self.live_allocations.load(Ordering::Relaxed)
    }

    /// Counts one more live `vkAllocateMemory` allocation before it is made, or refuses past the device's
    /// `maxMemoryAllocationCount` (the error says how many are live); [`VulkanContext::give_back_allocation_slot`] once
    /// it is freed (or failed).
    pub(crate) fn take_allocation_slot(&self) -> Result<(), String> {
        let limit = self.properties.limits.max_memory_allocation_count;
        self.live_allocations
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |live| (live < limit).then_some(live + 1))
            .map(drop)
            .map_err(|live| {
                format!("{live} device memory allocations are live: the device's maxMemoryAllocationCount is {limit}")
            })
    }

    /// One live allocation counted by [`VulkanContext::take_allocation_slot`] is gone.
    pub(crate) fn give_back_allocation_slot(&self) {
        self.live_allocations.fetch_sub(1, Ordering::AcqRel);
    }

    /// Holds `bytes` of the device's `sparseAddressSpaceSize` for a sparse buffer about to be used, or refuses past it
    /// (the limit is on every live sparse resource of the device together; the error says how much is held);
    /// [`VulkanContext::give_back_sparse_space`] when the buffer goes.
    pub(crate) fn take_sparse_space(&self, bytes: u64) -> Result<(), String> {
        let limit = self.properties.limits.sparse_address_space_size_bytes;
        self.sparse_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| held.checked_add(bytes).filter(|&total| total <= limit))
            .map(drop)
            .map_err(|held| {
                format!(
                    "a sparse buffer of {bytes} B does not fit: live sparse buffers hold {held} B of the device's \
                     sparseAddressSpaceSize of {limit} B"
                )
            })
    }

    /// Refuses a `VkBuffer` of `size_bytes` past the device's `maxBufferSize` (where the device says it: Vulkan 1.3's
    /// maintenance4), before it is created: `what` names it in the error.
    pub(crate) fn check_buffer_size(&self, size_bytes: u64, what: &str) -> Result<(), String> {
        match self.properties.limits.max_buffer_size_bytes {
            Some(max) if size_bytes > max => {
                Err(format!("{what} of {size_bytes} B is larger than the device's maxBufferSize ({max} B)"))
            }
            _ => Ok(()),
        }
    }

    /// `bytes` held by [`VulkanContext::take_sparse_space`] are free again.
    pub(crate) fn give_back_sparse_space(&self, bytes: u64) {
        self.sparse_bytes.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// The budget of every memory heap: from `VK_EXT_memory_budget` when enabled, else the heap sizes.
    pub fn heap_budgets(&self) -> Vec<HeapBudget> {
        let heaps = &self.properties.memory_heaps;
        if self.enabled_features.memory_budget {
            let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
            let mut memory = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
            // SAFETY: the physical device belongs to this live instance; the chain holds a structure the
            // enabled extension defines.
            unsafe { self.instance.get_physical_device_memory_properties2(self.physical_device, &mut memory) };
            return (0..)
                .zip(heaps)
                .map(|(heap_index, _)| HeapBudget {
                    heap_index,
                    budget_bytes: budget.heap_budget[heap_index as usize],
                    usage_bytes: Some(budget.heap_usage[heap_index as usize]),
                    from_extension: true,
                })
                .collect();
        }
        (0..)
            .zip(heaps)
            .map(|(heap_index, heap)| HeapBudget {
                heap_index,
                budget_bytes: heap.size_bytes,
                usage_bytes: None,
                from_extension: false,
            })
            .collect()
    }
}

impl Drop for VulkanContext {
    fn drop(&mut self) {
        #[cfg(feature = "wgpu")]
        crate::queue_guard::forget(self.device.handle());
        // SAFETY: the device is ours and idle once the wait returns; every source holds an `Arc` of this context,
        // so none of its memory outlives it; the messenger and the instance go after the device (children first).
        unsafe {
            // A lost device cannot be waited on; destruction proceeds either way.
            let _ = self.device.device_wait_idle();
            self.device.destroy_device(None);
            if let Some(debug) = self.debug.take() {
                debug.loader.destroy_debug_utils_messenger(debug.messenger, None);
            }
            self.instance.destroy_instance(None);
        }
    }
}

/// An instance (and messenger) not yet owned by a context: destroyed on drop unless turned into one. It owns the
/// loader and the log too, so that both outlive the instance whatever the path out.
struct Partial {
    entry: ash::Entry,
    instance: ash::Instance,
    debug: Option<Debug>,
    validation_log: ValidationLog,
    instance_extensions: Vec<&'static CStr>,
}

impl Drop for Partial {
    fn drop(&mut self) {
        // SAFETY: nothing was created from the instance but the messenger, destroyed first.
        unsafe {
            if let Some(debug) = self.debug.take() {
                debug.loader.destroy_debug_utils_messenger(debug.messenger, None);
            }
            self.instance.destroy_instance(None);
        }
    }
}

fn messenger_info(log: &ValidationLog) -> vk::DebugUtilsMessengerCreateInfoEXT<'static> {
    vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(vk::DebugUtilsMessageSeverityFlagsEXT::WARNING | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR)
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
        )
        .pfn_user_callback(Some(record_message))
        .user_data(Arc::as_ptr(&log.messages).cast_mut().cast())
}

/// An instance (Vulkan 1.3 asked for) with `extra` extensions, and the validation layer and a messenger when
/// `validation`; returns the extensions enabled too.
fn create_instance(
    entry: &ash::Entry,
    validation: bool,
    log: &ValidationLog,
    extra: &[&'static CStr],
) -> Result<(ash::Instance, Option<Debug>, Vec<&'static CStr>), VulkanError> {
    let application =
        vk::ApplicationInfo::default().application_name(c"heapscope").engine_name(c"heapscope").api_version(vk::API_VERSION_1_3);
    let mut layers = Vec::new();
    let mut names: Vec<&'static CStr> = extra.to_vec();
    if validation {
        // SAFETY: a global query of the loaded entry.
        let available = unsafe { entry.enumerate_instance_layer_properties() }
            .map_err(VulkanError::vk("vkEnumerateInstanceLayerProperties"))?;
        if !available.iter().any(|layer| layer.layer_name_as_c_str() == Ok(VALIDATION_LAYER)) {
            return Err(VulkanError::MissingLayer(VALIDATION_LAYER.to_string_lossy().into_owned()));
        }
        layers.push(VALIDATION_LAYER.as_ptr());
        if !names.contains(&ash::ext::debug_utils::NAME) {
            names.push(ash::ext::debug_utils::NAME);
        }
    }
    // Portability drivers (MoltenVK) are listed only to an instance that asks for them.
    // SAFETY: a global query of the loaded entry.
    let portability = unsafe { entry.enumerate_instance_extension_properties(None) }
        .map_err(VulkanError::vk("vkEnumerateInstanceExtensionProperties"))?
        .iter()
        .any(|extension| extension.extension_name_as_c_str() == Ok(ash::khr::portability_enumeration::NAME));
    if portability && !names.contains(&ash::khr::portability_enumeration::NAME) {
        names.push(ash::khr::portability_enumeration::NAME);
    }
    let extensions: Vec<*const std::ffi::c_char> = names.iter().map(|name| name.as_ptr()).collect();
    let mut instance_messenger = messenger_info(log);
    let mut info = vk::InstanceCreateInfo::default()
        .application_info(&application)
        .enabled_layer_names(&layers)
        .enabled_extension_names(&extensions);
    if portability {
        info = info.flags(vk::InstanceCreateFlags::ENUMERATE_PORTABILITY_KHR);
    }
    if validation {
        // Also catches messages of vkCreateInstance and vkDestroyInstance.
        info = info.push_next(&mut instance_messenger);
    }
    // SAFETY: every pointer in `info` (names, application info, messenger info) outlives the call.
    let instance = unsafe { entry.create_instance(&info, None) }.map_err(|result| match result {
        vk::Result::ERROR_INCOMPATIBLE_DRIVER => VulkanError::NoDriver(format!("vkCreateInstance failed: {result}")),
        _ => VulkanError::Vk { call: "vkCreateInstance", result },
    })?;
    if !validation {
        return Ok((instance, None, names));
    }
    let loader = ash::ext::debug_utils::Instance::new(entry, &instance);
    // SAFETY: the instance enabled VK_EXT_debug_utils; `user_data` points into the log's `Arc`, which the
    // caller keeps alive until after the messenger is destroyed.
    match unsafe { loader.create_debug_utils_messenger(&messenger_info(log), None) } {
        Ok(messenger) => Ok((instance, Some(Debug { loader, messenger }), names)),
        Err(result) => {
            // SAFETY: nothing else was created from the instance.
            unsafe { instance.destroy_instance(None) };
            Err(VulkanError::Vk { call: "vkCreateDebugUtilsMessengerEXT", result })
        }
    }
}

impl Partial {
    /// The physical devices and what the selection knows about them.
    fn candidates(&self) -> Result<(Vec<vk::PhysicalDevice>, Vec<DeviceCandidate>), VulkanError> {
        let instance = &self.instance;
        // SAFETY: a query of the live instance.
        let physical_devices = unsafe { instance.enumerate_physical_devices() }.map_err(|result| match result {
            vk::Result::ERROR_INITIALIZATION_FAILED => {
                VulkanError::NoDriver(format!("vkEnumeratePhysicalDevices failed: {result}"))
            }
            _ => VulkanError::Vk { call: "vkEnumeratePhysicalDevices", result },
        })?;
        let candidates: Vec<DeviceCandidate> = physical_devices
            .iter()
            .map(|&physical_device| {
                // SAFETY: the physical device was just enumerated from this instance.
                let properties = unsafe { instance.get_physical_device_properties(physical_device) };
                DeviceCandidate {
                    name: properties
                        .device_name_as_c_str()
                        .map_or_else(|_| String::new(), |name| name.to_string_lossy().into_owned()),
                    vendor_id: properties.vendor_id,
                    kind: device_kind(properties.device_type),
                }
            })
            .collect();
        Ok((physical_devices, candidates))
    }

    /// Chooses the physical device and creates the logical device; the context takes the instance over.
    fn device(self, options: &ContextOptions, hook: Option<&mut dyn DeviceHook>) -> Result<VulkanContext, VulkanError> {
        let (physical_devices, candidates) = self.candidates()?;
        let instance = &self.instance;
        let physical_device = physical_devices[select_device(&candidates, options.device_selector.as_deref())?];

        // SAFETY: the physical device belongs to this live instance (and so for the queries below).
        let raw_properties = unsafe { instance.get_physical_device_properties(physical_device) };
        // SAFETY: as above.
        let raw_memory = unsafe { instance.get_physical_device_memory_properties(physical_device) };
        // SAFETY: as above.
        let families = unsafe { instance.get_physical_device_queue_family_properties(physical_device) };
        // SAFETY: as above.
        let device_extensions = unsafe { instance.enumerate_device_extension_properties(physical_device) }
            .map_err(VulkanError::vk("vkEnumerateDeviceExtensionProperties"))?;
        let has_vulkan_1_2 = raw_properties.api_version >= vk::API_VERSION_1_2;
        let mut features_1_2 = vk::PhysicalDeviceVulkan12Features::default();
        let mut features = vk::PhysicalDeviceFeatures2::default();
        if has_vulkan_1_2 {
            features = features.push_next(&mut features_1_2);
        }
        // SAFETY: as above; the chain holds a 1.2 structure only on a 1.2 device.
        unsafe { instance.get_physical_device_features2(physical_device, &mut features) };
        let core = features.features;
        let has_extension =
            |name: &CStr| device_extensions.iter().any(|extension| extension.extension_name_as_c_str() == Ok(name));
        let memory_budget = has_extension(ash::ext::memory_budget::NAME);
        let supported = DeviceFeatures {
            sparse_binding: core.sparse_binding == vk::TRUE,
            sparse_residency_buffer: core.sparse_residency_buffer == vk::TRUE,
            sparse_residency_aliased: core.sparse_residency_aliased == vk::TRUE,
            timeline_semaphore: has_vulkan_1_2 && features_1_2.timeline_semaphore == vk::TRUE,
            memory_budget,
        };
        // `maxMemoryAllocationSize` (core in 1.1) and `maxBufferSize` (core in 1.3), in one query.
        let (has_vulkan_1_1, has_vulkan_1_3) =
            (raw_properties.api_version >= vk::API_VERSION_1_1, raw_properties.api_version >= vk::API_VERSION_1_3);
        let mut maintenance3 = vk::PhysicalDeviceMaintenance3Properties::default();
        let mut maintenance4 = vk::PhysicalDeviceMaintenance4Properties::default();
        if has_vulkan_1_1 {
            let mut properties2 = vk::PhysicalDeviceProperties2::default().push_next(&mut maintenance3);
            if has_vulkan_1_3 {
                properties2 = properties2.push_next(&mut maintenance4);
            }
            // SAFETY: as above; the chain holds structures core in the versions this device supports.
            unsafe { instance.get_physical_device_properties2(physical_device, &mut properties2) };
        }
        let max_buffer_size_bytes = has_vulkan_1_3.then_some(maintenance4.max_buffer_size);
        let max_memory_allocation_size_bytes = has_vulkan_1_1.then_some(maintenance3.max_memory_allocation_size);
        let properties = properties::device_properties(
            &raw_properties,
            (max_buffer_size_bytes, max_memory_allocation_size_bytes),
            &raw_memory,
            &families,
            supported,
        );

        let family_with = |flag: vk::QueueFlags| {
            (0..)
                .zip(&families)
                .find(|(_, family)| family.queue_flags.contains(flag) && family.queue_count > 0)
                .map(|(index, _)| index)
        };
        let compute_family = family_with(vk::QueueFlags::COMPUTE)
            .ok_or_else(|| VulkanError::Unsupported(format!("{} has no compute queue family", properties.name)))?;
        let sparse_family = if supported.sparse_binding {
            if families[compute_family as usize].queue_flags.contains(vk::QueueFlags::SPARSE_BINDING) {
                Some(compute_family)
            } else {
                family_with(vk::QueueFlags::SPARSE_BINDING)
            }
        } else {
            None
        };
        // Sparse binding without a queue to bind on is of no use: enable it only with one.
        let sparse = sparse_family.is_some();
        let enabled = DeviceFeatures {
            sparse_binding: sparse,
            sparse_residency_buffer: sparse && supported.sparse_residency_buffer,
            sparse_residency_aliased: sparse && supported.sparse_residency_aliased,
            ..supported
        };

        let priorities = [1.0_f32];
        let mut queue_infos =
            vec![vk::DeviceQueueCreateInfo::default().queue_family_index(compute_family).queue_priorities(&priorities)];
        if let Some(family) = sparse_family.filter(|&family| family != compute_family) {
            queue_infos.push(vk::DeviceQueueCreateInfo::default().queue_family_index(family).queue_priorities(&priorities));
        }
        let enabled_core = vk::PhysicalDeviceFeatures::default()
            .sparse_binding(enabled.sparse_binding)
            .sparse_residency_buffer(enabled.sparse_residency_buffer)
            .sparse_residency_aliased(enabled.sparse_residency_aliased);
        let mut enabled_1_2 = vk::PhysicalDeviceVulkan12Features::default().timeline_semaphore(enabled.timeline_semaphore);
        let mut enabled_features = vk::PhysicalDeviceFeatures2::default().features(enabled_core);
        if has_vulkan_1_2 {
            enabled_features = enabled_features.push_next(&mut enabled_1_2);
        }
        let mut extensions: Vec<&'static CStr> = if memory_budget { vec![ash::ext::memory_budget::NAME] } else { Vec::new() };
        // A portability driver (MoltenVK) lists VK_KHR_portability_subset, which must then be enabled.
        if has_extension(ash::khr::portability_subset::NAME) {
            extensions.push(ash::khr::portability_subset::NAME);
        }
        let hooked = hook.is_some();
        let (device, device_extensions) = if let Some(hook) = hook {
            let request = DeviceRequest { queue_infos: &queue_infos, core_features: enabled_core, extensions: &extensions };
            hook.create_device(&self.entry, instance, &self.instance_extensions, physical_device, &request)?
        } else {
            let extension_names: Vec<*const std::ffi::c_char> = extensions.iter().map(|name| name.as_ptr()).collect();
            let device_info = vk::DeviceCreateInfo::default()
                .queue_create_infos(&queue_infos)
                .enabled_extension_names(&extension_names)
                .push_next(&mut enabled_features);
            // SAFETY: the physical device is this instance's; every feature and extension enabled was reported
            // supported above; all pointers in `device_info` outlive the call.
            let device = unsafe { instance.create_device(physical_device, &device_info, None) }
                .map_err(VulkanError::vk("vkCreateDevice"))?;
            (device, extensions)
        };

        // SAFETY: one queue of each family was created with the device.
        let compute_queue = unsafe { device.get_device_queue(compute_family, 0) };
        // SAFETY: as above.
        let sparse_queue = sparse_family.map(|family| (family, unsafe { device.get_device_queue(family, 0) }));

        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so each field moves into the context exactly once.
        let (entry, instance, debug, validation_log, instance_extensions) = unsafe {
            (
                std::ptr::read(&this.entry),
                std::ptr::read(&this.instance),
                std::ptr::read(&this.debug),
                std::ptr::read(&this.validation_log),
                std::ptr::read(&this.instance_extensions),
            )
        };
        Ok(VulkanContext {
            entry,
            instance,
            instance_extensions,
            device_extensions,
            hooked,
            debug,
            validation_log,
            physical_device,
            device,
            properties,
            enabled_features: enabled,
            compute_queue_family: compute_family,
            compute_queue,
            sparse_queue,
            queue_lock: Arc::new(Mutex::new(())),
            live_allocations: AtomicU32::new(0),
            sparse_bytes: AtomicU64::new(0),
        })
    }
}

/// Vulkan's device type as the selection's kind.
fn device_kind(device_type: vk::PhysicalDeviceType) -> DeviceKind {
    match device_type {
        vk::PhysicalDeviceType::DISCRETE_GPU => DeviceKind::Discrete,
        vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceKind::Integrated,
        vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceKind::Virtual,
        vk::PhysicalDeviceType::CPU => DeviceKind::Cpu,
        _ => DeviceKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A selector matching no device fails cleanly: the instance is destroyed while the loader is still loaded
    /// (it once crashed here).
    #[test]
    fn no_matching_device_is_an_error_not_a_crash() {
        crate::testing::validation_turn();
        let options = ContextOptions { validation: true, device_selector: Some("no such device".into()) };
        match VulkanContext::new(&options) {
            Err(VulkanError::NoMatchingDevice { selector, devices }) => {
                assert_eq!(selector, "no such device");
                assert!(devices.starts_with("0: "), "{devices}");
            }
            Err(error)
                if (error.means_no_vulkan() || matches!(error, VulkanError::MissingLayer(_)))
                    && std::env::var("HEAPSCOPE_REQUIRE_GPU").as_deref() != Ok("1") =>
            {
                eprintln!("skipped: {error}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// The log is not empty by accident: an invalid call (a buffer with no usage) is recorded.
    #[test]
    fn validation_log_records_an_invalid_call() {
        crate::testing::validation_turn();
        let context = match VulkanContext::new(&ContextOptions::from_env().with_validation(true)) {
            Ok(context) => context,
            Err(error)
                if (error.means_no_vulkan() || matches!(error, VulkanError::MissingLayer(_)))
                    && std::env::var("HEAPSCOPE_REQUIRE_GPU").as_deref() != Ok("1") =>
            {
                eprintln!("skipped: {error}");
                return;
            }
            Err(error) => panic!("{error}"),
        };
        assert!(context.validation_messages().is_empty(), "{:?}", context.validation_messages());
        let info = vk::BufferCreateInfo::default().size(256).usage(vk::BufferUsageFlags::empty());
        // SAFETY: invalid usage on purpose (no usage bit), which the layer reports and drivers tolerate; the
        // buffer is destroyed at once, never bound.
        unsafe {
            if let Ok(buffer) = context.device().create_buffer(&info, None) {
                context.device().destroy_buffer(buffer, None);
            }
        }
        let messages = context.validation_messages();
        assert!(messages.iter().any(|message| message.starts_with("[ERROR]") && message.contains("usage")), "{messages:?}");
    }
}
