//! The app's tests: egui_kittest UI tests, image snapshots rendered headless through wgpu (lavapipe here) and live runs
//! on the device; one test binary, each former file a module.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

mod live_device;
mod snapshots;
mod ui;
