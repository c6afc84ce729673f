//! The panes side by side: a header per contender (name, reserved / live, OOMs) above its heap map, and the
//! details of what the pointer is over. Used by the app and by headless rendering alike.

use egui::{Color32, RichText, Ui};
use heapscope_core::units::Bytes;
use heapscope_lab::recording::counted;
use heapscope_lab::timeline::{Change, Layout, Span, Timeline};

use crate::heap_map::{self, Hit, Rows, Scale, Scene, StepAnimation};
use crate::palette::ColourBy;
use crate::session::{Pane, Session};

/// How the panes are drawn this frame.
#[derive(Clone, Copy, Debug)]
pub struct PaneStyle {
    /// Steps shown.
    pub shown_steps: u64,
    /// Progress of the step animating (1 when none).
    pub progress: f32,
    /// How allocations are coloured.
    pub colour_by: ColourBy,
    /// Whether headers offer a contender menu (the app) or only name it (rendering).
    pub interactive: bool,
    /// The allocation picked on the active memory timeline (its slot), outlined in every pane that holds it.
    pub selected: Option<u32>,
    /// How the maps are scaled against each other.
    pub scale: ScaleRule,
}

/// How the panes' maps are scaled (a map zoomed by hand keeps its own zoom).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScaleRule {
    /// One scale in every pane, fitting what each holds at the moment shown and at its peak over the whole
    /// recording: areas compare across panes and across moments (memory grows on screen as it does on the device).
    #[default]
    OneOverTheRecording,
    /// One scale in every pane, fitting what each holds at the moment shown (a picture of one moment).
    OneAtTheMoment,
    /// Each pane fits its own (exploring one heap; areas do not compare).
    FitEach,
    /// Each pane fits its own, at the moment shown and at its peak over the whole recording (an animation of each
    /// heap: a pane keeps its scale from frame to frame; areas compare within a pane only).
    FitEachOverTheRecording,
}

impl ScaleRule {
    /// The fits a pane's scale covers under this rule, in maps `height` points tall: what it holds at the moment shown,
    /// and under the rules "over the recording" its peak.
    fn fits(self, pane: &mut Pane, height: f32) -> Vec<Scale> {
        let mut fits = vec![Rows::fit(&pane.layout, &pane.timeline, height)];
        if matches!(self, ScaleRule::OneOverTheRecording | ScaleRule::FitEachOverTheRecording) {
            fits.push(pane.peak_fit(height));
        }
        fits
    }
}

/// The coarsest of `fits` (the one holding the most decides), its rows as thin as the thinnest.
fn coarsest(fits: impl IntoIterator<Item = Scale>) -> Option<Scale> {
    fits.into_iter().reduce(|scale, fit| Scale {
        row_bytes: scale.row_bytes.max(fit.row_bytes),
        row_height: scale.row_height.min(fit.row_height),
        gap: scale.gap.min(fit.gap),
    })
}

/// Points above a map taken by its pane's header (name, totals and the device gauge).
const HEADER_POINTS: f32 = 52.0;
/// Room kept beside a pane's name for its close button.
const CLOSE_BUTTON_POINTS: f32 = 24.0;

/// The scale every map is drawn at under `rule` in maps `height` points tall, or `None` where each pane has its own
/// ([`ScaleRule::FitEach`], [`ScaleRule::FitEachOverTheRecording`]): the coarsest of the panes' fits.
pub fn shared_scale(session: &mut Session, rule: ScaleRule, height: f32) -> Option<Scale> {
    if matches!(rule, ScaleRule::FitEach | ScaleRule::FitEachOverTheRecording) {
        return None;
    }
    coarsest(session.panes.iter_mut().flat_map(|pane| rule.fits(pane, height)))
}

/// A gauge of `pane`'s reserved bytes against the device's `capacity_bytes`, full width, in the pane's colour.
fn capacity_gauge(ui: &mut Ui, pane: &Pane, capacity_bytes: u64, colour: Color32) {
    let reserved = pane.layout.totals().reserved_bytes;
    let (rect, response) = ui.allocate_exact_size(egui::vec2(ui.available_width(), 6.0), egui::Sense::hover());
    let painter = ui.painter_at(rect);
    painter.rect_filled(rect, 1.0, Color32::from_gray(48));
    let share = (reserved as f64 / capacity_bytes.max(1) as f64).clamp(0.0, 1.0) as f32;
    painter.rect_filled(egui::Rect::from_min_size(rect.min, egui::vec2(rect.width() * share, rect.height())), 1.0, colour);
    response.on_hover_text(format!(
        "reserved {} of the device's {} ({:.0}%)",
        Bytes(reserved),
        Bytes(capacity_bytes),
        f64::from(share) * 100.0
    ));
}

/// What the user did in the panes.
#[derive(Debug, Default)]
pub struct PaneActions {
    /// Pane `index` should replay with another contender.
    pub switch: Option<(usize, heapscope_lab::contender::Contender)>,
    /// Pane `index` should close.
    pub close: Option<usize>,
    /// The pane the pointer is over.
    pub hovered_pane: Option<usize>,
    /// The pane clicked (its map or its name): the app focuses it.
    pub clicked_pane: Option<usize>,
    /// Where each pane (header and map) was drawn, for the app to mark the focused one.
    pub pane_rects: Vec<egui::Rect>,
}

/// What step `step` of `timeline` animates, from the layout `before` it: allocations born, allocations dying,
/// allocations sliding (freed and placed again in the same step, in the same region: compaction's moves), regions
/// appearing and released, pages mapped and unmapped.
pub fn step_animation(timeline: &Timeline, before: &Layout, step: u64, progress: f32) -> StepAnimation {
    let mut animation = StepAnimation { progress, ..StepAnimation::default() };
    // Allocations freed in this step, by slot, as they were before it: placed again, they moved.
    let mut leaving: Vec<Span> = Vec::new();
    let region = |address: u64| before.region_of(address).map(|region| region.address);
    for change in timeline.changes(step) {
        match *change {
            Change::Allocated(span) => {
                match leaving.iter().position(|old| old.slot == span.slot).map(|index| leaving.swap_remove(index)) {
                    Some(old) if region(old.address).is_some() && region(old.address) == region(span.address) => {
                        animation.sliding.push((old, span.address));
                    }
                    Some(old) => {
                        animation.dying.push(old);
                        animation.born.push(span.address);
                    }
                    None => animation.born.push(span.address),
                }
            }
            Change::Freed { address } => {
                // A second move of the same allocation starts where the first one ends.
                let old = match animation.sliding.iter().position(|&(_, to)| to == address) {
                    Some(index) => Some(animation.sliding.swap_remove(index).0),
                    None => before.span_at(address).copied(),
                };
                leaving.extend(old);
            }
            Change::RegionAdded { address, .. } => animation.new_regions.push(address),
            Change::RegionResized { .. } => {}
            Change::RegionRemoved { address } => {
                animation.released.extend(before.region_of(address).filter(|region| region.address == address).cloned());
            }
            Change::PagesMapped { address, size_bytes } => animation.mapped.push((address, size_bytes)),
            Change::PagesUnmapped { address, size_bytes } => animation.unmapped.push((address, size_bytes)),
        }
    }
    animation.dying.extend(leaving);
    animation.dying.sort_unstable_by_key(|span| span.address);
    animation.born.sort_unstable();
    animation.mapped.sort_unstable();
    animation.unmapped.sort_unstable();
    animation
}

/// The reserved / live line of a pane's header at its current layout.
pub fn header_text(pane: &Pane) -> String {
    let totals = pane.layout.totals();
    let ratio = if totals.live_bytes == 0 {
        "-".to_owned()
    } else {
        format!("{:.2}", totals.reserved_bytes as f64 / totals.live_bytes as f64)
    };
    let ooms_so_far = pane.timeline.refusals().iter().filter(|(step, _)| *step < pane.layout_steps).count();
    let mut text = format!(
        "reserved {} · live {} · reserved/live {ratio} · OOMs {ooms_so_far}/{}",
        Bytes(totals.reserved_bytes),
        Bytes(totals.live_bytes),
        pane.timeline.refusals().len()
    );
    // What the map cannot show: the entry just played held more inside it than before or after (a request served and
    // given back at once, as a contender serves the recording's out-of-memory request, which the program never held).
    if let Some(transient) = pane.timeline.transient_at(pane.layout_steps) {
        text.push_str(&format!(
            " · at its most within this entry: reserved {}, live {} (held and given back inside it)",
            Bytes(transient.reserved_bytes),
            Bytes(transient.live_bytes)
        ));
    }
    text
}

/// The tooltip text for `hit` in `pane`'s region at `region`.
pub fn describe_hit(session: &Session, region: u64, hit: &Hit, shown_steps: u64) -> String {
    match hit {
        Hit::Allocation(span) => describe_span(session, region, span, shown_steps),
        Hit::Free(address, bytes) => format!("free run of {} at offset {:#x}", Bytes(*bytes), address - region),
        Hit::Unmapped(address) => format!("virtual address space, no page mapped (offset {:#x})", address - region),
    }
}

fn describe_span(session: &Session, region: u64, span: &Span, shown_steps: u64) -> String {
    if span.is_before_recording() {
        let mut text = format!(
            "{}allocated before the recording started: {} requested, {} set aside ({} padding and rounding)\noffset {:#x} \
             in the region at {:#x}",
            span.trace_slot().map(|slot| format!("allocation #{slot}, ")).unwrap_or_default(),
            Bytes(span.requested_bytes),
            Bytes(span.footprint_bytes),
            Bytes(span.waste_bytes()),
            span.address - region,
            region,
        );
        if let Some(slot) = span.trace_slot() {
            // Its stack is the one the snapshot's final segments or its free entry recorded, where either did.
            if let Some(free) = session.slots.get(slot as usize).and_then(|slot| slot.free_step) {
                text.push_str(&format!("\nfreed at entry {free}"));
            }
            if let Some(category) = session.category(slot) {
                text.push_str(&format!("\ncategory: {category}"));
            }
            text.push_str(&session.frames(slot).lines("stack", 16));
        }
        return text;
    }
    let mut text = format!(
        "allocation #{}: {} requested, {} set aside ({} padding and rounding)\noffset {:#x} in the region at {:#x}",
        span.slot,
        Bytes(span.requested_bytes),
        Bytes(span.footprint_bytes),
        Bytes(span.waste_bytes()),
        span.address - region,
        region,
    );
    let free_step = session.slots.get(span.slot as usize).and_then(|slot| slot.free_step);
    match free_step {
        Some(free) => {
            let entries = counted(free.saturating_sub(span.born), "entry", "entries");
            text.push_str(&format!("\nlifetime: entry {} to {free} ({entries})", span.born));
        }
        None => text.push_str(&format!(
            "\nlifetime: from entry {}, never freed ({} so far)",
            span.born,
            counted(shown_steps.saturating_sub(span.born), "entry", "entries")
        )),
    }
    if let Some(category) = session.category(span.slot) {
        text.push_str(&format!("\ncategory: {category}"));
    }
    text.push_str(&session.frames(span.slot).lines("stack", 16));
    text
}

/// Draws every pane of `session` side by side in `ui`, at `style`; `animations` holds each pane's step
/// animation and `too_small` the request to highlight free runs against, per pane.
pub fn show(
    ui: &mut Ui,
    session: &mut Session,
    style: PaneStyle,
    animations: &[Option<StepAnimation>],
    too_small: &[Option<u64>],
) -> PaneActions {
    let mut actions = PaneActions::default();
    let count = session.panes.len().max(1);
    let map_height = (ui.available_height() - HEADER_POINTS - 20.0).max(32.0);
    let scale = shared_scale(session, style.scale, map_height);
    let capacity_bytes = session.config.capacity_bytes;
    if let Some(scale) = scale {
        // The device in rows, and the gauge under each name, where a capacity is known (no gauge is drawn otherwise).
        let capacity = capacity_bytes
            .map(|bytes| {
                let rows = bytes as f64 / scale.row_bytes as f64;
                let rows = if rows < 100.0 { format!("{rows:.1}") } else { format!("{rows:.0}") };
                format!("; the device's {} is {rows} rows; the bar under each name: reserved of the device", Bytes(bytes))
            })
            .unwrap_or_default();
        ui.label(
            RichText::new(format!(
                "one scale in every pane: 1 row (full width) = {}{capacity}; OOMs n/m: requests refused so far, of all refused",
                Bytes(scale.row_bytes)
            ))
            .small(),
        );
    }
    let mut hovered_text = None;
    let colours = crate::plot::pane_colours(session.panes.iter().map(Pane::name));
    ui.columns(count, |columns| {
        for (index, (column, pane)) in columns.iter_mut().zip(session.panes.iter_mut()).enumerate() {
            // A pane keeps to its column: a long name (a contender with its settings) is cut with "…", its full text on
            // hover, instead of running into the next pane's name and widening its own frame over the next map.
            column.horizontal(|ui| {
                let colour = colours[index];
                let name = RichText::new(pane.name()).strong().color(colour);
                if style.interactive
                    && let Some(current) = pane.contender
                {
                    let name_width = (ui.available_width() - CLOSE_BUTTON_POINTS).max(0.0);
                    let menu = ui
                        .scope(|ui| {
                            ui.set_max_width(name_width);
                            egui::containers::menu::MenuButton::from_button(egui::Button::new(name).truncate()).ui(ui, |ui| {
                                for contender in heapscope_lab::contender::Contender::all()
                                    .into_iter()
                                    .filter(|contender| !contender.needs_device())
                                {
                                    if ui.selectable_label(contender == current, contender.name()).clicked()
                                        && contender != current
                                    {
                                        actions.switch = Some((index, contender));
                                    }
                                }
                            })
                        })
                        .inner;
                    if menu.0.on_hover_text(format!("{}: replay with another allocator", pane.name())).clicked() {
                        actions.clicked_pane = Some(index);
                    }
                    if ui.small_button("x").on_hover_text("close this pane").clicked() {
                        actions.close = Some(index);
                    }
                } else {
                    ui.add(egui::Label::new(name).truncate()).on_hover_text(pane.name());
                }
            });
            column.label(RichText::new(header_text(pane)).small());
            if let Some(capacity_bytes) = capacity_bytes {
                let colour = colours[index];
                capacity_gauge(column, pane, capacity_bytes, colour);
            }
            // Under a rule of each pane's own scale over the recording, the pane's (a map's own fit is of the moment).
            let own_scale = match style.scale {
                ScaleRule::FitEachOverTheRecording => coarsest(style.scale.fits(pane, map_height)),
                _ => None,
            };
            let scene = Scene {
                layout: &pane.layout,
                timeline: &pane.timeline,
                position: style.shown_steps,
                colour_by: style.colour_by,
                slots: &session.slots,
                hues: session.hues.of(style.colour_by),
                scale: own_scale.or(scale),
                animation: animations.get(index).and_then(Option::as_ref),
                too_small_below: too_small.get(index).copied().flatten(),
                hovered: style
                    .selected
                    .and_then(|slot| pane.layout.spans().find(|span| span.slot == slot))
                    .map(|span| span.address),
            };
            let response = heap_map::show(column, &scene, &mut pane.view);
            if response.response.hovered() {
                actions.hovered_pane = Some(index);
            }
            if response.response.clicked() {
                actions.clicked_pane = Some(index);
            }
            actions.pane_rects.push(column.min_rect());
            if let Some((region, hit)) = response.hovered {
                hovered_text = Some((index, region, hit, response.response));
            }
        }
    });
    if let Some((_, region, hit, response)) = hovered_text {
        let text = describe_hit(session, region, &hit, style.shown_steps);
        response.on_hover_ui_at_pointer(|ui| {
            ui.label(RichText::new(text).monospace().color(Color32::LIGHT_GRAY));
        });
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_lab::contender::Contender;

    /// The compaction story's last step: the moved allocations slide within the range (none of them fades out or grows
    /// in), and only the 1 GiB request is born; halfway through, each is drawn halfway between its places.
    #[test]
    fn compaction_moves_slide() {
        let session = Session::story_named("compaction", &[Contender::Heap(heapscope_core::PolicyKind::Tlsf)]).unwrap();
        let timeline = &session.panes[0].timeline;
        let last = timeline.steps() - 1;
        let before = timeline.layout_at(last);
        let animation = step_animation(timeline, &before, last, 0.5);
        assert!(!animation.sliding.is_empty(), "{animation:?}");
        assert!(animation.dying.is_empty(), "moves do not fade: {:?}", animation.dying);
        assert_eq!(animation.born.len(), 1, "the 1 GiB request alone grows in");
        for (old, to) in &animation.sliding {
            assert!(*to < old.address, "compaction slides allocations down: {old:?} to {to:#x}");
            assert_eq!(heap_map::sliding_at(old.address, *to, 0.5), old.address - (old.address - to) / 2);
        }
        let table = [(100, 300, 0.0, 100), (100, 300, 1.0, 300), (100, 300, 0.25, 150), (300, 100, 0.5, 200), (7, 7, 0.5, 7)];
        for (from, to, progress, at) in table {
            assert_eq!(heap_map::sliding_at(from, to, progress), at, "{from} to {to} at {progress}");
        }
    }

    /// Four panes named with long settings, in a narrow window: each name is cut inside its own column (the app's menu
    /// buttons and `render`'s labels alike), so no pane's frame reaches over the next one's map.
    #[test]
    fn long_names_stay_inside_their_panes() {
        use heapscope_lab::contender::{PYTORCH, PYTORCH_EXPANDABLE};
        let panes = [PYTORCH, PYTORCH_EXPANDABLE, Contender::Heap(heapscope_core::PolicyKind::Tlsf), Contender::Paged];
        let rules = crate::session::RuleOverrides {
            alloc_conf: Some("max_split_size_mb:128,garbage_collection_threshold:0.6,roundup_power2_divisions:4".into()),
            ..Default::default()
        };
        let mut session = Session::story_named("frag_oom", &panes).unwrap().with_rules(&rules).unwrap();
        assert!(session.panes[0].name().len() > 60, "{}", session.panes[0].name());
        for interactive in [true, false] {
            let rects = std::cell::RefCell::new(Vec::new());
            let style = PaneStyle {
                shown_steps: 10,
                progress: 1.0,
                colour_by: ColourBy::SizeClass,
                interactive,
                selected: None,
                scale: ScaleRule::default(),
            };
            let width = 640.0;
            let mut harness = egui_kittest::Harness::builder().with_size([width, 400.0]).build_ui(|ui| {
                *rects.borrow_mut() = show(ui, &mut session, style, &[], &[]).pane_rects;
            });
            harness.run();
            drop(harness);
            let rects = rects.into_inner();
            assert_eq!(rects.len(), 4, "interactive {interactive}");
            for pair in rects.windows(2) {
                assert!(pair[0].max.x <= pair[1].min.x, "interactive {interactive}: panes overlap: {rects:?}");
            }
            assert!(rects.iter().all(|rect| rect.max.x <= width), "interactive {interactive}: {rects:?}");
        }
    }

    /// The recording's out-of-memory entry (frag_oom's 1 GiB at entry 100), which `paged` serves and gives back at
    /// once: the map shows the entry's end, the header what the entry held at its most, and the plotted lines reach the
    /// peak `replay` counts (2.95 GiB reserved @ 100); the entries around it say nothing of the kind.
    #[test]
    fn what_an_entry_held_inside_it_is_said_and_plotted() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/traces/pytorch/frag_oom-default.pickle.gz");
        let options = crate::session::OpenOptions::default();
        let mut session = Session::open(&path, &[Contender::Paged], &options).unwrap();
        let oom_position = 101;
        session.seek(oom_position);
        let text = header_text(&session.panes[0]);
        assert!(text.contains(" · at its most within this entry: reserved 2.95 GiB, live 2.95 GiB"), "{text}");
        assert!(text.starts_with("reserved 1.95 GiB"), "the map's own figures are the entry's end: {text}");
        for position in [oom_position - 1, oom_position + 1] {
            session.seek(position);
            assert!(!header_text(&session.panes[0]).contains("within this entry"), "position {position}");
        }
        let series = crate::plot::Series::of(&session.panes[0].timeline);
        let peak = series.reserved.iter().map(|point| point[1]).fold(0.0, f64::max);
        assert_eq!(peak as u64, session.panes[0].timeline.transient_at(oom_position).unwrap().reserved_bytes);
    }

    #[test]
    fn hover_details_name_size_offset_and_lifetime() {
        let mut session = Session::story_named("frag_oom", &[Contender::Pytorch { expandable: false }]).unwrap();
        session.seek(45);
        let pane = &session.panes[0];
        let span = *pane.layout.spans().find(|span| span.slot == 21).unwrap();
        let region = pane.layout.region_of(span.address).unwrap().address;
        let text = describe_hit(&session, region, &Hit::Allocation(span), 45);
        assert!(
            text.starts_with("allocation #21: 100.00 MiB requested, 100.00 MiB set aside (0 B padding and rounding)"),
            "{text}"
        );
        assert!(text.contains("offset 0x0 in the region at"), "{text}");
        assert!(text.contains("lifetime: from entry 41, never freed (4 entries so far)"), "{text}");
        let (run, bytes) = pane.layout.free_runs().next().unwrap();
        let region = pane.layout.region_of(run).unwrap().address;
        assert_eq!(
            describe_hit(&session, region, &Hit::Free(run, bytes), 45),
            format!("free run of 50.00 MiB at offset {:#x}", run - region)
        );
        assert!(header_text(pane).starts_with("reserved 2.93 GiB · live 500.00 MiB"), "{}", header_text(pane));
        // An allocation from before the recording that no start event matches has no slot, lifetime or stack to
        // name; one that does is named by its slot, with what its slot knows (when it was freed).
        let before = Span::before_recording(region + 4096, 1024, 1000, Span::BEFORE_RECORDING);
        assert_eq!(
            describe_hit(&session, region, &Hit::Allocation(before), 45),
            format!(
                "allocated before the recording started: 1000 B requested, 1.00 KiB set aside (24 B padding and rounding)\n\
                 offset 0x1000 in the region at {region:#x}"
            )
        );
        let (freed, at) = (0..).zip(&session.slots).find_map(|(index, slot)| Some((index, slot.free_step?))).unwrap();
        let text = describe_hit(&session, region, &Hit::Allocation(Span { slot: freed, ..before }), 45);
        assert!(text.starts_with(&format!("allocation #{freed}, allocated before the recording started: 1000 B")), "{text}");
        assert!(text.contains(&format!("\nfreed at entry {at}")), "{text}");
    }
}
