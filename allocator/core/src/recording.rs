//! A recording to replay: a [`Trace`] of allocations and frees for the core's contenders and, when it
//! came from PyTorch, the snapshot itself for the caching-allocator emulation.
//!
//! From a PyTorch snapshot, one device's trace becomes a [`Trace`]: `alloc` allocates under its address,
//! `free_completed` frees (the moment PyTorch reuses the memory), and an `oom` entry becomes a request
//! freed at once — the request PyTorch refused, asked of every contender so each says whether it would
//! have served it. Frees of allocations made before the recording started are skipped and counted.
//! Every event remembers the index of the entry it came from, so verdicts point into the file.

use crate::pytorch::{Action, Snapshot};
use crate::trace::{Trace, TraceBuilder};
use crate::{Error, Result};

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

    /// The file's entry index for event `event` of the trace.
    pub fn entry_of(&self, event: u64) -> u64 {
        usize::try_from(event).ok().and_then(|event| self.entry_index.get(event)).copied().unwrap_or(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pytorch::{StackId, TraceEntry};
    use crate::trace::Event;

    fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
        TraceEntry { action, addr, size, stream: 0, time_us: None, device_free: None, frames: StackId::NONE }
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
    fn contradictions_and_missing_devices_are_named() {
        let twice =
            Snapshot { device_traces: vec![vec![entry(Action::Alloc, 8, 1), entry(Action::Alloc, 8, 1)]], ..Snapshot::default() };
        let message = Recording::from_snapshot("t.pickle", twice, 0).unwrap_err().to_string();
        assert!(message.contains("device_traces[0][1]") && message.contains("already live"), "{message}");
        let message = Recording::from_snapshot("t.pickle", Snapshot::default(), 1).unwrap_err().to_string();
        assert!(message.contains("no device 1"), "{message}");
    }
}
