//! What wgpu-hal logs at warning level or above (the Vulkan validation layer's messages among them, when wgpu
//! asks for validation), collected so that `heapscope bench --backend wgpu` on plain wgpu with validation on fails
//! on any message, as the Vulkan backend does with heapscope's own messenger.

use std::sync::Mutex;

/// The collecting logger.
struct Collect {
    /// `(target, message)`.
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
            self.messages.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(entry);
        }
    }

    fn flush(&self) {}
}

/// Starts collecting (once per process; later calls change nothing).
pub fn install() {
    if log::set_logger(&COLLECT).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}

/// The messages so far that concern a device on `backend` (not those of the backends wgpu probed and did not
/// choose: `heapscope_wgpu::foreign_backend_log`).
pub fn messages(backend: heapscope_wgpu::wgpu::Backend) -> Vec<String> {
    COLLECT
        .messages
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .filter(|(target, _)| !heapscope_wgpu::foreign_backend_log(target, backend))
        .map(|(_, message)| message.clone())
        .collect()
}
