//! Tests: the four shared PyTorch 2.11 traces replayed exactly, and each rule on small hand-made traces.

use super::*;
use crate::snapshot::{PoolId, RecordedSettings, Snapshot, TraceEntry};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// A real snapshot from `assets/traces/pytorch/` and PyTorch's own statistics of the same run.
fn load(name: &str) -> (Snapshot, serde_json::Value) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
    let snap = crate::read_snapshot(&dir.join(format!("{name}.pickle.gz"))).unwrap();
    let truth_text = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
    (snap, serde_json::from_str(&truth_text).unwrap())
}

fn run(name: &str, capacity: Option<u64>) -> (Emulation, serde_json::Value, Snapshot) {
    let (snap, truth) = load(name);
    let conf = AllocConf::from_recorded(snap.settings.as_ref().unwrap());
    (emulate(&snap, 0, &conf, capacity).unwrap(), truth, snap)
}

#[test]
fn shared_traces_replay_exactly() {
    for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
        let (em, truth, snap) = run(name, None);
        let f = em.fidelity;
        eprintln!("{name}: {f:?}");
        assert!(f.is_exact(), "{name}: {f:?}");
        assert_eq!(f.matched, f.recorded);
        for (key, value) in truth["memory_stats"].as_object().unwrap() {
            assert_eq!(em.stats.get(key), value.as_i64(), "{name}: {key}");
        }
        assert_eq!(em.stats.summary_table(0), truth["memory_summary"].as_str().unwrap(), "{name}: summary");
        assert_eq!(em.final_segments, snap.segments.iter().map(strip).collect::<Vec<_>>(), "{name}: final segments");
    }
}

/// The rounding rules saturate at the top of u64: `advise` bounds a recording's blocks before the emulation refuses
/// a size near 2^64 with its error (an overflow there was a panic). Each rounds up, never below the request.
#[test]
fn rounding_saturates_near_the_top_of_u64() {
    let divisions = {
        let mut conf = AllocConf::default();
        conf.parse_overrides("roundup_power2_divisions:8").unwrap();
        conf
    };
    for size in [u64::MAX, u64::MAX - 100, u64::MAX - 511, (1 << 63) + 1, 1 << 63, 3 << 62] {
        for conf in [&AllocConf::default(), &divisions] {
            let rounded = round_size(size, conf);
            assert!(rounded >= size, "{size}: {rounded}");
            assert!(get_allocation_size(rounded) >= rounded, "{size}");
        }
    }
    assert_eq!(round_size(u64::MAX - 100, &AllocConf::default()), u64::MAX);
    // Divisions from 2^55 on: PyTorch's product with 512 wraps to 0, and sizes go up to the next power of two.
    for (divisions, size, rounded) in
        [(1u64 << 54, 150 * MIB, 150 * MIB), (1 << 55, 150 * MIB, 256 * MIB), (1 << 63, 150 * MIB + 1, 256 * MIB)]
    {
        let mut conf = AllocConf::default();
        conf.parse_overrides(&format!("roundup_power2_divisions:{divisions}")).unwrap();
        assert_eq!(round_size(size, &conf), rounded, "{divisions} divisions");
    }
}

/// Marks (`snapshot`, and the `user_defined` annotations some PyTorch versions record) between a segment event and
/// the request it served, or a release and what followed it, change nothing: the shared traces with a mark after
/// every entry replay exactly, and their OOM is at the same place.
#[test]
fn marks_between_entries_change_nothing() {
    for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default"] {
        let (mut snap, _) = load(name);
        let conf = AllocConf::from_recorded(snap.settings.as_ref().unwrap());
        let plain = emulate(&snap, 0, &conf, None).unwrap();
        let marked: Vec<TraceEntry> = snap.device_traces[0]
            .iter()
            .enumerate()
            .flat_map(|(index, entry)| {
                let mark = if index % 2 == 0 { Action::UserDefined } else { Action::Snapshot };
                [entry.clone(), TraceEntry::new(mark, 0, 0)]
            })
            .collect();
        snap.device_traces[0] = marked;
        let em = emulate(&snap, 0, &conf, None).unwrap();
        assert!(em.fidelity.is_exact(), "{name}: {:?}", em.fidelity);
        assert_eq!((em.fidelity.matched, em.stats.clone()), (plain.fidelity.matched, plain.stats.clone()), "{name}");
        assert_eq!(em.first_oom.map(|oom| oom.event_index), plain.first_oom.map(|oom| 2 * oom.event_index), "{name}");
    }
}

/// Files of PyTorch before 2.5 record no `allocator_settings`: whether segments were expandable is known from the
/// file itself (segments marked expandable, pages mapped), and such a recording replays as exactly as with its
/// settings. So is a state with no trace, from its segments alone.
#[test]
fn unrecorded_expandable_segments_are_known_from_the_file() {
    for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
        let (mut snap, _) = load(name);
        let recorded = snap.settings.take().unwrap();
        let conf = AllocConf::of_snapshot(&snap);
        assert_eq!(conf, AllocConf::from_recorded(&recorded), "{name}: the shared runs set nothing else");
        let em = emulate(&snap, 0, &conf, None).unwrap();
        assert!(em.fidelity.is_exact(), "{name}: {:?}", em.fidelity);
        if !snap.segments.is_empty() {
            let state = Snapshot { device_traces: vec![Vec::new()], ..snap.clone() };
            assert_eq!(AllocConf::of_snapshot(&state).expandable_segments, recorded.expandable_segments, "{name}: state");
        }
    }
}

fn strip(s: &Segment) -> Segment {
    let mut s = s.clone();
    s.frames = StackId::NONE;
    for b in &mut s.blocks {
        b.frames = StackId::NONE;
    }
    s
}

/// The state rebuilt at the start of a recording cut from a whole run (as `max_entries` cuts it) is the whole run's
/// state at that entry, live block for live block, at some 60 cuts of each shared recording. A live
/// block known only from its free entry is its rounded request, grown to the nearest boundary where PyTorch kept the
/// remainder; an allocation the trace placed above it while it lived is such a boundary, not its end (taken for its
/// end, 51 of gpt2's default cuts held blocks too large, one by 83 MiB).
#[test]
fn start_states_rebuilt_at_every_cut_are_the_whole_runs_state_there() {
    for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
        let (whole, _) = load(name);
        let conf = AllocConf::from_recorded(whole.settings.as_ref().unwrap());
        let trace = &whole.device_traces[0];
        let mut emulator = Emulator::new(&whole, 0, &conf, None).unwrap();
        for cut in (1..trace.len()).step_by(trace.len() / 60) {
            while emulator.entries_done() < cut {
                emulator.step();
            }
            let window = Snapshot { device_traces: vec![trace[cut..].to_vec()], ..whole.clone() };
            let rebuilt = CachingAllocator::at_recording_start(&window, 0, &conf, None).unwrap();
            // The live blocks (a segment the driver gave for the entry after the cut exists in the emulation only once
            // that entry's allocation lands in it).
            let live = |allocator: &CachingAllocator| -> Vec<Block> {
                let report = allocator.report();
                report
                    .iter()
                    .flat_map(|segment| strip(segment).blocks)
                    .filter(|block| block.state != BlockState::Inactive)
                    .collect()
            };
            assert_eq!(live(&rebuilt), live(emulator.allocator()), "{name} cut at {cut}");
        }
    }
}

#[test]
fn frag_oom_default_ooms_at_3584_mib_like_pytorch() {
    let (em, truth, _) = run("frag_oom-default", Some(3584 * MIB));
    let OomEvent { event_index, report } = em.first_oom.expect("an OOM");
    assert_eq!(event_index, 100, "the recorded oom entry");
    assert_eq!(report.request_bytes, 1 << 30);
    assert_eq!(report.allocated_bytes, truth["before_big"]["allocated"].as_u64().unwrap());
    assert_eq!(report.reserved_bytes, truth["before_big"]["reserved"].as_u64().unwrap());
    assert_eq!(report.free_in_reserved_bytes, 1000 * MIB, "1000.00 MiB is reserved by PyTorch but unallocated");
    assert_eq!(report.largest_free_block_bytes, 50 * MIB);
    assert_eq!(report.num_alloc_retries, 1);
    assert!(em.fidelity.is_exact(), "{:?}", em.fidelity);
    assert_eq!(em.stats.num_ooms, 1);
    assert_eq!(em.stats.summary_table(0), truth["memory_summary"].as_str().unwrap());
}

#[test]
fn frag_oom_expandable_succeeds_at_3584_mib() {
    let (em, truth, _) = run("frag_oom-expandable", Some(3584 * MIB));
    assert_eq!(em.first_oom, None);
    assert!(em.fidelity.is_exact(), "{:?}", em.fidelity);
    let grow = em.segment_events.iter().find(|e| e.cause == 101).expect("the 1 GiB request maps pages");
    assert_eq!((grow.action, grow.size_bytes), (Action::SegmentMap, 40 * MIB));
    assert_eq!(em.stats.get("reserved_bytes.all.peak"), truth["memory_stats"]["reserved_bytes.all.peak"].as_i64());
    assert_eq!(em.stats.num_device_alloc, 21);
}

/// A recording that starts mid-run: drop a prefix of the trace, keep the final segments. The state rebuilt
/// at the cut must let every later segment event and placement match.
#[test]
fn recordings_cut_mid_run_replay_exactly() {
    for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
        let (snap, _) = load(name);
        let conf = AllocConf::from_recorded(snap.settings.as_ref().unwrap());
        // 23 cuts spread over the trace, at any kind of entry (also between a free's two halves).
        for (cut, em) in exact_from_cuts(name, &snap, &conf, 24) {
            let want: Vec<Segment> = snap.segments.iter().map(strip).collect();
            assert_eq!(em.final_segments.len(), want.len(), "{name} cut at {cut}");
            for (got, want) in em.final_segments.iter().zip(&want) {
                assert_eq!(got, want, "{name} cut at {cut}");
            }
        }
    }
}

/// An expandable recording that ends with a pool's allocations freed and its pages unmapped (as after `empty_cache`)
/// shows no final segment of that pool: cut mid-run, the pages mapped at its start, and the allocations live in them,
/// are known only from the trace's `segment_map` / `segment_unmap` entries — in the large pool (frag_oom) and the
/// small one (gpt2's 2 MiB pages), also with the two reservations as close as on a GPU of less memory. Every later
/// segment event and placement still matches (the frees of the allocations live at the cut among them).
#[test]
fn expandable_recordings_that_end_unmapped_replay_exactly_from_a_cut() {
    // (recording, where its small pool's reservation is moved: bytes above the large pool's, the pools unmapped at
    // its end)
    let both = [Pool::Large, Pool::Small];
    let cases: [(&str, Option<u64>, &[Pool]); 3] = [
        ("frag_oom-expandable", None, &both),
        ("gpt2_train_fixed-expandable", None, &both),
        ("gpt2_train_fixed-expandable", Some(40 << 30), &both),
    ];
    for (name, small_pool_at, unmapped) in cases {
        let (mut snap, _) = load(name);
        if let Some(above_large) = small_pool_at {
            move_small_pool_reservation(&mut snap, above_large);
        }
        let conf = AllocConf::from_recorded(snap.settings.as_ref().unwrap());
        let time = snap.device_traces[0].last().and_then(TraceEntry::time_us);
        let end = |action, addr, size, stream| TraceEntry::new(action, addr, size).with_stream(stream).with_time_us(time);
        // Every block of those pools freed, then (one `empty_cache`) every page of theirs unmapped.
        let (gone, kept): (Vec<Segment>, Vec<Segment>) =
            std::mem::take(&mut snap.segments).into_iter().partition(|segment| unmapped.contains(&segment.segment_type));
        snap.segments = kept;
        let mut tail = Vec::new();
        for segment in &gone {
            for block in segment.blocks.iter().filter(|block| block.state != BlockState::Inactive) {
                tail.push(end(Action::FreeRequested, block.address, block.requested_size, segment.stream));
                tail.push(end(Action::FreeCompleted, block.address, block.requested_size, segment.stream));
            }
        }
        tail.extend(gone.iter().map(|segment| end(Action::SegmentUnmap, segment.address, segment.total_size, segment.stream)));
        assert!(tail.iter().any(|entry| entry.action == Action::SegmentUnmap), "{name}: expandable segments at its end");
        snap.device_traces[0].extend(tail);
        for (cut, em) in exact_from_cuts(name, &snap, &conf, 12) {
            assert_eq!(em.final_segments.len(), snap.segments.len(), "{name} cut at {cut}: only the pools kept stay mapped");
        }
    }
}

/// A small-pool virtual segment that the end unmapped, in reach of a final large one (reservations as close as on a
/// GPU of less memory), is a segment of its own, with its live allocation: not pages of the large one.
#[test]
fn an_unmapped_small_segment_in_reach_of_a_large_one_is_its_own() {
    let large = 0x7f00_0000_0000u64;
    let small = large + (40 << 30);
    let full = vec![Block::new(large, 20 * MIB, 20 * MIB, BlockState::ActiveAllocated)];
    let segment = Segment { is_expandable: true, ..Segment::from_blocks(0, large, 20 * MIB, Pool::Large, full) };
    let trace = vec![
        entry(Action::FreeRequested, small, 512),
        entry(Action::FreeCompleted, small, 512),
        entry(Action::SegmentUnmap, small, 2 * MIB),
    ];
    let settings = RecordedSettings { expandable_segments: true, ..RecordedSettings::default() };
    let snap = Snapshot { segments: vec![segment], device_traces: vec![trace], settings: Some(settings), ..Snapshot::default() };
    let em = emulate(&snap, 0, &AllocConf::of_snapshot(&snap), None).unwrap();
    assert!(em.fidelity.is_exact(), "{:?}", em.fidelity);
    assert_eq!(
        em.segment_events.last().map(|event| (event.action, event.addr, event.size_bytes)),
        Some((Action::SegmentUnmap, small, 2 * MIB))
    );
}

/// Reservations of other streams and pools in reach of one the final segments show (as on a GPU of less memory than
/// 128 GiB, where reservations lie about 1.125 times its memory apart), unmapped by the end: each is its own virtual
/// segment, with the allocations live in it, never pages of the reservation below; and a small-pool run of ten
/// pages (a multiple of the large pool's 20 MiB page) is the small pool's, as the allocations in it show. Each case
/// beside its control, the same reservation far out of reach.
#[test]
fn reservations_in_reach_of_each_other_stay_apart() {
    const GIB: u64 = 1 << 30;
    let base = 0x7f00_0000_0000u64;
    let e = |action, addr, size, stream| TraceEntry::new(action, addr, size).with_stream(stream);
    let final_segment = |stream: u64, size: u64, pool: Pool, live: u64| {
        let mut blocks = vec![Block::new(base, live, live, BlockState::ActiveAllocated)];
        if live < size {
            blocks.push(Block::new(base + live, size - live, 0, BlockState::Inactive));
        }
        Segment { is_expandable: true, stream, ..Segment::from_blocks(0, base, size, pool, blocks) }
    };
    use Action::{Alloc, FreeCompleted, FreeRequested, SegmentMap, SegmentUnmap};
    // (case, final segments, trace), each at a reservation `gap` above the final one's
    let cases = |gap: u64| -> Vec<(&str, Vec<Segment>, Vec<TraceEntry>)> {
        let other = base + gap;
        // A block of `bytes` live at the start freed, its page run of `page` bytes unmapped, mapped again, allocated.
        let again = |bytes: u64, page: u64, stream: u64| {
            vec![
                e(FreeRequested, other, bytes, stream),
                e(FreeCompleted, other, bytes, stream),
                e(SegmentUnmap, other, page, stream),
                e(SegmentMap, other, page, stream),
                e(Alloc, other, bytes, stream),
            ]
        };
        vec![
            (
                "another stream's large reservation, unmapped and mapped again",
                vec![final_segment(1, 20 * MIB, Pool::Large, 20 * MIB)],
                again(20 * MIB, 20 * MIB, 2),
            ),
            (
                "the same stream's large reservation above a small one",
                vec![final_segment(0, 2 * MIB, Pool::Small, 512)],
                again(20 * MIB, 20 * MIB, 0),
            ),
            (
                "another stream's page, half live at the start, while the final one's stream maps its next page",
                vec![final_segment(1, 40 * MIB, Pool::Large, 20 * MIB)],
                vec![
                    e(SegmentMap, base + 20 * MIB, 20 * MIB, 1),
                    e(Alloc, base + 20 * MIB, 10 * MIB, 1),
                    e(FreeRequested, other, 10 * MIB, 2),
                    e(FreeCompleted, other, 10 * MIB, 2),
                    e(SegmentUnmap, other, 20 * MIB, 2),
                ],
            ),
            (
                "the same stream's large page above a full small one that maps its next page",
                vec![final_segment(0, 4 * MIB, Pool::Small, 2 * MIB)],
                vec![
                    e(SegmentMap, base + 2 * MIB, 2 * MIB, 0),
                    e(Alloc, base + 2 * MIB, 512, 0),
                    e(FreeRequested, other, 10 * MIB, 0),
                    e(FreeCompleted, other, 10 * MIB, 0),
                    e(SegmentUnmap, other, 20 * MIB, 0),
                ],
            ),
            ("another stream's small reservation", vec![final_segment(1, 2 * MIB, Pool::Small, 512)], again(512, 2 * MIB, 2)),
            (
                "a small-pool run of ten pages, no final segment",
                Vec::new(),
                vec![
                    e(Alloc, other + 512, 512, 0),
                    e(FreeRequested, other, 512, 0),
                    e(FreeCompleted, other, 512, 0),
                    e(FreeRequested, other + 512, 512, 0),
                    e(FreeCompleted, other + 512, 512, 0),
                    e(SegmentUnmap, other, 20 * MIB, 0),
                ],
            ),
        ]
    };
    for gap in [40 * GIB, 90 * GIB, 200 * GIB] {
        for (case, segments, trace) in cases(gap) {
            let settings = RecordedSettings { expandable_segments: true, ..RecordedSettings::default() };
            let snap = Snapshot { segments, device_traces: vec![trace], settings: Some(settings), ..Snapshot::default() };
            let em = emulate(&snap, 0, &AllocConf::of_snapshot(&snap), None).unwrap();
            assert!(em.fidelity.is_exact(), "{case}, {} GiB above: {:?}", gap / GIB, em.fidelity);
        }
    }
}

/// Moves every address of `snap`'s small-pool reservation (its segments, blocks and trace entries) down to start
/// `above_large` bytes above the large pool's.
fn move_small_pool_reservation(snap: &mut Snapshot, above_large: u64) {
    let base = |pool: Pool| snap.segments.iter().filter(|s| s.segment_type == pool).map(|s| s.address).min().unwrap();
    let (small, large) = (base(Pool::Small), base(Pool::Large));
    assert!(small > large + above_large, "the small pool's reservation lies above");
    let moved = |address: &mut u64| {
        if *address >= small {
            *address -= small - (large + above_large);
        }
    };
    for segment in &mut snap.segments {
        moved(&mut segment.address);
        segment.blocks.iter_mut().for_each(|block| moved(&mut block.address));
    }
    snap.device_traces[0].iter_mut().for_each(|entry| moved(&mut entry.addr));
}

/// `snap` cut at `pieces - 1` places spread over its trace (at any kind of entry, also between a free's two halves),
/// each emulated from its start: every segment event and placement matches. The cut and its emulation.
fn exact_from_cuts(name: &str, snap: &Snapshot, conf: &AllocConf, pieces: usize) -> Vec<(usize, Emulation)> {
    let trace = &snap.device_traces[0];
    (1..pieces)
        .map(|k| {
            let cut = trace.len() * k / pieces + k % 3;
            let mut cut_snap = snap.clone();
            cut_snap.device_traces[0] = trace[cut..].to_vec();
            let em = emulate(&cut_snap, 0, conf, None).unwrap();
            assert!(em.fidelity.is_exact(), "{name} cut at {cut}: {:?}", em.fidelity);
            (cut, em)
        })
        .collect()
}

/// A what-if with the other kind of memory than a recording begun mid-run (expandable segments turned on or off):
/// the allocations live at the start are allocated afresh by the what-if's allocator, in segments of its own kind,
/// not laid out in the recorded segments (whose fragmentation belongs to the other kind). At every cut of every
/// shared trace: every allocation live at the start is held, with the same bytes requested as in the rebuilt recorded
/// layout, in no segment of the recorded kind, no device call counted; and the replay from there
/// runs to the end.
#[test]
fn what_ifs_of_the_other_kind_allocate_the_start_state_afresh() {
    for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
        let (snap, _) = load(name);
        let recorded = AllocConf::from_recorded(snap.settings.as_ref().unwrap());
        let flipped = AllocConf { expandable_segments: !recorded.expandable_segments, ..recorded.clone() };
        let trace = &snap.device_traces[0];
        for k in 1..8 {
            let cut = trace.len() * k / 8 + k % 3;
            let mut cut_snap = snap.clone();
            cut_snap.device_traces[0] = trace[cut..].to_vec();
            let as_recorded = Emulator::new(&cut_snap, 0, &recorded, None).unwrap();
            let what_if = Emulator::new(&cut_snap, 0, &flipped, None).unwrap();
            let (before, after) = (as_recorded.allocator(), what_if.allocator());
            // The same requests (a block's own size follows the kind: an unsplit remainder stays with its block in
            // one kind of segment and not in the other).
            for key in ["requested_bytes.all.current", "allocation.all.current"] {
                assert_eq!(after.stats().get(key), before.stats().get(key), "{name} cut at {cut}: {key}");
            }
            assert_counted_as_rebuilt(after, before, &format!("{name} cut at {cut}"));
            assert_eq!(after.stats().num_device_alloc, 0, "{name} cut at {cut}");
            let kinds: Vec<bool> = after.report().iter().map(|segment| segment.is_expandable).collect();
            assert!(kinds.iter().all(|&expandable| expandable == flipped.expandable_segments), "{name} cut at {cut}: {kinds:?}");
            let em = emulate(&cut_snap, 0, &flipped, None).unwrap();
            assert_eq!(em.fidelity.start_left_out, 0, "{name} cut at {cut}");
        }
    }
    // Every cut of frag_oom, some between a free's two halves (a block freed before the start: allocated and its free
    // requested afresh, it counted in the allocations made and freed, unlike the rebuild; `compare` said 30 against 29).
    let (snap, _) = load("frag_oom-default");
    let flipped = AllocConf { expandable_segments: true, ..AllocConf::default() };
    for cut in 1..snap.device_traces[0].len() {
        let mut cut_snap = snap.clone();
        cut_snap.device_traces[0].drain(..cut);
        let as_recorded = Emulator::new(&cut_snap, 0, &AllocConf::default(), None).unwrap();
        let what_if = Emulator::new(&cut_snap, 0, &flipped, None).unwrap();
        assert_counted_as_rebuilt(what_if.allocator(), as_recorded.allocator(), &format!("frag_oom cut at {cut}"));
    }
    // The reviewer's case: frag_oom begun at entry 30, expandable segments turned on, on the device its oom tells,
    // fits as the whole recording does (it used to run out of memory in the recorded segments' holes).
    let (snap, _) = load("frag_oom-default");
    let mut cut_snap = snap.clone();
    cut_snap.device_traces[0].drain(..30);
    let expandable = AllocConf { expandable_segments: true, ..AllocConf::default() };
    for snapshot in [&snap, &cut_snap] {
        let em = emulate(snapshot, 0, &expandable, Some(3584 * MIB)).unwrap();
        assert_eq!(em.first_oom, None);
    }
}

/// A start state allocated afresh counts its allocations as the rebuilt one does: those live, none freed.
fn assert_counted_as_rebuilt(after: &CachingAllocator, before: &CachingAllocator, case: &str) {
    for key in ["allocation.all.allocated", "allocation.all.freed", "allocation.all.peak", "allocated_bytes.all.freed"] {
        assert_eq!(after.stats().get(key), before.stats().get(key), "{case}: {key}");
    }
}

/// `torch.cuda.memory_snapshot()`'s output (a list of segments, no trace), written by python3 from the final
/// segments of the shared traces: the start state rebuilt from it is those segments, its counters theirs,
/// and it exports and reads back.
#[test]
fn memory_snapshot_lists_rebuild_their_state() {
    use crate::import::tests::{python3, run_python, temp_dir};
    if !python3() {
        return;
    }
    let dir = temp_dir("memory-snapshot-lists");
    let names = ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"];
    let script = r#"
import gzip, os, pickle, sys
source, out = sys.argv[1], sys.argv[2]
for name in sys.argv[3:]:
    with gzip.open(os.path.join(source, name + ".pickle.gz")) as f:
        segments = pickle.load(f)["segments"]
    with open(os.path.join(out, name + ".pickle"), "wb") as f:
        pickle.dump(segments, f, protocol=4)
"#;
    let assets = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch");
    let mut args = vec![assets.to_str().unwrap(), dir.to_str().unwrap()];
    args.extend(names);
    run_python(script, &args);
    for name in names {
        let (recorded, _) = load(name);
        let state = crate::read_snapshot(&dir.join(format!("{name}.pickle"))).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(state.device_traces, vec![Vec::new()], "{name}");
        assert_eq!(state.segments.iter().map(strip).collect::<Vec<_>>(), recorded.segments.iter().map(strip).collect::<Vec<_>>());
        let want: Vec<Segment> = recorded.segments.iter().map(strip).collect();
        let sum = |size: fn(&Segment) -> u64| i64::try_from(want.iter().map(size).sum::<u64>()).unwrap();
        for conf in [AllocConf::default(), AllocConf::from_recorded(recorded.settings.as_ref().unwrap())] {
            let em = emulate(&state, 0, &conf, None).unwrap_or_else(|error| panic!("{name}: {error}"));
            assert_eq!(em.final_segments, want, "{name}");
            assert!(em.fidelity.is_exact() && em.fidelity.recorded == 0 && em.fidelity.allocs == 0, "{name}");
            assert_eq!(em.stats.get("reserved_bytes.all.current"), Some(sum(|s| s.total_size)), "{name}");
            assert_eq!(em.stats.get("allocated_bytes.all.current"), Some(sum(|s| s.allocated_size)), "{name}");
            assert_eq!(em.stats.get("active_bytes.all.current"), Some(sum(|s| s.active_size)), "{name}");
            assert!(em.stats.summary_table(0).contains("GPU reserved memory"), "{name}");
            let start = CachingAllocator::at_recording_start(&state, 0, &conf, None).unwrap();
            assert_eq!(start.report(), want, "{name}");
        }
        let mut exported = Vec::new();
        crate::write_snapshot(&state, &mut exported).unwrap();
        assert_eq!(crate::parse_snapshot(exported.as_slice(), name).unwrap(), state, "{name}: exported and read back");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

// ---- rules on hand-made requests -------------------------------------------------------------------------

fn conf() -> AllocConf {
    AllocConf::default()
}

fn conf_with(overrides: &str) -> AllocConf {
    let mut c = AllocConf::default();
    c.parse_overrides(overrides).unwrap();
    c
}

fn events(a: &mut CachingAllocator) -> Vec<(Action, u64)> {
    a.take_events().into_iter().map(|e| (e.action, e.size_bytes)).collect()
}

/// Block sizes of every segment, in address order, with `true` for allocated blocks.
fn layout(a: &CachingAllocator) -> Vec<Vec<(u64, bool)>> {
    a.report().iter().map(|s| s.blocks.iter().map(|b| (b.size, b.state == BlockState::ActiveAllocated)).collect()).collect()
}

#[test]
fn rounding() {
    let c = conf();
    for (request, rounded) in [(0, 512), (1, 512), (512, 512), (513, 1024), (MIB + 1, MIB + 512), (3 * MIB + 1, 3 * MIB + 512)] {
        assert_eq!(round_size(request, &c), rounded, "{request}");
    }
    let c = conf_with("roundup_power2_divisions:4");
    for (request, rounded) in [(1200, 1536), (3 * MIB + 1, 3 * MIB + 512 * 1024), (4 * MIB, 4 * MIB), (5 * MIB, 5 * MIB)] {
        assert_eq!(round_size(request, &c), rounded, "{request}");
    }
    let c = conf_with("roundup_power2_divisions:[1:2,2:4,>:8]"); // `>`: the intervals after 2 MiB (PyTorch 2.9)
    assert_eq!(round_size(MIB + 1, &c), MIB + 512 * 1024, "below 2 MiB: 2 divisions");
    assert_eq!(round_size(3 * MIB + 1, &c), 3 * MIB + 512 * 1024, "2..4 MiB: 4 divisions, steps of 512 KiB");
    assert_eq!(round_size(5 * MIB, &c), 5 * MIB, "4..8 MiB: steps of 512 KiB");
    assert_eq!(round_size(5 * MIB + 1, &c), 5 * MIB + 512 * 1024);
}

#[test]
fn pool_choice_and_segment_size() {
    assert_eq!(get_pool(MIB), Pool::Small);
    assert_eq!(get_pool(MIB + 512), Pool::Large);
    for (size, segment) in [
        (512, 2 * MIB),
        (MIB, 2 * MIB),
        (MIB + 512, 20 * MIB),
        (10 * MIB - 512, 20 * MIB),
        (10 * MIB, 10 * MIB),
        (11 * MIB + 512, 12 * MIB),
    ] {
        assert_eq!(get_allocation_size(size), segment, "{size}");
    }
    let mut a = CachingAllocator::new(conf(), None);
    a.malloc(4096, 0, None).unwrap();
    a.malloc(3 * MIB, 0, None).unwrap();
    a.malloc(30 * MIB + 1, 0, None).unwrap();
    a.malloc(4096, 7, None).unwrap();
    assert_eq!(
        events(&mut a),
        [
            (Action::SegmentAlloc, 2 * MIB),
            (Action::SegmentAlloc, 20 * MIB),
            (Action::SegmentAlloc, 32 * MIB),
            (Action::SegmentAlloc, 2 * MIB)
        ],
        "one small segment per stream"
    );
    assert_eq!(a.stats().segment.get(crate::memory_stats::StatType::SmallPool).current, 2);
}

#[test]
fn split_rules() {
    let mut a = CachingAllocator::new(conf(), None);
    a.malloc(MIB, 0, None).unwrap();
    a.malloc(19 * MIB, 0, None).unwrap(); // remainder 1 MiB: not split
    a.malloc(MIB + 512, 0, None).unwrap(); // new 20 MiB segment, remainder > 1 MiB: split
    assert_eq!(
        layout(&a),
        [vec![(MIB, true), (MIB, false)], vec![(20 * MIB, true)], vec![(MIB + 512, true), (19 * MIB - 512, false)]]
    );
}

#[test]
fn small_pool_splits_down_to_512_bytes() {
    let mut a = CachingAllocator::new(conf(), None);
    a.malloc(MIB, 0, None).unwrap();
    a.malloc(MIB - 512, 0, None).unwrap();
    assert_eq!(layout(&a), [vec![(MIB, true), (MIB - 512, true), (512, false)]]);
    a.malloc(1, 0, None).unwrap();
    assert_eq!(layout(&a), [vec![(MIB, true), (MIB - 512, true), (512, true)]]);
}

#[test]
fn merge_with_free_neighbours() {
    let mut a = CachingAllocator::new(conf(), None);
    let x = a.malloc(4 * MIB, 0, None).unwrap();
    let y = a.malloc(4 * MIB, 0, None).unwrap();
    let z = a.malloc(4 * MIB, 0, None).unwrap();
    assert!(a.free(y));
    assert_eq!(layout(&a), [vec![(4 * MIB, true), (4 * MIB, false), (4 * MIB, true), (8 * MIB, false)]]);
    assert_eq!(a.stats().inactive_split.all().current, 2);
    assert!(a.free(x));
    assert_eq!(layout(&a), [vec![(8 * MIB, false), (4 * MIB, true), (8 * MIB, false)]]);
    assert!(a.free(z));
    assert_eq!(layout(&a), [vec![(20 * MIB, false)]]);
    assert_eq!(a.stats().inactive_split_bytes.all().current, 0, "a whole free segment is releasable");
    assert!(!a.free(z), "double free is refused");
}

#[test]
fn best_fit_breaks_ties_by_address() {
    let mut a = CachingAllocator::new(conf(), None);
    let hi = a.malloc(30 * MIB, 0, Some(0x9000_0000)).unwrap();
    let lo = a.malloc(30 * MIB, 0, Some(0x1000_0000)).unwrap();
    let big = a.malloc(40 * MIB, 0, Some(0x5000_0000)).unwrap();
    a.free(hi);
    a.free(big);
    a.free(lo);
    assert_eq!(a.malloc(30 * MIB, 0, None), Ok(0x1000_0000), "equal sizes: lowest address");
    assert_eq!(a.malloc(25 * MIB, 0, None), Ok(0x9000_0000), "smallest block that fits");
    assert_eq!(a.malloc(25 * MIB, 1, Some(0x2000_0000)), Ok(0x2000_0000), "other streams do not share blocks");
}

#[test]
fn oversize_blocks() {
    let mut a = CachingAllocator::new(conf_with("max_split_size_mb:32"), None);
    let big = a.malloc(40 * MIB, 0, None).unwrap();
    assert_eq!(a.stats().oversize_segments.current, 1);
    assert_eq!(a.stats().oversize_allocations.current, 1);
    a.free(big);
    a.take_events();
    a.malloc(30 * MIB, 0, None).unwrap();
    assert_eq!(events(&mut a), [(Action::SegmentAlloc, 30 * MIB)], "small requests never get oversize blocks");
    assert_eq!(a.malloc(34 * MIB, 0, None), Ok(big), "within max_non_split_rounding: served whole");
    assert!(events(&mut a).is_empty());
    assert_eq!(layout(&a)[0], [(40 * MIB, true)], "never split");
    let c = a.malloc(60 * MIB, 0, None).unwrap();
    a.free(c);
    a.take_events();
    a.malloc(38 * MIB, 0, None).unwrap();
    assert_eq!(events(&mut a), [(Action::SegmentAlloc, 38 * MIB)], "60 MiB exceeds 38 MiB by 20 MiB or more");
}

#[test]
fn garbage_collection_threshold() {
    let mut a = CachingAllocator::new(conf_with("garbage_collection_threshold:0.5"), Some(100 * MIB));
    let x = a.malloc(30 * MIB, 0, None).unwrap();
    let y = a.malloc(30 * MIB, 0, None).unwrap();
    a.free(x);
    a.free(y);
    a.take_events();
    a.malloc(40 * MIB, 0, None).unwrap();
    assert_eq!(
        events(&mut a),
        [(Action::SegmentFree, 30 * MIB), (Action::SegmentFree, 30 * MIB), (Action::SegmentAlloc, 40 * MIB)],
        "60 MiB reserved > 50 MiB: cached segments of at least average age are freed first"
    );
    // Without a capacity (no memory fraction) there is no garbage collection.
    let mut a = CachingAllocator::new(conf_with("garbage_collection_threshold:0.5"), None);
    let x = a.malloc(30 * MIB, 0, None).unwrap();
    a.free(x);
    a.take_events();
    a.malloc(40 * MIB, 0, None).unwrap();
    assert_eq!(events(&mut a), [(Action::SegmentAlloc, 40 * MIB)]);
}

#[test]
fn release_on_oom_then_retry() {
    let mut a = CachingAllocator::new(conf(), Some(60 * MIB));
    let x = a.malloc(40 * MIB, 0, None).unwrap();
    a.free(x);
    a.take_events();
    a.malloc(50 * MIB, 0, None).unwrap();
    assert_eq!(events(&mut a), [(Action::SegmentFree, 40 * MIB), (Action::SegmentAlloc, 50 * MIB)]);
    assert_eq!(a.stats().num_alloc_retries, 1);
    let err = a.malloc(20 * MIB, 0, None).unwrap_err();
    assert_eq!(
        err,
        OomReport {
            request_bytes: 20 * MIB,
            reserved_bytes: 50 * MIB,
            allocated_bytes: 50 * MIB,
            free_in_reserved_bytes: 0,
            usable_free_bytes: 0,
            largest_free_block_bytes: 0,
            num_alloc_retries: 2,
            alloc_bytes: 20 * MIB,
            needed_bytes: 20 * MIB,
        }
    );
    assert_eq!(a.stats().num_ooms, 1);
    // Oversize blocks go first when max_split_size is set (release_available_cached_blocks, no retry).
    let mut a = CachingAllocator::new(conf_with("max_split_size_mb:32"), Some(90 * MIB));
    let x = a.malloc(40 * MIB, 0, None).unwrap();
    let _keep = a.malloc(30 * MIB, 0, None).unwrap();
    a.free(x);
    a.take_events();
    a.malloc(30 * MIB, 0, None).unwrap();
    assert_eq!(events(&mut a), [(Action::SegmentFree, 40 * MIB), (Action::SegmentAlloc, 30 * MIB)]);
    assert_eq!(a.stats().num_alloc_retries, 0);
}

/// A refused request's report counts as usable only the cached blocks `get_free_block` would look at: its pool's, of its
/// size (small or large), on its stream; the rest of what is reserved but unallocated stays in the totals.
#[test]
fn an_oom_report_tells_the_blocks_the_request_could_use() {
    // (request bytes, its stream, usable free bytes, largest usable block)
    let cases = [
        // A small request: the 30 MiB free are large blocks, and the device cannot give its 2 MiB segment.
        (100 * KIB, 0, 0, 0),
        // A large request on another stream: the free block is stream 0's.
        (5 * MIB, 1, 0, 0),
        // A large request on stream 0, too large for its free block.
        (40 * MIB, 0, 30 * MIB, 30 * MIB),
    ];
    for (request_bytes, stream, usable_bytes, largest_bytes) in cases {
        // A 60 MiB segment, half of it live, on a device of 61 MiB.
        let mut a = CachingAllocator::new(conf(), Some(61 * MIB));
        let whole = a.malloc(60 * MIB, 0, None).unwrap();
        a.free(whole);
        a.malloc(30 * MIB, 0, None).unwrap();
        let report = a.malloc(request_bytes, stream, None).unwrap_err();
        let what = format!("{request_bytes} B on stream {stream}");
        assert_eq!((report.reserved_bytes, report.free_in_reserved_bytes), (60 * MIB, 30 * MIB), "{what}");
        assert_eq!((report.usable_free_bytes, report.largest_free_block_bytes), (usable_bytes, largest_bytes), "{what}");
    }
}

#[test]
fn expandable_segments_map_and_unmap() {
    let mut a = CachingAllocator::new(conf_with("expandable_segments:True"), None);
    let x = a.malloc(30 * MIB, 0, Some(0x10_0000_0000)).unwrap();
    assert_eq!(x, 0x10_0000_0000);
    let y = a.malloc(5 * MIB, 0, None).unwrap();
    assert_eq!(y, x + 30 * MIB, "the mapped remainder serves it");
    let s = a.malloc(4096, 0, None).unwrap();
    assert_eq!(events(&mut a), [(Action::SegmentMap, 40 * MIB), (Action::SegmentMap, 2 * MIB)], "20 MiB / 2 MiB pages");
    let z = a.malloc(10 * MIB, 0, None).unwrap();
    assert_eq!(z, y + 5 * MIB, "grows at the end");
    assert_eq!(events(&mut a), [(Action::SegmentMap, 20 * MIB)]);
    assert_eq!(layout(&a)[0], [(30 * MIB, true), (5 * MIB, true), (10 * MIB, true), (15 * MIB, false)]);
    a.free(x);
    a.free(z);
    a.empty_cache();
    assert_eq!(
        events(&mut a),
        [(Action::SegmentUnmap, 20 * MIB), (Action::SegmentUnmap, 20 * MIB)],
        "whole free pages only: [0, 20) and [40, 60) MiB"
    );
    assert_eq!(
        layout(&a)[..2],
        [vec![(10 * MIB, false), (5 * MIB, true), (5 * MIB, false)], vec![(4096, true), (2 * MIB - 4096, false)]]
    );
    a.free(y);
    a.free(s);
    a.empty_cache();
    assert_eq!(events(&mut a), [(Action::SegmentUnmap, 20 * MIB), (Action::SegmentUnmap, 2 * MIB)]);
    assert!(a.report().is_empty());
    assert_eq!(a.stats().num_device_alloc, 3);
    assert_eq!(a.stats().num_device_free, 4);
    assert_eq!(a.reserved_bytes(), 0);
}

#[test]
fn expandable_oom_unmaps_free_pages_first() {
    let mut a = CachingAllocator::new(conf_with("expandable_segments:True"), Some(40 * MIB));
    let x = a.malloc(20 * MIB, 0, None).unwrap();
    a.malloc(20 * MIB, 0, None).unwrap();
    a.free(x);
    a.take_events();
    let err = a.malloc(30 * MIB, 0, None).unwrap_err();
    assert_eq!(events(&mut a), [(Action::SegmentUnmap, 20 * MIB)]);
    assert_eq!((err.reserved_bytes, err.num_alloc_retries), (20 * MIB, 1));
}

/// Requests of exabytes on streams of their own, each refused, each leaving its reservation behind, run the address
/// space out: a reservation that would end past `ADDRESS_LIMIT` is refused by the driver (the reservations' ends passed
/// 2^64 and the emulation panicked), with and without the recording's addresses.
#[test]
fn reservations_past_the_address_limit_are_refused() {
    for hint in [false, true] {
        let mut a = CachingAllocator::new(conf_with("expandable_segments:True"), Some(80 * GIB));
        for stream in 0..40u64 {
            let base_hint = hint.then(|| ADDRESS_LIMIT - (1 << 60) - 512 * stream);
            assert!(a.malloc(1 << 60, 0x1000 + stream, base_hint).is_err(), "stream {stream}: 1 EiB on 80 GiB");
        }
        // What was reserved stays within the limit, and a request that fits is still served.
        assert!(a.expandable.iter().flatten().all(|segment| segment.base + segment.size <= ADDRESS_LIMIT), "hint {hint}");
        assert!(a.malloc(64 * MIB, 0, None).is_ok(), "hint {hint}");
    }
}

/// Under a memory fraction PyTorch refuses a request whose whole allocation size would pass the allowed bytes before
/// mapping a page (`alloc_block`'s `set_fraction` check), garbage collection on or not; on a device of the same bytes
/// without a fraction, the pages it needs are mapped. 50 MiB takes three 20 MiB pages; 45 MiB more needs two more
/// pages (100 MiB in all) but its allocation size passes 100.
#[test]
fn a_memory_fraction_refuses_by_the_allocation_size() {
    let cases = [
        ("expandable_segments:True,per_process_memory_fraction:0.5", 200 * MIB, false),
        ("expandable_segments:True,per_process_memory_fraction:0.5,garbage_collection_threshold:0.99", 200 * MIB, false),
        ("expandable_segments:True", 100 * MIB, true),
    ];
    for (settings, capacity, served) in cases {
        let mut a = CachingAllocator::new(conf_with(settings), Some(capacity));
        a.malloc(50 * MIB, 0, None).unwrap();
        assert_eq!(a.reserved_bytes(), 60 * MIB, "{settings}");
        assert_eq!(a.malloc(45 * MIB, 0, None).is_ok(), served, "{settings}");
    }
}

/// A segment of `size` bytes at `address` reserved, used whole, its block freed (cached) and the segment freed.
fn cached_then_released(address: u64, size: u64) -> Vec<TraceEntry> {
    let segment = [Action::SegmentAlloc, Action::Alloc, Action::FreeRequested, Action::FreeCompleted, Action::SegmentFree];
    segment.into_iter().map(|action| entry(action, address, size)).collect()
}

/// A recorded `oom` on no capacity given: its device is what was reserved there plus the driver's free bytes it
/// recorded, measured after PyTorch released its cache (the `segment_free` entries before it). A 500 MiB segment cached
/// and released, then 700 MiB refused with 600 MiB free: refused here too (the released bytes are not counted twice,
/// once cached and once free).
#[test]
fn a_recorded_oom_without_a_capacity_counts_released_memory_once() {
    let a = 0x7000_0000_0000;
    let mut oom = entry(Action::Oom, 0, 700 * MIB);
    oom.set_device_free(Some(600 * MIB));
    let mut trace = cached_then_released(a, 500 * MIB);
    trace.push(oom);
    let snap = Snapshot { device_traces: vec![trace], ..Snapshot::default() };
    let em = emulate(&snap, 0, &conf(), None).unwrap();
    assert_eq!(em.first_oom.map(|oom| oom.event_index), Some(5), "{:?}", em.fidelity);
    assert!(em.fidelity.is_exact(), "{:?}", em.fidelity);
}

fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
    TraceEntry::new(action, addr, size)
}

/// A block of a final segment: allocated for `requested` bytes, or inactive for none.
fn final_block(address: u64, size: u64, requested: u64) -> Block {
    Block {
        address,
        size,
        requested_size: requested,
        state: if requested == 0 { BlockState::Inactive } else { BlockState::ActiveAllocated },
        frames: StackId::NONE,
    }
}

/// A final expandable segment of `stream` and `pool`: its `blocks`, side by side.
fn expandable_segment(stream: u64, pool: Pool, blocks: Vec<Block>) -> Segment {
    let (address, total_size) = (blocks[0].address, blocks.iter().map(|b| b.size).sum());
    Segment { stream, is_expandable: true, ..Segment::from_blocks(0, address, total_size, pool, blocks) }
}

/// A free of an allocation the recording never made, in no segment it shows (no final segment, no segment event):
/// PyTorch could not have held it, so the emulation leaves it out and its fidelity says so; one inside a segment
/// freed later is held.
#[test]
fn allocations_live_at_the_start_in_no_segment_are_left_out_and_said() {
    let a = 0x7000_0000_0000;
    // (trace, allocations left out)
    let cases = [
        (vec![entry(Action::FreeRequested, a, MIB), entry(Action::FreeCompleted, a, MIB)], 1),
        (
            vec![
                entry(Action::FreeRequested, a, MIB),
                entry(Action::FreeCompleted, a, MIB),
                entry(Action::SegmentFree, a, 2 * MIB),
            ],
            0,
        ),
    ];
    for (trace, left_out) in cases {
        let snap = Snapshot { device_traces: vec![trace], ..Snapshot::default() };
        let em = emulate(&snap, 0, &conf(), None).unwrap();
        assert_eq!(em.fidelity.start_left_out, left_out, "{:?}", snap.device_traces[0]);
        assert_eq!(em.fidelity.is_exact(), left_out == 0, "{:?}", em.fidelity);
    }
}

#[test]
fn empty_cache_is_taken_from_unexplained_segment_frees() {
    let a = 0x7000_0000_0000;
    let b = 0x7100_0000_0000;
    let mut trace = cached_then_released(a, 30 * MIB);
    trace.extend([entry(Action::SegmentAlloc, b, 30 * MIB), entry(Action::Alloc, b, 30 * MIB)]);
    let snap = Snapshot { device_traces: vec![trace], ..Snapshot::default() };
    let em = emulate(&snap, 0, &conf(), None).unwrap();
    assert!(em.fidelity.is_exact(), "{:?}", em.fidelity);
    assert_eq!(em.fidelity.recorded, 3);
    assert_eq!(em.stats.num_device_free, 1);
}

#[test]
fn traces_without_addresses_get_increasing_bases() {
    let trace = vec![entry(Action::Alloc, 0, 30 * MIB), entry(Action::Alloc, 0, 4096), entry(Action::Alloc, 0, 40 * MIB)];
    let snap = Snapshot { device_traces: vec![trace], ..Snapshot::default() };
    let em = emulate(&snap, 0, &conf(), None).unwrap();
    let bases: Vec<u64> = em.segment_events.iter().map(|e| e.addr).collect();
    assert!(bases.windows(2).all(|w| w[0] < w[1]), "{bases:?}");
    assert_eq!(em.stats.num_device_alloc, 3);
}

#[test]
fn free_is_two_steps_allocated_then_active() {
    let mut a = CachingAllocator::new(conf(), None);
    let x = a.malloc(4 * MIB, 0, None).unwrap();
    assert!(a.free_requested(x));
    assert_eq!(a.stats().allocated_bytes.all().current, 0);
    assert_eq!(a.stats().active_bytes.all().current, 4 * MIB as i64);
    assert_eq!(a.report()[0].blocks[0].state, BlockState::ActivePendingFree);
    assert_eq!(a.malloc(4 * MIB, 0, None).map(|y| y == x), Ok(false), "a pending block is not reused");
    assert!(a.free_completed(x));
    assert_eq!(a.stats().active_bytes.all().current, 4 * MIB as i64);
}

/// Random requests on two streams, with and without expandable segments and a capacity: the counters
/// always agree with the blocks the allocator reports.
#[test]
fn counters_agree_with_the_layout_under_random_requests() {
    let mut rng = heapscope_core::rng::Rng::new(0x9E37_79B9_7F4A_7C15);
    let mut next = move || rng.next_u64();
    // (settings, capacity, base hints: for two requests in three a random address of 64 spaced 8 GiB apart, so
    // that reservations collide, get cut, and move when one reserved by a refused request without a hint gets one)
    for (overrides, capacity, hinted) in [
        ("", None, false),
        ("expandable_segments:True", None, false),
        ("max_split_size_mb:64", Some(600 * MIB), false),
        ("expandable_segments:True", Some(300 * MIB), false),
        ("garbage_collection_threshold:0.5,roundup_power2_divisions:4", Some(400 * MIB), false),
        ("expandable_segments:True", Some(300 * MIB), true),
        ("expandable_segments:True", None, true),
    ] {
        let mut a = CachingAllocator::new(conf_with(overrides), capacity);
        let mut live: Vec<u64> = Vec::new();
        for step in 0..3000 {
            if live.is_empty() || next() % 3 != 0 {
                let size = match next() % 4 {
                    0 => next() % (64 * 1024),
                    1 => next() % (2 * MIB),
                    2 => next() % (30 * MIB),
                    _ => next() % (120 * MIB),
                };
                let hint = (hinted && next() % 3 != 0).then(|| (1 << 32) + (next() % 64) * (8 << 30));
                let streams = if hinted { 24 } else { 2 };
                if let Ok(addr) = a.malloc(size, next() % streams, hint) {
                    live.push(addr);
                }
            } else {
                let addr = live.swap_remove((next() % live.len() as u64) as usize);
                assert!(a.free(addr));
            }
            if step % 500 == 0 {
                a.empty_cache();
            }
            let report = a.report();
            let s = a.stats();
            let total: u64 = report.iter().map(|g| g.total_size).sum();
            let allocated: u64 = report.iter().map(|g| g.allocated_size).sum();
            let requested: u64 = report.iter().map(|g| g.requested_size).sum();
            assert_eq!(s.reserved_bytes.all().current, total as i64, "{overrides} step {step}");
            assert_eq!(a.reserved_bytes(), total);
            assert_eq!(s.allocated_bytes.all().current, allocated as i64);
            assert_eq!(s.requested_bytes.all().current, requested as i64);
            assert_eq!(s.allocation.all().current, live.len() as i64);
            if let Some(cap) = capacity {
                assert!(total <= cap);
            }
            if !a.conf().expandable_segments {
                let split_free: u64 = report
                    .iter()
                    .filter(|g| g.blocks.len() > 1)
                    .flat_map(|g| g.blocks.iter().filter(|b| b.state == BlockState::Inactive))
                    .map(|b| b.size)
                    .sum();
                assert_eq!(s.inactive_split_bytes.all().current, split_free as i64, "{overrides} step {step}");
                assert_eq!(s.segment.all().current, report.len() as i64);
            }
            for g in &report {
                let mut at = g.address;
                for b in &g.blocks {
                    assert_eq!(b.address, at, "blocks tile the segment");
                    at += b.size;
                }
            }
            // Reservations never overlap, and every mapped range lies in the one holding it.
            let mut ranges = a.expandable_segments();
            ranges.extend(report.iter().filter(|g| !g.is_expandable).map(|g| (g.address, g.total_size)));
            ranges.sort_unstable();
            assert!(ranges.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "{overrides} step {step}: {ranges:x?}");
            for g in report.iter().filter(|g| g.is_expandable) {
                let (base, size) = a.segment_at(g.address).unwrap();
                assert!(g.address + g.total_size <= base + size, "{overrides} step {step}");
            }
        }
    }
}

// ---- issue 14: expandable segments' bases from the trace ---------------------------------------------------

const GIB: u64 = 1 << 30;

/// Where each new expandable segment's reservation goes: (requests as (size, stream, hint), where each was
/// placed, the reservations after them as (base, virtual bytes)). A device with 80 GiB reserves 90 GiB per
/// segment, closer together than the emulation's default 128 GiB: the bases come from the hints, an earlier
/// segment is cut where the next reservation starts, a segment reserved without a hint (by an `oom`) moves
/// to the first hint that lands in it.
#[test]
fn issue_14_expandable_bases_come_from_the_trace() {
    const A: u64 = 0x3_0200_0000;
    const V: u64 = EXPANDABLE_VIRTUAL_BYTES;
    type Case = (&'static str, Vec<(u64, u64, Option<u64>)>, Vec<Option<u64>>, Vec<(u64, u64)>);
    let cases: Vec<Case> = vec![
        (
            "90 GiB apart: the first is cut where the second starts",
            vec![(100 * MIB, 0, Some(A)), (30 * MIB, 7, Some(A + 90 * GIB))],
            vec![Some(A), Some(A + 90 * GIB)],
            vec![(A, 90 * GIB), (A + 90 * GIB, V)],
        ),
        (
            "a hint inside the first's mapped pages is no base: synthetic, past everything",
            vec![(100 * MIB, 0, Some(A)), (30 * MIB, 7, Some(A + 60 * MIB))],
            vec![Some(A), Some(A + V)],
            vec![(A, V), (A + V, V)],
        ),
        (
            "below the first: ends where the first starts",
            vec![(100 * MIB, 0, Some(A + 10 * GIB)), (30 * MIB, 7, Some(A))],
            vec![Some(A + 10 * GIB), Some(A)],
            vec![(A + 10 * GIB, V), (A, 10 * GIB)],
        ),
        (
            "below the first with no room for the request's pages: synthetic",
            vec![(100 * MIB, 0, Some(A + 20 * MIB)), (30 * MIB, 7, Some(A))],
            vec![Some(A + 20 * MIB), Some(A + 20 * MIB + V)],
            vec![(A + 20 * MIB, V), (A + 20 * MIB + V, V)],
        ),
        (
            "the same base twice: synthetic",
            vec![(100 * MIB, 0, Some(A)), (30 * MIB, 7, Some(A))],
            vec![Some(A), Some(A + V)],
            vec![(A, V), (A + V, V)],
        ),
        (
            "no hint: synthetic, and mapped at once it stays (a later hint in it moves nothing)",
            vec![(100 * MIB, 0, Some(A)), (30 * MIB, 7, None), (10 * MIB, 7, Some(A + 90 * GIB))],
            vec![Some(A), Some(A + V), Some(A + V + 30 * MIB)],
            vec![(A, V), (A + V, V)],
        ),
    ];
    for (name, requests, placed, segments) in cases {
        let mut a = CachingAllocator::new(conf_with("expandable_segments:True"), None);
        let got: Vec<Option<u64>> = requests.iter().map(|&(size, stream, hint)| a.malloc(size, stream, hint).ok()).collect();
        assert_eq!(got, placed, "{name}");
        assert_eq!(a.expandable_segments(), segments, "{name}");
    }
    // A segment reserved by a refused request (an `oom`: no address) moves to where the next request that lands in
    // it was recorded, while nothing is mapped in it.
    let mut a = CachingAllocator::new(conf_with("expandable_segments:True"), Some(GIB));
    assert_eq!(a.malloc(100 * MIB, 0, Some(A)), Ok(A));
    assert!(a.malloc(2 * GIB, 9, None).is_err());
    assert_eq!(a.expandable_segments(), [(A, V), (A + V, V)], "reserved by the refused request, synthetic");
    assert_eq!(a.malloc(20 * MIB, 9, Some(A + 90 * GIB)), Ok(A + 90 * GIB));
    assert_eq!(a.expandable_segments(), [(A, 90 * GIB), (A + 90 * GIB, V)]);
    assert_eq!(a.segment_at(A + 90 * GIB - 1), Some((A, 90 * GIB)));
    assert_eq!(a.segment_at(A + 90 * GIB), Some((A + 90 * GIB, V)));
    // Such a segment, still unplaced, moves out of the way of a reservation the trace puts over it.
    let mut a = CachingAllocator::new(conf_with("expandable_segments:True"), Some(GIB));
    assert_eq!(a.malloc(100 * MIB, 0, Some(A)), Ok(A));
    assert!(a.malloc(2 * GIB, 9, None).is_err());
    assert_eq!(a.malloc(100 * MIB, 7, Some(A + V - 10 * GIB)), Ok(A + V - 10 * GIB));
    assert_eq!(a.expandable_segments(), [(A, V - 10 * GIB), (A + 2 * V, V), (A + V - 10 * GIB, V)], "past everything");
}

/// A recording as PyTorch would make it on an 80 GiB device with `expandable_segments:True`, from an empty
/// allocator: reservations 90 GiB apart (9/8 of the device), one per pool and stream (large and small on
/// stream 0, large on streams 7 and 9), an `oom` on stream 9 that reserves a segment it cannot map (no
/// address in the entry), a request that then lands in that segment at its real base, and a last `oom`
/// whose release unmaps free pages. Every segment event (with its address) and every placement must match.
#[test]
fn issue_14_expandable_recording_from_empty_with_oom_replays_exactly() {
    const R: u64 = 90 * GIB;
    const A: u64 = 0x3_0200_0000;
    const S: u64 = A + R;
    const B: u64 = A + 2 * R;
    const C: u64 = A + 3 * R;
    let on = |stream: u64, e: TraceEntry| e.with_stream(stream);
    let oom = |stream: u64, size: u64, device_free: u64| {
        entry(Action::Oom, 0, size).with_stream(stream).with_device_free(Some(device_free))
    };
    let trace = vec![
        entry(Action::SegmentMap, A, 100 * MIB),
        entry(Action::Alloc, A, 100 * MIB), // 1: 5 pages of 20 MiB
        entry(Action::SegmentMap, S, 2 * MIB),
        entry(Action::Alloc, S, 1000), // 3: the small pool's reservation
        on(7, entry(Action::SegmentMap, B, 40 * MIB)),
        on(7, entry(Action::Alloc, B, 30 * MIB)), // 5: stream 7's reservation, 10 MiB left mapped
        entry(Action::SegmentMap, A + 100 * MIB, 60 * MIB),
        entry(Action::Alloc, A + 100 * MIB, 50 * MIB), // 7: grows A
        entry(Action::FreeRequested, A, 100 * MIB),
        entry(Action::FreeCompleted, A, 100 * MIB),
        entry(Action::Alloc, A, 80 * MIB),            // 10: best fit, split
        entry(Action::Alloc, A + 80 * MIB, 12 * MIB), // 11
        oom(9, 30 * GIB, GIB),                        // 12: reserves stream 9's segment, cannot map it
        on(9, entry(Action::SegmentMap, C, 20 * MIB)),
        on(9, entry(Action::Alloc, C, 20 * MIB)), // 14: lands in it, at its real base
        entry(Action::FreeRequested, A + 100 * MIB, 50 * MIB),
        entry(Action::FreeCompleted, A + 100 * MIB, 50 * MIB), // 16: [A+92, A+160) MiB free
        entry(Action::SegmentUnmap, A + 100 * MIB, 60 * MIB),  // the last oom's release
        oom(0, 10 * GIB, 61 * MIB),                            // 18
    ];
    let (block, segment) = (final_block, expandable_segment);
    let final_segments = vec![
        segment(
            0,
            Pool::Large,
            vec![block(A, 80 * MIB, 80 * MIB), block(A + 80 * MIB, 12 * MIB, 12 * MIB), block(A + 92 * MIB, 8 * MIB, 0)],
        ),
        segment(0, Pool::Small, vec![block(S, 1024, 1000), block(S + 1024, 2 * MIB - 1024, 0)]),
        segment(7, Pool::Large, vec![block(B, 30 * MIB, 30 * MIB), block(B + 30 * MIB, 10 * MIB, 0)]),
        segment(9, Pool::Large, vec![block(C, 20 * MIB, 20 * MIB)]),
    ];
    let settings = RecordedSettings { expandable_segments: true, ..RecordedSettings::default() };
    let snap = Snapshot {
        categories: Vec::new(),
        pool_ids: Vec::new(),
        unknown_actions: Vec::new(),
        contender_export: None,
        segments: final_segments.clone(),
        device_traces: vec![trace.clone()],
        settings: Some(settings),
        frame_stacks: vec![Vec::new()],
    };
    let conf = AllocConf::from_recorded(snap.settings.as_ref().unwrap());
    let em = emulate(&snap, 0, &conf, None).unwrap();
    assert!(em.fidelity.is_exact(), "{:?}", em.fidelity);
    assert_eq!((em.fidelity.recorded, em.fidelity.allocs), (6, 7));
    let recorded: Vec<(Action, u64, usize)> =
        emulate::recorded_segment_events(&trace).iter().map(|e| (e.action, e.addr, e.cause)).collect();
    let emulated: Vec<(Action, u64, usize)> = em.segment_events.iter().map(|e| (e.action, e.addr, e.cause)).collect();
    assert_eq!(emulated, recorded, "every segment event at its recorded address");
    for (index, e) in trace.iter().enumerate().filter(|(_, e)| e.action == Action::Alloc) {
        assert_eq!(em.placements[index], Some(e.addr), "entry {index}");
    }
    assert_eq!(em.first_oom.map(|oom| oom.event_index), Some(12));
    assert_eq!(em.stats.num_ooms, 2);
    assert_eq!(em.final_segments, final_segments);
}

/// The shared GPT-2 expandable recording (H200: the small pool's reservation 157 GiB above the large
/// pool's) with the small pool's reservation moved to 90 GiB above, where an 80 GiB device's driver puts it:
/// still exact, at the moved addresses.
#[test]
fn issue_14_reservations_closer_than_the_default_replay_exactly() {
    let (mut snap, _) = load("gpt2_train_fixed-expandable");
    let large = snap.segments.iter().find(|s| s.segment_type == Pool::Large).unwrap().address;
    let small = snap.segments.iter().find(|s| s.segment_type == Pool::Small).unwrap().address;
    assert!(small - large > EXPANDABLE_VIRTUAL_BYTES, "the H200's reservations are farther apart than the default");
    let moved = large + 90 * GIB;
    let shift = |addr: &mut u64| {
        if *addr >= small {
            *addr = *addr - small + moved;
        }
    };
    for e in &mut snap.device_traces[0] {
        shift(&mut e.addr);
    }
    for s in &mut snap.segments {
        shift(&mut s.address);
        s.blocks.iter_mut().for_each(|b| shift(&mut b.address));
    }
    let conf = AllocConf::from_recorded(snap.settings.as_ref().unwrap());
    let em = emulate(&snap, 0, &conf, None).unwrap();
    assert!(em.fidelity.is_exact(), "{:?}", em.fidelity);
    assert!(em.fidelity.allocs > 6000);
    assert_eq!(em.final_segments, snap.segments.iter().map(strip).collect::<Vec<_>>());
    let recorded: Vec<u64> = emulate::recorded_segment_events(&snap.device_traces[0]).iter().map(|e| e.addr).collect();
    let emulated: Vec<u64> = em.segment_events.iter().map(|e| e.addr).collect();
    assert_eq!(emulated, recorded);
    // A recording cut in the middle rebuilds both reservations from the final segments, 90 GiB apart.
    let mut cut = snap.clone();
    let half = cut.device_traces[0].len() / 2;
    cut.device_traces[0].drain(..half);
    let em = emulate(&cut, 0, &conf, None).unwrap();
    assert!(em.fidelity.is_exact(), "{:?}", em.fidelity);
    let start = CachingAllocator::at_recording_start(&cut, 0, &conf, None).unwrap();
    assert_eq!(
        start.expandable_segments(),
        [(large, 90 * GIB), (moved, EXPANDABLE_VIRTUAL_BYTES)],
        "the large one ends where the small one starts"
    );
}

/// With every address hidden but where the first range goes, the driver's rule places the segments: every decision
/// (each segment event, PyTorch's own counters) stays as recorded on the shared traces, and frag_oom's segments land
/// where the driver put them. Without the trace's addresses, the recorded run's own ones are foretold by the rule
/// one at a time (`Fidelity::driver_rule`); the counts are in BENCHMARKS.md.
#[test]
fn shared_traces_keep_every_decision_with_their_addresses_hidden() {
    for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
        let (snap, truth) = load(name);
        let conf = AllocConf::from_recorded(snap.settings.as_ref().unwrap());
        let mut emulator = Emulator::new(&snap, 0, &conf, None).unwrap().hide_addresses();
        assert_eq!(emulator.allocator().address_source(), AddressSource::Driver);
        while emulator.step().is_some() {}
        let em = emulator.finish();
        let f = em.fidelity;
        eprintln!(
            "{name}, addresses hidden: segment events {}/{}, at the recorded address {}, placements {}/{}; \
             the rule foretold {}/{} as recorded",
            f.matched,
            f.recorded,
            f.addresses_matched,
            f.placement_matched,
            f.allocs,
            run(name, None).0.fidelity.driver_rule.foretold,
            run(name, None).0.fidelity.driver_rule.placed,
        );
        assert!(f.first_mismatch.is_none() && f.matched == f.recorded, "{name}: {f:?}");
        for (key, value) in truth["memory_stats"].as_object().unwrap() {
            assert_eq!(em.stats.get(key), value.as_i64(), "{name}: {key}");
        }
        if name == "frag_oom-default" {
            assert!(f.is_exact() && f.addresses_matched == f.recorded, "{name}: {f:?}");
        }
    }
}

/// A what-if that turns expandable segments off cannot take its segments' addresses from the trace: predicting the
/// default from an expandable recording, whose addresses rise, the driver's rule puts each `cudaMalloc` below the last,
/// so best fit's tie between two equal free segments goes to the later one, as on a real device. A what-if of the same
/// kind keeps the recorded addresses.
#[test]
fn a_what_if_places_its_segments_by_the_drivers_rule() {
    let base = 0x3_0200_0000;
    let trace = vec![
        entry(Action::SegmentMap, base, 40 * MIB),
        entry(Action::Alloc, base, 30 * MIB),
        entry(Action::SegmentMap, base + 40 * MIB, 20 * MIB),
        entry(Action::Alloc, base + 30 * MIB, 30 * MIB),
        entry(Action::FreeRequested, base, 30 * MIB),
        entry(Action::FreeCompleted, base, 30 * MIB),
        entry(Action::FreeRequested, base + 30 * MIB, 30 * MIB),
        entry(Action::FreeCompleted, base + 30 * MIB, 30 * MIB),
        entry(Action::Alloc, base, 30 * MIB),
    ];
    let settings = RecordedSettings { expandable_segments: true, ..RecordedSettings::default() };
    let snap = Snapshot { device_traces: vec![trace], settings: Some(settings), ..Snapshot::default() };
    let as_recorded = Emulator::new(&snap, 0, &AllocConf::of_snapshot(&snap), None).unwrap();
    assert_eq!(as_recorded.allocator().address_source(), AddressSource::Trace);
    let mut same_kind = AllocConf::of_snapshot(&snap);
    same_kind.parse_overrides("max_split_size_mb:64").unwrap();
    assert_eq!(Emulator::new(&snap, 0, &same_kind, None).unwrap().allocator().address_source(), AddressSource::Trace);
    let what_if = Emulator::new(&snap, 0, &conf(), None).unwrap();
    assert_eq!(what_if.allocator().address_source(), AddressSource::Driver);
    let mut em = what_if;
    while em.step().is_some() {}
    let em = em.finish();
    let [a, b, c] = [1, 3, 8].map(|i| em.placements[i].unwrap());
    assert_eq!((b + 32 * MIB, c), (a, b), "B a granule run below A; the tie goes to B, the lower");
    assert_eq!(a + 32 * MIB, DEFAULT_CUDA_MALLOC_TOP, "the first range ends where a process's usually do");
}

/// A private pool (a CUDA graph's, a `torch.cuda.MemPool`'s) serves only its own requests and is released only once
/// it is gone; a request in it never releases the allocator's whole cache to retry.
#[test]
fn private_pools_serve_only_their_own_requests() {
    let graph = (0, 1);
    let mut a = CachingAllocator::new(conf(), None);
    let x = a.malloc(1000, 0, None).unwrap();
    a.free(x);
    assert_eq!(events(&mut a), [(Action::SegmentAlloc, 2 * MIB)]);
    // The default pool's cached block does not serve the graph: a segment of its own.
    let y = a.malloc_in(graph, 1000, 0, None).unwrap();
    assert_eq!(events(&mut a), [(Action::SegmentAlloc, 2 * MIB)]);
    assert_ne!(a.segment_at(x), a.segment_at(y));
    a.free(y);
    // Each pool's cached block serves its own again.
    assert_eq!((a.malloc(1000, 0, None).unwrap(), a.malloc_in(graph, 1000, 0, None).unwrap()), (x, y));
    let pools: Vec<(u64, (i64, i64))> = a.report().iter().map(|s| (s.address, s.segment_pool_id)).collect();
    assert_eq!(pools, [(x, (0, 0)), (y, graph)], "each segment names its pool");
    a.free(x);
    a.free(y);
    // `emptyCache()` leaves a live graph's pool alone, and releases it once the graph is gone.
    a.empty_cache();
    assert_eq!(events(&mut a), [(Action::SegmentFree, 2 * MIB)]);
    a.set_freeable(graph);
    a.empty_cache();
    assert_eq!(events(&mut a), [(Action::SegmentFree, 2 * MIB)]);
    assert!(a.report().is_empty());

    // On a 40 MiB device holding a free 20 MiB segment: the default pool releases it to serve 30 MiB, the graph's
    // request runs out of memory instead.
    let full = || {
        let mut a = CachingAllocator::new(conf(), Some(40 * MIB));
        let x = a.malloc(5 * MIB, 0, None).unwrap();
        a.free(x);
        a.take_events();
        a
    };
    let mut a = full();
    assert!(a.malloc(30 * MIB, 0, None).is_ok());
    assert_eq!(events(&mut a), [(Action::SegmentFree, 20 * MIB), (Action::SegmentAlloc, 30 * MIB)]);
    let mut a = full();
    let refused = a.malloc_in(graph, 30 * MIB, 0, None).unwrap_err();
    assert!(events(&mut a).is_empty());
    // The default pool's free 20 MiB could not have served it: the graph's pool has no cached block.
    assert_eq!((refused.largest_free_block_bytes, refused.free_in_reserved_bytes), (0, 20 * MIB));
}

/// The default pool's segment at `d` caching a free block, then a graph captured into its private pool (`PoolId(1)`)
/// at `p`: its own segment though the default pool's block would fit, split, a block freed and reused inside it.
fn graph_captured(d: u64, p: u64) -> Vec<TraceEntry> {
    let graph = PoolId(1);
    vec![
        entry(Action::SegmentAlloc, d, 2 * MIB),
        entry(Action::Alloc, d, 1000),
        entry(Action::FreeRequested, d, 1000),
        entry(Action::FreeCompleted, d, 1000),
        entry(Action::SegmentAlloc, p, 2 * MIB).with_pool_id(graph),
        entry(Action::Alloc, p, 1000).with_pool_id(graph),
        entry(Action::Alloc, p + 1024, 3000).with_pool_id(graph),
        entry(Action::FreeRequested, p + 1024, 3000).with_pool_id(graph),
        entry(Action::FreeCompleted, p + 1024, 3000).with_pool_id(graph),
        entry(Action::Alloc, p + 1024, 2000).with_pool_id(graph),
    ]
}

/// A recording of PyTorch 2.12, from an empty allocator: a graph captured into its private pool while the default
/// pool holds a free block that would fit, then the graph deleted and `empty_cache()` releasing both pools. Replayed
/// exactly with the entries' `pool_id`; without them the graph's requests take the default pool's block.
#[test]
fn recordings_of_cuda_graphs_replay_exactly_with_their_pools() {
    let (d, p) = (0x7000_0000_0000_u64, 0x7000_0020_0000_u64);
    let graph = PoolId(1);
    let mut trace = graph_captured(d, p);
    trace.extend([
        // After the capture: the default pool's block again.
        entry(Action::Alloc, d, 1000),
        entry(Action::FreeRequested, d, 1000),
        entry(Action::FreeCompleted, d, 1000),
        // The graph deleted, then `torch.cuda.empty_cache()`: the default pools first, then the freed graph's.
        entry(Action::FreeRequested, p, 1000).with_pool_id(graph),
        entry(Action::FreeCompleted, p, 1000).with_pool_id(graph),
        entry(Action::FreeRequested, p + 1024, 2000).with_pool_id(graph),
        entry(Action::FreeCompleted, p + 1024, 2000).with_pool_id(graph),
        entry(Action::SegmentFree, d, 2 * MIB),
        entry(Action::SegmentFree, p, 2 * MIB).with_pool_id(graph),
        // PyTorch reserves a new segment at `d` for the last request: the recording says where.
        entry(Action::SegmentAlloc, d, 2 * MIB),
        entry(Action::Alloc, d, 1000),
    ]);
    let snap = Snapshot { device_traces: vec![trace], pool_ids: vec![(0, 0), (0, 1)], ..Snapshot::default() };
    let em = emulate(&snap, 0, &conf(), None).unwrap();
    assert!(em.fidelity.is_exact(), "{:?}", em.fidelity);
    assert_eq!((em.fidelity.recorded, em.fidelity.allocs, em.fidelity.placement_matched), (5, 6, 6));
    let blind = Snapshot { pool_ids: Vec::new(), ..snap.clone() };
    let em = emulate(&blind, 0, &conf(), None).unwrap();
    assert!(!em.fidelity.is_exact(), "without the pools the graph takes the default pool's block");

    // Cut mid-run (the state at the end as final segments, the first entries left out): the same decisions after the
    // cut, the graph's segment known to be its pool's from the final segments.
    let full = emulate(&snap, 0, &conf(), None).unwrap();
    let mut at_cut = snap.clone();
    at_cut.device_traces[0].truncate(10);
    at_cut.segments = emulate(&at_cut, 0, &conf(), None).unwrap().final_segments;
    assert_eq!(at_cut.segments.iter().map(|s| s.segment_pool_id).collect::<Vec<_>>(), [(0, 0), (0, 1)]);
    let mut cut = snap.clone();
    cut.segments = full.final_segments.clone();
    cut.device_traces[0].drain(..10);
    let em = emulate(&cut, 0, &conf(), None).unwrap();
    assert!(em.fidelity.is_exact(), "{:?}", em.fidelity);
}

/// With expandable segments a private pool reserves address space of its own: a graph's requests map pages there,
/// the default pool's in its own reservation, even where the two lie in reach of each other (100 GiB apart). From
/// empty and from every cut, each memory pool's pages are its own.
#[test]
fn expandable_private_pools_keep_their_own_reservations() {
    const GIB: u64 = 1 << 30;
    let (d, g) = (0x7000_0000_0000_u64, 0x7000_0000_0000_u64 + 100 * GIB);
    let graph = PoolId(1);
    let in_graph = |e: TraceEntry| e.with_pool_id(graph);
    let mut trace = vec![
        entry(Action::SegmentMap, d, 20 * MIB),
        entry(Action::Alloc, d, 5 * MIB),
        in_graph(entry(Action::SegmentMap, g, 20 * MIB)),
        in_graph(entry(Action::Alloc, g, 5 * MIB)),
        entry(Action::Alloc, d + 5 * MIB, 5 * MIB),
        in_graph(entry(Action::Alloc, g + 5 * MIB, 12 * MIB)),
        in_graph(entry(Action::FreeRequested, g, 5 * MIB)),
        in_graph(entry(Action::FreeCompleted, g, 5 * MIB)),
        entry(Action::FreeRequested, d, 5 * MIB),
        entry(Action::FreeCompleted, d, 5 * MIB),
        in_graph(entry(Action::Alloc, g, 4 * MIB)),
        entry(Action::Alloc, d, 3 * MIB),
        in_graph(entry(Action::SegmentMap, g + 20 * MIB, 20 * MIB)),
        in_graph(entry(Action::Alloc, g + 17 * MIB, 10 * MIB)),
        entry(Action::Alloc, d + 10 * MIB, 6 * MIB),
    ];
    let (snap, full) = exact_with_a_graph_from_every_cut(std::mem::take(&mut trace));
    assert_eq!((full.fidelity.recorded, full.fidelity.placement_matched), (3, 8));
    let pools: Vec<(u64, (i64, i64))> = full.final_segments.iter().map(|s| (s.address, s.segment_pool_id)).collect();
    assert_eq!(pools, [(d, (0, 0)), (g, (0, 1))]);
    let blind = Snapshot { pool_ids: Vec::new(), ..snap };
    let conf = conf_with("expandable_segments:True");
    assert!(!emulate(&blind, 0, &conf, None).unwrap().fidelity.is_exact(), "without the pools, one reservation");
}

/// `trace` (a graph's pool `PoolId(1)` = `(0, 1)`, expandable segments) replayed exactly from empty, and from every
/// cut with the final segments of the whole run: the recording and the whole run.
fn exact_with_a_graph_from_every_cut(trace: Vec<TraceEntry>) -> (Snapshot, Emulation) {
    let snap = Snapshot {
        device_traces: vec![trace],
        pool_ids: vec![(0, 0), (0, 1)],
        settings: Some(RecordedSettings { expandable_segments: true, ..RecordedSettings::default() }),
        ..Snapshot::default()
    };
    let conf = conf_with("expandable_segments:True");
    let full = emulate(&snap, 0, &conf, None).unwrap();
    assert!(full.fidelity.is_exact(), "{:?}", full.fidelity);
    for cut in 1..snap.device_traces[0].len() {
        let mut from_cut = snap.clone();
        from_cut.segments = full.final_segments.clone();
        from_cut.device_traces[0].drain(..cut);
        let em = emulate(&from_cut, 0, &conf, None).unwrap();
        assert!(em.fidelity.is_exact(), "cut at {cut}: {:?}", em.fidelity);
    }
    (snap, full)
}

/// A file before PyTorch 2.12 names no request's pool, only its final segments': a graph alive at the end, its
/// requests told by where they were placed (`RequestPools`), replays exactly from the start and from every cut.
#[test]
fn requests_in_a_graphs_final_segments_are_its_pools_in_files_before_2_12() {
    let (d, p) = (0x7000_0000_0000_u64, 0x7000_0020_0000_u64);
    let mut trace = graph_captured(d, p);
    trace.extend([entry(Action::Alloc, d, 1000), entry(Action::Alloc, d + 1024, 1000)]);
    let named = Snapshot { device_traces: vec![trace], pool_ids: vec![(0, 0), (0, 1)], ..Snapshot::default() };
    let full = emulate(&named, 0, &conf(), None).unwrap();
    assert!(full.fidelity.is_exact(), "{:?}", full.fidelity);
    // As PyTorch 2.11 writes it: the final segments name the graph's pool, the entries nothing.
    let mut old = named.clone();
    old.segments = full.final_segments.clone();
    old.device_traces[0].iter_mut().for_each(|entry| entry.pool_id = PoolId::DEFAULT);
    old.pool_ids = Vec::new();
    for cut in 0..old.device_traces[0].len() {
        let mut from_cut = old.clone();
        from_cut.device_traces[0].drain(..cut);
        let em = emulate(&from_cut, 0, &conf(), None).unwrap();
        assert!(em.fidelity.is_exact(), "cut at {cut}: {:?}", em.fidelity);
    }
    // Without the final segments' pools nothing tells the graph's requests apart.
    let mut blind = old.clone();
    blind.segments.iter_mut().for_each(|segment| segment.segment_pool_id = (0, 0));
    assert!(!emulate(&blind, 0, &conf(), None).unwrap().fidelity.is_exact());
}

/// The same for a graph's expandable segment (PyTorch 2.5 to 2.11 give private pools expandable segments and name no
/// request's pool): the pages its trace maps are its pool's, as the final segment's pool and reservation show, so a
/// recording cut before them does not hold them from its start (it held the graph's 1000 MiB from the first entry and
/// ran out of memory on a device with room for the run).
#[test]
fn a_graphs_expandable_pages_are_its_pools_in_files_before_2_12() {
    let (d, g) = (0x7000_0000_0000_u64, 0x7000_0000_0000_u64 + (100 << 30));
    let graph = |e: TraceEntry| e.with_pool_id(PoolId(1));
    let mut trace = vec![entry(Action::SegmentMap, d, 40 * MIB), entry(Action::Alloc, d, 30 * MIB)];
    trace.extend([Action::FreeRequested, Action::FreeCompleted].map(|action| entry(action, d, 30 * MIB)));
    trace.extend([graph(entry(Action::SegmentMap, g, 1000 * MIB)), graph(entry(Action::Alloc, g, 1000 * MIB))]);
    trace.push(entry(Action::Alloc, d, 20 * MIB));
    let expandable = conf_with("expandable_segments:True");
    let named = Snapshot { device_traces: vec![trace], pool_ids: vec![(0, 0), (0, 1)], ..Snapshot::default() };
    let full = emulate(&named, 0, &expandable, None).unwrap();
    assert!(full.fidelity.is_exact(), "{:?}", full.fidelity);
    let mut old = named.clone();
    old.segments = full.final_segments.clone();
    assert!(old.segments.iter().any(|segment| segment.segment_pool_id == (0, 1) && segment.is_expandable));
    old.device_traces[0].iter_mut().for_each(|entry| entry.pool_id = PoolId::DEFAULT);
    old.pool_ids = Vec::new();
    for cut in 0..old.device_traces[0].len() {
        let mut from_cut = old.clone();
        from_cut.device_traces[0].drain(..cut);
        // The device holds the run (1040 MiB at most), not the graph's pages twice over.
        let em = emulate(&from_cut, 0, &expandable, Some(1100 * MIB)).unwrap();
        assert!(em.fidelity.is_exact() && em.first_oom.is_none(), "cut at {cut}: {:?} {:?}", em.fidelity, em.first_oom);
    }
}

/// PyTorch before 2.5 served private pools from whole segments even with expandable segments on; a recording that shows
/// it (a graph's `segment_alloc` beside the default pool's mapped pages) replays so, from the start and every cut, where
/// the emulation mapped the graph's pages instead.
#[test]
fn a_graphs_whole_segments_under_expandable_segments_replay_as_recorded() {
    let (d, p) = (0x7000_0000_0000_u64, 0x7100_0000_0000_u64);
    let graph = |e: TraceEntry| e.with_pool_id(PoolId(1));
    let mut trace = vec![entry(Action::SegmentMap, d, 20 * MIB), entry(Action::Alloc, d, 5 * MIB)];
    trace.extend([graph(entry(Action::SegmentAlloc, p, 20 * MIB)), graph(entry(Action::Alloc, p, 5 * MIB))]);
    trace.extend([graph(entry(Action::Alloc, p + 5 * MIB, 3 * MIB)), entry(Action::Alloc, d + 5 * MIB, 2 * MIB)]);
    let expandable = conf_with("expandable_segments:True");
    let recorded = RecordedSettings { expandable_segments: true, ..RecordedSettings::default() };
    let mut snapshot =
        Snapshot { device_traces: vec![trace], pool_ids: vec![(0, 0), (0, 1)], settings: Some(recorded), ..Snapshot::default() };
    let full = emulate(&snapshot, 0, &expandable, None).unwrap();
    assert!(full.fidelity.is_exact(), "{:?}", full.fidelity);
    snapshot.segments = full.final_segments.clone();
    assert!(snapshot.segments.iter().any(|segment| segment.segment_pool_id == (0, 1) && !segment.is_expandable));
    for cut in 0..snapshot.device_traces[0].len() {
        let mut from_cut = snapshot.clone();
        from_cut.device_traces[0].drain(..cut);
        let em = emulate(&from_cut, 0, &expandable, None).unwrap();
        assert!(em.fidelity.is_exact(), "cut at {cut}: {:?}", em.fidelity);
    }
}

/// How a private pool's memory goes back, each as PyTorch records it: deleting a `torch.cuda.MemPool`
/// (`emptyCache(id)`: only that pool, the default pool's cached segment stays); a freed graph's expandable pages
/// unmapped by `empty_cache()`; a pool's own request releasing its oversize blocks (`max_split_size`), after which
/// the pool lives on and a later `empty_cache()` leaves it alone.
#[test]
fn private_pools_give_memory_back_as_pytorch_records_it() {
    let (d, p) = (0x7000_0000_0000_u64, 0x7000_0100_0000_u64);
    let pool = PoolId(1);
    let mine = |e: TraceEntry| e.with_pool_id(pool);
    let alloc_free = |addr: u64, size: u64, in_pool: bool| {
        [Action::Alloc, Action::FreeRequested, Action::FreeCompleted]
            .map(|action| if in_pool { mine(entry(action, addr, size)) } else { entry(action, addr, size) })
    };
    let mut mem_pool_deleted = vec![entry(Action::SegmentAlloc, d, 2 * MIB)];
    mem_pool_deleted.extend(alloc_free(d, 1000, false));
    mem_pool_deleted.push(mine(entry(Action::SegmentAlloc, p, 2 * MIB)));
    mem_pool_deleted.extend(alloc_free(p, 1000, true));
    mem_pool_deleted.extend([mine(entry(Action::SegmentFree, p, 2 * MIB)), entry(Action::Alloc, d, 1000)]);

    // Reservations lie far apart (PyTorch reserves more than the device's memory for each).
    let g = d + (100 << 30);
    let mut unmapped = vec![entry(Action::SegmentMap, d, 20 * MIB), entry(Action::Alloc, d, 5 * MIB)];
    unmapped.push(mine(entry(Action::SegmentMap, g, 20 * MIB)));
    unmapped.extend(alloc_free(g, 5 * MIB, true));
    unmapped.extend([mine(entry(Action::SegmentUnmap, g, 20 * MIB)), entry(Action::Alloc, d + 5 * MIB, MIB + 1)]);

    // On a 60 MiB device: two 22 MiB segments of the pool cached, its 40 MiB request releases both.
    let (p, q, c) = (d + 64 * MIB, d + 128 * MIB, d + 192 * MIB);
    let mut oversize = vec![entry(Action::SegmentAlloc, d, 12 * MIB), entry(Action::Alloc, d, 12 * MIB)];
    for base in [p, q] {
        oversize.extend([mine(entry(Action::SegmentAlloc, base, 22 * MIB)), mine(entry(Action::Alloc, base, 22 * MIB))]);
    }
    for base in [p, q] {
        oversize.extend(alloc_free(base, 22 * MIB, true)[1..].iter().cloned());
    }
    oversize.extend([
        mine(entry(Action::SegmentFree, p, 22 * MIB)),
        mine(entry(Action::SegmentFree, q, 22 * MIB)),
        mine(entry(Action::SegmentAlloc, c, 40 * MIB)),
    ]);
    oversize.extend(alloc_free(c, 40 * MIB, true));
    oversize.extend(alloc_free(d, 12 * MIB, false)[1..].iter().cloned());
    // `torch.cuda.empty_cache()`: the default pool's segment only, the pool's cached 40 MiB stay.
    oversize.extend([
        entry(Action::SegmentFree, d, 12 * MIB),
        entry(Action::SegmentAlloc, d, 2 * MIB),
        entry(Action::Alloc, d, 1000),
    ]);

    // Two graphs deleted, then `empty_cache()`: the default pool's cached segment first, then the freed pools in
    // PyTorch's hash map's order (here the second graph's before the first's).
    let second = |e: TraceEntry| e.with_pool_id(PoolId(2));
    let own = d + 32 * MIB;
    let mut two_graphs = vec![mine(entry(Action::SegmentAlloc, p, 2 * MIB))];
    two_graphs.extend(alloc_free(p, 1000, true));
    two_graphs.push(second(entry(Action::SegmentAlloc, d, 2 * MIB)));
    two_graphs.extend(alloc_free(d, 1000, false).map(second));
    two_graphs.push(entry(Action::SegmentAlloc, own, 2 * MIB));
    two_graphs.extend(alloc_free(own, 1000, false));
    two_graphs.extend([
        entry(Action::SegmentFree, own, 2 * MIB),
        second(entry(Action::SegmentFree, d, 2 * MIB)),
        mine(entry(Action::SegmentFree, p, 2 * MIB)),
        entry(Action::SegmentAlloc, d, 20 * MIB),
        entry(Action::Alloc, d, 5 * MIB),
    ]);

    // The user's `empty_cache()` calls: the runs that give the default pools' memory back unasked (not a pool's alone,
    // nor what the allocator gave back for a request of its own).
    let user_call = |trace: &[TraceEntry], addr: u64| {
        vec![
            trace.iter().position(|e| e.action == Action::SegmentFree && e.addr == addr && e.pool_id == PoolId::DEFAULT).unwrap(),
        ]
    };
    let (two_graphs_call, oversize_call) = (user_call(&two_graphs, own), user_call(&oversize, d));

    // (what, trace, settings, capacity, recorded segment events, the user's calls)
    let cases = [
        ("two graphs released in another order", two_graphs, "", None, 7, two_graphs_call),
        ("a MemPool deleted", mem_pool_deleted, "", None, 3, Vec::new()),
        ("a graph's pages unmapped", unmapped, "expandable_segments:True", None, 3, Vec::new()),
        (
            "a pool's oversize blocks released by its own request",
            oversize,
            "max_split_size_mb:20",
            Some(60 * MIB),
            8,
            oversize_call,
        ),
    ];
    for (what, trace, settings, capacity, recorded, calls) in cases {
        let snap = Snapshot { device_traces: vec![trace], pool_ids: vec![(0, 0), (0, 1), (0, 2)], ..Snapshot::default() };
        let conf = conf_with(settings);
        let em = emulate(&snap, 0, &conf, capacity).unwrap();
        assert!(em.fidelity.is_exact(), "{what}: {:?}", em.fidelity);
        assert_eq!((em.fidelity.recorded, em.fidelity.addresses_matched), (recorded, recorded), "{what}");
        assert_eq!(em.empty_caches, calls, "{what}");
        if settings.is_empty() {
            // The recording's own settings (it records none: PyTorch's defaults), as the lab finds the calls.
            assert_eq!(user_empty_caches(&snap, 0, capacity).unwrap(), calls, "{what}");
        }
        // Given the calls, the run is the same, pools released as before.
        let given: std::sync::Arc<[usize]> = calls.clone().into();
        let mut emulator = Emulator::new(&snap, 0, &conf, capacity).unwrap().with_empty_caches(given);
        while emulator.step().is_some() {}
        let again = emulator.finish();
        assert!(again.fidelity.is_exact(), "{what}, given: {:?}", again.fidelity);
        assert_eq!(again.empty_caches, calls, "{what}, given");
    }
}

/// A reservation of another memory pool between two of the default pool's keeps them apart: a page run of the default
/// pool above a graph's reservation, seen only in the trace (every page unmapped by the end), is a reservation of its
/// own, not the one below the graph's. Exact from every cut.
#[test]
fn a_private_reservation_between_two_of_the_default_pool_keeps_them_apart() {
    const GIB: u64 = 1 << 30;
    let d = 0x7000_0000_0000_u64;
    let (g, r) = (d + 40 * GIB, d + 60 * GIB);
    let graph = PoolId(1);
    let in_graph = |e: TraceEntry| e.with_pool_id(graph);
    let trace = vec![
        entry(Action::SegmentMap, d, 20 * MIB),
        entry(Action::Alloc, d, 5 * MIB),
        in_graph(entry(Action::SegmentMap, g, 20 * MIB)),
        in_graph(entry(Action::Alloc, g, 5 * MIB)),
        // Past what the default reservation below the graph's holds: a new one.
        entry(Action::SegmentMap, r, 50 * GIB),
        entry(Action::Alloc, r, 50 * GIB),
        entry(Action::FreeRequested, r, 50 * GIB),
        entry(Action::FreeCompleted, r, 50 * GIB),
        entry(Action::SegmentUnmap, r, 50 * GIB),
        entry(Action::Alloc, d + 5 * MIB, MIB + 1),
        // More than the reservation below the graph's holds: a new one (were the run above the graph's taken for part
        // of the one below, that would hold it).
        entry(Action::SegmentMap, d + 200 * GIB, 70 * GIB),
        entry(Action::Alloc, d + 200 * GIB, 70 * GIB),
        entry(Action::FreeRequested, d + 200 * GIB, 70 * GIB),
        entry(Action::FreeCompleted, d + 200 * GIB, 70 * GIB),
        entry(Action::SegmentUnmap, d + 200 * GIB, 70 * GIB),
        entry(Action::Alloc, d + 6 * MIB + 512, MIB + 1),
    ];
    let (_, full) = exact_with_a_graph_from_every_cut(trace);
    assert_eq!(full.fidelity.recorded, 6);
}

/// Recordings as PyTorch would make them with `expandable_segments:True` on a 180 GiB device (B200-class: reservations of
/// 202.5 GiB, 9/8 of the device, beyond the 128 GiB taken), each replayed from an empty allocator and from every cut
/// (the start state rebuilt from the final segments and the trace), on an unknown device and on one of 181 GiB (or,
/// where the device decides, only the latter): every segment event, every placement and the final segments are the
/// recorded ones.
#[test]
fn issue_14_reservations_beyond_128_gib_replay_exactly() {
    const R: u64 = 180 * GIB + 180 * GIB / 8;
    const A: u64 = 0x3_0200_0000;
    const S: u64 = A + R;
    const DEVICE: Option<u64> = Some(181 * GIB);
    let g = |offset: u64| A + offset * GIB;
    let map_alloc = |at: u64, gib: u64| vec![entry(Action::SegmentMap, g(at), gib * GIB), entry(Action::Alloc, g(at), gib * GIB)];
    let free =
        |at: u64, gib: u64| vec![entry(Action::FreeRequested, g(at), gib * GIB), entry(Action::FreeCompleted, g(at), gib * GIB)];
    let (block, segment) = (final_block, expandable_segment);
    let large = |blocks: &[(u64, u64, u64)]| {
        segment(0, Pool::Large, blocks.iter().map(|&(at, gib, live)| block(g(at), gib * GIB, live * GIB)).collect())
    };
    let small = segment(0, Pool::Small, vec![block(S, 1024, 1000), block(S + 1024, 2 * MIB - 1024, 0)]);
    // The large pool's reservation maps 130 GiB, then 30 GiB more at its end (every page mapped: the request lands at
    // the end, in the same reservation), serves one 150 GiB block across the 128 GiB mark from the pages mapped; the
    // small pool's reservation begins 202.5 GiB above; then the free 10 GiB at the end and 20 GiB more mapped after it.
    let grown = [
        map_alloc(0, 130),
        map_alloc(130, 30),
        free(0, 130),
        vec![entry(Action::Alloc, g(0), 50 * GIB), entry(Action::Alloc, g(50), 30 * GIB)],
        free(0, 50),
        free(50, 30),
        free(130, 30),
        vec![entry(Action::Alloc, g(0), 150 * GIB)],
        vec![entry(Action::SegmentMap, S, 2 * MIB), entry(Action::Alloc, S, 1000)],
        vec![entry(Action::SegmentMap, g(160), 20 * GIB), entry(Action::Alloc, g(150), 30 * GIB)],
    ]
    .concat();
    // The same, its large reservation emptied and every page unmapped at the end (`empty_cache`): the start state of a
    // cut comes from the trace's page runs alone.
    let mut emptied = grown.clone();
    emptied.extend([free(0, 150), free(150, 30), vec![entry(Action::SegmentUnmap, A, 180 * GIB)]].concat());
    // Everything freed, then more than the pages mapped asked for: the free run begins at the base.
    let at_base = [map_alloc(0, 120), free(0, 120), vec![entry(Action::SegmentMap, g(120), 10 * GIB)]].concat();
    let at_base = [at_base, vec![entry(Action::Alloc, A, 130 * GIB)]].concat();
    // A refused request's reservation (an `oom`, no address: placed where the emulation chooses) is not in the way of
    // the first one growing; freed, its two blocks are one free block that serves 150 GiB with no page mapped.
    let oom = entry(Action::Oom, 0, 170 * GIB).with_device_free(Some(160 * GIB));
    let past_oom = [map_alloc(0, 20), vec![oom], map_alloc(20, 140), free(0, 20), free(20, 140)].concat();
    let past_oom = [past_oom, vec![entry(Action::Alloc, A, 150 * GIB)]].concat();
    // 17 blocks of 10 GiB, every even one from 20 to 140 GiB freed and unmapped: a 40 GiB request fits no hole nor the
    // 32.5 GiB left of the reservation, and gets a second one (the emulation takes the first to span 9/8 of the 170 GiB
    // reserved at once, not twice 130 GiB). The first block stays: its base shows where the reservation begins.
    let mut overshoot: Vec<TraceEntry> = (0..17).flat_map(|i| map_alloc(10 * i, 10)).collect();
    overshoot.extend((2..16).step_by(2).flat_map(|i| free(10 * i, 10)));
    overshoot.extend((2..16).step_by(2).map(|i| entry(Action::SegmentUnmap, g(10 * i), 10 * GIB)));
    overshoot.extend([entry(Action::SegmentMap, S, 40 * GIB), entry(Action::Alloc, S, 40 * GIB)]);
    let mut overshoot_final = vec![large(&[(0, 10, 10), (10, 10, 10)])];
    overshoot_final.extend((3..15).step_by(2).map(|i| large(&[(10 * i, 10, 10)])));
    overshoot_final.push(large(&[(150, 10, 10), (160, 10, 10)]));
    overshoot_final.push(segment(0, Pool::Large, vec![block(S, 40 * GIB, 40 * GIB)]));
    // Best fit by the room beside a free block: [0, 10) and the unmapped [10, 30) (30 GiB) against [160, 170) and the
    // 32.5 GiB left of the reservation above it: PyTorch places 5 GiB at the base, which only a known device tells.
    let beside_tail = [map_alloc(0, 10), map_alloc(10, 20), map_alloc(30, 130), map_alloc(160, 10)].concat();
    let beside_tail =
        [beside_tail, free(10, 20), vec![entry(Action::SegmentUnmap, g(10), 20 * GIB)], free(0, 10), free(160, 10)].concat();
    let beside_tail = [beside_tail, vec![entry(Action::Alloc, A, 5 * GIB)]].concat();
    // (what, trace, final segments, devices)
    type Case = (&'static str, Vec<TraceEntry>, Vec<Segment>, Vec<Option<u64>>);
    let cases: Vec<Case> = vec![
        ("grown", grown, vec![large(&[(0, 150, 150), (150, 30, 30)]), small.clone()], vec![None, DEVICE]),
        ("emptied", emptied, vec![small], vec![None, DEVICE]),
        ("at its base", at_base, vec![large(&[(0, 130, 130)])], vec![None, DEVICE]),
        ("past an oom", past_oom, vec![large(&[(0, 150, 150), (150, 10, 0)])], vec![None, DEVICE]),
        ("a second reservation", overshoot, overshoot_final, vec![None, DEVICE]),
        (
            "beside the tail",
            beside_tail,
            vec![large(&[(0, 5, 5), (5, 5, 0)]), large(&[(30, 130, 130), (160, 10, 0)])],
            vec![DEVICE],
        ),
    ];
    let settings = RecordedSettings { expandable_segments: true, ..RecordedSettings::default() };
    let conf = AllocConf::from_recorded(&settings);
    for (what, trace, final_segments, devices) in cases {
        let snap = Snapshot {
            segments: final_segments.clone(),
            device_traces: vec![trace.clone()],
            settings: Some(settings.clone()),
            ..Snapshot::default()
        };
        for cut in 0..trace.len() {
            let mut cut_snap = snap.clone();
            cut_snap.device_traces[0].drain(..cut);
            for &capacity in &devices {
                let at = format!("{what}, cut at {cut}, device {capacity:?}");
                let em = emulate(&cut_snap, 0, &conf, capacity).unwrap();
                assert!(em.fidelity.is_exact(), "{at}: {:?}", em.fidelity);
                let rest = &cut_snap.device_traces[0];
                for (index, e) in rest.iter().enumerate().filter(|(_, e)| e.action == Action::Alloc) {
                    assert_eq!(em.placements[index], Some(e.addr), "{at}: entry {index}");
                }
                let recorded: Vec<(Action, u64, u64)> =
                    emulate::recorded_segment_events(rest).iter().map(|e| (e.action, e.addr, e.size_bytes)).collect();
                let emulated: Vec<(Action, u64, u64)> =
                    em.segment_events.iter().map(|e| (e.action, e.addr, e.size_bytes)).collect();
                assert_eq!(emulated, recorded, "{at}");
                // The request a free block was last part of is not what this is about (a cut may not know it).
                let live_requests = |segments: &[Segment]| -> Vec<Segment> {
                    let mut segments = segments.to_vec();
                    segments.iter_mut().flat_map(|s| &mut s.blocks).filter(|b| b.state == BlockState::Inactive).for_each(|b| {
                        b.requested_size = 0;
                    });
                    segments
                };
                assert_eq!(live_requests(&em.final_segments), final_segments, "{at}");
            }
        }
    }
}

/// A final expandable segment says its pool: the trace's runs over it are that pool's pages, whatever their length.
/// A paged heap's export maps its large segments in pages of 2 MiB; guessed by length, such runs were the small pool's,
/// beside the final segment's large reservation over the same pages: the start state held the final range mapped
/// (the trace maps it first), and with more runs the two reservations overlapped and the file was refused.
#[test]
fn a_final_segment_tells_the_pool_of_the_runs_over_it() {
    let base = 0x7e00_0000_0000u64;
    let segment = expandable_segment(0, Pool::Large, vec![final_block(base, 2 * MIB, 0)]);
    let trace = vec![entry(Action::SegmentMap, base, 6 * MIB), entry(Action::SegmentUnmap, base + 2 * MIB, 4 * MIB)];
    let snap = Snapshot { segments: vec![segment], device_traces: vec![trace], ..Snapshot::default() };
    let conf = AllocConf { expandable_segments: true, ..AllocConf::default() };
    let (start, _, left_out) = initial::rebuild_start_state(&snap, 0, &conf, None, &RequestPools::of(&snap, 0)).unwrap();
    assert_eq!((start.total_allocated_memory, left_out), (0, 0), "nothing mapped at the start");
    let em = emulate(&snap, 0, &conf, None).unwrap();
    assert_eq!(em.stats.num_ooms, 0);
}
