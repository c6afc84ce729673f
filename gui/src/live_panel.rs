//! The "Live" bar: pick a workload, a contender, a budget and the steps, start and stop the run on the device, and read how
//! it goes ([`crate::device_live`]). Without a Vulkan device it says so and points at the stories.

use egui::{RichText, Ui};
use heapscope_core::units::{exact_size, parse_size};
use heapscope_lab::contender::Contender;

use crate::device_live::{LiveConfig, LiveRun, LiveWorkload};

/// What the user asked of the bar this frame.
#[derive(Clone, Debug, PartialEq)]
pub enum LiveAction {
    /// Start this run.
    Start(LiveConfig),
    /// Stop the run.
    Stop,
}

/// The bar's state: the form, the run, and why live mode cannot run here (if it cannot).
#[derive(Debug)]
pub struct LivePanel {
    /// Whether the bar shows.
    pub open: bool,
    /// The workload picked.
    pub workload: LiveWorkload,
    /// The contender picked.
    pub policy: Contender,
    /// The budget typed, a size as on the command line (`160M`, `112 MiB`, `4096`; empty: the workload's
    /// default).
    pub budget: String,
    /// The steps typed (empty: the workload's default).
    pub steps: String,
    /// The workload's seed (from the command line, else 1).
    pub seed: u64,
    /// The run started last (running or over).
    pub run: Option<LiveRun>,
    /// Why the last start failed (`no GPU/Vulkan device: …`).
    pub unavailable: Option<String>,
}

impl Default for LivePanel {
    fn default() -> Self {
        Self {
            open: false,
            workload: LiveWorkload::Serve,
            policy: Contender::Heap(heapscope_core::PolicyKind::Tlsf),
            budget: String::new(),
            steps: String::new(),
            seed: 1,
            run: None,
            unavailable: None,
        }
    }
}

impl LivePanel {
    /// Fills the form with `config` (the run started from the command line or by the app), so that the bar
    /// shows what runs and "Start run" starts it again (the budget written exactly).
    pub fn set_config(&mut self, config: &LiveConfig) {
        self.workload = config.workload;
        self.policy = config.policy;
        self.budget = config.budget_bytes.map(exact_size).unwrap_or_default();
        self.steps = config.steps.map(|steps| steps.to_string()).unwrap_or_default();
        self.seed = config.seed;
    }

    /// The run the form describes.
    ///
    /// # Errors
    /// A budget that is not a size above 0, or steps that are not a positive whole number, named.
    pub fn config(&self) -> anyhow::Result<LiveConfig> {
        let mut config = LiveConfig::new(self.workload, self.policy);
        config.seed = self.seed;
        let typed = self.steps.trim();
        if !typed.is_empty() {
            let steps: u32 = typed
                .parse()
                .ok()
                .filter(|&steps| steps > 0)
                .ok_or_else(|| anyhow::anyhow!("steps {typed:?}: expected a whole number above 0"))?;
            config.steps = Some(steps);
        }
        let typed = self.budget.trim();
        if !typed.is_empty() {
            let bytes = parse_size(typed).map_err(|error| anyhow::anyhow!("budget: {error}"))?;
            anyhow::ensure!(bytes > 0, "budget {typed:?}: nothing could be allocated in 0 bytes");
            config.budget_bytes = Some(bytes);
        }
        Ok(config)
    }

    /// Whether a run is going.
    pub fn running(&self) -> bool {
        self.run.as_ref().is_some_and(|run| !run.finished())
    }

    /// Draws the bar; returns what was asked, or an error in the form.
    pub fn show(&mut self, ui: &mut Ui) -> Option<anyhow::Result<LiveAction>> {
        let mut action = None;
        ui.horizontal_wrapped(|ui| {
            ui.label(RichText::new("Live").strong());
            let running = self.running();
            ui.add_enabled_ui(!running, |ui| {
                egui::ComboBox::from_id_salt("live workload").selected_text(format!("workload: {}", self.workload)).show_ui(
                    ui,
                    |ui| {
                        for workload in LiveWorkload::ALL {
                            ui.selectable_value(&mut self.workload, workload, workload.name());
                        }
                    },
                );
                egui::ComboBox::from_id_salt("live contender").selected_text(format!("contender: {}", self.policy)).show_ui(
                    ui,
                    |ui| {
                        for policy in Contender::BENCH {
                            ui.selectable_value(&mut self.policy, policy, policy.name());
                        }
                    },
                );
                ui.label("budget");
                ui.add(
                    egui::TextEdit::singleline(&mut self.budget)
                        .hint_text(exact_size(self.workload.default_budget_bytes()))
                        .desired_width(70.0),
                );
                ui.label("steps");
                ui.add(egui::TextEdit::singleline(&mut self.steps).hint_text("default").desired_width(60.0));
            });
            if running {
                if ui.button("Stop run").clicked() {
                    action = Some(Ok(LiveAction::Stop));
                }
            } else if ui.button("Start run").clicked() {
                action = Some(self.config().map(LiveAction::Start));
            }
            if let Some(run) = &self.run {
                ui.label(run.progress().describe());
                ui.label(RichText::new(run.where_it_runs()).weak());
            }
        });
        if let Some(why) = &self.unavailable {
            ui.label(
                RichText::new(format!(
                    "{why}. Live mode needs one; the built-in stories (menu \"Stories\") show the same allocators without it."
                ))
                .italics(),
            );
        }
        action
    }
}
