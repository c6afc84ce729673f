//! What wgpu-hal logs at warning level or above, collected so that a run with validation on fails on it: on
//! plain wgpu the Vulkan validation layer's messages reach heapscope only through wgpu-hal's `log` records (on
//! heapscope's own Vulkan device, heapscope's messenger records them instead). Used by `heapscope bench --backend
//! wgpu` and by this crate's tests.
//!
//! [`install`] sets a `log` logger once per process (a process has one logger: when another was set first, nothing
//! is collected); [`messages`] hands back what was collected about a device on one backend, leaving out what the
//! backends wgpu probed and did not choose logged ([`foreign_backend_log`]) and EGL's failed display probes
//! ([`egl_display_probe`]).

use std::sync::{Mutex, PoisonError};

/// The collecting logger.
struct Collect {
    /// `(target, message)`, in order.
    messages: Mutex<Vec<(String, String)>>,
}

static COLLECT: Collect = Collect { messages: Mutex::new(Vec::new()) };

impl log::Log for Collect {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn && metadata.target().starts_with("wgpu_hal")
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let message = format!("[{}] {}: {}", record.level(), record.target(), record.args());
            let entry = (record.target().to_owned(), message);
            self.messages.lock().unwrap_or_else(PoisonError::into_inner).push(entry);
        }
    }

    fn flush(&self) {}
}

/// Starts collecting wgpu-hal's warnings and errors (once per process; later calls change nothing).
pub fn install() {
    if log::set_logger(&COLLECT).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}

/// The messages collected so far that concern a device on `backend`, each as `[level] target: text`; none
/// before [`install`].
pub fn messages(backend: wgpu::Backend) -> Vec<String> {
    COLLECT
        .messages
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|(target, message)| !foreign_backend_log(target, backend) && !egl_display_probe(target, message))
        .map(|(_, message)| message.clone())
        .collect()
}

/// Whether wgpu-hal's log target `target` belongs to a backend other than `backend`: wgpu probes every backend it
/// was built with when it looks for adapters, and what those log (the GL backend's EGL finding no display driver
/// on a headless machine, say) says nothing about the work of a device on `backend`. Validation checks skip them.
pub fn foreign_backend_log(target: &str, backend: wgpu::Backend) -> bool {
    const BACKENDS: [(&str, wgpu::Backend); 4] = [
        ("wgpu_hal::vulkan", wgpu::Backend::Vulkan),
        ("wgpu_hal::gles", wgpu::Backend::Gl),
        ("wgpu_hal::metal", wgpu::Backend::Metal),
        ("wgpu_hal::dx12", wgpu::Backend::Dx12),
    ];
    BACKENDS.iter().any(|&(prefix, owner)| owner != backend && target.starts_with(prefix))
}

/// Whether a GL backend's record is EGL failing to initialise one of the displays it probes (`eglInitialize`: "DRI2:
/// failed to load driver" on a machine without that display's driver): wgpu tries several and goes on with one that
/// works, so it says nothing about the device's work, on GL either (a validation run on lavapipe's GL adapter failed
/// on it).
pub fn egl_display_probe(target: &str, message: &str) -> bool {
    target.starts_with("wgpu_hal::gles::egl") && message.contains("'eglInitialize'")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages of the backends wgpu probed are set apart from the device's own backend's and from wgpu-hal's
    /// shared code.
    #[test]
    fn foreign_backend_logs_are_told_apart() {
        let table = [
            ("wgpu_hal::gles::egl", wgpu::Backend::Vulkan, true),
            ("wgpu_hal::vulkan::instance", wgpu::Backend::Vulkan, false),
            ("wgpu_hal::vulkan::instance", wgpu::Backend::Gl, true),
            ("wgpu_hal::gles::egl", wgpu::Backend::Gl, false),
            ("wgpu_hal::auxil", wgpu::Backend::Vulkan, false),
            ("wgpu_hal::metal", wgpu::Backend::Dx12, true),
        ];
        for (target, backend, foreign) in table {
            assert_eq!(foreign_backend_log(target, backend), foreign, "{target} on {backend:?}");
        }
    }

    #[test]
    fn egl_display_probes_are_told_apart() {
        let table = [
            (
                "wgpu_hal::gles::egl",
                "[ERROR] wgpu_hal::gles::egl: EGL 'eglInitialize' code 0x3001: DRI2: failed to load driver",
                true,
            ),
            ("wgpu_hal::gles::egl", "[ERROR] wgpu_hal::gles::egl: GLES: [ShaderCompiler/Error] ...", false),
            ("wgpu_hal::vulkan::instance", "[ERROR] wgpu_hal::vulkan::instance: 'eglInitialize'", false),
        ];
        for (target, message, probe) in table {
            assert_eq!(egl_display_probe(target, message), probe, "{message}");
        }
    }

    /// Only wgpu-hal's warnings and errors are collected, and each backend's reader sees its own and the shared
    /// ones. (Other tests of this binary may log too: each record is looked for by its own text.)
    #[test]
    fn collects_wgpu_hal_warnings_per_backend() {
        install();
        install();
        log::warn!(target: "wgpu_hal::vulkan::instance", "hal-log test: vulkan warning");
        log::error!(target: "wgpu_hal::gles::egl", "hal-log test: egl error");
        log::warn!(target: "wgpu_hal::auxil", "hal-log test: shared warning");
        log::info!(target: "wgpu_hal::vulkan::instance", "hal-log test: vulkan info");
        log::warn!(target: "wgpu_core::device", "hal-log test: core warning");
        // (record, seen on Vulkan, seen on GL)
        let table = [
            ("[WARN] wgpu_hal::vulkan::instance: hal-log test: vulkan warning", true, false),
            ("[ERROR] wgpu_hal::gles::egl: hal-log test: egl error", false, true),
            ("[WARN] wgpu_hal::auxil: hal-log test: shared warning", true, true),
            ("[INFO] wgpu_hal::vulkan::instance: hal-log test: vulkan info", false, false),
            ("[WARN] wgpu_core::device: hal-log test: core warning", false, false),
        ];
        let (vulkan, gl) = (messages(wgpu::Backend::Vulkan), messages(wgpu::Backend::Gl));
        for (record, on_vulkan, on_gl) in table {
            assert_eq!(vulkan.iter().any(|message| message == record), on_vulkan, "{record} on Vulkan: {vulkan:?}");
            assert_eq!(gl.iter().any(|message| message == record), on_gl, "{record} on GL: {gl:?}");
        }
    }
}
