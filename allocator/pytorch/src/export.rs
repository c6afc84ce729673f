//! Writing snapshot files: a [`Snapshot`] as the pickle `torch.cuda.memory._dump_snapshot` writes
//! (PyTorch ≥ 2.1 schema, protocol 4, uncompressed), readable by Python's `pickle.load`, PyTorch's
//! MemoryViz and [`read_snapshot`](super::read_snapshot).
//!
//! Every key string and every interned frame list is written once and shared through the pickle memo, as
//! PyTorch's own files share them; a trace entry without frames refers to the shared empty list.
//! `time_us` and `device_free` are written when present, `addr` is left out of `oom` entries (PyTorch
//! writes none), and `allocator_settings` only when the snapshot has settings. An entry's category is written under
//! the key it was read from (`category`, `user_metadata` or `compile_context`, its text shared through the memo);
//! an entry's memory pool is written as PyTorch 2.12 writes it (`pool_id`, a pair) when the snapshot names a private
//! pool; keys the model does not hold (an entry's other labels, pinned-memory settings) are not written, and
//! `heapscope_contender_export` only in an export of another contender ([`ContenderExport`]).

use std::collections::HashMap;
use std::io::{self, BufWriter, Write};

use super::pickle_write::{BATCH, PickleWriter};
use super::snapshot::{
    Action, Block, BlockState, ContenderExport, Pool, RecordedSettings, Segment, Snapshot, StackId, TraceEntry,
};

/// Writes `snapshot` to `writer` as a protocol 4 pickle (not compressed; wrap `writer` in a gzip encoder
/// for a `.pickle.gz`).
///
/// # Errors
/// The writer's I/O errors; [`io::ErrorKind::InvalidData`] when a [`StackId`] is not in
/// [`Snapshot::frame_stacks`].
pub fn write_snapshot(snapshot: &Snapshot, writer: impl Write) -> io::Result<()> {
    let mut exporter = Exporter {
        out: PickleWriter::new(BufWriter::with_capacity(256 * 1024, writer))?,
        snapshot,
        strings: HashMap::new(),
        stacks: vec![None; snapshot.frame_stacks.len().max(1)],
    };
    exporter.snapshot()?;
    exporter.out.finish()?.flush()
}

/// Writes `snapshot`'s segments alone as the list `torch.cuda.memory_snapshot()` returns (protocol 4, not
/// compressed): a state with no trace, which [`read_snapshot`](super::read_snapshot) reads back with an empty
/// trace per device up to the highest its segments name.
///
/// # Errors
/// As [`write_snapshot`].
pub fn write_segments(snapshot: &Snapshot, writer: impl Write) -> io::Result<()> {
    let mut exporter = Exporter {
        out: PickleWriter::new(BufWriter::with_capacity(256 * 1024, writer))?,
        snapshot,
        strings: HashMap::new(),
        stacks: vec![None; snapshot.frame_stacks.len().max(1)],
    };
    exporter.out.empty_list()?;
    exporter.list_items(&snapshot.segments, Exporter::segment)?;
    exporter.out.finish()?.flush()
}

struct Exporter<'a, W: Write> {
    out: PickleWriter<W>,
    snapshot: &'a Snapshot,
    /// Memo slots of strings written so far.
    strings: HashMap<&'a str, u32>,
    /// Memo slots of frame lists written so far, by `StackId`.
    stacks: Vec<Option<u32>>,
}

impl<'a, W: Write> Exporter<'a, W> {
    /// A string shared through the memo.
    fn shared_str(&mut self, text: &'a str) -> io::Result<()> {
        if let Some(&slot) = self.strings.get(text) {
            return self.out.get(slot);
        }
        self.out.str(text)?;
        let slot = self.out.memoize()?;
        self.strings.insert(text, slot);
        Ok(())
    }

    /// Writes `items` as the pairs of the dict on top, in batches.
    fn dict_items<T>(&mut self, items: &[T], mut write: impl FnMut(&mut Self, &T) -> io::Result<()>) -> io::Result<()> {
        for batch in items.chunks(BATCH) {
            self.out.mark()?;
            for item in batch {
                write(self, item)?;
            }
            self.out.set_items()?;
        }
        Ok(())
    }

    /// Writes `items` as the elements of the list on top, in batches.
    fn list_items<T>(&mut self, items: &'a [T], mut write: impl FnMut(&mut Self, &'a T) -> io::Result<()>) -> io::Result<()> {
        for batch in items.chunks(BATCH) {
            self.out.mark()?;
            for item in batch {
                write(self, item)?;
            }
            self.out.appends()?;
        }
        Ok(())
    }

    fn snapshot(&mut self) -> io::Result<()> {
        let snapshot = self.snapshot;
        self.out.empty_dict()?;
        self.out.mark()?;
        self.shared_str("segments")?;
        self.out.empty_list()?;
        self.list_items(&snapshot.segments, Self::segment)?;
        self.shared_str("device_traces")?;
        self.out.empty_list()?;
        let mut device = 0;
        self.list_items(&snapshot.device_traces, |this, trace| {
            this.out.empty_list()?;
            let mut index = 0;
            this.list_items(trace, |this, entry| {
                // An action heapscope does not know is written with its own name.
                let action = snapshot.action_name(device, index, entry);
                index += 1;
                this.entry(entry, action)
            })?;
            device += 1;
            Ok(())
        })?;
        if let Some(settings) = &snapshot.settings {
            self.shared_str("allocator_settings")?;
            self.settings(settings)?;
        }
        if let Some(export) = &snapshot.contender_export {
            self.shared_str(ContenderExport::KEY)?;
            self.contender_export(export)?;
        }
        self.out.set_items()
    }

    fn frames(&mut self, id: StackId) -> io::Result<()> {
        let index = id.0 as usize;
        let snapshot = self.snapshot;
        let frames = if index == 0 && snapshot.frame_stacks.is_empty() {
            &[][..]
        } else {
            snapshot.frame_stacks.get(index).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, format!("frame list {index} is not in the snapshot's frame_stacks"))
            })?
        };
        if let Some(slot) = self.stacks[index] {
            return self.out.get(slot);
        }
        self.out.empty_list()?;
        self.stacks[index] = Some(self.out.memoize()?);
        self.list_items(frames, |this, frame| {
            this.out.empty_dict()?;
            this.out.mark()?;
            this.shared_str("name")?;
            this.shared_str(&frame.name)?;
            this.shared_str("filename")?;
            this.shared_str(&frame.filename)?;
            this.shared_str("line")?;
            this.out.int(i128::from(frame.line))?;
            this.out.set_items()
        })
    }

    fn key_int(&mut self, key: &'static str, value: u64) -> io::Result<()> {
        self.shared_str(key)?;
        self.out.int(i128::from(value))
    }

    fn segment(&mut self, segment: &'a Segment) -> io::Result<()> {
        self.out.empty_dict()?;
        self.out.mark()?;
        self.key_int("device", u64::from(segment.device))?;
        self.key_int("address", segment.address)?;
        self.key_int("total_size", segment.total_size)?;
        self.key_int("allocated_size", segment.allocated_size)?;
        self.key_int("active_size", segment.active_size)?;
        self.key_int("requested_size", segment.requested_size)?;
        self.key_int("stream", segment.stream)?;
        self.shared_str("segment_type")?;
        self.shared_str(match segment.segment_type {
            Pool::Large => "large",
            Pool::Small => "small",
        })?;
        self.shared_str("segment_pool_id")?;
        self.out.int(i128::from(segment.segment_pool_id.0))?;
        self.out.int(i128::from(segment.segment_pool_id.1))?;
        self.out.tuple2()?;
        self.shared_str("is_expandable")?;
        self.out.bool(segment.is_expandable)?;
        self.shared_str("frames")?;
        self.frames(segment.frames)?;
        self.shared_str("blocks")?;
        self.out.empty_list()?;
        self.list_items(&segment.blocks, Self::block)?;
        self.out.set_items()
    }

    fn block(&mut self, block: &'a Block) -> io::Result<()> {
        self.out.empty_dict()?;
        self.out.mark()?;
        self.key_int("address", block.address)?;
        self.key_int("size", block.size)?;
        self.key_int("requested_size", block.requested_size)?;
        self.shared_str("state")?;
        self.shared_str(match block.state {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        })?;
        self.shared_str("frames")?;
        self.frames(block.frames)?;
        self.out.set_items()
    }

    /// Writes `entry`, whose action is called `action`.
    fn entry(&mut self, entry: &'a TraceEntry, action: &'a str) -> io::Result<()> {
        self.out.empty_dict()?;
        self.out.mark()?;
        self.shared_str("action")?;
        self.shared_str(action)?;
        if entry.action != Action::Oom || entry.addr != 0 {
            self.key_int("addr", entry.addr)?;
        }
        if let Some(device_free) = entry.device_free() {
            self.key_int("device_free", device_free)?;
        }
        self.key_int("size", entry.size)?;
        self.key_int("stream", entry.stream)?;
        if let Some(time_us) = entry.time_us() {
            self.shared_str("time_us")?;
            self.out.int(i128::from(time_us))?;
        }
        self.shared_str("frames")?;
        self.frames(entry.frames)?;
        if let Some(category) = self.snapshot.category(entry.category) {
            self.shared_str(category.key.as_str())?;
            self.shared_str(&category.name)?;
        }
        if !self.snapshot.pool_ids.is_empty() {
            let (first, second) = self.snapshot.pool_id(entry.pool_id);
            self.shared_str("pool_id")?;
            self.out.int(i128::from(first))?;
            self.out.int(i128::from(second))?;
            self.out.tuple2()?;
        }
        self.out.set_items()
    }

    fn settings(&mut self, settings: &'a RecordedSettings) -> io::Result<()> {
        self.out.empty_dict()?;
        self.out.mark()?;
        self.shared_str("PYTORCH_CUDA_ALLOC_CONF")?;
        self.out.str(&settings.alloc_conf)?;
        self.shared_str("max_split_size")?;
        self.out.int(settings.max_split_size.map_or(-1, i128::from))?;
        self.shared_str("garbage_collection_threshold")?;
        self.out.float(settings.garbage_collection_threshold)?;
        self.shared_str("expandable_segments")?;
        self.out.bool(settings.expandable_segments)?;
        self.shared_str("roundup_power2_divisions")?;
        self.out.empty_dict()?;
        self.dict_items(&settings.roundup_power2_divisions, |this, &(start, divisions)| {
            this.out.str(&start.to_string())?;
            this.out.int(i128::from(divisions))
        })?;
        self.out.set_items()
    }

    /// `heapscope_contender_export`: `{"contender": str, "empty_cache_entries": [[int, ...], ...]}`.
    fn contender_export(&mut self, export: &'a ContenderExport) -> io::Result<()> {
        self.out.empty_dict()?;
        self.out.mark()?;
        self.shared_str("contender")?;
        self.out.str(&export.contender)?;
        self.shared_str("empty_cache_entries")?;
        self.out.empty_list()?;
        self.list_items(&export.empty_cache_entries, |this, entries| {
            this.out.empty_list()?;
            this.list_items(entries, |this, &entry| this.out.int(entry as i128))
        })?;
        self.out.set_items()
    }
}

#[cfg(test)]
mod tests {
    use super::super::import::tests::{ASSETS, asset, python3, run_python, temp_dir};
    use super::super::import::{parse_snapshot, read_snapshot};
    use super::super::snapshot::{Frame, PoolId, TraceEntry};
    use super::*;

    fn written(snapshot: &Snapshot) -> Vec<u8> {
        let mut bytes = Vec::new();
        write_snapshot(snapshot, &mut bytes).unwrap();
        bytes
    }

    /// `heapscope_contender_export` round trips, and what cannot be a list of entries of the trace is refused naming
    /// the key path and the value.
    #[test]
    fn a_contender_export_round_trips_and_bad_entries_are_refused() {
        let trace = vec![TraceEntry::new(Action::Alloc, 4096, 512); 3];
        // (the entries of device 0 and of device 1, what the error says; None: read back as written)
        let cases: [(Vec<Vec<usize>>, Option<&str>); 6] = [
            (vec![vec![0, 2]], None),
            (vec![], None),
            (vec![vec![2, 2, 3, 3]], None),
            (
                vec![vec![1, 4]],
                Some("heapscope_contender_export.empty_cache_entries[0][1]: entry 4, past device_traces[0]'s 3 entries"),
            ),
            (
                vec![vec![2, 1]],
                Some("heapscope_contender_export.empty_cache_entries[0][1]: entry 1 after entry 2: the entries ascend"),
            ),
            (
                vec![vec![0], vec![0]],
                Some("heapscope_contender_export.empty_cache_entries: 2 devices, and device_traces holds 1"),
            ),
        ];
        for (entries, error) in cases {
            let snapshot = Snapshot {
                device_traces: vec![trace.clone()],
                contender_export: Some(ContenderExport { contender: "tlsf".into(), empty_cache_entries: entries.clone() }),
                ..Snapshot::default()
            };
            match (parse_snapshot(written(&snapshot).as_slice(), "x.pickle"), error) {
                (Ok(again), None) => assert_eq!(again.contender_export, snapshot.contender_export, "{entries:?}"),
                (Err(found), Some(words)) => assert!(found.to_string().contains(words), "{entries:?}: {found}"),
                (found, _) => panic!("{entries:?}: {found:?}"),
            }
        }
    }

    #[test]
    fn real_snapshots_round_trip() {
        for name in ASSETS {
            let snapshot = read_snapshot(&asset(name)).unwrap();
            let bytes = written(&snapshot);
            let again = parse_snapshot(bytes.as_slice(), name).unwrap();
            assert_eq!(again, snapshot, "{name}");
            // Written twice, the same bytes.
            assert_eq!(written(&again), bytes, "{name}");
        }
    }

    #[test]
    fn edge_cases_round_trip() {
        let frames = vec![Frame { filename: "ü.py".into(), line: -1, name: "x".repeat(300).into() }];
        let entry = |action, addr, frames| {
            // `i64::MIN` itself is how an entry holds no time (no clock gives it).
            let mut entry = TraceEntry::new(action, addr, u64::MAX).with_time_us(Some(i64::MIN + 1));
            (entry.stream, entry.frames) = (u64::MAX, frames);
            entry
        };
        // (what, snapshot)
        let cases = [
            ("empty", Snapshot { frame_stacks: vec![Vec::new()], ..Snapshot::default() }),
            (
                "extremes and 2500 entries (three batches)",
                Snapshot {
                    device_traces: vec![
                        Vec::new(),
                        (0..2500).map(|i| entry(Action::FreeRequested, i, StackId(i as u32 % 2))).collect(),
                    ],
                    settings: Some(RecordedSettings {
                        alloc_conf: "expandable_segments:True".into(),
                        max_split_size: Some(u64::MAX - 1),
                        garbage_collection_threshold: 0.8,
                        expandable_segments: true,
                        roundup_power2_divisions: (0..1200).map(|i| (i, 1 << (i % 16))).collect(),
                    }),
                    frame_stacks: vec![Vec::new(), frames],
                    ..Snapshot::default()
                },
            ),
            (
                "oom with an address",
                Snapshot {
                    device_traces: vec![vec![entry(Action::Oom, 5, StackId::NONE).with_device_free(Some(7))]],
                    frame_stacks: vec![Vec::new()],
                    ..Snapshot::default()
                },
            ),
            (
                "entries in private pools (PyTorch 2.12's pool_id), numbered by first use",
                Snapshot {
                    device_traces: vec![
                        vec![
                            entry(Action::Alloc, 1, StackId::NONE).with_pool_id(PoolId(1)),
                            entry(Action::Alloc, 2, StackId::NONE),
                        ],
                        vec![entry(Action::Alloc, 3, StackId::NONE).with_pool_id(PoolId(2))],
                    ],
                    frame_stacks: vec![Vec::new()],
                    pool_ids: vec![(0, 0), (0, 1), (i64::MIN, i64::MAX)],
                    ..Snapshot::default()
                },
            ),
        ];
        for (what, snapshot) in cases {
            let again = parse_snapshot(written(&snapshot).as_slice(), what).unwrap();
            assert_eq!(again, snapshot, "{what}");
        }
    }

    /// The segments alone, as `torch.cuda.memory_snapshot()` returns them, read back as a state with no trace: the
    /// same segments, an empty trace per device up to the highest named.
    #[test]
    fn segment_lists_round_trip_as_states_with_no_trace() {
        for name in ASSETS {
            let mut snapshot = read_snapshot(&asset(name)).unwrap();
            // (the devices of the segments, the traces read back)
            for (devices, traces) in [(&[0u32][..], 1), (&[2, 0][..], 3)] {
                for (index, segment) in snapshot.segments.iter_mut().enumerate() {
                    segment.device = devices[index % devices.len()];
                }
                let mut bytes = Vec::new();
                write_segments(&snapshot, &mut bytes).unwrap();
                let state = parse_snapshot(bytes.as_slice(), name).unwrap();
                assert_eq!(state.segments, snapshot.segments, "{name}");
                assert_eq!(state.device_traces, vec![Vec::new(); traces], "{name} {devices:?}");
                assert_eq!(state.settings, None, "{name}");
            }
        }
    }

    #[test]
    fn unknown_stack_ids_are_an_error() {
        let snapshot = Snapshot {
            device_traces: vec![vec![{
                let mut entry = TraceEntry::new(Action::Alloc, 1, 1);
                entry.frames = StackId(9);
                entry
            }]],
            frame_stacks: vec![Vec::new()],
            ..Snapshot::default()
        };
        let error = write_snapshot(&snapshot, io::sink()).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    /// Python's own `pickle.load` reads what we write, with PyTorch's schema and shared frame lists.
    #[test]
    fn python_reads_the_written_files() {
        if !python3() {
            return;
        }
        let dir = temp_dir("export");
        let script = r#"
import pickle, sys, gzip
original = pickle.load(gzip.open(sys.argv[1]))
ours = pickle.load(open(sys.argv[2], "rb"))
assert sorted(ours) == ["allocator_settings", "device_traces", "segments"], sorted(ours)
seg_keys = ["active_size", "address", "allocated_size", "blocks", "device", "frames", "is_expandable", "requested_size",
            "segment_pool_id", "segment_type", "stream", "total_size"]
for mine, theirs in zip(ours["segments"], original["segments"], strict=True):
    assert sorted(mine) == seg_keys, sorted(mine)
    assert type(mine["segment_pool_id"]) is tuple
    for key in seg_keys:
        if key != "blocks":
            assert mine[key] == theirs[key], (key, mine[key], theirs[key])
    for b, c in zip(mine["blocks"], theirs["blocks"], strict=True):
        assert sorted(b) == ["address", "frames", "requested_size", "size", "state"], sorted(b)
        assert all(b[k] == c[k] for k in b), (b, c)
for mine, theirs in zip(ours["device_traces"], original["device_traces"], strict=True):
    for e, f in zip(mine, theirs, strict=True):
        for key in ["action", "addr", "size", "stream", "time_us", "device_free"]:
            assert e.get(key) == f.get(key), (key, e, f)
        assert e["frames"] == f.get("frames", []), (e, f)
events = ours["device_traces"][0]
shared = len({id(e["frames"]) for e in events})
distinct = len({repr(e["frames"]) for e in events})
assert shared == distinct, (shared, distinct)
s, t = ours["allocator_settings"], original["allocator_settings"]
for key in ["PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold", "expandable_segments",
            "roundup_power2_divisions"]:
    assert s[key] == t[key], (key, s[key], t[key])
print(len(events), shared)
"#;
        for name in ["frag_oom-default.pickle.gz", "frag_oom-expandable.pickle.gz", "gpt2_train_fixed-expandable.pickle.gz"] {
            let snapshot = read_snapshot(&asset(name)).unwrap();
            // Python sees as many distinct frame list objects as the trace has StackIds.
            let trace = &snapshot.device_traces[0];
            let stacks: std::collections::HashSet<StackId> = trace.iter().map(|entry| entry.frames).collect();
            let expected = format!("{} {}", trace.len(), stacks.len());
            let out = dir.join(name.replace(".gz", ""));
            write_snapshot(&snapshot, std::fs::File::create(&out).unwrap()).unwrap();
            let printed = run_python(script, &[asset(name).to_str().unwrap(), out.to_str().unwrap()]);
            assert_eq!(printed.trim(), expected, "{name}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
