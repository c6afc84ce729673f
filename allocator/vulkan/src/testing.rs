//! Test support (feature `testing`): a device context for tests, validation on, that skips where the machine has no
//! Vulkan (unless `HEAPSCOPE_REQUIRE_GPU=1`, so a green CI run means the device tests ran), and the check at the end
//! that the validation layer said nothing. Shared by this crate's device tests, the kernels crate's and the app's.
//!
//! One test at a time per process uses the validation layer ([`validation_turn`]): the layer Debian 12 ships
//! (1.3.239) keeps its per-instance and per-device state in one process-wide map that creating or destroying an
//! instance or a device writes while every other Vulkan call reads it, unlocked (KhronosGroup/Vulkan-ValidationLayers
//! issue 4391). Two tests on two devices of one process crashed it now and then (one run in ten of the kernels'
//! device tests here, two CI runs in about fifty): one test's `vkUpdateDescriptorSets` read a null entry while
//! another test's `vkCreateDevice` wrote the map (a SIGSEGV inside the layer; the core dump examined). Tests that
//! use no device still run side by side.
#![allow(
    clippy::missing_panics_doc,
    clippy::manual_assert,
    reason = "test support: a failed check panics, as a failed test does"
)]

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::{ContextOptions, ValidationLog, VulkanContext, VulkanError};

/// Whose turn it is with the validation layer: held by one test's thread at a time.
static VALIDATION_TURN: Mutex<()> = Mutex::new(());

thread_local! {
    /// This thread's turn, once taken: released when the thread ends (a test's thread ends with the test, passed
    /// or failed).
    static TURN_HELD: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
}

/// Waits for this process's one turn with the validation layer and holds it until the calling thread ends (see
/// the module docs for why). Every test that creates a validated instance or device calls it first,
/// from the test's own thread: [`context`] and [`sparse_context`] do. Taking it again on the same thread does
/// nothing, so a test may open several devices; a thread the test spawns must not create one itself (it would
/// wait for the test's turn to end).
pub fn validation_turn() {
    TURN_HELD.with(|held| {
        let mut held = held.borrow_mut();
        if held.is_none() {
            // A test that panicked with the turn poisons nothing that matters: the lock guards no data.
            *held = Some(VALIDATION_TURN.lock().unwrap_or_else(PoisonError::into_inner));
        }
    });
}

/// A context with the validation layer on (and `HEAPSCOPE_DEVICE` honoured); `None` (the test is skipped) when
/// the machine has no Vulkan loader, device or validation layer, unless `HEAPSCOPE_REQUIRE_GPU=1`: then it
/// panics, so a green CI run means the device tests ran.
pub fn context() -> Option<VulkanContext> {
    validation_turn();
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
