//! What wgpu-hal logs at warning level or above (the Vulkan validation layer's messages among them, when wgpu
//! asks for validation), collected so that `heapscope bench --backend wgpu` on plain wgpu with validation on fails
//! on any message, as the Vulkan backend does with heapscope's own messenger.

use std::sync::Mutex;

/// The collecting logger.
struct Collect {
    messages: Mutex<Vec<String>>,
}

static COLLECT: Collect = Collect { messages: Mutex::new(Vec::new()) };

impl log::Log for Collect {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn && metadata.target().starts_with("wgpu_hal")
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let message = format!("[{}] {}: {}", record.level(), record.target(), record.args());
            self.messages.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(message);
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

/// The messages so far.
pub fn messages() -> Vec<String> {
    COLLECT.messages.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

/// Forgets the messages so far.
pub fn clear() {
    COLLECT.messages.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
}
