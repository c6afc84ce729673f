//! Test support (feature `testing`): a device context for tests, validation on, that skips where the machine has no
//! Vulkan (unless `HEAPSCOPE_REQUIRE_GPU=1`, so a green CI run means the device tests ran), and the check at the end
//! that the validation layer said nothing. Shared by this crate's device tests and the kernels crate's.
#![allow(
    clippy::missing_panics_doc,
    clippy::manual_assert,
    reason = "test support: a failed check panics, as a failed test does"
)]

use std::sync::Arc;

use crate::{ContextOptions, ValidationLog, VulkanContext, VulkanError};

/// A context with the validation layer on (and `HEAPSCOPE_DEVICE` honoured); `None` (the test is skipped) when
/// the machine has no Vulkan loader, device or validation layer, unless `HEAPSCOPE_REQUIRE_GPU=1`: then it
/// panics, so a green CI run means the device tests ran.
pub fn context() -> Option<VulkanContext> {
    let options = ContextOptions::from_env().with_validation(true);
    let required = std::env::var("HEAPSCOPE_REQUIRE_GPU").is_ok_and(|value| value.trim() == "1");
    match VulkanContext::new(&options) {
        Ok(context) => {
            assert!(context.validation_enabled());
            Some(context)
        }
        Err(error) if !required && (error.means_no_vulkan() || matches!(error, VulkanError::MissingLayer(_))) => {
            eprintln!("skipped: no Vulkan device to test on ({error}); set HEAPSCOPE_REQUIRE_GPU=1 to fail instead");
            None
        }
        Err(error) => panic!("Vulkan bring-up failed: {error}"),
    }
}

/// A validated context with sparse residency for buffers (and timeline semaphores), or `None` (skipped) without
/// one; with `HEAPSCOPE_REQUIRE_GPU=1` a device without them is a failure.
pub fn sparse_context() -> Option<Arc<VulkanContext>> {
    let context = context()?;
    let features = context.enabled_features();
    if !(features.sparse_binding && features.sparse_residency_buffer && features.timeline_semaphore) {
        assert!(std::env::var("HEAPSCOPE_REQUIRE_GPU").as_deref() != Ok("1"), "no sparse residency: {features:?}");
        eprintln!("skipped: {} has no sparse residency for buffers", context.properties().name);
        return None;
    }
    Some(Arc::new(context))
}

/// Drops the last handle of the context (device and instance destroyed, leaks reported by the layer) and
/// asserts the validation layer said nothing.
pub fn finish(context: Arc<VulkanContext>) {
    let log: ValidationLog = context.validation_log();
    let context = Arc::into_inner(context).expect("every source was dropped before finish()");
    drop(context);
    let messages = log.messages();
    assert!(messages.is_empty(), "validation messages:\n{}", messages.join("\n"));
}

/// Runs `test` with a validated context shared through an `Arc`, then [`finish`]es it: the test must have dropped
/// every heap, source and other handle on the context by its end. Does nothing (the test is skipped) where
/// [`context`] gives `None`.
pub fn with_context(test: impl FnOnce(&Arc<VulkanContext>)) {
    let Some(context) = context() else { return };
    let context = Arc::new(context);
    test(&context);
    finish(context);
}
