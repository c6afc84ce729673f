//! The side panels: "Why it failed" (the out-of-memory verdict in plain words, with the free runs that were
//! too small highlighted on the map), "Teach me" (one sentence per allocator decision) and "Advice" (the settings
//! that would have fit, ranked; a row opens as a pane).

use egui::{Color32, RichText, Ui};
use heapscope_core::OomCause;
use heapscope_core::units::{Bytes, BytesAtLeast};
use heapscope_lab::compare::unusable_free_words;
use heapscope_lab::recording::Moment;
use heapscope_lab::timeline::Refusal;

use crate::advice::{AdviceRun, AdviceState};
use crate::session::Session;

/// The verdict of `refusal` in plain words: a headline naming its cause (waste between allocations, waste inside
/// them, or not enough memory) with the bytes of each, and what would have helped.
pub fn verdict_words(refusal: &Refusal, too_small_runs: usize) -> (String, String) {
    let request = Bytes(refusal.requested_bytes);
    let free = refusal.free_memory();
    // What the policy needed: the request once rounded to its unit, where that is more.
    let needed = Bytes(refusal.needed_bytes.max(refusal.requested_bytes));
    let rounded =
        if refusal.needed_bytes > refusal.requested_bytes { format!(" once rounded to {needed}") } else { String::new() };
    match refusal.cause {
        OomCause::Fragmentation => (
            match unusable_free_words(refusal.unusable_free_bytes, refusal.largest_free_bytes) {
                Some(apart) => {
                    format!("Fragmentation (waste between allocations): {free}, enough for {request}{rounded}, but {apart}.")
                }
                None => format!(
                    "Fragmentation (waste between allocations): {free}, enough for {request}{rounded}, but the largest \
                     free run was only {}.",
                    Bytes(refusal.largest_free_bytes)
                ),
            },
            format!(
                "The {too_small_runs} free run(s) in red are each smaller than {needed}. Moving allocations together, \
                 or mapping pages where they are needed (paging, expandable segments), would have served it."
            ),
        ),
        OomCause::InternalWaste => (
            format!(
                "Internal waste (inside allocations): {free}, not enough for {request}{rounded}, while {} of the memory \
                 held is padding inside live allocations (rounding, size classes, page tails).",
                Bytes(refusal.waste_bytes)
            ),
            "Rounding less would have served it: a policy with a finer unit or no power-of-two size classes, smaller \
             pages, or requests sized to the allocator's unit."
                .to_owned(),
        ),
        OomCause::Exhaustion => (
            format!(
                "Not enough memory: {} reserved, {free}; {request} do not fit even without any waste.",
                Bytes(refusal.reserved_bytes)
            ),
            "Less memory live at once, or a larger device, is the only way out; no placement would have served it.".to_owned(),
        ),
    }
}

/// What the "Why it failed" panel asks for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OomActions {
    /// Seek to just after this step (a refusal).
    pub seek_to: Option<u64>,
    /// Focus this pane (and go to its next refusal).
    pub focus: Option<usize>,
}

/// The "Why it failed" panel for pane `focused` at `shown_steps` steps, with buttons to the other panes that
/// refused requests.
pub fn why_it_failed(ui: &mut Ui, session: &Session, focused: usize, shown_steps: u64) -> OomActions {
    let mut actions = OomActions::default();
    ui.heading("Why it failed");
    let Some(pane) = session.panes.get(focused) else { return actions };
    ui.label(RichText::new(format!("about {} (click a pane to pick another)", pane.name())).small());
    let others: Vec<(usize, &str, usize)> = session
        .panes
        .iter()
        .enumerate()
        .filter(|&(index, other)| index != focused && !other.timeline.refusals().is_empty())
        .map(|(index, other)| (index, other.name(), other.timeline.refusals().len()))
        .collect();
    if !others.is_empty() {
        ui.horizontal_wrapped(|ui| {
            ui.label("also refused in:");
            for (index, name, count) in others {
                if ui.button(format!("{name} ({count})")).on_hover_text("show this pane's refusals").clicked() {
                    actions.focus = Some(index);
                }
            }
        });
    }
    let refusals = pane.timeline.refusals();
    if refusals.is_empty() {
        ui.label(format!("{} served every request.", pane.name()));
        return actions;
    }
    ui.label(format!("{} refused {} request(s):", pane.name(), refusals.len()));
    for (step, refusal) in refusals.iter().take(50) {
        let cause = refusal.cause.name();
        let text = format!("{}: {} ({cause})", Moment::Entry(*step), Bytes(refusal.requested_bytes));
        if ui.selectable_label(shown_steps == step + 1, text).clicked() {
            actions.seek_to = Some(step + 1);
        }
    }
    if refusals.len() > 50 {
        ui.label(format!("... and {} more", refusals.len() - 50));
    }
    ui.separator();
    let current = shown_steps.checked_sub(1).and_then(|step| pane.timeline.refusal_at(step));
    let Some(refusal) = current else {
        ui.label("Pick one above (or press O) to see the heap when it failed.");
        return actions;
    };
    let too_small = pane.layout.free_runs().filter(|run| run.1 < refusal.needed_bytes).count();
    let (headline, advice) = verdict_words(refusal, too_small);
    ui.label(RichText::new(headline).strong().color(Color32::from_rgb(240, 120, 110)));
    ui.label(advice);
    let asked_from = session.entry_frames(shown_steps - 1).lines("The request came from", 12);
    if !asked_from.is_empty() {
        ui.label(RichText::new(asked_from.trim_start()).small());
    }
    let survivors: Vec<&str> = session
        .panes
        .iter()
        .filter(|other| other.timeline.refusal_at(shown_steps - 1).is_none() && other.timeline.steps() >= shown_steps)
        .map(crate::session::Pane::name)
        .collect();
    if !survivors.is_empty() {
        ui.label(format!("Served at the same entry by: {}.", survivors.join(", ")));
    }
    ui.collapsing("The numbers", |ui| {
        ui.label(RichText::new(&refusal.message).small());
    });
    actions
}

/// The "What holds it" panel: what is live at the moment shown, grouped by the innermost user frame (or the category,
/// when the app colours by category), largest first (the rows of `heapscope top`); returns whether "Go to the peak"
/// was clicked.
pub fn what_holds_it(ui: &mut Ui, top: &heapscope_lab::top::Top) -> bool {
    ui.heading("What holds it");
    ui.label(format!(
        "{} live at {}, in {} allocation(s), by {}:",
        Bytes(top.live_bytes),
        top.moment,
        top.live_count,
        if top.grouping == heapscope_lab::top::Grouping::Category { "their category" } else { "the code that made them" }
    ));
    let peak = ui.button("Go to the peak").on_hover_text("the first moment the live bytes are highest").clicked();
    if top.rows.is_empty() {
        return peak;
    }
    egui::Grid::new("holders").striped(true).num_columns(4).show(ui, |ui| {
        for heading in ["bytes", "count", "share", "where"] {
            ui.label(RichText::new(heading).small().strong());
        }
        ui.end_row();
        for row in top.rows.iter().take(30) {
            ui.label(RichText::new(Bytes(row.bytes).to_string()).small());
            ui.label(RichText::new(row.count.to_string()).small());
            ui.label(RichText::new(format!("{:.1}%", row.share * 100.0)).small());
            let what = match top.grouping {
                heapscope_lab::top::Grouping::Category => row.category.as_deref().unwrap_or("(no category recorded)"),
                _ => row.frames.first().map_or("(no stack recorded)", String::as_str),
            };
            ui.label(RichText::new(what).small());
            ui.end_row();
        }
    });
    if top.rows.len() > 30 {
        ui.label(
            RichText::new(format!("... {} more groups (heapscope top --limit N lists them all)", top.rows.len() - 30)).small(),
        );
    }
    peak
}

/// What the "Teach me" panel asks for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TeachActions {
    /// Open this built-in story.
    pub story: Option<&'static str>,
    /// One step forward.
    pub step: bool,
    /// One step back.
    pub back: bool,
}

/// The "Teach me" panel: the story, and for each pane the sentence explaining the step just shown.
pub fn teach_me(ui: &mut Ui, session: &Session, sentences: &[String], shown_steps: u64) -> TeachActions {
    let mut actions = TeachActions::default();
    ui.heading("Teach me");
    ui.horizontal_wrapped(|ui| {
        for story in heapscope_lab::story::NAMES {
            if ui.selectable_label(session.name == story, story).clicked() && session.name != story {
                actions.story = Some(story);
            }
        }
    });
    if !session.summary.is_empty() {
        ui.label(RichText::new(&session.summary).italics());
    }
    // The lesson's own words for this step (a `#` line of its CSV).
    if let Some(caption) = session.caption(shown_steps) {
        ui.label(RichText::new(caption).strong().color(Color32::from_rgb(250, 220, 120)));
    }
    ui.horizontal(|ui| {
        actions.back = ui.button("Previous decision").clicked();
        actions.step = ui.button("Next decision").clicked();
        ui.label(format!("{} / {} entries", Moment::at_position(shown_steps), session.steps()));
    });
    ui.separator();
    if shown_steps == 0 {
        ui.label("Nothing has happened yet: press \"Next decision\" (or the right arrow key) to watch the first one.");
        return actions;
    }
    for (pane, sentence) in session.panes.iter().zip(sentences) {
        ui.label(RichText::new(pane.name()).strong());
        ui.label(sentence);
        ui.add_space(4.0);
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_in_plain_words() {
        // frag_oom's refusal: the device's free memory is in the same line.
        let refusal = Refusal {
            requested_bytes: 1 << 30,
            needed_bytes: 1 << 30,
            cause: OomCause::Fragmentation,
            reserved_bytes: 3000 << 20,
            free_bytes: 1000 << 20,
            largest_free_bytes: 50 << 20,
            unusable_free_bytes: 0,
            waste_bytes: 0,
            unreserved_bytes: Some(584 << 20),
            message: String::new(),
        };
        let (headline, advice) = verdict_words(&refusal, 20);
        assert_eq!(
            headline,
            "Fragmentation (waste between allocations): 1000.00 MiB free in reserved memory and 584.00 MiB more on the \
             device, 1.55 GiB in all, enough for 1.00 GiB, but the largest free run was only 50.00 MiB."
        );
        assert!(advice.starts_with("The 20 free run(s) in red"), "{advice}");
        // Buddy's powers of two: 1.45 GiB of padding.
        let waste =
            Refusal { cause: OomCause::InternalWaste, waste_bytes: 1485 << 20, unreserved_bytes: Some(0), ..refusal.clone() };
        let (headline, advice) = verdict_words(&waste, 0);
        assert!(headline.starts_with("Internal waste (inside allocations): 1000.00 MiB free in reserved memory and none left"));
        assert!(headline.contains("while 1.45 GiB of the memory held is padding inside live allocations"), "{headline}");
        assert!(advice.starts_with("Rounding less would have served it"), "{advice}");
        // A 15 MiB request in 16 MiB pages.
        let rounded = Refusal { requested_bytes: 15 << 20, needed_bytes: 16 << 20, ..waste };
        assert!(verdict_words(&rounded, 0).0.contains("not enough for 15.00 MiB once rounded to 16.00 MiB"));
        // Fragmentation of a request rounded up: the runs too small are those under what the policy needed.
        let between = Refusal { cause: OomCause::Fragmentation, largest_free_bytes: 15 << 20, ..rounded };
        let (headline, advice) = verdict_words(&between, 3);
        assert!(headline.contains("enough for 15.00 MiB once rounded to 16.00 MiB, but the largest free run was only 15.00 MiB"));
        assert!(advice.starts_with("The 3 free run(s) in red are each smaller than 16.00 MiB."), "{advice}");
        // PyTorch's free blocks of another size, stream or pool are said apart, with the largest it could use.
        let apart = Refusal { unusable_free_bytes: 10 << 20, largest_free_bytes: 1 << 20, ..between };
        let (headline, _) = verdict_words(&apart, 3);
        assert!(
            headline.contains("but 10.00 MiB of it is cached in blocks this request cannot use")
                && headline.ends_with("the largest free block it could use is 1.00 MiB."),
            "{headline}"
        );
        let (headline, _) = verdict_words(&Refusal { cause: OomCause::Exhaustion, unreserved_bytes: None, ..refusal }, 0);
        assert_eq!(
            headline,
            "Not enough memory: 2.93 GiB reserved, 1000.00 MiB free in reserved memory; 1.00 GiB do not fit even without \
             any waste."
        );
    }
}

/// What the "Advice" panel asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdviceActions {
    /// Open this setting (`PYTORCH_CUDA_ALLOC_CONF` over PyTorch's defaults, or `paged`) as a pane.
    pub add: Option<String>,
}

/// The "Advice" panel: the run's progress, then the answer and the ranked settings, each with a button that opens
/// it as a pane (while there is room: `can_add`).
pub fn advice(ui: &mut Ui, run: &AdviceRun, can_add: bool) -> AdviceActions {
    let mut actions = AdviceActions::default();
    ui.heading("What to set");
    match run.state() {
        AdviceState::Running(done, total) => {
            let fraction = if total == 0 { 0.0 } else { done as f32 / total as f32 };
            ui.add(egui::ProgressBar::new(fraction).text(format!("{done} of {total} settings replayed")));
            ui.label(RichText::new("each setting replays the whole recording").small());
            ui.ctx().request_repaint_after(std::time::Duration::from_millis(100));
        }
        AdviceState::Failed(why) => {
            ui.colored_label(Color32::LIGHT_RED, why);
        }
        AdviceState::Done(advice) => {
            let capacity = advice.capacity_bytes.map_or_else(|| "unknown".to_owned(), |bytes| Bytes(bytes).to_string());
            ui.label(format!("device capacity {capacity}"));
            ui.label(RichText::new(advice.answer()).strong());
            ui.add_space(4.0);
            egui::Grid::new("advice").striped(true).num_columns(5).show(ui, |ui| {
                for heading in ["#", "setting", "peak reserved", "OOMs", "needs"] {
                    ui.label(RichText::new(heading).small());
                }
                ui.end_row();
                for row in &advice.settings {
                    ui.label(if row.rank == 0 { "-".to_owned() } else { row.rank.to_string() });
                    let name = match row.setting.as_str() {
                        "" => "PyTorch's defaults",
                        setting => setting,
                    };
                    let mut label = if row.as_recorded { format!("{name} (as recorded)") } else { name.to_owned() };
                    let mut hover = "open this setting as a pane".to_owned();
                    if row.start_afresh {
                        label.push_str(" (~)");
                        hover.push_str(
                            "\n(~) the other kind of memory than the recording's, which began mid-run: what was live at \
                             its start is allocated afresh, without the fragmentation built before, so its figures can \
                             be too low; ranked after the recording's kind",
                        );
                    }
                    let button = ui.add_enabled(can_add, egui::Button::new(label).small());
                    if button.on_hover_text(hover).clicked() {
                        actions.add = Some(row.setting.clone());
                    }
                    ui.label(Bytes(row.peak_reserved_bytes).to_string());
                    if row.start_exceeds_capacity {
                        ui.label("start").on_hover_text(if row.start_afresh {
                            "what was live at the start, allocated afresh in this kind of memory, takes more than this \
                             device holds"
                        } else {
                            "the recording began with more reserved than this device holds: no device of that size ran it"
                        });
                    } else {
                        ui.label(row.ooms.to_string());
                    }
                    let needs =
                        row.min_capacity_bytes.map_or_else(|| "no device".to_owned(), |bytes| BytesAtLeast(bytes).to_string());
                    let needs = ui.label(if row.monotone { needs } else { format!("{needs} (!)") });
                    if let Some(retries @ 1..) = row.retries_at_need {
                        needs.on_hover_text(format!(
                            "on this capacity PyTorch frees its cache and retries a failed cudaMalloc {retries} time{}, each \
                             waiting for the device",
                            if retries == 1 { "" } else { "s" }
                        ));
                    }
                    ui.end_row();
                }
            });
        }
    }
    actions
}
