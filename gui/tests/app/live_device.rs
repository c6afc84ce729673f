//! Live mode on the real device, driven through the app like a person would: a small serve run through a heap of
//! blocks, paging and PyTorch's allocator in both modes starts from the app, the harness steps until the run is over, and the pane shows the
//! heap the device held, with no kernel mismatch. Validation on; skipped without a Vulkan device unless
//! `HEAPSCOPE_REQUIRE_GPU=1` (as CI sets).
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use heapscope_lab::contender::Contender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use heapscope_core::PolicyKind;
use heapscope_gui::HeapscopeApp;
use heapscope_gui::device_live::{LiveConfig, LiveWorkload};
use heapscope_gui::playback::ManualClock;
use heapscope_gui::shared_device::SharedDevice;
use heapscope_lab::timeline::RegionKind;
use heapscope_vulkan::{ContextOptions, VulkanContext, VulkanError};

/// A validated context, or `None` (skipped) without Vulkan unless `HEAPSCOPE_REQUIRE_GPU=1`.
fn context() -> Option<Arc<VulkanContext>> {
    heapscope_vulkan::testing::validation_turn();
    let required = std::env::var("HEAPSCOPE_REQUIRE_GPU").is_ok_and(|value| value.trim() == "1");
    match VulkanContext::new(&ContextOptions::from_env().with_validation(true)) {
        Ok(context) => Some(Arc::new(context)),
        Err(error) if !required && (error.means_no_vulkan() || matches!(error, VulkanError::MissingLayer(_))) => {
            eprintln!("skipped: no Vulkan device to test on ({error}); set HEAPSCOPE_REQUIRE_GPU=1 to fail instead");
            None
        }
        Err(error) => panic!("Vulkan bring-up failed: {error}"),
    }
}

/// Runs `config` from the app until it is over; returns the harness.
fn run_live(context: &Arc<VulkanContext>, config: LiveConfig) -> Harness<'static, HeapscopeApp> {
    let clock = ManualClock::default();
    let app = HeapscopeApp::new(Box::new(clock.clone()));
    let mut harness =
        Harness::builder().with_size([1400.0, 900.0]).build_ui_state(|ui, app: &mut HeapscopeApp| app.show(ui), app);
    harness.run_steps(1);
    harness.state_mut().start_live_on(context, config);
    assert_eq!(harness.state().error, None);
    let started = Instant::now();
    loop {
        clock.advance(0.05);
        harness.run_steps(1);
        let app = harness.state();
        let source_over = app.session.as_ref().unwrap().live.as_ref().is_none_or(|source| source.finished());
        if source_over && !app.live.running() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "the live run did not end within 2 minutes");
        std::thread::sleep(Duration::from_millis(5));
    }
    harness.run_steps(2);
    harness
}

#[test]
fn a_live_serve_run_shows_the_device_heap_as_it_runs() {
    let Some(context) = context() else { return };
    let log = context.validation_log();
    let contenders = [
        Contender::Heap(PolicyKind::Tlsf),
        Contender::Paged,
        Contender::Pytorch { expandable: false },
        Contender::Pytorch { expandable: true },
    ];
    for policy in contenders {
        let config = LiveConfig { steps: Some(24), ..LiveConfig::new(LiveWorkload::Serve, policy) };
        let harness = run_live(&context, config.clone());
        let app = harness.state();
        assert_eq!(app.live.config().unwrap(), config, "{policy}: the Live bar shows the run, \"Start run\" repeats it");
        let progress = app.live.run.as_ref().unwrap().progress();
        let report = match progress.finished.clone().unwrap() {
            Ok(report) => report,
            Err(message) => panic!("{policy}: the live run failed: {message}"),
        };
        assert!(report.kernels_ran && report.allocs > 0, "{policy}: {report:?}");
        assert_eq!((report.mismatches, progress.mismatches), (0, 0), "{policy}: kernel mismatches");
        assert_eq!(progress.ooms, report.ooms, "{policy}: every refusal reached the pane");
        let pane = &app.session.as_ref().unwrap().panes[0];
        // One step per allocation, free and refusal, every one of them on the map; the runner frees everything
        // by the end (what lives forever last).
        assert_eq!(pane.timeline.steps(), 2 * report.allocs + report.ooms, "{policy}");
        assert_eq!(pane.timeline.layout_at(pane.timeline.steps()).totals().live_allocations, 0, "{policy}");
        assert_eq!(pane.timeline.steps(), progress.events, "{policy}");
        let peak_live = pane.timeline.samples().iter().map(|sample| sample.live_bytes).max().unwrap();
        let peak_reserved = pane.timeline.samples().iter().map(|sample| sample.reserved_bytes).max().unwrap();
        assert!(peak_live >= report.peak_live_bytes, "{policy}: peak live {peak_live} on the map vs {report:?}");
        assert_eq!(peak_reserved, report.peak_reserved_bytes, "{policy}: the map's reserved bytes are the device's");
        // The middle of the run shows allocations placed in the device's regions.
        let middle = pane.timeline.layout_at(pane.timeline.steps() / 2);
        assert!(middle.totals().live_allocations > 0, "{policy}");
        let kinds: Vec<RegionKind> = middle.regions().map(|region| region.kind).collect();
        let expected = if matches!(policy, Contender::Paged | Contender::Pytorch { expandable: true }) {
            RegionKind::Virtual
        } else {
            RegionKind::Block
        };
        assert!(!kinds.is_empty() && kinds.iter().all(|&kind| kind == expected), "{policy}: {kinds:?}");
        assert!(harness.query_by_label_contains("kernel mismatches 0").is_some(), "{policy}: the bar says how it went");
    }
    let context = Arc::into_inner(context).expect("the live runs dropped their targets");
    drop(context);
    let messages = log.messages();
    assert!(messages.is_empty(), "validation messages:\n{}", messages.join("\n"));
}

/// The app drawn with heapscope's own device (what the window does: `SharedDevice`, `WgpuSetup::Existing`) while a
/// live run allocates, binds pages and runs kernels on that very device: the harness renders a frame after every
/// step — egui-wgpu submitting on the one queue lavapipe has while the worker submits and binds on it — and the
/// validation layer on the device (its thread-safety checks among them) says nothing.
#[test]
fn a_live_run_on_the_device_the_app_draws_with() {
    // Skipped without Vulkan, as the other tests here.
    let Some(probe) = context() else { return };
    drop(probe);
    let shared = SharedDevice::open(&ContextOptions::from_env().with_validation(true)).unwrap();
    let clock = ManualClock::default();
    let mut app = HeapscopeApp::new(Box::new(clock.clone()));
    app.window_device = Some(Arc::clone(shared.context()));
    let mut harness = Harness::builder()
        .with_size([1000.0, 700.0])
        .wgpu_setup(shared.wgpu_setup())
        .build_ui_state(|ui, app: &mut HeapscopeApp| app.show(ui), app);
    harness.run_steps(1);
    let config = LiveConfig { steps: Some(60), ..LiveConfig::new(LiveWorkload::Churn, Contender::Paged) };
    harness.state_mut().start_live(config);
    assert_eq!(harness.state().error, None);
    let started = Instant::now();
    let mut frames = 0;
    while harness.state().live.running() {
        clock.advance(0.05);
        harness.run_steps(1);
        harness.render().unwrap();
        frames += 1;
        assert!(started.elapsed() < Duration::from_secs(120), "the live run did not end within 2 minutes");
    }
    harness.run_steps(2);
    let picture = harness.render().unwrap();
    let run = harness.state().live.run.as_ref().unwrap();
    assert!(run.draws_here, "the run is on the device the app draws with");
    assert!(run.where_it_runs().ends_with("the device this window draws with"), "{}", run.where_it_runs());
    let progress = run.progress();
    let report = progress.finished.clone().unwrap().unwrap();
    assert!(report.kernels_ran && report.allocs > 0 && progress.mismatches == 0, "{report:?}");
    assert!(frames > 0, "frames were drawn while the run went");
    assert!(harness.query_by_label_contains("the device this window draws with").is_some(), "the Live bar says where");
    let colours: std::collections::HashSet<[u8; 4]> = picture.pixels().map(|pixel| pixel.0).collect();
    assert!(colours.len() >= 16, "{} colours: the frame drew nothing", colours.len());
    drop(harness);
    let messages = shared.validation_messages();
    assert!(messages.is_empty(), "validation messages:\n{}", messages.join("\n"));
}
