//! # heapscope-gui
//!
//! The face of heapscope: an egui / eframe app that animates a heap as a trace plays, scrubs to any
//! moment, puts 1 to 4 allocators side by side on the same trace, says why a request failed, and steps
//! through the built-in stories one allocator decision at a time.
//!
//! ## Design
//!
//! - The model is the lab's [`heapscope_lab::timeline`]: each contender's replay as plain layout changes
//!   per step, with totals and checkpoints, so seeking anywhere is a checkpoint plus a few thousand changes
//!   and the app never replays from zero. A [`session::Session`] holds the recording and one
//!   [`session::Pane`] per contender, all at one position. Panes that must seek from a checkpoint do it in
//!   parallel, and free the big layouts they replace on a thread of their own; a pane keeps the layout before the step shown as playback moves, so a step's animation and
//!   explanation cost its changes, not a rebuild (`benches/session_seek.rs`: four panes of a 1,000,000-event
//!   trace with 100,000 allocations live). A [`live::LiveSource`] feeds a pane step by step
//!   instead of a recording: [`device_live`] runs a workload on the Vulkan device and streams what its heap does
//!   ([`live_panel`] is its bar; `heapscope gui --live serve` starts it).
//! - [`heap_map`] draws a layout: regions as bands of rows at one bytes-per-row scale, allocations as spans
//!   coloured by size class, age, stack frames or category ([`palette`]: never red nor grey, with a legend), padding and
//!   rounding shaded, free runs distinct (red when too small for the request that failed), resident pages of
//!   virtual ranges marked.
//!   Only visible rows are built and sub-pixel spans merge, so a frame costs the pixels shown, not the
//!   allocations live (`benches/heap_map.rs`: 100,000 live allocations).
//! - [`playback`] turns an injectable [`playback::Clock`] into a position (fractional while a step
//!   animates: new spans grow in, freed ones fade out, new regions fade in, released ones fade out in
//!   place, mapped pages fade in and unmapped ones out); tests drive a
//!   [`playback::ManualClock`].
//! - [`app`] is the window: transport, the timeline [`plot`] (click or drag to seek), the panes
//!   ([`panes`]; the focused one, clicked last or picked with 1 to 4, is outlined), "Why it failed" (about the
//!   focused pane), "What holds it", "Advice" (computed on a worker thread: [`advice`]) and "Teach me" ([`panels`]),
//!   files opened from the command line, by drag
//!   and drop, by path, or with "Open…" / Ctrl+O: [`file_browser`], a small browser in plain egui over
//!   `std::fs` (the dialog crates need GTK or a desktop portal), filtered to what heapscope opens.
//! - [`shared_device`]: the window draws with heapscope's own Vulkan device where it can
//!   (`egui_wgpu::WgpuSetup::Existing` over heapscope's `WgpuVulkan`), and live runs allocate on that very device;
//!   wgpu's queue operations take heapscope's queue lock, so the renderer and a live run share one queue safely.
//! - [`window`] is the native window (eframe on wgpu), and its scripted run: quit after N frames, a screenshot
//!   of the real window first (`heapscope gui --quit-after-frames N --screenshot PNG`; the root's
//!   `tests/end_to_end/gui/window.rs` runs it under Xvfb).
//! - [`render()`] draws the same panes headless through egui_kittest's wgpu renderer into a PNG, or into an
//!   animated GIF of the story playing: `heapscope render`, the demo's picture, and the snapshot tests.
#![warn(missing_docs)]

pub mod active_plot;
pub mod advice;
pub mod app;
pub mod device_live;
pub mod file_browser;
pub mod heap_map;
pub mod live;
pub mod live_panel;
pub mod palette;
pub mod panels;
pub mod panes;
pub mod playback;
pub mod plot;
pub mod render;
pub mod session;
pub mod shared_device;
pub mod slot;
pub mod window;

pub use app::HeapscopeApp;
pub use render::{GifOptions, RenderOptions, render, render_gif, render_png};
pub use session::Session;
pub use window::{WindowOptions, run};
