//! What holds the memory at a moment: the live allocations of a recording grouped by where they were allocated,
//! memory_viz's first question ("what is live at the peak?") answered for any moment, as plain data.
//!
//! The live set is the recording's own (what the program asked for and had not freed), the same for every
//! contender: entry by entry, from the start state ([`Recording::start_events`]) on. A moment is an entry (the
//! state once it is done), the start, the peak (the first moment the live bytes are highest), or the first
//! out-of-memory entry (the state when its request was refused, and that request's own stack, [`Top::refused`]).
//!
//! Each allocation is attributed to its stack frames (a PyTorch snapshot's `frames`; an allocation live at the start
//! takes its block's frames from the final segments, or if freed during the recording its free's frames where the
//! file's frees carry the allocation's stack, [`frees_carry_allocation_stacks`](crate::recording::frees_carry_allocation_stacks)), folded as memory_viz folds them
//! ([`heapscope_pytorch::frames`]), and grouped by its innermost user frame ([`Grouping::UserFrame`], the default),
//! by its whole folded stack ([`Grouping::FullStack`]), or by the category its entry was labelled with
//! ([`Grouping::Category`]: `user_metadata`, `compile_context`, the profiler's `category`, see
//! [`heapscope_pytorch::CategoryKey`]). Rows come out by bytes, then count, largest first; allocations with no frame
//! (or no category) recorded form one row without.

use std::collections::HashMap;

use heapscope_core::trace::Event;
use heapscope_pytorch::frames::{describe, folded, user_frame};
use heapscope_pytorch::{CategoryId, Snapshot, StackId};

use crate::recording::{Moment, Recording};

/// Which moment to look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopAt {
    /// A moment of the recording (`start`, or once entry `N` is done).
    Moment(Moment),
    /// The first moment the live bytes are highest.
    Peak,
    /// Just before the first out-of-memory entry (its request refused).
    Oom,
}

impl std::str::FromStr for TopAt {
    type Err = TopError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "peak" => Ok(Self::Peak),
            "oom" => Ok(Self::Oom),
            moment => moment.parse().map(Self::Moment).map_err(|_| TopError::BadMoment { text: text.to_owned() }),
        }
    }
}

/// How allocations are grouped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Grouping {
    /// By the innermost user frame (`heapscope_pytorch::frames::user_frame`).
    #[default]
    UserFrame,
    /// By the whole folded stack.
    FullStack,
    /// By the category of the allocation's entry.
    Category,
}

impl Grouping {
    /// Its name in JSON and on the command line: `user_frame`, `full_stack`, `category`.
    pub fn name(self) -> &'static str {
        match self {
            Grouping::UserFrame => "user_frame",
            Grouping::FullStack => "full_stack",
            Grouping::Category => "category",
        }
    }
}

/// One group of live allocations.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TopRow {
    /// Where they were allocated, innermost first, as `function (file:line)`: one frame by user frame, the folded
    /// stack in full by full stack; empty where no frame was recorded, and by category.
    pub frames: Vec<String>,
    /// By category, the category as `key: text` (`user_metadata: forward`); `None` otherwise and for the
    /// allocations whose entries name none.
    pub category: Option<String>,
    /// Their bytes (as requested).
    pub bytes: u64,
    /// How many.
    pub count: u64,
    /// Their share of the live bytes (0 to 1).
    pub share: f64,
}

/// The request an out-of-memory entry refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Refused {
    /// Its entry.
    pub entry: u64,
    /// Bytes asked for.
    pub bytes: u64,
    /// Its own stack, folded, innermost first.
    pub frames: Vec<String>,
}

/// What was live at a moment, grouped. See the module docs.
#[derive(Clone, Debug, PartialEq)]
pub struct Top {
    /// The moment.
    pub moment: Moment,
    /// Bytes live then (`u64::MAX` where they add up past it: see `saturated`).
    pub live_bytes: u64,
    /// Whether the live bytes add up past `u64::MAX` (sizes read from a file may): `live_bytes`, and the rows' bytes
    /// that reached `u64::MAX`, are then lower bounds.
    pub saturated: bool,
    /// Allocations live then.
    pub live_count: u64,
    /// How the rows are grouped.
    pub grouping: Grouping,
    /// The groups, largest first.
    pub rows: Vec<TopRow>,
    /// At an out-of-memory moment, the refused request.
    pub refused: Option<Refused>,
}

/// Why a moment cannot be looked at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopError {
    /// A moment that does not parse.
    #[error("{text:?} is no moment: expected `peak`, `oom`, `start` or an entry number (from 0)")]
    BadMoment {
        /// What was given.
        text: String,
    },
    /// `--at oom` on a recording without an out-of-memory entry.
    #[error("{recording} has no out-of-memory entry: nothing was refused{elsewhere}")]
    NoOom {
        /// The recording's name (with its device, for a file of several).
        recording: String,
        /// Where the file's other devices have one (`; device 1 has one: --device 1`), or nothing.
        elsewhere: String,
    },
    /// An entry past the recording's last.
    #[error("{recording} has {}: there is no entry {entry}", entries_words(*entries))]
    NoSuchEntry {
        /// The recording's name (with its device, for a file of several).
        recording: String,
        /// The entry asked for.
        entry: u64,
        /// How many it has.
        entries: u64,
    },
}

/// How many entries a recording has, and which: `12 entries (0 to 11)`, or none but its start.
fn entries_words(entries: u64) -> String {
    match entries {
        0 => "no entries, only its start (`--at start`)".to_owned(),
        1 => "1 entry (0)".to_owned(),
        entries => format!("{entries} entries (0 to {})", entries - 1),
    }
}

/// Where an allocation came from: its stack frames and its category in the recording's snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Origin {
    /// Its frames ([`StackId::NONE`] where none were recorded).
    pub stack: StackId,
    /// Its entry's category ([`CategoryId::NONE`] where it names none).
    pub category: CategoryId,
}

/// The origin of each event of `recording` (meaningful for allocations): a trace entry's `frames` and category, or
/// for an allocation live at the start what [`Recording::start_origins`] says of it (its final block's frames, or its
/// free's where the file's frees carry the stack of what they free; no category: no entry made it).
pub fn allocation_origins(recording: &Recording) -> Vec<Origin> {
    let events = recording.trace.events();
    let Some(snapshot) = &recording.snapshot else { return vec![Origin::default(); events.len()] };
    let entries = snapshot.device_traces.get(recording.device).map_or(&[][..], Vec::as_slice);
    let start = recording.start_origins();
    (0..events.len())
        .map(|index| {
            if index < recording.start_events {
                let stack = start.get(index).and_then(Option::as_ref).map_or(StackId::NONE, |entry| entry.frames);
                return Origin { stack, category: CategoryId::NONE };
            }
            let entry = recording.entry_index.get(index).and_then(|&entry| entries.get(usize::try_from(entry).ok()?));
            entry.map_or_else(Origin::default, |entry| Origin { stack: entry.frames, category: entry.category })
        })
        .collect()
}

/// The frames of `stack` in `snapshot` as a row's key, by `grouping` (none by category).
fn key(snapshot: Option<&Snapshot>, stack: StackId, grouping: Grouping) -> Vec<String> {
    let Some(frames) = snapshot.and_then(|snapshot| snapshot.frame_stacks.get(stack.0 as usize)) else { return Vec::new() };
    match grouping {
        Grouping::UserFrame => user_frame(frames).map(describe).into_iter().collect(),
        Grouping::FullStack => folded(frames).map(describe).collect(),
        Grouping::Category => Vec::new(),
    }
}

/// The other devices of `recording`'s file that have an `oom` entry, said as where to look (`; device 1 has one:
/// --device 1`); empty when none does.
fn ooms_elsewhere(recording: &Recording) -> String {
    let devices = recording.other_devices_with_oom();
    match devices.as_slice() {
        [] => String::new(),
        [device] => format!("; device {device} has one: --device {device}"),
        [first, ..] => format!("; devices {devices:?} have one: --device {first}"),
    }
}

/// What was live in `recording` at `at`, grouped by `grouping`. See the module docs.
///
/// # Errors
/// [`TopError::NoOom`] for [`TopAt::Oom`] on a recording that refused nothing, [`TopError::NoSuchEntry`] for an
/// entry past its last.
pub fn top(recording: &Recording, at: TopAt, grouping: Grouping) -> Result<Top, TopError> {
    let events = recording.trace.events();
    // Live bytes once each moment is done, to find the peak: moments in order, each one's events in a run.
    let target = match at {
        TopAt::Moment(Moment::Entry(entry)) if entry >= recording.entries => {
            return Err(TopError::NoSuchEntry { recording: recording.shown_name(), entry, entries: recording.entries });
        }
        TopAt::Moment(moment) => moment,
        TopAt::Oom => match recording.first_oom() {
            Some((0, _)) => Moment::Start,
            Some((entry, _)) => Moment::Entry(entry - 1),
            None => return Err(TopError::NoOom { recording: recording.shown_name(), elsewhere: ooms_elsewhere(recording) }),
        },
        TopAt::Peak => peak(recording).0,
    };
    let origins = allocation_origins(recording);
    let mut live: HashMap<u32, (u64, Origin)> = HashMap::new();
    for (index, event) in (0..).zip(events) {
        if recording.moment_of(index) > target {
            break;
        }
        match *event {
            Event::Alloc { slot, size_bytes } => {
                live.insert(slot, (size_bytes, origins[index as usize]));
            }
            Event::Free { slot } => {
                live.remove(&slot);
            }
            Event::EmptyCache => {}
        }
    }
    let snapshot = recording.snapshot.as_ref();
    // Summed wide: sizes read from a file may add up past a u64 (shown saturated).
    let live_total: u128 = live.values().map(|&(bytes, _)| u128::from(bytes)).sum();
    let live_bytes = u64::try_from(live_total).unwrap_or(u64::MAX);
    // Rows keyed by the grouping's frames or category, each origin's key computed once.
    let mut keys: HashMap<Origin, usize> = HashMap::new();
    let mut rows: Vec<TopRow> = Vec::new();
    let mut by_key: HashMap<(Vec<String>, Option<String>), usize> = HashMap::new();
    // Each row's bytes summed wide too: its share is of the true total where its shown bytes saturate.
    let mut wide: Vec<u128> = Vec::new();
    for &(bytes, origin) in live.values() {
        let origin = match grouping {
            Grouping::Category => Origin { stack: StackId::NONE, ..origin },
            Grouping::UserFrame | Grouping::FullStack => Origin { category: CategoryId::NONE, ..origin },
        };
        let row = *keys.entry(origin).or_insert_with(|| {
            let frames = key(snapshot, origin.stack, grouping);
            let category = snapshot.and_then(|snapshot| snapshot.category(origin.category)).map(ToString::to_string);
            *by_key.entry((frames.clone(), category.clone())).or_insert_with(|| {
                rows.push(TopRow { frames, category, bytes: 0, count: 0, share: 0.0 });
                wide.push(0);
                rows.len() - 1
            })
        });
        rows[row].bytes = rows[row].bytes.saturating_add(bytes);
        rows[row].count += 1;
        wide[row] += u128::from(bytes);
    }
    for (row, &bytes) in rows.iter_mut().zip(&wide) {
        row.share = if live_total == 0 { 0.0 } else { bytes as f64 / live_total as f64 };
    }
    rows.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.count.cmp(&a.count))
            .then_with(|| a.frames.cmp(&b.frames))
            .then_with(|| a.category.cmp(&b.category))
    });
    let refused = match at {
        TopAt::Oom => recording.first_oom().map(|(entry, oom)| Refused {
            entry,
            bytes: oom.size,
            frames: key(snapshot, oom.frames, Grouping::FullStack),
        }),
        _ => None,
    };
    let saturated = live_total > u128::from(u64::MAX);
    Ok(Top { moment: target, live_bytes, saturated, live_count: live.len() as u64, grouping, rows, refused })
}

/// The moment `at` names for drawing the heap (`render --at`, `gui --at`): an entry or the start as given, the peak's
/// moment ([`peak`]), or for `oom` the first out-of-memory entry itself, whose refused request the map shows (where
/// `top` lists what was live when it came, the moment before).
///
/// # Errors
/// [`TopError::NoOom`] for `oom` on a recording without an out-of-memory entry.
pub fn moment_to_draw(recording: &Recording, at: TopAt) -> Result<Moment, TopError> {
    match at {
        TopAt::Moment(moment) => Ok(moment),
        TopAt::Peak => Ok(peak(recording).0),
        TopAt::Oom => match recording.first_oom() {
            Some((entry, _)) => Ok(Moment::Entry(entry)),
            None => Err(TopError::NoOom { recording: recording.shown_name(), elsewhere: ooms_elsewhere(recording) }),
        },
    }
}

/// The first moment the recording's live bytes are highest (the start when nothing is ever allocated after it), and
/// those bytes (saturated at `u64::MAX`: sizes read from a file may add up past it). Live bytes are counted once
/// each moment is done: an out-of-memory entry allocates and frees its request in one moment, so it changes nothing.
pub fn peak(recording: &Recording) -> (Moment, u64) {
    let mut sizes: Vec<u64> = vec![0; recording.trace.slots() as usize];
    let (mut live, mut peak) = (0u128, (Moment::Start, 0u128));
    let events = recording.trace.events();
    for (index, event) in (0..).zip(events) {
        match *event {
            Event::Alloc { slot, size_bytes } => {
                sizes[slot as usize] = size_bytes;
                live += u128::from(size_bytes);
            }
            Event::Free { slot } => live -= u128::from(std::mem::take(&mut sizes[slot as usize])),
            Event::EmptyCache => {}
        }
        let moment = recording.moment_of(index);
        let done = events.get(index as usize + 1).is_none() || recording.moment_of(index + 1) != moment;
        if done && live > peak.1 {
            peak = (moment, live);
        }
    }
    (peak.0, u64::try_from(peak.1).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::frees_carry_allocation_stacks;
    use heapscope_pytorch::{Action, Block, BlockState, Frame, Pool, Segment, TraceEntry};

    fn frame(name: &str, filename: &str, line: i64) -> Frame {
        Frame { filename: filename.into(), line, name: name.into() }
    }

    fn entry(action: Action, addr: u64, size: u64, stack: u32) -> TraceEntry {
        TraceEntry::new(action, addr, size).with_frames(StackId(stack))
    }

    /// Four allocations from three places, one freed, then a refused request:
    /// entry 0: A, 100 B, `forward (model.py:10)` under the unwinder's frames;
    /// entry 1: B, 200 B, PyTorch's `linear.py` then `forward (model.py:20)`;
    /// entry 2: C, 300 B, `forward (model.py:10)` again;
    /// entries 3-4: A freed; entry 5: D, 50 B, `step (train.py:5)`; entry 6: 1000 B refused, from `train.py:5`.
    fn recording() -> Recording {
        let frame_stacks = vec![
            Vec::new(),
            vec![
                frame("torch::unwind::unwind()", "??", 0),
                frame("_PyEval_EvalFrameDefault", "Python/ceval.c", 1),
                frame("forward", "model.py", 10),
            ],
            vec![frame("forward", "/site-packages/torch/nn/modules/linear.py", 125), frame("forward", "model.py", 20)],
            vec![frame("step", "train.py", 5)],
        ];
        let trace = vec![
            entry(Action::Alloc, 0x1000, 100, 1),
            entry(Action::Alloc, 0x2000, 200, 2),
            entry(Action::Alloc, 0x3000, 300, 1),
            entry(Action::FreeRequested, 0x1000, 100, 1),
            entry(Action::FreeCompleted, 0x1000, 100, 1),
            entry(Action::Alloc, 0x4000, 50, 3),
            entry(Action::Oom, 0, 1000, 3),
        ];
        let snapshot = Snapshot { device_traces: vec![trace], frame_stacks, ..Snapshot::default() };
        Recording::from_snapshot("hand.pickle", snapshot, 0).unwrap()
    }

    fn rows(top: &Top) -> Vec<(Vec<&str>, u64, u64)> {
        top.rows.iter().map(|row| (row.frames.iter().map(String::as_str).collect(), row.bytes, row.count)).collect()
    }

    #[test]
    fn the_peak_grouped_by_user_frame_is_the_hand_computed_answer() {
        let recording = recording();
        assert_eq!(peak(&recording), (Moment::Entry(2), 600), "100 + 200 + 300 once entry 2 is done");
        let peak = top(&recording, TopAt::Peak, Grouping::UserFrame).unwrap();
        assert_eq!((peak.moment, peak.live_bytes, peak.live_count), (Moment::Entry(2), 600, 3));
        assert_eq!(rows(&peak), [(vec!["forward (model.py:10)"], 400, 2), (vec!["forward (model.py:20)"], 200, 1)]);
        let shares: Vec<f64> = peak.rows.iter().map(|row| row.share).collect();
        assert_eq!(shares, [400.0 / 600.0, 200.0 / 600.0]);
        assert_eq!(peak.refused, None);
    }

    /// Sizes read from a file may add up past a u64: the peak and the totals saturate (they overflowed, a panic).
    #[test]
    fn live_bytes_past_a_u64_saturate() {
        // Sixteen requests of 2^60 bytes (the most PyTorch asks of the driver; the file may overlap them) reach 2^64.
        let huge = 1u64 << 60;
        let mut trace: Vec<TraceEntry> = (0..16).map(|k| entry(Action::Alloc, k * 512, huge, 0)).collect();
        trace.push(entry(Action::FreeCompleted, 0, huge, 0));
        let snapshot = Snapshot { device_traces: vec![trace], ..Snapshot::default() };
        let recording = Recording::from_snapshot("huge.pickle", snapshot, 0).unwrap();
        assert_eq!(peak(&recording), (Moment::Entry(15), u64::MAX));
        let at_peak = top(&recording, TopAt::Peak, Grouping::UserFrame).unwrap();
        assert_eq!((at_peak.live_bytes, at_peak.live_count), (u64::MAX, 16));
        assert_eq!(rows(&at_peak), [(Vec::new(), u64::MAX, 16)]);
        assert_eq!(at_peak.rows[0].share, 1.0);
        // Seventeen such blocks, none labelled: one row by category, all of the live bytes (its saturated bytes over
        // the true total made it 16/17).
        let trace = (0..17).map(|k| entry(Action::Alloc, k * 512, huge, 0)).collect();
        let snapshot = Snapshot { device_traces: vec![trace], ..Snapshot::default() };
        let recording = Recording::from_snapshot("huge.pickle", snapshot, 0).unwrap();
        let by_category = top(&recording, TopAt::Peak, Grouping::Category).unwrap();
        assert_eq!(by_category.rows.len(), 1);
        assert_eq!((by_category.rows[0].bytes, by_category.rows[0].share), (u64::MAX, 1.0));
    }

    /// By category: entries 0 and 2 labelled `user_metadata: forward`, entry 1 `compile_context: region`, entry 5
    /// none; at the peak 400 B forward, 200 B in the region; at the OOM the unlabelled 50 B form a row of their own.
    #[test]
    fn grouped_by_category() {
        use heapscope_pytorch::{Category, CategoryKey};
        let mut recording = recording();
        let snapshot = recording.snapshot.as_mut().unwrap();
        snapshot.categories = vec![
            Category::none(),
            Category { key: CategoryKey::UserMetadata, name: "forward".into() },
            Category { key: CategoryKey::CompileContext, name: "region".into() },
        ];
        for (entry, category) in [(0, 1), (1, 2), (2, 1), (3, 1), (4, 1)] {
            snapshot.device_traces[0][entry].category = CategoryId(category);
        }
        let rows = |at| -> Vec<(Option<String>, u64, u64)> {
            let found = top(&recording, at, Grouping::Category).unwrap();
            assert!(found.rows.iter().all(|row| row.frames.is_empty()));
            found.rows.into_iter().map(|row| (row.category, row.bytes, row.count)).collect()
        };
        let named = |text: &str| Some(text.to_owned());
        assert_eq!(rows(TopAt::Peak), [(named("user_metadata: forward"), 400, 2), (named("compile_context: region"), 200, 1)]);
        assert_eq!(
            rows(TopAt::Oom),
            [(named("user_metadata: forward"), 300, 1), (named("compile_context: region"), 200, 1), (None, 50, 1)]
        );
        // Frames groupings ignore categories.
        let by_frame = top(&recording, TopAt::Peak, Grouping::UserFrame).unwrap();
        assert!(by_frame.rows.iter().all(|row| row.category.is_none()) && by_frame.rows.len() == 2);
    }

    #[test]
    fn the_moment_of_an_oom_says_what_was_live_and_what_was_refused() {
        let recording = recording();
        let oom = top(&recording, TopAt::Oom, Grouping::UserFrame).unwrap();
        assert_eq!((oom.moment, oom.live_bytes), (Moment::Entry(5), 550));
        assert_eq!(
            rows(&oom),
            [
                (vec!["forward (model.py:10)"], 300, 1),
                (vec!["forward (model.py:20)"], 200, 1),
                (vec!["step (train.py:5)"], 50, 1)
            ]
        );
        assert_eq!(oom.refused, Some(Refused { entry: 6, bytes: 1000, frames: vec!["step (train.py:5)".to_owned()] }));
        // The same moment asked by its entry number, whole stacks folded (the unwinder and the eval loop gone).
        let full = top(&recording, TopAt::Moment(Moment::Entry(5)), Grouping::FullStack).unwrap();
        assert_eq!(full.rows[1].frames, ["forward (/site-packages/torch/nn/modules/linear.py:125)", "forward (model.py:20)"]);
        assert_eq!(full.rows[0].frames, ["forward (model.py:10)"]);
        let start = top(&recording, TopAt::Moment(Moment::Start), Grouping::UserFrame).unwrap();
        assert_eq!((start.live_bytes, start.rows.len()), (0, 0));
    }

    /// A recording begun mid-run: 0x9000 (64 B) was live at the start and is freed at entry 0, so no final block
    /// holds its frames. Where the file's frees carry the stack of what they free (three pairs alloc / free, of three
    /// stacks, have the same frames at both ends) the free's frames are its origin; where they carry their own, or one
    /// pair alone agrees (a temporary freed on the line that made it), it has none.
    #[test]
    fn an_allocation_live_at_the_start_and_freed_takes_its_frees_frames_when_frees_carry_allocation_stacks() {
        let frame_stacks = vec![
            Vec::new(),
            vec![frame("forward", "model.py", 10)],
            vec![frame("step", "train.py", 5)],
            vec![frame("backward", "model.py", 20)],
            vec![frame("loss", "train.py", 9)],
        ];
        // Pairs allocated and freed in the trace: the first freed with `first_free`'s frames.
        let pairs = |first_free: u32| -> Vec<TraceEntry> {
            [(0x1000, 1, first_free), (0x2000, 3, 3), (0x3000, 4, 4)]
                .into_iter()
                .flat_map(|(addr, made, freed)| {
                    [
                        entry(Action::Alloc, addr, 100, made),
                        entry(Action::FreeRequested, addr, 100, freed),
                        entry(Action::FreeCompleted, addr, 100, freed),
                    ]
                })
                .collect()
        };
        let start_at = |trace_pairs: Vec<TraceEntry>| {
            let mut trace = vec![entry(Action::FreeRequested, 0x9000, 64, 2), entry(Action::FreeCompleted, 0x9000, 64, 2)];
            trace.extend(trace_pairs);
            let snapshot = Snapshot { device_traces: vec![trace], frame_stacks: frame_stacks.clone(), ..Snapshot::default() };
            let recording = Recording::from_snapshot("cut.pickle", snapshot, 0).unwrap();
            assert_eq!(recording.start_addresses, [0x9000]);
            rows(&top(&recording, TopAt::Moment(Moment::Start), Grouping::UserFrame).unwrap())
                .into_iter()
                .map(|(frames, bytes, _)| (frames.into_iter().map(str::to_owned).collect::<Vec<_>>(), bytes))
                .collect::<Vec<_>>()
        };
        assert_eq!(start_at(pairs(1)), [(vec!["step (train.py:5)".to_owned()], 64)]);
        // The free of 0x1000 from elsewhere (`train.py:5`, not its `model.py:10`): frees carry their own stacks.
        assert_eq!(start_at(pairs(2)), [(Vec::<String>::new(), 64)]);
        // One pair alone agreeing tells nothing.
        assert_eq!(start_at(pairs(1)[..3].to_vec()), [(Vec::<String>::new(), 64)]);
        // Freed by its caller before the start (pending), completed at entry 0: the completion's frames.
        let mut trace = vec![entry(Action::FreeCompleted, 0x9000, 64, 2)];
        trace.extend(pairs(1));
        let snapshot = Snapshot { device_traces: vec![trace], frame_stacks: frame_stacks.clone(), ..Snapshot::default() };
        let recording = Recording::from_snapshot("pending.pickle", snapshot, 0).unwrap();
        let start = top(&recording, TopAt::Moment(Moment::Start), Grouping::UserFrame).unwrap();
        assert_eq!(rows(&start), [(vec!["step (train.py:5)"], 64, 1)]);
        // Its address taken again by an allocation live at the end: the final block there is that one's (model.py:10),
        // not the start allocation's, which no free's stack tells here.
        let trace = vec![
            entry(Action::FreeRequested, 0x9000, 64, 2),
            entry(Action::FreeCompleted, 0x9000, 64, 2),
            entry(Action::Alloc, 0x9000, 64, 1),
        ];
        let blocks = vec![
            Block::new(0x8000, 0x1000, 0, BlockState::Inactive),
            Block { frames: StackId(1), ..Block::new(0x9000, 0x1000, 64, BlockState::ActiveAllocated) },
        ];
        let segments = vec![Segment::from_blocks(0, 0x8000, 0x2000, Pool::Small, blocks)];
        let snapshot =
            Snapshot { device_traces: vec![trace], segments, frame_stacks: frame_stacks.clone(), ..Snapshot::default() };
        let recording = Recording::from_snapshot("reused.pickle", snapshot, 0).unwrap();
        let start = top(&recording, TopAt::Moment(Moment::Start), Grouping::UserFrame).unwrap();
        assert_eq!(rows(&start), [(Vec::<&str>::new(), 64, 1)]);
        for (trace, carried) in [
            (pairs(1), true),
            (pairs(2), false),
            (pairs(1)[..3].to_vec(), false),
            // No pair with frames: nothing tells.
            (vec![entry(Action::Alloc, 0x1000, 100, 0), entry(Action::FreeRequested, 0x1000, 100, 0)], false),
            (vec![entry(Action::FreeRequested, 0x1000, 100, 1)], false),
        ] {
            assert_eq!(frees_carry_allocation_stacks(&trace), carried, "{trace:?}");
        }
    }

    #[test]
    fn moments_that_do_not_exist_are_errors_naming_the_recording() {
        let recording = recording();
        let error = top(&recording, TopAt::Moment(Moment::Entry(7)), Grouping::UserFrame).unwrap_err();
        assert_eq!(error.to_string(), "hand.pickle has 7 entries (0 to 6): there is no entry 7");
        // A recording of no entry has only its start (it said "0 entries (0 to 0)", as if entry 0 were there).
        let empty =
            Recording::from_snapshot("empty.pickle", Snapshot { device_traces: vec![Vec::new()], ..Snapshot::default() }, 0);
        let error = top(&empty.unwrap(), TopAt::Moment(Moment::Entry(0)), Grouping::UserFrame).unwrap_err();
        assert_eq!(error.to_string(), "empty.pickle has no entries, only its start (`--at start`): there is no entry 0");
        let plain = Recording::from_trace(heapscope_core::Trace::parse_csv("plain.csv", "a,0,10\n").unwrap());
        let error = top(&plain, TopAt::Oom, Grouping::UserFrame).unwrap_err();
        assert_eq!(error.to_string(), "plain.csv has no out-of-memory entry: nothing was refused");
        // A file of several devices names the device, and the one that ran out of memory.
        let traces = vec![vec![TraceEntry::new(Action::Alloc, 1 << 20, 512)], vec![TraceEntry::new(Action::Oom, 0, 1 << 30)]];
        let two = Recording::from_snapshot("two.pickle", Snapshot { device_traces: traces, ..Snapshot::default() }, 0).unwrap();
        let error = top(&two, TopAt::Oom, Grouping::UserFrame).unwrap_err();
        assert_eq!(
            error.to_string(),
            "two.pickle (device 0) has no out-of-memory entry: nothing was refused; device 1 has one: --device 1"
        );
        let error = top(&two, TopAt::Moment(Moment::Entry(5)), Grouping::UserFrame).unwrap_err();
        assert_eq!(error.to_string(), "two.pickle (device 0) has 1 entry (0): there is no entry 5");
        // A trace has no frames: one row without them.
        let at = top(&plain, TopAt::Peak, Grouping::UserFrame).unwrap();
        assert_eq!(rows(&at), [(vec![], 10, 1)]);
        for (text, expected) in [
            ("peak", TopAt::Peak),
            ("oom", TopAt::Oom),
            ("start", TopAt::Moment(Moment::Start)),
            ("12", TopAt::Moment(Moment::Entry(12))),
        ] {
            assert_eq!(text.parse::<TopAt>(), Ok(expected));
        }
        let error = "later".parse::<TopAt>().unwrap_err().to_string();
        assert_eq!(error, "\"later\" is no moment: expected `peak`, `oom`, `start` or an entry number (from 0)");
    }
}
