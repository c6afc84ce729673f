//! The app driven like a person would, headless with egui_kittest: open a trace, press play, seek, switch
//! policy, read the OOM panel, step through a story, watch a live source. Time comes from a manual clock.
#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test, with its location")]

use egui::{Key, Modifiers};
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use heapscope_core::{OomCause, PolicyKind};
use heapscope_gui::HeapscopeApp;
use heapscope_gui::device_live::{LiveConfig, LiveWorkload};
use heapscope_gui::live::{ChannelSource, LiveStep};
use heapscope_gui::playback::ManualClock;
use heapscope_lab::contender::Contender;
use heapscope_lab::timeline::{Change, RegionKind, Span};
use heapscope_vulkan::ContextOptions;

fn harness(clock: &ManualClock) -> Harness<'static, HeapscopeApp> {
    let app = HeapscopeApp::new(Box::new(clock.clone()));
    Harness::builder().with_size([1400.0, 900.0]).build_ui_state(|ui, app: &mut HeapscopeApp| app.show(ui), app)
}

/// The app with the file at `path` opened as from the top bar (in the background), checked to open without an error.
fn opened(clock: &ManualClock, path: &std::path::Path) -> Harness<'static, HeapscopeApp> {
    let mut harness = harness(clock);
    harness.run_steps(1);
    harness.state_mut().open_path(path);
    harness.run_steps(2);
    assert!(harness.state().error.is_none(), "{:?}", harness.state().error);
    harness
}

/// A file dropped on the window, as an integration hands it over.
#[derive(Debug)]
struct Dropped(std::path::PathBuf);

impl egui::DroppedFile for Dropped {
    fn path(&self) -> &std::path::Path {
        &self.0
    }

    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|error| error.to_string())
    }
}

fn drop_file(harness: &mut Harness<'static, HeapscopeApp>, path: std::path::PathBuf) {
    harness.input_mut().dropped_files.push(std::sync::Arc::new(Dropped(path)));
}

/// Steps the harness until the file opening in the background is in (a few seconds at most).
fn wait_for_open(harness: &mut Harness<'static, HeapscopeApp>) {
    for _ in 0..500 {
        harness.run_steps(1);
        if harness.state().loading().is_none() {
            harness.run_steps(1);
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the file did not open within 5 s");
}

/// The app with the shipped frag_oom recording (which records stacks) dropped on it and open.
fn frag_oom_recording(clock: &ManualClock) -> Harness<'static, HeapscopeApp> {
    let mut harness = harness(clock);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/traces/pytorch/frag_oom-default.pickle.gz");
    drop_file(&mut harness, path);
    wait_for_open(&mut harness);
    harness
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("heapscope-gui-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn open_a_trace_press_play_and_seek() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(2);
    assert_eq!(harness.state().session.as_ref().unwrap().name, "frag_oom", "the app opens on the story");

    // Open a CSV trace by typing its path.
    let trace: String = (0..50)
        .map(|id| format!("a,{id},{}\n", (id + 1) * 1_000_000))
        .chain((0..50).step_by(2).map(|id| format!("f,{id}\n")))
        .collect();
    let path = temp_file("opened.csv", &trace);
    harness.get_by_role(egui::accesskit::Role::TextInput).focus();
    harness.run_steps(1);
    harness.get_by_role(egui::accesskit::Role::TextInput).type_text(path.to_str().unwrap());
    harness.run_steps(1);
    harness.get_by_label("Open").click();
    harness.run_steps(1);
    assert!(
        harness.state().loading().is_some_and(|name| name.ends_with("opened.csv"))
            || harness.state().session.as_ref().unwrap().name.ends_with("opened.csv")
    );
    wait_for_open(&mut harness);
    let app = harness.state();
    assert!(app.error.is_none(), "{:?}", app.error);
    let session = app.session.as_ref().unwrap();
    assert!(session.name.ends_with("opened.csv"), "{}", session.name);
    assert_eq!((session.steps(), session.panes.len()), (75, 4));

    // Play: one second of the manual clock at 2 steps per second.
    harness.get_by_label("Play").click();
    harness.run_steps(1);
    clock.advance(0.2);
    harness.run_steps(1);
    clock.advance(0.2);
    harness.run_steps(1);
    let position = harness.state().playback.position;
    assert!(harness.state().playback.playing && position > 0.5 && position < 1.5, "{position}");
    assert!(harness.query_by_label("Pause").is_some(), "the button now pauses");
    harness.get_by_label("Pause").click();
    harness.run_steps(1);
    assert!(!harness.state().playback.playing);

    // Seek with the keyboard, then a step animates over the next frames.
    harness.key_press(Key::End);
    harness.run_steps(1);
    assert_eq!(harness.state().playback.shown_steps(), 75);
    for pane in &harness.state().session.as_ref().unwrap().panes {
        assert_eq!(pane.layout_steps, 75, "{} follows", pane.name());
        assert_eq!(pane.layout.totals().live_allocations, 25, "{}", pane.name());
    }
    harness.key_press(Key::Home);
    harness.run_steps(1);
    harness.get_by_label("Step").click();
    harness.run_steps(1);
    clock.advance(0.2);
    harness.run_steps(1);
    let playback = &harness.state().playback;
    assert_eq!((playback.shown_steps(), playback.progress() < 1.0), (1, true), "{playback:?}");
    clock.advance(1.0);
    harness.run_steps(2);
    assert_eq!(harness.state().playback.position, 1.0);
}

#[test]
fn dropped_files_open_and_bad_files_say_why() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    let bad = temp_file("bad.csv", "a,1,100\nx,2\n");
    drop_file(&mut harness, bad);
    harness.run_steps(1);
    wait_for_open(&mut harness);
    let error = harness.state().error.clone().unwrap();
    assert!(error.contains("bad.csv:2: ") && error.contains("unknown event \"x\""), "{error}");
    assert_eq!(error.matches("bad.csv").count(), 1, "the file is named once: {error}");
    assert!(harness.query_by_label_contains("unknown event").is_some(), "the error shows");
    assert_eq!(harness.state().session.as_ref().unwrap().name, "frag_oom", "the story stays open");
    let empty = temp_file("empty.csv", "");
    drop_file(&mut harness, empty.clone());
    harness.run_steps(1);
    wait_for_open(&mut harness);
    assert_eq!(harness.state().error.as_deref(), Some(format!("{}: the file is empty", empty.display()).as_str()));
    let good = temp_file("good.csv", "a,1,100\na,2,200\nf,1\n");
    drop_file(&mut harness, good);
    harness.run_steps(1);
    wait_for_open(&mut harness);
    assert_eq!(harness.state().session.as_ref().unwrap().steps(), 3);
    assert!(harness.state().error.is_none());
}

#[test]
fn switch_policy_and_add_panes() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    // The first pane's menu: pick buddy.
    harness.get_by_label("pytorch").click();
    harness.run_steps(2);
    harness.get_by_label("buddy").click();
    harness.run_steps(2);
    let session = harness.state().session.as_ref().unwrap();
    assert_eq!(session.panes[0].contender, Some(Contender::Heap(PolicyKind::Buddy)));
    assert_eq!(session.panes.len(), 4);
    // Close one, add one back; the focused pane (tlsf) stays focused.
    harness.key_press(Key::Num3);
    harness.run_steps(1);
    harness.get_all_by_label("x").next().unwrap().click();
    harness.run_steps(2);
    assert_eq!(harness.state().session.as_ref().unwrap().panes.len(), 3);
    let app = harness.state();
    assert_eq!(app.session.as_ref().unwrap().panes[app.focused].name(), "tlsf");
    harness.get_by_label("+ pane").click();
    harness.run_steps(2);
    assert_eq!(harness.state().session.as_ref().unwrap().panes.len(), 4);
}

#[test]
fn the_oom_panel_says_why_in_plain_words() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    assert!(harness.query_by_label("Why it failed").is_some());
    harness.key_press(Key::O);
    harness.run_steps(2);
    assert_eq!(harness.state().playback.shown_steps(), 61, "O jumps to the refused 1 GiB request");
    assert!(
        harness
            .query_by_label(
                "Fragmentation (waste between allocations): 1000.00 MiB free in reserved memory and 584.00 MiB more on \
                 the device, 1.55 GiB in all, enough for 1.00 GiB, but the largest free run was only 50.00 MiB."
            )
            .is_some(),
        "the verdict in plain words, the device's free memory in the same line"
    );
    assert!(harness.query_by_label_contains("The 20 free run(s) in red").is_some());
    assert!(
        harness.query_by_label("Served at the same entry by: pytorch-expandable, paged.").is_some(),
        "tlsf in 256 MiB blocks fails too"
    );
    let refusal = harness.state().session.as_ref().unwrap().panes[0].timeline.refusal_at(60).unwrap().clone();
    assert_eq!(refusal.cause, OomCause::Fragmentation);
}

/// A real recording with stacks: at the refused request, the panel names the code that asked for it (the request's
/// own frames, not the last allocation's).
#[test]
fn the_oom_panel_names_the_refused_requests_own_stack() {
    let clock = ManualClock::default();
    let mut harness = frag_oom_recording(&clock);
    harness.key_press(Key::O);
    harness.run_steps(2);
    assert_eq!(harness.state().playback.shown_steps(), 101, "O jumps to the refused 1 GiB request at entry 100");
    assert!(
        harness
            .query_by_label_contains("The request came from:\n  wl_frag_oom (capture.py:88)\n  <module> (capture.py:166)")
            .is_some(),
        "the refused request's own frames"
    );
}

/// "What holds it": at the refused request the live 1.95 GiB come from one line of the capture script; "Go to the
/// peak" seeks to entry 39, where 2.93 GiB are live from another line (the rows of `heapscope top`).
#[test]
fn what_holds_it_groups_the_live_memory_by_code_and_finds_the_peak() {
    let clock = ManualClock::default();
    let mut harness = frag_oom_recording(&clock);
    harness.key_press(Key::O);
    harness.run_steps(2);
    harness.get_by_label("What holds it").click();
    harness.run_steps(2);
    assert!(harness.query_by_label("1.95 GiB live at entry 100, in 20 allocation(s), by the code that made them:").is_some());
    assert!(harness.query_by_label("wl_frag_oom (capture.py:85)").is_some());
    harness.get_by_label("Go to the peak").click();
    harness.run_steps(3);
    assert_eq!(harness.state().playback.shown_steps(), 40, "the peak is once entry 39 is done");
    assert!(harness.query_by_label("2.93 GiB live at entry 39, in 20 allocation(s), by the code that made them:").is_some());
    assert!(harness.query_by_label("wl_frag_oom (capture.py:83)").is_some());
    assert!(harness.query_by_label("100.0%").is_some());
}

/// The active memory timeline in the app: a click low in the stack seeks there and picks the allocation under the
/// pointer, which the panes then outline; a click above the stack picks nothing.
#[test]
fn a_click_on_the_allocations_timeline_seeks_and_picks_an_allocation() {
    let clock = ManualClock::default();
    let mut harness = frag_oom_recording(&clock);
    harness.get_by_label("allocations").click();
    harness.run_steps(2);
    assert_eq!(harness.state().timeline_view, heapscope_gui::active_plot::TimelineView::Allocations);
    // The timeline is the bottom 210 pixels of the 900-pixel window; a third of the way along, near its floor.
    let low = egui::pos2(470.0, 870.0);
    harness.drag_at(low);
    harness.run_steps(1);
    harness.drop_at(low);
    harness.run_steps(2);
    let app = harness.state();
    let slot = app.selected.expect("an allocation under the pointer");
    let shown = app.playback.shown_steps();
    assert!(shown > 0 && shown < 141, "seeked into the recording: {shown}");
    let session = app.session.as_ref().unwrap();
    assert!(session.panes[0].layout.spans().any(|span| span.slot == slot), "the picked allocation is live where it was picked");
    let high = egui::pos2(470.0, 705.0);
    harness.drag_at(high);
    harness.run_steps(1);
    harness.drop_at(high);
    harness.run_steps(2);
    assert_eq!(harness.state().selected, None, "nothing above the stack");
}

#[test]
fn the_oom_panel_follows_the_pane_clicked_not_the_pointer() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(2);
    // frag_oom: pytorch and tlsf refuse the 1 GiB request, pytorch-expandable and paged serve it.
    assert_eq!(harness.state().focused, 0);
    assert!(harness.query_by_label("pytorch refused 1 request(s):").is_some());
    // On its way to the side panel the pointer crosses paged's map: the panel stays on pytorch.
    let paged_map = harness.get_by_label("paged").rect().center() + egui::vec2(0.0, 150.0);
    harness.hover_at(paged_map);
    harness.run_steps(2);
    assert_eq!(harness.state().focused, 0, "hovering does not focus");
    assert!(harness.query_by_label("pytorch refused 1 request(s):").is_some());
    // A click on paged's map focuses it: the panel says so and offers the panes that refused.
    harness.drag_at(paged_map);
    harness.run_steps(1);
    harness.drop_at(paged_map);
    harness.run_steps(2);
    assert_eq!(harness.state().focused, 3, "a click focuses");
    assert!(harness.query_by_label("paged served every request.").is_some());
    assert!(harness.query_by_label("pytorch (1)").is_some() && harness.query_by_label("tlsf (1)").is_some());
    // O, with a pane focused that refused nothing, finds pytorch's refusal and focuses pytorch.
    harness.key_press(Key::O);
    harness.run_steps(2);
    assert_eq!((harness.state().playback.shown_steps(), harness.state().focused), (61, 0));
    assert!(harness.query_by_label_contains("Fragmentation (waste between allocations): 1000.00 MiB free in").is_some());
    // The button of another pane that refused focuses it.
    harness.get_by_label("tlsf (1)").click();
    harness.run_steps(2);
    assert_eq!((harness.state().playback.shown_steps(), harness.state().focused), (61, 2));
    assert!(harness.query_by_label("tlsf refused 1 request(s):").is_some());
    // The keys 1 to 4 focus a pane too.
    harness.key_press(Key::Num2);
    harness.run_steps(1);
    assert_eq!(harness.state().focused, 1);
    assert!(harness.query_by_label("pytorch-expandable served every request.").is_some());
}

#[test]
fn the_colour_menu_has_a_legend() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    harness.get_by_label("colour: size class").click();
    harness.run_steps(2);
    assert!(harness.query_by_label("Legend").is_some());
    assert!(harness.query_by_label("1 MiB to 2 MiB, 4 GiB to 8 GiB").is_some(), "size classes with their ranges");
    assert!(harness.query_by_label("free run too small for the request refused").is_some());
    harness.get_by_label("age").click();
    harness.run_steps(2);
    assert_eq!(harness.state().colour_by, heapscope_gui::palette::ColourBy::Age);
    harness.get_by_label("colour: age").click();
    harness.run_steps(2);
    assert!(harness.query_by_label("just allocated").is_some(), "the legend follows the mode");
}

#[test]
fn single_letter_keys_ignore_modified_presses() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    harness.key_press_modifiers(Modifiers::ALT, Key::T);
    harness.key_press_modifiers(Modifiers::COMMAND, Key::Space);
    harness.key_press_modifiers(Modifiers::ALT, Key::O);
    harness.run_steps(2);
    let app = harness.state();
    assert_eq!((app.teach, app.playback.playing, app.playback.shown_steps()), (false, false, 0));
    harness.key_press(Key::T);
    harness.key_press(Key::Space);
    harness.run_steps(1);
    assert_eq!((harness.state().teach, harness.state().playback.playing), (true, true), "unmodified, they work");
}

#[test]
fn teach_me_explains_each_decision() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    harness.get_by_label("Teach me").click();
    harness.run_steps(1);
    assert!(harness.query_by_label_contains("Nothing has happened yet").is_some());
    harness.get_by_label("Next decision").click();
    harness.run_steps(1);
    clock.advance(1.0);
    harness.run_steps(2);
    assert_eq!(harness.state().playback.position, 1.0);
    assert!(harness.query_by_label_contains("cudaMalloc reserves a new 150.00 MiB segment").is_some());
    assert!(harness.query_by_label_contains("maps 75 pages (150.00 MiB)").is_some(), "paging explains itself too");
    // Another story from the panel.
    harness.get_by_label("llm_serving_paged").click();
    harness.run_steps(2);
    let app = harness.state();
    assert_eq!(app.session.as_ref().unwrap().name, "llm_serving_paged");
    assert!(app.teach, "teach mode stays on");
}

/// "Teach me" tells the compaction story: in one range, the 1 GiB request meets fragmentation, the heap compacts and
/// serves it; the sentence of that step says what moved, every heap pane serves it, and the step animates (the moved
/// allocations slide, `panes::step_animation`).
#[test]
fn teach_me_tells_the_compaction_story() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    harness.get_by_label("Teach me").click();
    harness.run_steps(1);
    harness.get_by_label("compaction").click();
    harness.run_steps(2);
    assert_eq!(harness.state().session.as_ref().unwrap().name, "compaction");
    harness.key_press(Key::End);
    harness.run_steps(2);
    let steps = harness.state().session.as_ref().unwrap().steps();
    assert_eq!(harness.state().playback.shown_steps(), steps);
    assert!(harness.query_by_label_contains("Compaction: ").is_some(), "the last step's sentence says what moved");
    assert!(harness.query_by_label_contains("moved together, gathering the free space between them into one run").is_some());
    for pane in &harness.state().session.as_ref().unwrap().panes {
        if pane.name().starts_with("tlsf") {
            assert!(pane.timeline.refusals().is_empty(), "{}: compacting served every request", pane.name());
        }
    }
    // Back one decision and forward again: the step animates.
    harness.get_by_label("Previous decision").click();
    harness.run_steps(1);
    harness.get_by_label("Next decision").click();
    harness.run_steps(1);
    clock.advance(0.1);
    harness.run_steps(1);
    let playback = &harness.state().playback;
    assert_eq!((playback.shown_steps(), playback.progress() < 1.0), (steps, true), "{playback:?}");
}

#[test]
fn a_live_source_grows_its_pane() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    let (source, sender) = ChannelSource::new();
    harness.state_mut().attach_live("device 0", Box::new(source));
    sender
        .send(LiveStep {
            changes: vec![Change::RegionAdded { address: 0, size_bytes: 1 << 20, kind: RegionKind::Block }],
            refusal: None,
        })
        .unwrap();
    harness.run_steps(1);
    for slot in 0..4u32 {
        let span = Span {
            address: u64::from(slot) * 4096,
            footprint_bytes: 4096,
            lead_bytes: 0,
            requested_bytes: 4000,
            slot,
            before_recording: false,
            born: 0,
        };
        sender.send(LiveStep { changes: vec![Change::Allocated(span)], refusal: None }).unwrap();
    }
    clock.advance(0.25);
    harness.run_steps(1);
    clock.advance(0.25);
    harness.run_steps(1);
    let pane = &harness.state().session.as_ref().unwrap().panes[0];
    assert_eq!(pane.timeline.steps(), 5);
    assert_eq!(pane.layout.totals().live_allocations, 4, "the view follows the newest step");
    // "+ pane" has nothing to replay in a live session: it is disabled.
    harness.get_by_label("+ pane").click();
    harness.run_steps(1);
    harness.state_mut().add_pane();
    assert_eq!(harness.state().session.as_ref().unwrap().panes.len(), 1, "a live session keeps its one pane");
    // So is "allocations" (a live run records no allocations to stack); the totals keep following the run.
    harness.get_by_label("allocations").click();
    harness.run_steps(1);
    assert_eq!(harness.state().timeline_view, heapscope_gui::active_plot::TimelineView::Totals);
    // Nonsense from the source is an error on screen, not a crash.
    sender.send(LiveStep { changes: vec![Change::Freed { address: 12345 }], refusal: None }).unwrap();
    harness.run_steps(1);
    assert!(harness.state().error.as_deref().unwrap_or_default().contains("no live allocation starts at 0x3039"));
    // "Live" opens its bar: a workload, a contender, a budget and "Start run".
    harness.get_by_label("Live").click();
    harness.run_steps(1);
    assert!(harness.query_by_label("budget").is_some() && harness.query_by_label("Start run").is_some());
    // A budget that is no size, or nothing, is named, not started.
    for (typed, said) in [("lots", "size \"lots\""), ("0M", "budget \"0M\": nothing could be allocated")] {
        harness.state_mut().live.budget = typed.into();
        harness.get_by_label("Start run").click();
        harness.run_steps(1);
        let error = harness.state().error.clone().unwrap_or_default();
        assert!(error.contains(said), "{typed}: {error}");
    }
    // Without the device asked for, the bar says so and points at the stories; what is shown stays.
    let nowhere = ContextOptions { validation: false, device_selector: Some("no-such-gpu-anywhere".into()) };
    harness.state_mut().start_live_with(&nowhere, LiveConfig::new(LiveWorkload::Serve, Contender::Paged));
    harness.run_steps(1);
    assert!(harness.query_by_label_contains("no GPU/Vulkan device: ").is_some());
    assert!(harness.query_by_label_contains("the built-in stories").is_some());
    assert!(harness.state().live.run.is_none());
}

#[test]
fn the_live_bar_shows_the_run_started_from_the_command_line() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    // `gui --live churn --policy paged --budget 112M --steps 40`, on a device that is not there.
    let config = LiveConfig {
        budget_bytes: Some(112 << 20),
        steps: Some(40),
        seed: 7,
        ..LiveConfig::new(LiveWorkload::Churn, Contender::Paged)
    };
    let nowhere = ContextOptions { validation: false, device_selector: Some("no-such-gpu-anywhere".into()) };
    harness.state_mut().start_live_with(&nowhere, config.clone());
    harness.run_steps(1);
    let shown = |text: &str| harness.query_by_label(text).is_some() || harness.query_by_value(text).is_some();
    assert!(shown("workload: churn"), "the bar names the workload that runs: {:?}", harness.root());
    assert!(shown("contender: paged"));
    let live = &harness.state().live;
    assert_eq!((live.budget.as_str(), live.steps.as_str()), ("112 MiB", "40"));
    assert_eq!(live.config().unwrap(), config, "\"Start run\" starts the same run again");
    // A budget of no whole MiB is shown, named in the title and started again exactly.
    let odd = LiveConfig { budget_bytes: Some(1_000_000), ..LiveConfig::new(LiveWorkload::Serve, Contender::Paged) };
    harness.state_mut().live.set_config(&odd);
    assert_eq!(harness.state().live.budget, "1000000 B");
    assert_eq!(harness.state().live.config().unwrap(), odd.clone());
    assert_eq!(odd.title(), "live serve · paged · 1000000 B");
    // Steps that are no number are named.
    harness.state_mut().live.steps = "many".into();
    assert_eq!(harness.state().live.config().unwrap_err().to_string(), "steps \"many\": expected a whole number above 0");
}

/// A scratch folder of this test process, emptied.
fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("heapscope-gui-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Clicks a line of the file browser's list: the pointer comes over it first (a click in a scroll area counts
/// once the pointer was there a frame before).
fn click_row(harness: &mut Harness<'static, HeapscopeApp>, label: &str) {
    harness.get_by_label(label).hover();
    harness.run_steps(1);
    harness.get_by_label(label).click();
    harness.run_steps(1);
}

/// Double-clicks at `pos` as a person does: the pointer comes there a frame before, then two presses and
/// releases 50 ms apart, each in a frame of its own at that time.
///
/// egui counts a click as double when it is released within `InputOptions::max_double_click_delay` (0.3 s) of
/// the click before, close by, by `RawInput::time`. egui_kittest leaves `time` unset, so each frame is
/// `step_dt` (0.25 s) after the last, and every queued event gets a frame of its own: two `Node::click`s are
/// press 0, release 0.25, press 0.5, release 0.75 s, never a double click. Setting `RawInput::time` for these four
/// frames (and unsetting it after: time goes on from there) makes the timing a person's.
fn double_click_at(harness: &mut Harness<'static, HeapscopeApp>, pos: egui::Pos2) {
    harness.hover_at(pos);
    harness.run_steps(1);
    let start = harness.ctx.input(|input| input.time);
    for (index, pressed) in [true, false, true, false].into_iter().enumerate() {
        harness.input_mut().time = Some(start + 0.05 * (index + 1) as f64);
        harness.event(egui::Event::PointerButton {
            pos,
            button: egui::PointerButton::Primary,
            pressed,
            modifiers: Modifiers::NONE,
        });
        harness.step();
    }
    harness.input_mut().time = None;
}

/// Double-clicks a line of the file browser's list whose text holds `label`; a frame more draws what it led to.
fn double_click_row(harness: &mut Harness<'static, HeapscopeApp>, label: &str) {
    let pos = harness.get_by_label_contains(label).rect().center();
    double_click_at(harness, pos);
    harness.run_steps(1);
}

#[test]
fn double_clicks_in_the_file_browser_enter_folders_and_open_files() {
    let root = scratch_dir("browse-double");
    let traces = root.join("traces");
    std::fs::create_dir(&traces).unwrap();
    std::fs::write(traces.join("three.csv"), "a,1,100\na,2,200\nf,1\n").unwrap();

    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    harness.key_press_modifiers(Modifiers::COMMAND, Key::O);
    harness.run_steps(2);
    harness.state_mut().file_browser.as_mut().unwrap().set_typed_path(root.to_str().unwrap());
    harness.get_by_label("Go").click();
    harness.run_steps(1);
    let browser_dir =
        |harness: &Harness<'static, HeapscopeApp>| harness.state().file_browser.as_ref().unwrap().dir().to_path_buf();
    assert_eq!(browser_dir(&harness), std::fs::canonicalize(&root).unwrap());

    // Two clicks a quarter of a second apart or more are two clicks: they select, they do not enter.
    click_row(&mut harness, "traces/");
    click_row(&mut harness, "traces/");
    assert_eq!(browser_dir(&harness), std::fs::canonicalize(&root).unwrap(), "two slow clicks only select");
    assert_eq!(harness.state().file_browser.as_ref().unwrap().selected().unwrap().name, "traces");

    // A double-click on a folder enters it; Backspace goes back up, where a double-click enters it again.
    double_click_row(&mut harness, "traces/");
    assert_eq!(browser_dir(&harness), std::fs::canonicalize(&traces).unwrap(), "a double-click enters the folder");
    harness.key_press(Key::Backspace);
    harness.run_steps(1);
    assert_eq!(browser_dir(&harness), std::fs::canonicalize(&root).unwrap(), "Backspace goes up");
    double_click_row(&mut harness, "traces/");
    assert_eq!(browser_dir(&harness), std::fs::canonicalize(&traces).unwrap());

    // A double-click on a file opens it: the browser closes and the app shows the trace.
    assert_eq!(harness.state().session.as_ref().unwrap().name, "frag_oom");
    double_click_row(&mut harness, "three.csv");
    assert!(harness.state().file_browser.is_none(), "the browser closes on open");
    wait_for_open(&mut harness);
    let app = harness.state();
    assert!(app.error.is_none(), "{:?}", app.error);
    let session = app.session.as_ref().unwrap();
    assert!(session.name.ends_with("three.csv"), "{}", session.name);
    assert_eq!(session.steps(), 3);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn open_a_snapshot_from_the_file_browser() {
    let root = scratch_dir("browse");
    let traces = root.join("traces");
    std::fs::create_dir(&traces).unwrap();
    let asset = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/traces/pytorch/frag_oom-default.pickle.gz");
    std::fs::copy(&asset, traces.join("frag_oom-default.pickle.gz")).unwrap();
    std::fs::write(traces.join("notes.txt"), "not a recording").unwrap();

    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    harness.key_press_modifiers(Modifiers::COMMAND, Key::O);
    harness.run_steps(2);
    assert!(harness.state().file_browser.is_some(), "Ctrl+O opens the browser");
    assert!(harness.query_by_label("Open a recording").is_some());
    let cwd = std::fs::canonicalize(std::env::current_dir().unwrap()).unwrap();
    assert_eq!(harness.state().file_browser.as_ref().unwrap().dir(), cwd, "nothing opened yet: the working directory");

    // Go to the scratch folder by its path, select `traces` with a click and enter it with Enter (double-clicks:
    // `double_clicks_in_the_file_browser_enter_folders_and_open_files`).
    harness.state_mut().file_browser.as_mut().unwrap().set_typed_path(root.to_str().unwrap());
    harness.get_by_label("Go").click();
    harness.run_steps(1);
    // Ctrl+O again while it is open leaves it where it is.
    harness.key_press_modifiers(Modifiers::COMMAND, Key::O);
    harness.run_steps(1);
    assert_eq!(harness.state().file_browser.as_ref().unwrap().dir(), std::fs::canonicalize(&root).unwrap());
    click_row(&mut harness, "traces/");
    assert_eq!(harness.state().file_browser.as_ref().unwrap().selected().unwrap().name, "traces", "a click selects");
    harness.key_press(Key::Enter);
    harness.run_steps(1);
    let browser = harness.state().file_browser.as_ref().unwrap();
    assert_eq!(browser.dir(), std::fs::canonicalize(&traces).unwrap(), "Enter enters the folder");
    let names: Vec<&str> = browser.entries().iter().map(|entry| entry.name.as_str()).collect();
    assert_eq!(names, ["..", "frag_oom-default.pickle.gz"], "folders first, only what heapscope opens");
    harness.get_by_label("show all files").click();
    harness.run_steps(1);
    assert!(harness.query_by_label_contains("notes.txt").is_some(), "show all files lists the rest");
    click_row(&mut harness, "show all files");
    assert!(harness.query_by_label_contains("notes.txt").is_none());

    // The arrows select the snapshot (the parent, then it), Enter opens it in the background.
    harness.key_press(Key::ArrowDown);
    harness.run_steps(1);
    harness.key_press(Key::ArrowDown);
    harness.run_steps(1);
    assert_eq!(harness.state().file_browser.as_ref().unwrap().selected().unwrap().name, "frag_oom-default.pickle.gz");
    assert_eq!(harness.state().playback.shown_steps(), 0, "the arrows move the selection, not the playback");
    harness.key_press(Key::Enter);
    harness.run_steps(1);
    assert!(harness.state().file_browser.is_none(), "the browser closes on open");
    wait_for_open(&mut harness);
    let app = harness.state();
    assert!(app.error.is_none(), "{:?}", app.error);
    let session = app.session.as_ref().unwrap();
    assert!(session.name.contains("frag_oom-default.pickle.gz"), "{}", session.name);
    assert!(session.steps() > 0 && session.panes.len() == 4, "{} steps", session.steps());

    // Opened again, the browser starts in the folder of that file; Cancel closes it.
    harness.get_by_label("Open…").click();
    harness.run_steps(1);
    let expected = std::fs::canonicalize(&traces).unwrap();
    assert_eq!(harness.state().file_browser.as_ref().unwrap().dir(), expected);
    harness.get_by_label("Cancel").click();
    harness.run_steps(1);
    assert!(harness.state().file_browser.is_none());
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn the_file_browser_says_why_a_folder_does_not_list() {
    let root = scratch_dir("browse-missing");
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    harness.get_by_label("Open…").click();
    // The first frame of a modal sizes it, unseen; the second shows it.
    harness.run_steps(2);
    let missing = root.join("no-such-folder");
    harness.state_mut().file_browser.as_mut().unwrap().set_typed_path(missing.to_str().unwrap());
    harness.get_by_label("Go").click();
    harness.run_steps(1);
    let shown = format!("cannot list {}: no such folder", missing.display());
    assert!(harness.query_by_label(&shown).is_some(), "the error in words: {shown}");
    // The parent entry is the way out.
    click_row(&mut harness, ".. (parent folder)");
    harness.key_press(Key::Enter);
    harness.run_steps(1);
    let browser = harness.state().file_browser.as_ref().unwrap();
    assert_eq!((browser.dir(), browser.error()), (std::fs::canonicalize(&root).unwrap().as_path(), None));
    harness.key_press(Key::Escape);
    harness.run_steps(1);
    assert!(harness.state().file_browser.is_none(), "Esc closes");
    assert_eq!(harness.state().session.as_ref().unwrap().name, "frag_oom", "nothing else changed");
    std::fs::remove_dir_all(&root).unwrap();
}

/// A turn of the wheel over `pos` (`delta_points` down the content; with `modifiers`), as an integration sends it.
fn wheel_at(harness: &mut Harness<'static, HeapscopeApp>, pos: egui::Pos2, delta_points: f32, modifiers: Modifiers) {
    harness.hover_at(pos);
    harness.run_steps(1);
    harness.event(egui::Event::MouseWheel {
        unit: egui::MouseWheelUnit::Point,
        delta: egui::vec2(0.0, delta_points),
        phase: egui::TouchPhase::Move,
        source: egui::MouseWheelSource::Wheel,
        modifiers,
    });
    // egui spreads a wheel turn over a few frames.
    harness.run_steps(6);
}

/// The rows of `gui/README.md`'s "Keyboard and mouse" that the tests above do not drive: the arrows, `[` / `]`,
/// and the mouse on a map and on the timeline.
#[test]
fn the_arrows_the_speed_keys_the_maps_and_the_timeline_answer() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(2);
    let shown = |harness: &Harness<'static, HeapscopeApp>| harness.state().playback.shown_steps();

    // → steps forward, animated over the next frames; ← steps back.
    harness.key_press(Key::ArrowRight);
    harness.run_steps(1);
    assert!(harness.state().playback.moving(), "→ starts the step's animation");
    clock.advance(1.0);
    harness.run_steps(2);
    assert_eq!(harness.state().playback.position, 1.0);
    harness.key_press(Key::ArrowRight);
    harness.run_steps(1);
    clock.advance(1.0);
    harness.run_steps(2);
    assert_eq!(harness.state().playback.position, 2.0);
    harness.key_press(Key::ArrowLeft);
    harness.run_steps(1);
    assert_eq!(harness.state().playback.position, 1.0, "← goes back a step");

    // `]` faster, `[` slower.
    let speed = harness.state().playback.speed;
    harness.key_press(Key::CloseBracket);
    harness.run_steps(1);
    assert_eq!(harness.state().playback.speed, speed + 1);
    harness.key_press(Key::OpenBracket);
    harness.key_press(Key::OpenBracket);
    harness.run_steps(1);
    assert_eq!(harness.state().playback.speed, speed - 1);

    // On pytorch's map: ctrl + wheel zooms in, the wheel and a drag scroll the rows, a double-click fits it again.
    // (With "fit each pane": at one scale over the recording, the second step's heap is small enough that zoomed in
    // twice it still fits, with nothing to scroll.)
    harness.get_by_label("fit each pane").click();
    harness.run_steps(1);
    assert_eq!(harness.state().scale_rule, heapscope_gui::panes::ScaleRule::FitEach);
    let map = harness.get_by_label("pytorch").rect().center() + egui::vec2(0.0, 150.0);
    let view = |harness: &Harness<'static, HeapscopeApp>| harness.state().session.as_ref().unwrap().panes[0].view;
    assert_eq!(view(&harness), heapscope_gui::heap_map::MapView::default(), "the map opens fitted");
    wheel_at(&mut harness, map, 200.0, Modifiers::COMMAND);
    let once = view(&harness).scale.expect("ctrl + wheel zooms").row_bytes;
    wheel_at(&mut harness, map, 200.0, Modifiers::COMMAND);
    let twice = view(&harness).scale.unwrap().row_bytes;
    assert!(twice < once, "a wheel turn up zooms in further: {once} then {twice} bytes per row");
    let scrolled_by_zoom = view(&harness).scroll;
    wheel_at(&mut harness, map, -120.0, Modifiers::NONE);
    let scrolled = view(&harness).scroll;
    assert!(scrolled > scrolled_by_zoom, "the wheel scrolls down: {scrolled_by_zoom} then {scrolled}");
    assert_eq!(view(&harness).scale.unwrap().row_bytes, twice, "the wheel alone does not zoom");
    harness.drag_at(map);
    harness.run_steps(1);
    harness.hover_at(map - egui::vec2(0.0, 60.0));
    harness.run_steps(1);
    harness.drop_at(map - egui::vec2(0.0, 60.0));
    harness.run_steps(1);
    assert!(view(&harness).scroll > scrolled, "a drag up scrolls down: {scrolled} then {}", view(&harness).scroll);
    double_click_at(&mut harness, map);
    assert_eq!(view(&harness), heapscope_gui::heap_map::MapView::default(), "a double-click fits the whole heap");
    // A pinch reaches egui as a zoom factor: spread to twice the size, the rows hold half the bytes.
    harness.event(egui::Event::Zoom(2.0));
    harness.run_steps(1);
    let pinched = view(&harness).scale.expect("a pinch zooms the fitted map").row_bytes;
    harness.event(egui::Event::Zoom(2.0));
    harness.run_steps(1);
    let again = view(&harness).scale.unwrap().row_bytes;
    assert!((pinched / 2).abs_diff(again) <= 1, "a pinch to twice the size: {pinched} then {again} bytes per row");

    // A click on the timeline seeks there, further right further in; a drag seeks as it goes.
    let legend = harness.get_by_label_contains("solid: reserved").rect();
    let on_timeline = |x: f32| egui::pos2(legend.left() + x, legend.bottom() + 70.0);
    let mut click_at = |pos: egui::Pos2| {
        harness.hover_at(pos);
        harness.run_steps(1);
        harness.drag_at(pos);
        harness.run_steps(1);
        harness.drop_at(pos);
        harness.run_steps(1);
        shown(&harness)
    };
    let (left, right) = (click_at(on_timeline(300.0)), click_at(on_timeline(700.0)));
    assert!(0 < left && left < right && right <= 61, "clicks at two places seek to steps {left} and {right}");
    harness.drag_at(on_timeline(300.0));
    harness.run_steps(1);
    harness.hover_at(on_timeline(500.0));
    harness.run_steps(1);
    harness.hover_at(on_timeline(700.0));
    harness.run_steps(1);
    assert_eq!(shown(&harness), right, "a drag seeks to where the pointer is, not where it was a frame before");
    harness.drop_at(on_timeline(700.0));
    harness.run_steps(1);
    assert_eq!(shown(&harness), right, "and ends where it was let go");

    // A click on a pane's name focuses it (and opens its menu of contenders).
    assert_eq!(harness.state().focused, 0);
    harness.get_by_label("paged").click();
    harness.run_steps(2);
    assert_eq!(harness.state().focused, 3, "a click on paged's name focuses paged");
}

/// A step or play started after the window stood still animates from where it was: egui draws no frames while
/// nothing moves, and the idle time before the key is not played at once.
#[test]
fn a_step_after_idle_time_animates_instead_of_jumping() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    clock.advance(0.9);
    harness.key_press(Key::ArrowRight);
    harness.run_steps(1);
    assert_eq!(harness.state().playback.position, 0.0, "the step starts from its start");
    clock.advance(0.1);
    harness.run_steps(1);
    let playback = &harness.state().playback;
    assert!((playback.position - 0.25).abs() < 1e-9, "a quarter of its 0.4 s: {playback:?}");
    clock.advance(1.0);
    harness.run_steps(2);
    assert_eq!(harness.state().playback.position, 1.0);

    // Play after idle time: from the step shown, at 2 steps a second.
    clock.advance(0.9);
    harness.key_press(Key::Space);
    harness.run_steps(1);
    clock.advance(0.25);
    harness.run_steps(1);
    let playback = &harness.state().playback;
    assert!(playback.playing && (playback.position - 1.5).abs() < 1e-9, "{playback:?}");
}

/// Sizes that add up past a u64 (a 16 EiB request beside others): the allocations view builds, draws, and answers a
/// hover over it (its sums overflowed, a panic with overflow checks on).
#[test]
fn the_allocations_view_draws_sizes_past_a_u64() {
    let dir = scratch_dir("huge-allocations");
    let path = dir.join("huge.csv");
    std::fs::write(&path, format!("a,1,{}\na,2,4096\nf,2\nf,1\na,3,7\n", u64::MAX)).unwrap();
    let clock = ManualClock::default();
    let mut harness = opened(&clock, &path);
    harness.state_mut().timeline_view = heapscope_gui::active_plot::TimelineView::Allocations;
    harness.state_mut().playback.seek(2);
    harness.run_steps(2);
    let plot = harness.get_by_label("allocations").rect();
    // Across the timeline under the toggles: every column drawn, hovered and clicked.
    for x in [0.1, 0.3, 0.5, 0.7, 0.9] {
        harness.hover_at(egui::pos2(plot.left() + 1.0, plot.bottom() + 80.0) + egui::vec2(1200.0 * x, 0.0));
        harness.run_steps(1);
    }
    assert!(harness.state().error.is_none(), "{:?}", harness.state().error);
    std::fs::remove_dir_all(&dir).ok();
}

/// The frag_oom snapshot on two devices (issue 14, part 4), written here: device 0 as recorded (it ran out of
/// memory), device 1 the same run without its `oom` entry.
fn two_device_snapshot(dir: &std::path::Path) -> std::path::PathBuf {
    let asset = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/traces/pytorch/frag_oom-default.pickle.gz");
    let mut snapshot = heapscope_pytorch::read_snapshot(&asset).unwrap();
    let mut second: Vec<_> = snapshot.device_traces[0].clone();
    second.retain(|entry| entry.action != heapscope_pytorch::Action::Oom);
    let moved: Vec<_> =
        snapshot.segments.iter().map(|segment| heapscope_pytorch::Segment { device: 1, ..segment.clone() }).collect();
    snapshot.segments.extend(moved);
    snapshot.device_traces.push(second);
    let path = dir.join("two-devices.pickle");
    heapscope_pytorch::write_snapshot(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
    path
}

/// A file of several devices opens on the one that ran out of memory, says which in the top bar, and the device
/// picker reopens it on another, with the same panes.
#[test]
fn the_device_picker_reopens_the_file_on_another_device() {
    let dir = scratch_dir("device-picker");
    let path = two_device_snapshot(&dir);
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    assert!(harness.query_by_value("device 0").is_none(), "a story has no device picker");
    harness.state_mut().open_path(&path);
    harness.run_steps(2);
    let session = harness.state().session.as_ref().unwrap();
    assert!(harness.state().error.is_none(), "{:?}", harness.state().error);
    assert_eq!(session.recording.device, 0, "the device that ran out of memory");
    assert!(session.name.ends_with("two-devices.pickle (device 0)"), "{}", session.name);
    let (entries, panes) = (session.recording.entries, session.panes.len());
    let notice = harness.state().notice.clone().unwrap_or_default();
    assert!(
        notice.ends_with(
            "two-devices.pickle records 2 devices: showing device 0 (it ran out of memory); the device picker shows the others"
        ),
        "{notice}"
    );
    assert!(harness.query_by_label(&notice).is_some(), "said on screen");
    assert!(session.panes.iter().any(|pane| !pane.timeline.refusals().is_empty()), "device 0's OOM replays");

    // The picker lists both devices with their entries and the OOM; picking device 1 reopens the file there, on the
    // memory its own recording tells (none: unlimited; device 0's was its `oom` entry's), with nothing picked of
    // device 0's allocations.
    harness.state_mut().selected = Some(3);
    harness.get_by_value("device 0").click();
    harness.run_steps(2);
    assert!(harness.query_by_label(&format!("device 0: {entries} entries, ran out of memory")).is_some());
    harness.get_by_label(&format!("device 1: {} entries", entries - 1)).click();
    harness.run_steps(2);
    let app = harness.state();
    assert!(app.error.is_none(), "{:?}", app.error);
    let session = app.session.as_ref().unwrap();
    assert_eq!((session.recording.device, session.recording.entries), (1, entries - 1));
    assert!(session.name.ends_with("(device 1)"), "{}", session.name);
    assert_eq!(session.panes.len(), panes, "the same panes");
    assert!(harness.query_by_value("device 1").is_some(), "the picker shows the device now open");
    assert_eq!(app.notice, None, "a device picked needs no explaining");
    assert_eq!(session.config.capacity_bytes, heapscope_lab::capacity::Capacity::of(None, &session.recording).bytes);
    assert!(session.panes.iter().all(|pane| pane.timeline.refusals().is_empty()), "device 1 never ran out");
    assert_eq!(app.selected, None, "a slot of device 0's recording");
    // A story opened after the file: what was said of the file goes with it.
    harness.state_mut().open_path(&path);
    harness.run_steps(2);
    assert!(harness.state().notice.is_some());
    harness.state_mut().open_story("frag_oom");
    assert_eq!(harness.state().notice, None, "the lesson's window says nothing of the file");
    std::fs::remove_dir_all(&dir).ok();
}

/// The advice's settings as panes: the device picker reopens them all on the other device (four of them, no pane
/// more), and a file opened next opens with the plain panes alone (a setting's pane replays the recording it was
/// advised for as plain `pytorch`).
#[test]
fn setting_panes_follow_the_device_not_the_next_file() {
    let dir = scratch_dir("device-settings");
    let path = two_device_snapshot(&dir);
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    harness.state_mut().open_path(&path);
    let settings = ["expandable_segments:True", "max_split_size_mb:128", "garbage_collection_threshold:0.6", ""];
    let session = harness.state_mut().session.as_mut().unwrap();
    session.panes.truncate(1);
    session.add_setting_pane(settings[0]).unwrap();
    session.panes.remove(0);
    for setting in &settings[1..] {
        session.add_setting_pane(setting).unwrap();
    }
    harness.state_mut().switch_device(1);
    let app = harness.state();
    assert!(app.error.is_none(), "{:?}", app.error);
    let session = app.session.as_ref().unwrap();
    let shown: Vec<Option<&str>> = session.panes.iter().map(|pane| pane.setting.as_deref()).collect();
    assert_eq!(shown, settings.map(Some), "the four settings on device 1");
    assert_eq!(session.recording.device, 1);

    let session = harness.state_mut().session.as_mut().unwrap();
    session.panes.truncate(2);
    session.set_contender(0, Contender::Heap(PolicyKind::Tlsf)).unwrap();
    session.panes.remove(1);
    session.add_setting_pane("expandable_segments:True").unwrap();
    harness.state_mut().open_path(&path);
    let session = harness.state().session.as_ref().unwrap();
    let panes: Vec<(String, Option<&str>)> =
        session.panes.iter().map(|pane| (pane.name().to_owned(), pane.setting.as_deref())).collect();
    assert_eq!(panes, [("tlsf".to_owned(), None)], "no plain pytorch pane in place of the setting's");
    std::fs::remove_dir_all(&dir).ok();
}

/// A recording whose requests went to a private memory pool (PyTorch 2.12 names each entry's pool) on two CUDA
/// streams opens saying so on screen, in the words of the CLI ([`heapscope_lab::caveats`]): the panes side by side do
/// not serve those requests alike.
#[test]
fn what_the_panes_do_not_tell_apart_is_said_on_opening() {
    let dir = scratch_dir("caveats");
    let asset = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/traces/pytorch/frag_oom-default.pickle.gz");
    let mut snapshot = heapscope_pytorch::read_snapshot(&asset).unwrap();
    // The first allocation's address goes to a graph's pool, every entry of it; the second half of the trace to
    // another stream.
    snapshot.pool_ids = vec![(0, 0), (1, 0)];
    let trace = &mut snapshot.device_traces[0];
    let (addr, half) = (trace[0].addr, trace.len() / 2);
    for (index, entry) in trace.iter_mut().enumerate() {
        if entry.addr == addr {
            entry.pool_id = heapscope_pytorch::PoolId(1);
        }
        if index >= half {
            entry.stream += 1;
        }
    }
    let path = dir.join("pools-streams.pickle");
    heapscope_pytorch::write_snapshot(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
    let clock = ManualClock::default();
    let harness = opened(&clock, &path);
    let app = harness.state();
    let session = app.session.as_ref().unwrap();
    let contenders: Vec<Contender> = session.panes.iter().filter_map(|pane| pane.contender).collect();
    let said = heapscope_lab::caveats::all(&session.recording, &contenders, &session.config);
    assert_eq!(session.caveats, said);
    assert!(said[0].contains("went to 1 private memory pool") && said[1].starts_with("the recording uses 2 CUDA streams"));
    let notice = app.notice.clone().unwrap_or_default();
    assert_eq!(notice, said.join("\n"), "one line each, as the CLI prints them");
    let shown = harness.get_by_label(&notice).rect();
    assert!(shown.max.x <= 1400.0, "said within the window, wrapped: {shown:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A state with no trace (what `torch.cuda.memory_snapshot()` returns: a list of segments, written here) opens
/// in the app: one moment, the start, every pane holding the allocations live in it.
#[test]
fn a_state_with_no_trace_opens_at_its_one_moment() {
    let dir = scratch_dir("state");
    let asset =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/traces/pytorch/gpt2_train_fixed-default.pickle.gz");
    let snapshot = heapscope_pytorch::read_snapshot(&asset).unwrap();
    let path = dir.join("state.pickle");
    heapscope_pytorch::write_segments(&snapshot, std::fs::File::create(&path).unwrap()).unwrap();
    let clock = ManualClock::default();
    let harness = opened(&clock, &path);
    let app = harness.state();
    let session = app.session.as_ref().unwrap();
    assert_eq!((session.steps(), session.recording.entries), (0, 0), "one moment: the start");
    assert!(session.recording.start_events > 0);
    assert!(harness.query_by_label("start / 0 entries").is_some(), "the transport says where it is");
    for pane in &session.panes {
        assert_eq!(pane.layout.totals().live_allocations as usize, session.recording.start_events, "{}", pane.name());
        // Each is its start event's slot: its stack, its category, picked on the allocations view, outlined here.
        let mut slots: Vec<u32> = pane.layout.spans().map(|span| span.trace_slot().unwrap()).collect();
        slots.sort_unstable();
        assert_eq!(slots, (0..session.recording.start_events as u32).collect::<Vec<_>>(), "{}", pane.name());
        assert!(pane.layout.spans().all(Span::is_before_recording), "{}", pane.name());
    }
    assert!(harness.query_by_value("device 0").is_none() && session.devices.len() == 1, "one device: no picker");
    std::fs::remove_dir_all(&dir).ok();
}

/// "Advice" replays the story under every setting on a worker thread, shows the answer and the ranked settings,
/// and a row opens as a pane beside the others: the run that fits beside the one that failed.
#[test]
fn the_advice_panel_ranks_settings_and_opens_one_as_a_pane() {
    let clock = ManualClock::default();
    let mut harness = harness(&clock);
    harness.run_steps(1);
    // Room for one more pane: the story opens four.
    harness.get_all_by_label("x").next().unwrap().click();
    harness.run_steps(2);
    let panes = harness.state().session.as_ref().unwrap().panes.len();
    harness.get_by_label("Advice").click();
    harness.run_steps(1);
    assert!(harness.state().advice.is_some(), "the toggle starts the advice");
    for _ in 0..600 {
        harness.run_steps(1);
        if matches!(harness.state().advice.as_ref().unwrap().state(), heapscope_gui::advice::AdviceState::Done(_)) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    harness.run_steps(2);
    assert!(
        harness.query_by_label_contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True — fits in").is_some(),
        "the answer"
    );
    harness.get_by_label("expandable_segments:True").click();
    harness.run_steps(2);
    let session = harness.state().session.as_ref().unwrap();
    assert_eq!(session.panes.len(), panes + 1);
    let added = session.panes.last().unwrap();
    assert_eq!(
        (added.name(), added.setting.as_deref()),
        ("pytorch (expandable_segments:True)", Some("expandable_segments:True"))
    );
    assert!(added.timeline.refusals().is_empty(), "the setting that fits serves the 1 GiB request");
    harness.get_by_label("Advice").click();
    harness.run_steps(1);
    assert!(harness.state().advice.is_none(), "the toggle closes it");
}
