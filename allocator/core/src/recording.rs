//! A recording to replay: a [`Trace`] of allocations and frees for the core's contenders and, when it
//! came from PyTorch, the snapshot itself for the caching-allocator emulation.
//!
//! From a PyTorch snapshot, one device's trace becomes a [`Trace`]: `alloc` allocates under its address,
//! `free_completed` frees (the moment PyTorch reuses the memory), and an `oom` entry becomes a request
//! freed at once — the request PyTorch refused, asked of every contender so each says whether it would
//! have served it. Frees of allocations made before the recording started are skipped and counted.
//! Every event remembers the index of the entry it came from, so verdicts point into the file.

use std::io::Read;
use std::path::Path;

use crate::pytorch::{Action, Snapshot, SnapshotError, read_snapshot};
use crate::trace::{Trace, TraceBuilder};
use crate::{Error, Result};

/// What a recording file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `torch.cuda.memory._dump_snapshot` output, gzip-compressed or not.
    PytorchSnapshot,
    /// heapscope's native binary trace.
    Native,
    /// heapscope's compact CSV trace.
    Csv,
}

/// The format of a file starting with `head`.
pub fn sniff(head: &[u8]) -> Format {
    match head {
        [0x1f, 0x8b, ..] | [0x80, 2..=5, ..] => Format::PytorchSnapshot,
        _ if Trace::is_native(head) => Format::Native,
        _ => Format::Csv,
    }
}

/// Why a recording file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file cannot be read.
    #[error("cannot read {file}: {error}")]
    Io {
        /// The file.
        file: String,
        /// What the system said.
        error: std::io::Error,
    },
    /// The file is empty.
    #[error("{file}: the file is empty")]
    Empty {
        /// The file.
        file: String,
    },
    /// A device other than 0 asked of a trace, which has one.
    #[error("{file}: --device {device} applies to PyTorch snapshots only; a heapscope trace has one device")]
    NoSuchDevice {
        /// The file.
        file: String,
        /// The device asked for.
        device: usize,
    },
    /// A bad snapshot.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A bad trace, or a snapshot whose entries contradict each other.
    #[error(transparent)]
    Recording(#[from] Error),
}

/// A recording ready for replay.
#[derive(Clone, Debug)]
pub struct Recording {
    /// What to call it.
    pub name: String,
    /// The allocations and frees.
    pub trace: Trace,
    /// For each event of `trace`, the index of the entry it came from in the file's own numbering.
    pub entry_index: Vec<u64>,
    /// The snapshot, when the recording is PyTorch's.
    pub snapshot: Option<Snapshot>,
    /// The device whose trace this is.
    pub device: usize,
    /// Frees of allocations made before the recording started.
    pub frees_before_recording: u64,
}

impl Recording {
    /// A recording of a plain trace (entry indices are event indices).
    pub fn from_trace(trace: Trace) -> Self {
        Self {
            name: trace.name.clone(),
            entry_index: (0..trace.events().len() as u64).collect(),
            trace,
            snapshot: None,
            device: 0,
            frees_before_recording: 0,
        }
    }

    /// Device `device` of a PyTorch snapshot, named `name`.
    ///
    /// # Errors
    /// [`Error::Trace`] when the snapshot has no such device, or an entry contradicts the ones before it
    /// (an address allocated twice without a free, a zero-size allocation).
    pub fn from_snapshot(name: &str, snapshot: Snapshot, device: usize) -> Result<Self> {
        let entries = snapshot.device_traces.get(device).ok_or_else(|| Error::Trace {
            file: name.to_owned(),
            line: 0,
            what: format!("no device {device}: the snapshot records {} device(s)", snapshot.device_traces.len()),
        })?;
        let mut builder = TraceBuilder::new(format!("{name} (device {device})"));
        let mut entry_index = Vec::with_capacity(entries.len());
        let mut frees_before_recording = 0;
        let mut live = crate::hash::FastSet::default();
        // Ids for refused requests, clear of any address.
        let mut probe_id = u64::MAX;
        for (index, entry) in (0..).zip(entries) {
            let fail = |what: String| Error::Trace {
                file: name.to_owned(),
                line: 0,
                what: format!("device_traces[{device}][{index}]: {what}"),
            };
            match entry.action {
                Action::Alloc if entry.size > 0 => {
                    builder.alloc(entry.addr, entry.size).map_err(fail)?;
                    live.insert(entry.addr);
                    entry_index.push(index);
                }
                Action::FreeCompleted if entry.size > 0 => {
                    if live.remove(&entry.addr) {
                        builder.free(entry.addr).map_err(fail)?;
                        entry_index.push(index);
                    } else {
                        frees_before_recording += 1;
                    }
                }
                Action::Oom if entry.size > 0 => {
                    builder.alloc(probe_id, entry.size).map_err(fail)?;
                    builder.free(probe_id).map_err(fail)?;
                    entry_index.extend([index, index]);
                    probe_id -= 1;
                }
                _ => {}
            }
        }
        Ok(Self {
            name: name.to_owned(),
            trace: builder.finish(),
            entry_index,
            snapshot: Some(snapshot),
            device,
            frees_before_recording,
        })
    }

    /// Opens the recording at `path`: a PyTorch snapshot (gzip-compressed or not; device `device` of it), a
    /// native or a CSV trace, told apart by their first bytes.
    ///
    /// # Errors
    /// [`OpenError`] naming the file and what is wrong with it.
    pub fn open(path: &Path, device: usize) -> Result<Self, OpenError> {
        Self::open_device(path, Some(device))
    }

    /// [`Recording::open`] on device `device` of a snapshot, or with `None` on its [`busiest_device`] (device 0
    /// of a trace, which has one).
    ///
    /// # Errors
    /// [`OpenError`] naming the file and what is wrong with it.
    pub fn open_device(path: &Path, device: Option<usize>) -> Result<Self, OpenError> {
        let file = path.display().to_string();
        let io = |error| OpenError::Io { file: file.clone(), error };
        let mut head = [0u8; 8];
        let mut reader = std::fs::File::open(path).map_err(io)?;
        let read = reader.read(&mut head).map_err(io)?;
        if read == 0 {
            return Err(OpenError::Empty { file });
        }
        match sniff(&head[..read]) {
            Format::PytorchSnapshot => {
                let snapshot = read_snapshot(path)?;
                let device = device.unwrap_or_else(|| busiest_device(&snapshot));
                Ok(Self::from_snapshot(&file, snapshot, device)?)
            }
            Format::Native | Format::Csv if device.is_some_and(|device| device != 0) => {
                Err(OpenError::NoSuchDevice { file, device: device.unwrap_or_default() })
            }
            Format::Native | Format::Csv => Ok(Self::from_trace(Trace::read(path)?)),
        }
    }

    /// The file's entry index for event `event` of the trace.
    pub fn entry_of(&self, event: u64) -> u64 {
        usize::try_from(event).ok().and_then(|event| self.entry_index.get(event)).copied().unwrap_or(event)
    }
}

/// The device of `snapshot` with the most trace entries (the lowest of equals; 0 when it records none): where a
/// multi-device snapshot's activity is, when no device is named.
pub fn busiest_device(snapshot: &Snapshot) -> usize {
    let mut busiest = 0;
    for (device, entries) in snapshot.device_traces.iter().enumerate() {
        if entries.len() > snapshot.device_traces[busiest].len() {
            busiest = device;
        }
    }
    busiest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pytorch::TraceEntry;
    use crate::trace::Event;

    fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
        TraceEntry::new(action, addr, size)
    }

    #[test]
    fn sniff_table() {
        let cases: [(&[u8], Format); 6] = [
            (&[0x1f, 0x8b, 8, 0], Format::PytorchSnapshot),
            (&[0x80, 4, 0x95], Format::PytorchSnapshot),
            (&[0x80, 2, b'}'], Format::PytorchSnapshot),
            (b"HSTRACE\0", Format::Native),
            (b"a,1,10\n", Format::Csv),
            (&[], Format::Csv),
        ];
        for (head, format) in cases {
            assert_eq!(sniff(head), format, "{head:?}");
        }
    }

    #[test]
    fn open_names_the_file_and_the_problem() {
        let dir = std::env::temp_dir().join(format!("heapscope-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.csv");
        std::fs::write(&empty, "").unwrap();
        let csv = dir.join("t.csv");
        std::fs::write(&csv, "a,1,100\nf,1\n").unwrap();
        assert!(matches!(Recording::open(&empty, 0), Err(OpenError::Empty { .. })));
        assert!(matches!(Recording::open(&csv, 1), Err(OpenError::NoSuchDevice { device: 1, .. })));
        assert_eq!(Recording::open_device(&csv, None).unwrap().device, 0, "a trace has one device");
        assert!(Recording::open(&dir.join("missing.csv"), 0).unwrap_err().to_string().contains("missing.csv"));
        assert_eq!(Recording::open(&csv, 0).unwrap().trace.events().len(), 2);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn pytorch_entries_become_events() {
        let snapshot = Snapshot {
            device_traces: vec![vec![
                entry(Action::SegmentAlloc, 4096, 2 << 20),
                entry(Action::Alloc, 4096, 100),
                entry(Action::FreeCompleted, 1 << 40, 7), // allocated before the recording
                entry(Action::FreeRequested, 4096, 100),
                entry(Action::FreeCompleted, 4096, 100),
                entry(Action::Alloc, 64, 0), // zero bytes: nothing to allocate, nor to free
                entry(Action::FreeCompleted, 64, 0),
                entry(Action::Oom, 0, 1 << 30),
            ]],
            ..Snapshot::default()
        };
        let recording = Recording::from_snapshot("t.pickle", snapshot, 0).unwrap();
        assert_eq!(
            recording.trace.events(),
            [
                Event::Alloc { slot: 0, size_bytes: 100 },
                Event::Free { slot: 0 },
                Event::Alloc { slot: 1, size_bytes: 1 << 30 },
                Event::Free { slot: 1 },
            ]
        );
        assert_eq!(recording.entry_index, [1, 4, 7, 7]);
        assert_eq!(recording.frees_before_recording, 1);
        assert_eq!(recording.entry_of(2), 7);
    }

    #[test]
    fn the_busiest_device_has_the_most_entries() {
        let entries = |count: u64| (0..count).map(|addr| entry(Action::Alloc, addr * 512, 512)).collect::<Vec<_>>();
        // (entries per device, the busiest)
        let cases: [(&[u64], usize); 5] = [(&[], 0), (&[0], 0), (&[3, 5], 1), (&[0, 4, 4], 1), (&[7, 2, 6], 0)];
        for (counts, busiest) in cases {
            let snapshot =
                Snapshot { device_traces: counts.iter().map(|&count| entries(count)).collect(), ..Snapshot::default() };
            assert_eq!(busiest_device(&snapshot), busiest, "{counts:?}");
        }
    }

    #[test]
    fn contradictions_and_missing_devices_are_named() {
        let twice =
            Snapshot { device_traces: vec![vec![entry(Action::Alloc, 8, 1), entry(Action::Alloc, 8, 1)]], ..Snapshot::default() };
        let message = Recording::from_snapshot("t.pickle", twice, 0).unwrap_err().to_string();
        assert!(message.contains("device_traces[0][1]") && message.contains("already live"), "{message}");
        let message = Recording::from_snapshot("t.pickle", Snapshot::default(), 1).unwrap_err().to_string();
        assert!(message.contains("no device 1"), "{message}");
    }
}
