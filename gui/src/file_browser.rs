//! "Open…": a small file browser inside the app, plain egui over `std::fs` (the dialog crates need GTK or a
//! desktop portal, and the one written for egui has no release for egui 0.37).
//!
//! It lists one folder: a parent entry, then the subfolders, then the files, each group sorted by name;
//! files are filtered to what heapscope opens ([`OPENABLE_EXTENSIONS`]) unless "show all files" is on. The
//! path at the top is editable (Enter goes there, or opens it when it names a file). Click selects, double-click
//! or Enter opens a file or enters a folder, ↑ / ↓ move the selection, Backspace goes up, Esc or "Cancel"
//! closes. A folder that cannot be listed says why in words, and the parent entry stays to get out of it.
//!
//! The listing and the navigation are plain methods ([`FileBrowser::navigate`], [`FileBrowser::move_selection`],
//! [`FileBrowser::activate`]) tested without a window; [`FileBrowser::show`] is the modal that calls them.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};

use egui::{Color32, Key, Modifiers, RichText};

/// The endings of the files heapscope opens: PyTorch snapshots (pickle, gzip-compressed or not), heapscope's
/// native trace and its CSV trace. Compared without regard to case.
pub const OPENABLE_EXTENSIONS: [&str; 6] = [".pickle", ".pickle.gz", ".pkl", ".pkl.gz", ".hst", ".csv"];

/// Whether a file called `name` is one heapscope opens, by its ending.
pub fn openable(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    OPENABLE_EXTENSIONS.iter().any(|ending| lower.ends_with(ending) && lower.len() > ending.len())
}

/// What a listed entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EntryKind {
    /// The folder above (`..`).
    Parent,
    /// A subfolder.
    Folder,
    /// A file.
    File,
}

/// One line of the listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The name shown (`..` for the parent).
    pub name: String,
    /// Where it is.
    pub path: PathBuf,
    /// Folder, file or the parent.
    pub kind: EntryKind,
    /// A file's size (`None` for folders, or when the system does not say).
    pub size_bytes: Option<u64>,
}

/// Lists `dir`: its parent (unless `dir` is a root), its subfolders and its files, folders first, each group
/// sorted by name (case-insensitive). Files are those heapscope opens unless `show_all`; names starting with a
/// dot show only with `show_all`. Links are followed.
///
/// When the folder cannot be read, the second value says so in words, naming it; the parent entry still
/// comes back, so the listing keeps a way out.
pub fn list(dir: &Path, show_all: bool) -> (Vec<Entry>, Option<String>) {
    let mut entries: Vec<Entry> = dir
        .parent()
        .map(|parent| Entry { name: "..".to_owned(), path: parent.to_path_buf(), kind: EntryKind::Parent, size_bytes: None })
        .into_iter()
        .collect();
    let reader = match std::fs::read_dir(dir) {
        Ok(reader) => reader,
        Err(error) => return (entries, Some(format!("cannot list {}: {}", dir.display(), describe(&error)))),
    };
    let mut listed = Vec::new();
    for item in reader {
        // An entry that vanished or cannot be inspected mid-listing is left out; the rest still shows.
        let Ok(item) = item else { continue };
        let name = item.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && !show_all {
            continue;
        }
        let path = item.path();
        // `metadata` follows links, so a link to a folder is a folder.
        let metadata = std::fs::metadata(&path).ok();
        let is_folder = metadata.as_ref().is_some_and(std::fs::Metadata::is_dir);
        if !is_folder && !show_all && !openable(&name) {
            continue;
        }
        let (kind, size_bytes) =
            if is_folder { (EntryKind::Folder, None) } else { (EntryKind::File, metadata.map(|meta| meta.len())) };
        listed.push(Entry { name, path, kind, size_bytes });
    }
    listed.sort_by(|a, b| a.kind.cmp(&b.kind).then_with(|| by_name(&a.name, &b.name)));
    entries.extend(listed);
    (entries, None)
}

fn by_name(a: &str, b: &str) -> Ordering {
    a.to_lowercase().cmp(&b.to_lowercase()).then_with(|| a.cmp(b))
}

/// The system's reason in words, without Rust's `(os error N)` tail.
fn describe(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::NotFound => "no such folder".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        std::io::ErrorKind::NotADirectory => "not a folder".to_owned(),
        _ => error.to_string(),
    }
}

/// What the browser asks of the app.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BrowserAction {
    /// Open this file.
    Open(PathBuf),
    /// Close the browser, opening nothing.
    Cancel,
}

/// The browser's state: the folder shown, its listing, the selection and the editable path.
#[derive(Clone, Debug)]
pub struct FileBrowser {
    dir: PathBuf,
    entries: Vec<Entry>,
    error: Option<String>,
    selected: Option<usize>,
    /// Whether files heapscope does not open are listed too.
    pub show_all: bool,
    path_input: String,
    /// Set when the selection moved by keyboard, so the list scrolls to it.
    scroll_to_selected: bool,
}

impl FileBrowser {
    /// A browser on `dir` (made absolute against the working directory).
    pub fn new(dir: &Path) -> Self {
        let mut browser = Self {
            dir: PathBuf::new(),
            entries: Vec::new(),
            error: None,
            selected: None,
            show_all: false,
            path_input: String::new(),
            scroll_to_selected: false,
        };
        browser.navigate(dir);
        browser
    }

    /// A browser on the folder of `current_file` when there is one, else on the working directory.
    pub fn starting_at(current_file: Option<&Path>) -> Self {
        let folder = current_file
            .and_then(|file| if file.is_dir() { Some(file) } else { file.parent() })
            .filter(|folder| !folder.as_os_str().is_empty() && folder.is_dir());
        Self::new(folder.unwrap_or(Path::new(".")))
    }

    /// The folder shown.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its listing (see [`list`]).
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Why the folder could not be listed, if it could not.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// The selected entry.
    pub fn selected(&self) -> Option<&Entry> {
        self.selected.and_then(|index| self.entries.get(index))
    }

    /// Shows `dir` (relative paths against the working directory); the selection is cleared.
    pub fn navigate(&mut self, dir: &Path) {
        let absolute = if dir.is_absolute() {
            dir.to_path_buf()
        } else {
            std::env::current_dir().map_or_else(|_| dir.to_path_buf(), |cwd| cwd.join(dir))
        };
        // `a/b/..` and `./a` read as the folder they name: std's `canonicalize` resolves links too, so only
        // when the folder exists; otherwise the path stays as typed, and its error says so.
        self.dir = std::fs::canonicalize(&absolute).unwrap_or(absolute);
        self.path_input = self.dir.display().to_string();
        self.refresh();
    }

    /// Lists the folder again (after "show all files" changes, or to see new files).
    pub fn refresh(&mut self) {
        let (entries, error) = list(&self.dir, self.show_all);
        self.entries = entries;
        self.error = error;
        self.selected = None;
    }

    /// Moves the selection `delta` lines (clamped to the listing; from nothing, down selects the first line and
    /// up the last).
    pub fn move_selection(&mut self, delta: isize) {
        let Some(last) = self.entries.len().checked_sub(1) else { return };
        self.selected = Some(match self.selected {
            None if delta >= 0 => 0,
            None => last,
            Some(index) => index.saturating_add_signed(delta).min(last),
        });
        self.scroll_to_selected = true;
    }

    /// Selects the entry at `index` (ignored past the listing's end).
    pub fn select(&mut self, index: usize) {
        if index < self.entries.len() {
            self.selected = Some(index);
        }
    }

    /// Opens the entry at `index`: a folder (or the parent) is entered, a file comes back to be opened.
    pub fn activate(&mut self, index: usize) -> Option<PathBuf> {
        let entry = self.entries.get(index)?.clone();
        match entry.kind {
            EntryKind::Parent | EntryKind::Folder => {
                self.navigate(&entry.path);
                None
            }
            EntryKind::File => Some(entry.path),
        }
    }

    /// Goes to the folder above, if there is one.
    pub fn go_up(&mut self) {
        if let Some(parent) = self.dir.parent().map(Path::to_path_buf) {
            self.navigate(&parent);
        }
    }

    /// Follows the path typed at the top: a file comes back to be opened, anything else is navigated to (a
    /// folder that does not exist shows its error).
    pub fn go_to_typed(&mut self) -> Option<PathBuf> {
        let typed = PathBuf::from(self.path_input.trim());
        if typed.as_os_str().is_empty() {
            return None;
        }
        if typed.is_file() {
            return Some(typed);
        }
        self.navigate(&typed);
        None
    }

    /// Sets the path typed at the top (what typing in the box does).
    pub fn set_typed_path(&mut self, path: &str) {
        path.clone_into(&mut self.path_input);
    }

    /// The browser as a modal window over the app; what it asks of the app, if anything.
    pub fn show(&mut self, ctx: &egui::Context) -> Option<BrowserAction> {
        let modal = egui::Modal::new(egui::Id::unique("heapscope-file-browser")).show(ctx, |ui| self.contents(ui));
        // Esc closes; a click beside it does not (the click that opened it would close it at once).
        if modal.inner.is_none() && modal.is_top_modal && ctx.input_mut(|input| input.consume_key(Modifiers::NONE, Key::Escape)) {
            return Some(BrowserAction::Cancel);
        }
        modal.inner
    }

    fn contents(&mut self, ui: &mut egui::Ui) -> Option<BrowserAction> {
        let mut action = None;
        ui.set_width(640.0);
        ui.heading("Open a recording");
        let path_box = ui
            .horizontal(|ui| {
                ui.label("folder");
                let path_box =
                    ui.add(egui::TextEdit::singleline(&mut self.path_input).desired_width(480.0).hint_text("a folder or a file"));
                let entered = path_box.lost_focus() && ui.input(|input| input.key_pressed(Key::Enter));
                if (ui.button("Go").clicked() || entered)
                    && let Some(file) = self.go_to_typed()
                {
                    action = Some(BrowserAction::Open(file));
                }
                path_box
            })
            .inner;
        let typing = path_box.has_focus() || path_box.lost_focus();
        if ui.checkbox(&mut self.show_all, "show all files").changed() {
            self.refresh();
        }
        if let Some(error) = &self.error {
            ui.label(RichText::new(error).color(Color32::from_rgb(240, 100, 90)));
        } else if self.entries.iter().all(|entry| entry.kind == EntryKind::Parent) {
            ui.label(RichText::new("no folders or recordings here").italics());
        }
        ui.separator();
        let mut activated = None;
        egui::ScrollArea::vertical().max_height(320.0).auto_shrink([false, true]).show(ui, |ui| {
            for (index, entry) in self.entries.iter().enumerate() {
                let text = match entry.kind {
                    EntryKind::Parent => ".. (parent folder)".to_owned(),
                    EntryKind::Folder => format!("{}/", entry.name),
                    EntryKind::File => match entry.size_bytes {
                        Some(bytes) => format!("{}   ({})", entry.name, heapscope_core::units::Bytes(bytes)),
                        None => entry.name.clone(),
                    },
                };
                let row = ui.selectable_label(self.selected == Some(index), text);
                if row.double_clicked() {
                    activated = Some(index);
                } else if row.clicked() {
                    self.selected = Some(index);
                }
                if self.scroll_to_selected && self.selected == Some(index) {
                    row.scroll_to_me(None);
                }
            }
        });
        self.scroll_to_selected = false;
        if !typing {
            let pressed = |key| ui.input_mut(|input| input.consume_key(Modifiers::NONE, key));
            if pressed(Key::ArrowDown) {
                self.move_selection(1);
            }
            if pressed(Key::ArrowUp) {
                self.move_selection(-1);
            }
            if pressed(Key::Backspace) {
                self.go_up();
            }
            if pressed(Key::Enter) {
                activated = activated.or(self.selected);
            }
        }
        ui.separator();
        ui.horizontal(|ui| {
            let can_open = self.selected.is_some();
            if ui.add_enabled(can_open, egui::Button::new("Open")).clicked() {
                activated = activated.or(self.selected);
            }
            if ui.button("Cancel").clicked() {
                action = Some(BrowserAction::Cancel);
            }
            ui.label(RichText::new("Up / Down select · Enter or double-click opens · Backspace goes up · Esc closes").weak());
        });
        if let Some(index) = activated
            && let Some(file) = self.activate(index)
        {
            action = Some(BrowserAction::Open(file));
        }
        action
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openable_by_ending() {
        let cases = [
            ("run.pickle", true),
            ("run.pickle.gz", true),
            ("RUN.PKL", true),
            ("snap.pkl.gz", true),
            ("trace.hst", true),
            ("trace.csv", true),
            ("notes.txt", false),
            ("archive.gz", false),
            ("pickle", false),
            (".csv", false),
            ("trace.csv.bak", false),
        ];
        for (name, expected) in cases {
            assert_eq!(openable(name), expected, "{name}");
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("heapscope-browser-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn folders_first_sorted_and_filtered() {
        let dir = scratch("list");
        for folder in ["zeta", "Alpha", ".hidden"] {
            std::fs::create_dir(dir.join(folder)).unwrap();
        }
        for file in ["b.csv", "A.pickle.gz", "readme.txt", "c.hst", ".secret.csv"] {
            std::fs::write(dir.join(file), "a,1,10\n").unwrap();
        }
        let names = |entries: &[Entry]| entries.iter().map(|entry| entry.name.clone()).collect::<Vec<_>>();
        let (entries, error) = list(&dir, false);
        assert_eq!(error, None);
        assert_eq!(names(&entries), ["..", "Alpha", "zeta", "A.pickle.gz", "b.csv", "c.hst"]);
        assert_eq!(entries[0].path, dir.parent().unwrap());
        assert_eq!(entries[1].kind, EntryKind::Folder);
        assert_eq!((entries[4].kind, entries[4].size_bytes), (EntryKind::File, Some(7)));
        let (all, _) = list(&dir, true);
        assert_eq!(names(&all), ["..", ".hidden", "Alpha", "zeta", ".secret.csv", "A.pickle.gz", "b.csv", "c.hst", "readme.txt"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_folder_says_why_and_keeps_a_way_out() {
        let dir = scratch("missing");
        let missing = dir.join("not-here");
        let (entries, error) = list(&missing, false);
        let error = error.unwrap();
        assert!(error.contains("not-here") && error.contains("no such folder"), "{error}");
        assert_eq!(entries.len(), 1);
        assert_eq!((entries[0].kind, entries[0].path.as_path()), (EntryKind::Parent, dir.as_path()));
        let file = dir.join("f.csv");
        std::fs::write(&file, "a,1,10\n").unwrap();
        let error = list(&file, false).1.unwrap();
        assert!(error.contains("f.csv") && error.contains("not a folder"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn navigate_select_and_activate() {
        let dir = scratch("nav");
        std::fs::create_dir(dir.join("inner")).unwrap();
        std::fs::write(dir.join("inner").join("t.csv"), "a,1,10\n").unwrap();
        let mut browser = FileBrowser::starting_at(Some(&dir.join("inner").join("t.csv")));
        assert_eq!(browser.dir(), std::fs::canonicalize(dir.join("inner")).unwrap());
        // Up from nothing selects the last line, down past the end stays there, up past the start stays too.
        browser.move_selection(-1);
        assert_eq!(browser.selected().unwrap().name, "t.csv");
        browser.move_selection(5);
        assert_eq!(browser.selected().unwrap().name, "t.csv");
        browser.move_selection(-5);
        assert_eq!(browser.selected().unwrap().kind, EntryKind::Parent);
        assert_eq!(browser.activate(0), None, "the parent is entered");
        assert_eq!(browser.dir(), std::fs::canonicalize(&dir).unwrap());
        assert_eq!(browser.selected(), None);
        let inner = browser.entries().iter().position(|entry| entry.name == "inner").unwrap();
        assert_eq!(browser.activate(inner), None);
        assert_eq!(browser.activate(1), Some(browser.dir().join("t.csv")), "a file comes back");
        browser.set_typed_path(dir.join("nowhere").to_str().unwrap());
        assert_eq!(browser.go_to_typed(), None);
        assert!(browser.error().unwrap().contains("nowhere"), "{:?}", browser.error());
        browser.set_typed_path(dir.join("inner").join("t.csv").to_str().unwrap());
        assert_eq!(browser.go_to_typed(), Some(dir.join("inner").join("t.csv")), "a typed file opens");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
