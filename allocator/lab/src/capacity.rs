//! [`Capacity`]: the device memory a replay runs on — the one asked for (`--capacity`), else what the recording
//! tells, else unlimited, and always where it came from, so every command says it.
//!
//! A PyTorch recording that ran out of memory tells its device: its `oom` entry carries the driver's free bytes
//! (`device_free`), and the bytes PyTorch held reserved then follow from the final segments and the trace walked
//! back to that entry ([`recorded_capacity`]); one without them (written by hand or converted) leaves the device
//! taken as full there, as large as the most PyTorch had held reserved. Replaying it on unlimited memory would answer another question — which
//! contender "would have served it" on a device larger than the one that failed — so the recorded capacity is the
//! default of `replay`, `compare`, `summary`, `export`, `advise` and the app.

use std::fmt;

use crate::recording::Recording;
use heapscope_core::LARGEST_DEVICE_BYTES;
use heapscope_core::units::Bytes;

/// Where a capacity comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case", tag = "from"))]
pub enum CapacityFrom {
    /// Given (`--capacity`).
    Given,
    /// The recording's `oom` entry: the bytes reserved then, plus the driver's free bytes it recorded.
    Recorded {
        /// The entry.
        entry: u64,
        /// Bytes reserved by PyTorch at that entry.
        reserved_bytes: u64,
        /// The driver's free bytes it recorded (`device_free`).
        device_free_bytes: u64,
    },
    /// The recording's `oom` entry, which records no driver's free bytes (a file written by hand or converted: PyTorch
    /// writes them): the device taken as full then, and as large as the most PyTorch held reserved up to it (which it
    /// did hold: PyTorch had given cached segments back before refusing).
    OomWithoutFree {
        /// The entry.
        entry: u64,
        /// Bytes reserved by PyTorch at that entry.
        reserved_bytes: u64,
        /// The most bytes reserved by PyTorch up to it: the capacity.
        most_reserved_bytes: u64,
    },
    /// Neither: unlimited (`advise` ranks settings by the capacity they need).
    Unknown,
}

/// The device of the recording, as its first `oom` entry tells it: the bytes PyTorch held reserved there (the final
/// segments, less what the trace reserved and plus what it returned, walked up to the entry) plus the driver's free
/// bytes it recorded; or, where it records none, the most PyTorch held reserved up to it (the device taken as full
/// then: [`CapacityFrom::OomWithoutFree`]). At most the largest device heapscope models (1 EiB), as `--capacity` is:
/// a file's figures may add up past it. `None` for a plain trace, or a recording with no `oom` entry.
pub fn recorded_capacity(recording: &Recording) -> Option<(u64, CapacityFrom)> {
    snapshot_capacity(recording.snapshot.as_ref()?, recording.device)
}

/// [`recorded_capacity`] of device `device` of `snapshot` (before its recording is built).
pub(crate) fn snapshot_capacity(snapshot: &heapscope_pytorch::Snapshot, device: usize) -> Option<(u64, CapacityFrom)> {
    let oom = crate::recording::first_oom_device(snapshot, device)?;
    let from = match oom.device_free_bytes {
        Some(device_free_bytes) => {
            CapacityFrom::Recorded { entry: oom.entry, reserved_bytes: oom.reserved_bytes, device_free_bytes }
        }
        None => CapacityFrom::OomWithoutFree {
            entry: oom.entry,
            reserved_bytes: oom.reserved_bytes,
            most_reserved_bytes: oom.most_reserved_bytes,
        },
    };
    Some((oom.capacity_bytes(), from))
}

/// The bytes PyTorch held reserved before `recording`'s first entry (0 for a plain trace). No device smaller than
/// that held the recorded run.
pub fn reserved_at_start(recording: &Recording) -> u64 {
    recording.snapshot.as_ref().map_or(0, |snapshot| crate::recording::reserved_at_start(snapshot, recording.device))
}

/// The device memory of a replay and where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Bytes (`None`: unlimited).
    pub bytes: Option<u64>,
    /// Where they came from.
    pub from: CapacityFrom,
}

impl Capacity {
    /// `given` when there is one, else what `recording` tells, else unlimited.
    pub fn of(given: Option<u64>, recording: &Recording) -> Self {
        match given {
            Some(bytes) => Self { bytes: Some(bytes), from: CapacityFrom::Given },
            None => recorded_capacity(recording)
                .map_or(Self { bytes: None, from: CapacityFrom::Unknown }, |(bytes, from)| Self { bytes: Some(bytes), from }),
        }
    }
}

/// `3.50 GiB (--capacity)`, `3.50 GiB, as the recording tells: ...`, or `unlimited (...)`.
impl fmt::Display for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.bytes, self.from) {
            (Some(bytes), CapacityFrom::Given) => write!(f, "{} (--capacity)", Bytes(bytes)),
            (Some(bytes), CapacityFrom::Recorded { entry, reserved_bytes, device_free_bytes }) => {
                write!(
                    f,
                    "{}, as the recording tells: at its oom (entry {entry}) PyTorch held {} reserved and the driver had {} \
                     free",
                    Bytes(bytes),
                    Bytes(reserved_bytes),
                    Bytes(device_free_bytes)
                )?;
                if bytes < reserved_bytes.saturating_add(device_free_bytes) {
                    write!(f, " (more than the largest device heapscope models, {}: that one)", Bytes(LARGEST_DEVICE_BYTES))?;
                }
                Ok(())
            }
            (Some(bytes), CapacityFrom::OomWithoutFree { entry, reserved_bytes, .. }) => write!(
                f,
                "{}, as the recording suggests: its oom (entry {entry}) records no free bytes of the driver, so the \
                 device is taken as full, the most PyTorch held reserved up to it ({} at the oom)",
                Bytes(bytes),
                Bytes(reserved_bytes)
            ),
            (Some(bytes), CapacityFrom::Unknown) => write!(f, "{}", Bytes(bytes)),
            (None, _) => f.write_str("unlimited (no --capacity, and no oom entry in the recording tells the device)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_core::units::MIB;
    use heapscope_pytorch::{Action, Segment, Snapshot, TraceEntry};

    fn entry(action: Action, addr: u64, size: u64, device_free: Option<u64>) -> TraceEntry {
        TraceEntry::new(action, addr, size).with_device_free(device_free)
    }

    /// The reserved bytes at the `oom` entry come from the final segments and the trace walked back: segments
    /// reserved before it count, those released before it do not, those reserved after it are not yet there.
    #[test]
    fn the_recording_tells_its_device_at_its_oom_entry() {
        let segment = |address: u64, total_size: u64| {
            Segment::from_blocks(0, address, total_size, heapscope_pytorch::Pool::Large, Vec::new())
        };
        let snapshot = Snapshot {
            // At the end: the 20 MiB segment of entry 0 and the 60 MiB one reserved after the oom.
            segments: vec![segment(0x1000_0000, 20 * MIB), segment(0x3000_0000, 60 * MIB)],
            device_traces: vec![vec![
                entry(Action::SegmentAlloc, 0x1000_0000, 20 * MIB, None),
                entry(Action::SegmentAlloc, 0x2000_0000, 40 * MIB, None),
                entry(Action::SegmentFree, 0x2000_0000, 40 * MIB, None),
                entry(Action::Oom, 0, 100 * MIB, Some(30 * MIB)),
                entry(Action::SegmentAlloc, 0x3000_0000, 60 * MIB, None),
            ]],
            ..Snapshot::default()
        };
        let recording = Recording { snapshot: Some(snapshot), ..Recording::from_trace(heapscope_core::Trace::default()) };
        let capacity = Capacity::of(None, &recording);
        assert_eq!(
            capacity,
            Capacity {
                bytes: Some(50 * MIB),
                from: CapacityFrom::Recorded { entry: 3, reserved_bytes: 20 * MIB, device_free_bytes: 30 * MIB }
            }
        );
        assert!(capacity.to_string().starts_with("50.00 MiB, as the recording tells: at its oom (entry 3)"), "{capacity}");
        assert_eq!(Capacity::of(Some(MIB), &recording), Capacity { bytes: Some(MIB), from: CapacityFrom::Given });
        let plain = Recording::from_trace(heapscope_core::Trace::default());
        assert_eq!(Capacity::of(None, &plain), Capacity { bytes: None, from: CapacityFrom::Unknown });
        assert!(Capacity::of(None, &plain).to_string().starts_with("unlimited"));
    }

    /// Free bytes past any device (2^63, a file made by hand) make the device the largest heapscope models, as
    /// `--capacity` allows, and say so: it read 12582912 TiB, and a contender then served a request of 2^63 - 1 bytes.
    #[test]
    fn a_recorded_device_past_the_largest_modelled_is_that_one() {
        let snapshot =
            Snapshot { device_traces: vec![vec![entry(Action::Oom, 0, 1 << 62, Some(1 << 63))]], ..Snapshot::default() };
        let recording = Recording::from_snapshot("huge.pickle", snapshot, 0).unwrap();
        let capacity = Capacity::of(None, &recording);
        assert_eq!(capacity.bytes, Some(LARGEST_DEVICE_BYTES));
        let said = format!("(more than the largest device heapscope models, {}: that one)", Bytes(LARGEST_DEVICE_BYTES));
        assert!(capacity.to_string().ends_with(&said), "{capacity}");
    }

    /// An `oom` entry without the driver's free bytes: the device taken as full there, as large as the most PyTorch
    /// held reserved up to it (160 MiB before the 60 MiB segment went back, 100 MiB at the oom) — not unlimited, and
    /// not the 100 MiB at the oom, which the run had exceeded.
    #[test]
    fn an_oom_without_free_bytes_takes_the_device_as_full() {
        let snapshot = Snapshot {
            segments: vec![Segment::from_blocks(0, 0x1000_0000, 100 * MIB, heapscope_pytorch::Pool::Large, Vec::new())],
            device_traces: vec![vec![
                entry(Action::SegmentAlloc, 0x1000_0000, 100 * MIB, None),
                entry(Action::SegmentAlloc, 0x2000_0000, 60 * MIB, None),
                entry(Action::SegmentFree, 0x2000_0000, 60 * MIB, None),
                entry(Action::Oom, 0, 200 * MIB, None),
            ]],
            ..Snapshot::default()
        };
        let recording = Recording { snapshot: Some(snapshot), ..Recording::from_trace(heapscope_core::Trace::default()) };
        let capacity = Capacity::of(None, &recording);
        let from = CapacityFrom::OomWithoutFree { entry: 3, reserved_bytes: 100 * MIB, most_reserved_bytes: 160 * MIB };
        assert_eq!(capacity, Capacity { bytes: Some(160 * MIB), from });
        assert!(capacity.to_string().contains("its oom (entry 3) records no free bytes of the driver"), "{capacity}");
    }
}
