//! Another library's queue operations under heapscope's queue lock: an in-process layer for wgpu-hal.
//!
//! Vulkan requires every use of a `VkQueue` — `vkQueueSubmit`, `vkQueueBindSparse`, `vkQueuePresentKHR`,
//! `vkQueueWaitIdle`, its debug labels — and `vkDeviceWaitIdle` (all queues of the device) to be externally
//! synchronised. heapscope's own submissions take [`VulkanContext::lock_queues`]. wgpu-hal, driven by wgpu and by
//! whoever holds a `wgpu::Queue` (egui-wgpu's renderer, eframe presenting a frame), synchronises with its own locks
//! only, so on a device with one queue (lavapipe) its submissions would race heapscope's sparse binds and compute.
//!
//! Instead of asking every caller of wgpu to take heapscope's lock (egui-wgpu cannot), heapscope hands wgpu-hal an
//! `ash::Instance` and an `ash::Device` whose queue entry points are heapscope's ([`guarded`]): each looks up the
//! queue's context in a registry, takes the context's queue lock, calls the driver's entry point and releases the
//! lock. The instance's `vkGetDeviceProcAddr` is wrapped too, so what wgpu-hal loads later through it
//! (`VK_KHR_swapchain`'s `vkQueuePresentKHR`, `VK_EXT_debug_utils`' queue labels) is wrapped the same way; every
//! other entry point is the driver's own. heapscope's own `ash::Device` keeps the driver's entry points: its
//! callers lock explicitly, and a wgpu call never runs under heapscope's lock (the lock is not re-entrant).
//!
//! The registry holds one entry per device, made on the first [`guarded`] call and removed when the context is
//! dropped ([`forget`]) — after wgpu-hal's last use, since wgpu-hal's drop callbacks hold the context.

use std::ffi::{CStr, c_char};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use ash::vk;

/// The driver's entry points for one device, and the lock its queues share.
struct Guarded {
    device: vk::Device,
    queues: Vec<vk::Queue>,
    lock: Arc<Mutex<()>>,
    get_device_proc_addr: vk::PFN_vkGetDeviceProcAddr,
    queue_submit: vk::PFN_vkQueueSubmit,
    queue_submit2: Option<vk::PFN_vkQueueSubmit2>,
    queue_wait_idle: vk::PFN_vkQueueWaitIdle,
    queue_bind_sparse: vk::PFN_vkQueueBindSparse,
    device_wait_idle: vk::PFN_vkDeviceWaitIdle,
    queue_present: Option<vk::PFN_vkQueuePresentKHR>,
    begin_label: Option<vk::PFN_vkQueueBeginDebugUtilsLabelEXT>,
    end_label: Option<vk::PFN_vkQueueEndDebugUtilsLabelEXT>,
    insert_label: Option<vk::PFN_vkQueueInsertDebugUtilsLabelEXT>,
}

impl Guarded {
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every guarded device. A short `Vec`: one entry per context handed to wgpu.
static REGISTRY: RwLock<Vec<Arc<Guarded>>> = RwLock::new(Vec::new());

fn find(matches: impl Fn(&Guarded) -> bool) -> Option<Arc<Guarded>> {
    REGISTRY.read().unwrap_or_else(PoisonError::into_inner).iter().find(|guarded| matches(guarded)).cloned()
}

fn by_queue(queue: vk::Queue) -> Option<Arc<Guarded>> {
    find(|guarded| guarded.queues.contains(&queue))
}

/// The driver's entry point `name` of `device`, through the real `vkGetDeviceProcAddr`, as a `T`.
///
/// # Safety
/// `T` must be the function pointer type Vulkan defines for `name`; `device` a live device of the instance whose
/// `vkGetDeviceProcAddr` `get` is.
unsafe fn load<T: Copy>(get: vk::PFN_vkGetDeviceProcAddr, device: vk::Device, name: &CStr) -> Option<T> {
    // A `T` that is no function pointer fails to compile, whatever the caller says.
    const { assert!(size_of::<T>() == size_of::<unsafe extern "system" fn()>()) };
    // SAFETY: the caller's contract; the name is NUL-terminated.
    let function = unsafe { get(device, name.as_ptr()) }?;
    // SAFETY: `T` is the entry point's own pointer type (the caller's contract), the same size as any function
    // pointer.
    Some(unsafe { std::mem::transmute_copy::<unsafe extern "system" fn(), T>(&function) })
}

/// A device's queues and the lock that serialises them: what [`guarded`] wraps (a `VulkanContext`'s, handed in
/// by the interop, so this module needs nothing of the context).
pub(crate) struct Queues<'a> {
    /// The instance the device was made from.
    pub instance: &'a ash::Instance,
    /// The device.
    pub device: &'a ash::Device,
    /// Its queues that heapscope uses (compute, then a separate sparse queue if any).
    pub queues: Vec<vk::Queue>,
    /// The lock every operation on those queues takes.
    pub lock: Arc<Mutex<()>>,
}

/// An `ash::Instance` and an `ash::Device` for `queues`' device whose queue operations take its queue lock (see the
/// module documentation), for wgpu-hal. The first call for a device registers it.
///
/// # Safety
/// The returned handles must not be used after the device is destroyed (wgpu-hal's drop callbacks hold the context
/// that owns it).
pub(crate) unsafe fn guarded(queues: Queues<'_>) -> (ash::Instance, ash::Device) {
    let Queues { instance, device, queues, lock } = queues;
    let handle = device.handle();
    let get = instance.fp_v1_0().get_device_proc_addr;
    let mut registry = REGISTRY.write().unwrap_or_else(PoisonError::into_inner);
    let known = registry.iter().find(|guarded| guarded.device == handle).cloned();
    let entry = known.unwrap_or_else(|| {
        let core = device.fp_v1_0();
        // SAFETY: each type is the one Vulkan defines for its name; the device is the context's, alive.
        let entry = unsafe {
            Guarded {
                device: handle,
                queues,
                lock,
                get_device_proc_addr: get,
                queue_submit: core.queue_submit,
                queue_submit2: load(get, handle, c"vkQueueSubmit2").or_else(|| load(get, handle, c"vkQueueSubmit2KHR")),
                queue_wait_idle: core.queue_wait_idle,
                queue_bind_sparse: core.queue_bind_sparse,
                device_wait_idle: core.device_wait_idle,
                queue_present: load(get, handle, c"vkQueuePresentKHR"),
                begin_label: load(get, handle, c"vkQueueBeginDebugUtilsLabelEXT"),
                end_label: load(get, handle, c"vkQueueEndDebugUtilsLabelEXT"),
                insert_label: load(get, handle, c"vkQueueInsertDebugUtilsLabelEXT"),
            }
        };
        let entry = Arc::new(entry);
        registry.push(Arc::clone(&entry));
        entry
    });
    drop(registry);
    let mut instance_v1_0 = instance.fp_v1_0().clone();
    instance_v1_0.get_device_proc_addr = get_device_proc_addr;
    let guarded_instance =
        ash::Instance::from_parts_1_3(instance.handle(), instance_v1_0, instance.fp_v1_1().clone(), instance.fp_v1_3().clone());
    let mut device_v1_0 = device.fp_v1_0().clone();
    device_v1_0.queue_submit = queue_submit;
    device_v1_0.queue_wait_idle = queue_wait_idle;
    device_v1_0.queue_bind_sparse = queue_bind_sparse;
    device_v1_0.device_wait_idle = device_wait_idle;
    let mut device_v1_3 = device.fp_v1_3().clone();
    if entry.queue_submit2.is_some() {
        device_v1_3.queue_submit2 = queue_submit2;
    }
    let guarded_device =
        ash::Device::from_parts_1_3(handle, device_v1_0, device.fp_v1_1().clone(), device.fp_v1_2().clone(), device_v1_3);
    (guarded_instance, guarded_device)
}

/// Removes `device` from the registry (nothing when it was never guarded).
pub(crate) fn forget(device: vk::Device) {
    REGISTRY.write().unwrap_or_else(PoisonError::into_inner).retain(|guarded| guarded.device != device);
}

/// A queue of no guarded device (a registry bug), or an entry point the driver lacks: reported to the caller as a
/// failed call, never a panic across the FFI boundary.
const UNKNOWN_QUEUE: vk::Result = vk::Result::ERROR_UNKNOWN;

/// Runs `call` with `queue`'s entry points under its device's queue lock; `missing` when the queue is of no
/// guarded device or `call` finds no entry point.
fn locked<R>(queue: vk::Queue, missing: R, call: impl FnOnce(&Guarded) -> Option<R>) -> R {
    let Some(guarded) = by_queue(queue) else { return missing };
    let _lock = guarded.lock();
    call(&guarded).unwrap_or(missing)
}

// Each wrapper passes the caller's arguments on unchanged to the driver's entry point for that name, under the
// queue's lock: the caller's contract for the entry point is the driver's.

unsafe extern "system" fn queue_submit(
    queue: vk::Queue,
    count: u32,
    submits: *const vk::SubmitInfo<'_>,
    fence: vk::Fence,
) -> vk::Result {
    // SAFETY: see above.
    locked(queue, UNKNOWN_QUEUE, |guarded| Some(unsafe { (guarded.queue_submit)(queue, count, submits, fence) }))
}

unsafe extern "system" fn queue_submit2(
    queue: vk::Queue,
    count: u32,
    submits: *const vk::SubmitInfo2<'_>,
    fence: vk::Fence,
) -> vk::Result {
    // SAFETY: see above.
    locked(queue, UNKNOWN_QUEUE, |guarded| guarded.queue_submit2.map(|submit2| unsafe { submit2(queue, count, submits, fence) }))
}

unsafe extern "system" fn queue_wait_idle(queue: vk::Queue) -> vk::Result {
    // SAFETY: see above.
    locked(queue, UNKNOWN_QUEUE, |guarded| Some(unsafe { (guarded.queue_wait_idle)(queue) }))
}

unsafe extern "system" fn queue_bind_sparse(
    queue: vk::Queue,
    count: u32,
    binds: *const vk::BindSparseInfo<'_>,
    fence: vk::Fence,
) -> vk::Result {
    // SAFETY: see above.
    locked(queue, UNKNOWN_QUEUE, |guarded| Some(unsafe { (guarded.queue_bind_sparse)(queue, count, binds, fence) }))
}

unsafe extern "system" fn device_wait_idle(device: vk::Device) -> vk::Result {
    let Some(guarded) = find(|guarded| guarded.device == device) else { return UNKNOWN_QUEUE };
    let _lock = guarded.lock();
    // SAFETY: see above; the lock covers every queue of the device.
    unsafe { (guarded.device_wait_idle)(device) }
}

unsafe extern "system" fn queue_present(queue: vk::Queue, info: *const vk::PresentInfoKHR<'_>) -> vk::Result {
    // SAFETY: see above.
    locked(queue, UNKNOWN_QUEUE, |guarded| guarded.queue_present.map(|present| unsafe { present(queue, info) }))
}

unsafe extern "system" fn begin_label(queue: vk::Queue, label: *const vk::DebugUtilsLabelEXT<'_>) {
    // SAFETY: see above.
    locked(queue, (), |guarded| guarded.begin_label.map(|begin| unsafe { begin(queue, label) }));
}

unsafe extern "system" fn end_label(queue: vk::Queue) {
    // SAFETY: see above.
    locked(queue, (), |guarded| guarded.end_label.map(|end| unsafe { end(queue) }));
}

unsafe extern "system" fn insert_label(queue: vk::Queue, label: *const vk::DebugUtilsLabelEXT<'_>) {
    // SAFETY: see above.
    locked(queue, (), |guarded| guarded.insert_label.map(|insert| unsafe { insert(queue, label) }));
}

/// A function pointer as Vulkan's untyped `PFN_vkVoidFunction`.
macro_rules! void_function {
    ($function:expr, $type:ty) => {{
        let typed: $type = $function;
        // SAFETY: function pointers all have one size; the loader's caller casts it back to `$type` for this name.
        Some(unsafe { std::mem::transmute::<$type, unsafe extern "system" fn()>(typed) })
    }};
}

/// `vkGetDeviceProcAddr` for wgpu-hal: heapscope's wrapper for a queue operation the device has, else the
/// driver's entry point.
unsafe extern "system" fn get_device_proc_addr(device: vk::Device, name: *const c_char) -> vk::PFN_vkVoidFunction {
    let Some(guarded) = find(|guarded| guarded.device == device) else {
        // A device heapscope does not guard: the driver's own entry points, unwrapped (the loader's
        // `vkGetDeviceProcAddr` of any guarded device serves every device), not NULL.
        let any = find(|_| true)?;
        // SAFETY: the caller's contract (a live device, a NUL-terminated name), passed on unchanged.
        return unsafe { (any.get_device_proc_addr)(device, name) };
    };
    // SAFETY: Vulkan's callers pass a NUL-terminated name.
    let wanted = unsafe { CStr::from_ptr(name) };
    match wanted.to_bytes() {
        // Entry points loaded through the returned `vkGetDeviceProcAddr` are wrapped as well.
        b"vkGetDeviceProcAddr" => void_function!(get_device_proc_addr, vk::PFN_vkGetDeviceProcAddr),
        b"vkQueueSubmit" => void_function!(queue_submit, vk::PFN_vkQueueSubmit),
        b"vkQueueSubmit2" | b"vkQueueSubmit2KHR" if guarded.queue_submit2.is_some() => {
            void_function!(queue_submit2, vk::PFN_vkQueueSubmit2)
        }
        b"vkQueueWaitIdle" => void_function!(queue_wait_idle, vk::PFN_vkQueueWaitIdle),
        b"vkQueueBindSparse" => void_function!(queue_bind_sparse, vk::PFN_vkQueueBindSparse),
        b"vkDeviceWaitIdle" => void_function!(device_wait_idle, vk::PFN_vkDeviceWaitIdle),
        b"vkQueuePresentKHR" if guarded.queue_present.is_some() => {
            void_function!(queue_present, vk::PFN_vkQueuePresentKHR)
        }
        b"vkQueueBeginDebugUtilsLabelEXT" if guarded.begin_label.is_some() => {
            void_function!(begin_label, vk::PFN_vkQueueBeginDebugUtilsLabelEXT)
        }
        b"vkQueueEndDebugUtilsLabelEXT" if guarded.end_label.is_some() => {
            void_function!(end_label, vk::PFN_vkQueueEndDebugUtilsLabelEXT)
        }
        b"vkQueueInsertDebugUtilsLabelEXT" if guarded.insert_label.is_some() => {
            void_function!(insert_label, vk::PFN_vkQueueInsertDebugUtilsLabelEXT)
        }
        // SAFETY: the caller's arguments, passed on to the driver's entry point.
        _ => unsafe { (guarded.get_device_proc_addr)(device, name) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ContextOptions, VulkanContext};

    /// A device to test on, or `None` (skipped) without one unless `HEAPSCOPE_REQUIRE_GPU=1`.
    fn context() -> Option<VulkanContext> {
        match VulkanContext::new(&ContextOptions::from_env()) {
            Ok(context) => Some(context),
            Err(error) if error.means_no_vulkan() && std::env::var("HEAPSCOPE_REQUIRE_GPU").as_deref() != Ok("1") => {
                eprintln!("skipped: {error}");
                None
            }
            Err(error) => panic!("{error}"),
        }
    }

    /// The address of an entry point, to compare.
    fn address(function: vk::PFN_vkVoidFunction) -> Option<usize> {
        function.map(|function| function as usize)
    }

    /// The wrapped `vkGetDeviceProcAddr` asked for a device it does not guard answers with that device's own
    /// entry points (what the device's own instance answers), never NULL and never a wrapper; the guarded device
    /// still gets the wrappers.
    #[test]
    fn unguarded_device_gets_the_driver_entry_points() {
        let (Some(guarded_context), Some(other)) = (context(), context()) else { return };
        let queues = Queues {
            instance: guarded_context.instance(),
            device: guarded_context.device(),
            queues: vec![guarded_context.compute_queue().1],
            lock: guarded_context.queue_lock(),
        };
        // SAFETY: the handles are used only in this test, while `guarded_context` (their device) lives.
        let (instance, _device) = unsafe { guarded(queues) };
        let wrapped = instance.fp_v1_0().get_device_proc_addr;
        let own = other.instance().fp_v1_0().get_device_proc_addr;
        let device = other.device().handle();
        assert!(find(|guarded| guarded.device == device).is_none(), "the other device is not guarded");
        for name in [c"vkQueueSubmit", c"vkQueueWaitIdle", c"vkDeviceWaitIdle", c"vkGetDeviceProcAddr", c"vkAllocateMemory"] {
            // SAFETY: a live device and NUL-terminated names.
            let (answer, driver) = unsafe { (wrapped(device, name.as_ptr()), own(device, name.as_ptr())) };
            assert!(answer.is_some(), "{name:?}: NULL for a device not guarded");
            assert_eq!(address(answer), address(driver), "{name:?}: not the device's own entry point");
        }
        // SAFETY: the guarded device, alive; a NUL-terminated name.
        let submit = unsafe { wrapped(guarded_context.device().handle(), c"vkQueueSubmit".as_ptr()) };
        assert_eq!(address(submit), address(void_function!(queue_submit, vk::PFN_vkQueueSubmit)), "the guarded device's wrapper");
    }
}
