//! What a side-by-side replay of a recording does not tell apart, said in one sentence each: entries of actions
//! heapscope does not know ([`unknown_actions`]), final segments that disagree with the trace ([`final_state`]), expandable
//! segments switched on or off during the recording ([`switched_memory`]), requests that PyTorch served from private memory pools ([`pools`]), streams that some contenders ignore ([`streams`]) and contenders that never move under `--compact` ([`not_compacting`]). The CLI
//! prints them under its title, the app shows them when a recording opens ([`all`]): one wording, one place. And
//! where PyTorch's emulation does not reproduce the recorded OOM ([`recorded_oom`]) or the recorded decisions
//! ([`emulation_departs`]), said beside the verdict.

use heapscope_core::units::Bytes;
use heapscope_pytorch::caching::RequestPools;
use heapscope_pytorch::{Action, AllocConf, Fidelity};

use crate::compare::{CompareConfig, Figures, starts_afresh};
use crate::contender::Contender;
use crate::recording::{Moment, Recording, counted};

/// Every caveat of `recording` replayed by `contenders` with `config`, in the order said (under the CLI's title, in
/// the app's notice).
pub fn all(recording: &Recording, contenders: &[Contender], config: &CompareConfig) -> Vec<String> {
    [
        no_trace(recording),
        settings_string_not_in_effect(recording),
        unknown_actions(recording),
        final_state(recording),
        switched_memory(recording),
        pools(recording),
        streams(recording, contenders),
        start_afresh(recording, contenders, config),
        not_compacting(contenders, config),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The note that a snapshot records no trace for the device replayed (taken without
/// `torch.cuda.memory._record_memory_history()`, or `torch.cuda.memory_snapshot()`'s list of segments), or one of marks
/// alone (`snapshot`, `user_defined` or unknown entries, no allocation or free): there is nothing to replay, so every
/// contender only holds the blocks live in the final segments, and no verdict or advice says anything of what the
/// program did.
pub fn no_trace(recording: &Recording) -> Option<String> {
    let snapshot = recording.snapshot.as_ref()?;
    let entries = snapshot.device_traces.get(recording.device).map_or(&[][..], Vec::as_slice);
    if entries.iter().any(|entry| !entry.action.is_mark()) {
        return None;
    }
    let trace = if entries.is_empty() {
        "its trace is empty".to_owned()
    } else {
        format!("its trace holds {} and no allocation or free", counted(entries.len() as u64, "mark", "marks"))
    };
    Some(format!(
        "the file records no allocation history for device {} ({trace}: the snapshot was taken without \
         `torch.cuda.memory._record_memory_history()`): nothing is replayed, every contender only holds the blocks \
         live in its final segments, so the figures say nothing of what the program did; record the run with \
         `torch.cuda.memory._record_memory_history(max_entries=N)` before it for that",
        recording.device
    ))
}

/// The note that the trace's kind of memory for the default pools is not one setting's: it both reserves whole
/// segments (`segment_alloc`) and maps pages of expandable ones (`segment_map`), or it holds only the kind the recorded
/// settings (their value when the snapshot was taken) do not use. Expandable segments were switched during or after
/// the recording (`torch.cuda.memory._set_allocator_settings`), or a private pool freed before the end went unseen,
/// while PyTorch's emulation runs with one setting throughout. Private pools' memory, where the file tells it, is left
/// out (PyTorch before 2.5 reserved it whole under expandable segments).
pub fn switched_memory(recording: &Recording) -> Option<String> {
    let snapshot = recording.snapshot.as_ref()?;
    let entries = snapshot.device_traces.get(recording.device)?;
    let first = |action: Action| entries.iter().position(|entry| entry.action == action);
    let recorded = snapshot.settings.as_ref().map(|settings| settings.expandable_segments);
    // Cheapest first: most recordings hold one kind only, the recorded settings' (or record none).
    match (first(Action::SegmentAlloc), first(Action::SegmentMap), recorded) {
        (Some(_), Some(_), _) | (Some(_), None, Some(true)) | (None, Some(_), Some(false)) => {}
        _ => return None,
    }
    let pools = RequestPools::of(snapshot, recording.device);
    let default = |k: &usize| pools.pool_id(snapshot, *k, entries[*k].pool_id) == (0, 0);
    let first_default = |action: Action| (0..entries.len()).filter(|k| entries[*k].action == action).find(default);
    let on = |expandable: bool| if expandable { "expandable segments on" } else { "expandable segments off" };
    let why = "expandable segments were switched during or after the recording (`torch.cuda.memory._set_allocator_settings`), \
               or a CUDA graph's pool freed before the end (which PyTorch before 2.5 served from whole segments) is not \
               told apart";
    match (first_default(Action::SegmentAlloc), first_default(Action::SegmentMap), recorded) {
        (Some(reserved), Some(mapped), _) => Some(format!(
            "the trace both reserves whole segments (`segment_alloc`, first at entry {reserved}) and maps pages of \
             expandable ones (`segment_map`, first at entry {mapped}): {why}; PyTorch's emulation runs with one setting \
             throughout ({}), so on the other side of the switch its placements and out-of-memory verdicts are not the \
             recorded run's",
            on(AllocConf::of_snapshot(snapshot).expandable_segments)
        )),
        (reserved, mapped, Some(expandable)) if (reserved.is_some() && expandable) || (mapped.is_some() && !expandable) => {
            let (action, entry) = match (reserved, mapped) {
                (Some(reserved), _) => ("reserves whole segments (`segment_alloc`", reserved),
                (None, Some(mapped)) => ("maps pages of expandable segments (`segment_map`", mapped),
                (None, None) => return None,
            };
            Some(format!(
                "the recorded settings have {} (their value when the snapshot was taken), yet the trace {action}, first at \
                 entry {entry}) and nothing of the other kind: {why}; PyTorch's emulation runs with the recorded setting, \
                 `--alloc-conf expandable_segments:{}` as the trace shows",
                on(expandable),
                if expandable { "False" } else { "True" }
            ))
        }
        _ => None,
    }
}

/// The note that the snapshot's final segments disagree with what its trace leaves live at its end
/// ([`Recording::final_mismatch`]): the start state is rebuilt from both, so it, and every replay from it, may not be the
/// recorded run's.
pub fn final_state(recording: &Recording) -> Option<String> {
    let mismatch = recording.final_mismatch;
    let first = mismatch.first_address?;
    let mut parts = Vec::new();
    let be = |count: u64| if count == 1 { "is" } else { "are" };
    if mismatch.live_not_in_segments > 0 {
        let count = mismatch.live_not_in_segments;
        parts.push(format!(
            "{} the trace leaves live {} in none of them",
            counted(count, "allocation", "allocations"),
            be(count)
        ));
    }
    if mismatch.freed_but_allocated > 0 {
        let count = mismatch.freed_but_allocated;
        let was = if count == 1 { "was" } else { "were" };
        parts.push(format!("{} they show allocated {was} freed by the trace", counted(count, "block", "blocks")));
    }
    Some(format!(
        "the file's final segments do not match the end of its trace: {} (the first at {first:#x}); the file was edited, or \
         memory changed while the trace was not recording, so the start state, rebuilt from both, and every replay from it \
         may differ from the recorded run",
        parts.join(", ")
    ))
}

/// What any answer read from `recording` cannot tell, whoever replays it: no trace to replay ([`no_trace`]), actions
/// heapscope does not know ([`unknown_actions`]), final segments that disagree with the trace's end
/// ([`final_state`]). `advise` and `top` print them under their title.
pub fn of_recording(recording: &Recording) -> Vec<String> {
    [
        no_trace(recording),
        settings_string_not_in_effect(recording),
        unknown_actions(recording),
        final_state(recording),
        empty_caches_untold(recording),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The note that the `PYTORCH_CUDA_ALLOC_CONF` string the file records is not the settings its keys record, which were in
/// effect and which every replay runs with ([`AllocConf::recorded_string_in_effect`]).
pub fn settings_string_not_in_effect(recording: &Recording) -> Option<String> {
    let settings = recording.snapshot.as_ref()?.settings.as_ref()?;
    if AllocConf::recorded_string_in_effect(settings) {
        return None;
    }
    let in_effect = AllocConf::from_recorded(settings).overrides();
    let in_effect = if in_effect.is_empty() { "PyTorch's defaults".to_owned() } else { in_effect };
    Some(format!(
        "the file's PYTORCH_CUDA_ALLOC_CONF string, {:?}, is not the settings its keys record as in effect ({in_effect}): \
         PyTorch records the last string it parsed, and a parse leaves expandable_segments as it was (settings changed \
         while the program ran, torch.cuda.memory._set_allocator_settings); every replay runs with {in_effect}",
        settings.alloc_conf
    ))
}

/// The note that the user's `empty_cache()` calls among the recording's segment frees could not be told apart from
/// the allocator's own releases (the emulation of the recorded run refused the file): none is made by any replay.
pub fn empty_caches_untold(recording: &Recording) -> Option<String> {
    let why = recording.empty_caches_untold.as_ref()?;
    Some(format!(
        "its segment frees could not be told apart into `empty_cache()` calls and the allocator's own releases (the \
         emulation of the recorded run refused the file: {why}): no replay makes a call there, and each keeps its cache"
    ))
}

/// The note that entries of the device shown are of actions heapscope does not know (a later PyTorch's): read as marks,
/// allocating and freeing nothing, so every replay departs from the recording there if they change memory.
pub fn unknown_actions(recording: &Recording) -> Option<String> {
    let snapshot = recording.snapshot.as_ref()?;
    let mine: Vec<_> = snapshot.unknown_actions.iter().filter(|unknown| unknown.device == recording.device).collect();
    let first = mine.first()?;
    let mut names: Vec<String> = Vec::new();
    let mut more = 0;
    for unknown in &mine {
        // Shown cut: a name is the file's to choose.
        let chars = unknown.name.chars().count();
        let name = match chars {
            ..=64 => format!("{:?}", &*unknown.name),
            _ => format!("{:?}... ({chars} characters)", unknown.name.chars().take(64).collect::<String>()),
        };
        match names.len() {
            _ if names.contains(&name) => {}
            ..5 => names.push(name),
            _ => more += 1,
        }
    }
    if more > 0 {
        names.push(format!("{more} more"));
    }
    Some(format!(
        "{} of {} heapscope does not know ({}, the first at entry {}) {} read as marks, allocating and freeing \
         nothing: if {} memory, every replay departs from the recording there",
        counted(mine.len() as u64, "entry", "entries"),
        if names.len() == 1 { "an action" } else { "actions" },
        names.join(", "),
        first.entry,
        if mine.len() == 1 { "was" } else { "were" },
        if names.len() == 1 { "it changes" } else { "they change" },
    ))
}

/// The note that the recording uses private memory pools (CUDA graphs, `torch.cuda.MemPool`), which PyTorch serves
/// apart from the default pools: how many requests went there, as the entries say (`pool_id`, PyTorch 2.12 and later)
/// or as where they were placed in the final segments of a private pool shows ([`RequestPools`]); PyTorch's emulation
/// serves them apart, the other contenders do not. Private final segments in which no request was placed get the
/// note that no contender knows which requests went there.
pub fn pools(recording: &Recording) -> Option<String> {
    let snapshot = recording.snapshot.as_ref()?;
    let trace = snapshot.device_traces.get(recording.device).map_or(&[][..], Vec::as_slice);
    let pools = RequestPools::of(snapshot, recording.device);
    let (requests, used) = pools.private_requests(trace);
    if requests > 0 {
        let told = if pools.inferred() {
            " (as where they were placed shows: the file names no request's pool, PyTorch writes it from 2.12 on)"
        } else {
            ""
        };
        return Some(format!(
            "{} of the recording went to {}{told}, which PyTorch serves apart from the default pools (CUDA graphs, \
             torch.cuda.MemPool): PyTorch's emulation does too, the other contenders serve them from one heap with the rest",
            counted(requests as u64, "request", "requests"),
            counted(used as u64, "private memory pool", "private memory pools"),
        ));
    }
    let mut private: Vec<(i64, i64)> = Vec::new();
    let mut private_bytes = 0;
    for segment in snapshot.segments.iter().filter(|segment| segment.device as usize == recording.device) {
        if segment.segment_pool_id != (0, 0) {
            private_bytes += segment.total_size;
            if !private.contains(&segment.segment_pool_id) {
                private.push(segment.segment_pool_id);
            }
        }
    }
    (private_bytes > 0).then(|| {
        format!(
            "{} of the final segments belong to {} (CUDA graphs, torch.cuda.MemPool), which PyTorch serves apart from \
             the default pools; no request of the trace went to them: every contender here, PyTorch's emulation too, \
             serves every request from the default pools",
            Bytes(private_bytes),
            counted(private.len() as u64, "private memory pool", "private memory pools"),
        )
    })
}

/// The note, said once, that a recording of several CUDA streams is served by contenders that ignore streams.
pub fn streams(recording: &Recording, contenders: &[Contender]) -> Option<String> {
    let streams = recording.streams();
    let ignoring: Vec<&str> =
        contenders.iter().filter(|contender| !contender.pools_per_stream()).map(|contender| contender.name()).collect();
    (streams > 1 && !ignoring.is_empty()).then(|| {
        format!(
            "the recording uses {streams} CUDA streams: PyTorch's allocator keeps a pool per stream, {} {} every stream \
             from one heap",
            ignoring.join(", "),
            if ignoring.len() == 1 { "serves" } else { "serve" }
        )
    })
}

/// The note that `--compact` leaves some contenders as they are: the heap policies that keep no free runs by address
/// (`buddy`, `slab`, the linear ones) cannot be told where to place what moves, and PyTorch and gpu-allocator never
/// move memory. Their rows show no move; without this a user read them as finding nothing to move.
pub fn not_compacting(contenders: &[Contender], config: &CompareConfig) -> Option<String> {
    if config.compact == crate::compaction::CompactRule::Never {
        return None;
    }
    let names: Vec<&str> = contenders
        .iter()
        .filter(|contender| match contender {
            Contender::Heap(kind) => !kind.places_by_address(),
            Contender::Pytorch { .. } | Contender::GpuAllocator => true,
            Contender::Paged | Contender::Vma => false,
        })
        .map(|contender| contender.name())
        .collect();
    (!names.is_empty()).then(|| {
        let verb = if names.len() == 1 { "moves" } else { "move" };
        format!(
            "--compact {}: {} never {verb} allocations (only tlsf, best-fit and first-fit, which keep their free runs \
             by address, paged and vma compact)",
            config.compact,
            names.join(", ")
        )
    })
}

/// The note that a PyTorch contender running with the other kind of memory than the recording's (expandable segments
/// turned on or off) on a recording begun mid-run holds what was live at the start in segments of its own kind,
/// allocated afresh in address order (`caching::initial::reallocate_start_state`): what fragmentation the recorded
/// program had built before the recording is not known, so its figures can come out below a whole run's.
pub fn start_afresh(recording: &Recording, contenders: &[Contender], config: &CompareConfig) -> Option<String> {
    let names: Vec<String> = contenders
        .iter()
        .filter_map(|&contender| match contender {
            Contender::Pytorch { expandable } => {
                let conf = config.pytorch_conf(recording, expandable).ok()?;
                starts_afresh(recording, &conf).then(|| format!("`{}`", config.pytorch_name(recording, expandable)))
            }
            _ => None,
        })
        .collect();
    (!names.is_empty()).then(|| {
        format!(
            "{} (the other kind of memory than the recording's) allocates what was live at the start afresh, in address \
             order: the fragmentation before the recording is not known, so its figures can be lower than a whole run's",
            names.join(" and ")
        )
    })
}

/// The notes on PyTorch's emulation under the recorded settings, `figures` its run on a device of `capacity_bytes`
/// ([`emulation_departs`], then [`recorded_oom`]): said before the verdict by `compare` and `advise`. Nothing for
/// another run (no fidelity).
pub fn emulation(recording: &Recording, figures: &Figures, capacity_bytes: Option<u64>) -> Vec<String> {
    [emulation_departs(recording, figures.fidelity.as_ref(), capacity_bytes), recorded_oom(recording, figures)]
        .into_iter()
        .flatten()
        .collect()
}

/// The note that PyTorch's emulation under the recorded settings, on a device of `capacity_bytes`, did not reproduce
/// the recording's decisions (its `fidelity`: some segment events or placements differ): every figure of a PyTorch
/// run, the what-ifs' too, is then the emulation's rather than the recorded run's. Why, where it can tell: a device
/// smaller than the recorded run reserved at its peak (the emulation frees its cache or refuses where PyTorch did
/// not), a file without settings. Nothing for an exact replay, a what-if or a heap contender (`None`).
pub fn emulation_departs(recording: &Recording, fidelity: Option<&Fidelity>, capacity_bytes: Option<u64>) -> Option<String> {
    let fidelity = fidelity?;
    if fidelity.matched == fidelity.recorded && fidelity.placement_matched == fidelity.allocs {
        return None;
    }
    let recorded_peak =
        recording.snapshot.as_ref().map(|snapshot| crate::recording::recorded_peak_reserved(snapshot, recording.device));
    let small_device = match (capacity_bytes, recorded_peak) {
        (Some(capacity), Some(peak)) if capacity < peak => Some(format!(
            "the device of {} is smaller than the {} the recorded run reserved at its peak: the emulation frees its cache or \
             refuses where PyTorch did not",
            Bytes(capacity),
            Bytes(peak)
        )),
        _ => None,
    };
    let why = match (small_device, recording.snapshot.as_ref().map(|snapshot| snapshot.settings.is_some())) {
        (Some(why), _) => why,
        (None, Some(false)) if recording.snapshot.as_ref().is_some_and(AllocConf::expandable_from_file) => {
            "the file records no allocator settings: expandable segments were taken from its segments and PyTorch's \
             defaults for the rest, other settings would explain it"
                .to_owned()
        }
        (None, Some(false)) => {
            "the file records no allocator settings and PyTorch's defaults were assumed: other settings would explain it"
                .to_owned()
        }
        (None, _) => {
            "settings changed while the program ran, or memory taken beside PyTorch's allocator, would explain it".to_owned()
        }
    };
    Some(format!(
        "PyTorch's emulation under the recorded settings matched {} of {} recorded segment events and {} of {} placements \
         ({why}): its figures, and every what-if's, are the emulation's, not the recorded run's",
        fidelity.matched, fidelity.recorded, fidelity.placement_matched, fidelity.allocs
    ))
}

/// The note that PyTorch's emulation under the recorded settings did not refuse the request the recording's first
/// `oom` entry refused (it served it, or ran out elsewhere): its figures around there are not the recorded run's, and
/// a verdict built on them says so. `figures` is one replay's; nothing for a what-if, a heap contender (neither scores
/// its decisions against the recording's), or a recording without an `oom` entry.
pub fn recorded_oom(recording: &Recording, figures: &Figures) -> Option<String> {
    // The emulation under the recorded settings is the one run that scores its decisions against the recording's.
    if figures.what_if || figures.fidelity.is_none() {
        return None;
    }
    let (entry, _) = recording.first_oom()?;
    let emulated = match &figures.first_oom {
        Some(oom) if oom.moment == Moment::Entry(entry) => return None,
        Some(oom) => format!("first ran out of memory at entry {} instead", oom.event_index),
        None => "served it".to_owned(),
    };
    Some(format!(
        "the recording ran out of memory at entry {entry}; PyTorch's emulation under the recorded settings {emulated}: \
         its figures there are not the recorded run's (its fidelity says where its decisions part)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_core::PolicyKind;
    use heapscope_pytorch::{Action, PoolId, RecordedSettings, Snapshot, TraceEntry};

    /// The private pools note: said when a final segment of the device shown is in a pool other than `(0, 0)`, or one
    /// of its trace entries.
    #[test]
    fn the_pools_note_counts_the_private_pools_of_the_device_shown() {
        use heapscope_pytorch::{Pool, Segment};
        let segment = |device: u32, pool: (i64, i64), address: u64| Segment {
            segment_pool_id: pool,
            ..Segment::from_blocks(device, address, 2 << 20, Pool::Large, Vec::new())
        };
        let note = "of the final segments belong to";
        // (segments, the note's start)
        let cases: [(Vec<Segment>, Option<String>); 4] = [
            (Vec::new(), None),
            (vec![segment(0, (0, 0), 0)], None),
            (
                vec![segment(0, (1, 3), 0), segment(0, (0, 0), 1 << 30), segment(0, (1, 3), 2 << 30)],
                Some(format!("4.00 MiB {note} 1 private memory pool (")),
            ),
            (
                vec![segment(0, (1, 3), 0), segment(0, (2, 0), 1 << 30), segment(1, (5, 5), 2 << 30)],
                Some(format!("4.00 MiB {note} 2 private memory pools (")),
            ),
        ];
        for (segments, start) in cases {
            let snapshot = Snapshot { segments: segments.clone(), device_traces: vec![Vec::new(); 2], ..Snapshot::default() };
            let recording = Recording::from_snapshot("t.pickle", snapshot, 0).unwrap();
            let said = pools(&recording);
            match &start {
                Some(start) => assert!(said.as_deref().is_some_and(|said| said.starts_with(start.as_str())), "{said:?}"),
                None => assert_eq!(said, None, "{segments:?}"),
            }
        }
        // Entries naming their pool (PyTorch 2.12): counted from the trace of the device shown, with the segments' own.
        let entry = |addr: u64, pool: u8| TraceEntry::new(Action::Alloc, addr, 512).with_pool_id(PoolId(pool));
        // (device 0's trace, device 1's, the note's start)
        let cases: [(Vec<TraceEntry>, Vec<TraceEntry>, Option<&str>); 3] = [
            (vec![entry(0, 0)], vec![entry(0, 1)], None),
            (
                vec![entry(0, 1), entry(512, 1), entry(1024, 0)],
                Vec::new(),
                Some("2 requests of the recording went to 1 private memory pool, which"),
            ),
            (
                vec![entry(0, 1), entry(512, 2)],
                Vec::new(),
                Some("2 requests of the recording went to 2 private memory pools, which"),
            ),
        ];
        for (first, second, start) in cases {
            let snapshot = Snapshot {
                segments: vec![segment(0, (0, 0), 1 << 40), segment(0, (9, 9), 2 << 40)]
                    .into_iter()
                    .filter(|_| first.len() == 2)
                    .collect(),
                device_traces: vec![first, second],
                pool_ids: vec![(0, 0), (0, 1), (0, 2)],
                ..Snapshot::default()
            };
            let said = pools(&Recording::from_snapshot("t.pickle", snapshot, 0).unwrap());
            assert_eq!(said.as_deref().map(|said| &said[..start.map_or(0, str::len)]), start, "{said:?}");
        }
        // A file before 2.12: a request placed in a final segment of a private pool went there.
        let snapshot = Snapshot {
            segments: vec![segment(0, (0, 4), 1 << 40)],
            device_traces: vec![vec![entry((1 << 40) + 512, 0), entry(0, 0)]],
            ..Snapshot::default()
        };
        let said = pools(&Recording::from_snapshot("t.pickle", snapshot, 0).unwrap()).unwrap_or_default();
        let start = "1 request of the recording went to 1 private memory pool (as where they were placed shows: the file";
        assert!(said.starts_with(start), "{said}");
    }

    /// The compaction note, (rule, contenders, the note): said only where some contender cannot move what the rule asks
    /// it to.
    #[test]
    fn the_compaction_note_names_who_never_moves() {
        use crate::compaction::CompactRule;
        let (tlsf, buddy, paged) = (Contender::Heap(PolicyKind::Tlsf), Contender::Heap(PolicyKind::Buddy), Contender::Paged);
        let pytorch = Contender::Pytorch { expandable: false };
        let cases: [(CompactRule, Vec<Contender>, Option<&str>); 4] = [
            (CompactRule::Never, vec![buddy, pytorch], None),
            (CompactRule::OnOom, vec![tlsf, paged], None),
            (CompactRule::OnOom, vec![tlsf, buddy, pytorch], Some("--compact on-oom: buddy, pytorch never move allocations")),
            (CompactRule::Every(5), vec![buddy], Some("--compact every:5: buddy never moves allocations")),
        ];
        for (compact, contenders, said) in cases {
            let config = CompareConfig { compact, ..CompareConfig::default() };
            let note = not_compacting(&contenders, &config);
            assert_eq!(note.is_some(), said.is_some(), "{compact}: {note:?}");
            if let (Some(note), Some(said)) = (note, said) {
                assert!(note.starts_with(said), "{note}");
            }
        }
    }

    /// The streams note: said once, only when the recording has several streams and a contender ignores them.
    #[test]
    fn the_streams_note_names_who_ignores_streams() {
        let entry = |addr, stream| TraceEntry::new(Action::Alloc, addr, 512).with_stream(stream);
        let recording = |streams: &[u64]| {
            let trace = streams.iter().enumerate().map(|(index, &stream)| entry(index as u64 * 4096, stream)).collect();
            Recording::from_snapshot("t.pickle", Snapshot { device_traces: vec![trace], ..Snapshot::default() }, 0).unwrap()
        };
        let pytorch = Contender::Pytorch { expandable: false };
        let tlsf = Contender::Heap(PolicyKind::Tlsf);
        // (streams, contenders, the note)
        let cases: [(&[u64], &[Contender], Option<&str>); 4] = [
            (&[7, 7], &[pytorch, tlsf], None),
            (&[7, 9], &[pytorch], None),
            (
                &[7, 9, 11],
                &[pytorch, tlsf, Contender::Paged],
                Some(
                    "the recording uses 3 CUDA streams: PyTorch's allocator keeps a pool per stream, tlsf, paged serve every stream from one heap",
                ),
            ),
            (
                &[7, 9],
                &[tlsf],
                Some(
                    "the recording uses 2 CUDA streams: PyTorch's allocator keeps a pool per stream, tlsf serves every stream from one heap",
                ),
            ),
        ];
        for (streams, contenders, note) in cases {
            assert_eq!(super::streams(&recording(streams), contenders).as_deref(), note, "{streams:?} {contenders:?}");
        }
    }

    /// The recorded OOM: said when PyTorch's emulation under the recorded settings does not refuse the request the
    /// recording refused (here, on a device larger than the one its `oom` entry tells), not when it does, nor for a
    /// what-if or a heap contender.
    #[test]
    fn an_oom_the_emulation_does_not_reproduce_is_said() {
        use crate::compare::{CompareConfig, replay};
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch/frag_oom-default.pickle.gz");
        let recording = Recording::open(&path, 0).unwrap();
        let pytorch = Contender::Pytorch { expandable: false };
        // (contender, capacity, the note's end)
        let cases: [(Contender, Option<u64>, Option<&str>); 4] = [
            (pytorch, None, None),
            (pytorch, Some(100 << 30), Some("under the recorded settings served it: its figures")),
            (Contender::Pytorch { expandable: true }, Some(100 << 30), None),
            (Contender::Heap(PolicyKind::Tlsf), Some(100 << 30), None),
        ];
        for (contender, capacity_bytes, said) in cases {
            let config = CompareConfig { capacity_bytes, ..CompareConfig::default() };
            let outcome = replay(&recording, contender, &config).unwrap();
            let note = recorded_oom(&recording, outcome.figures().unwrap());
            assert_eq!(note.is_some(), said.is_some(), "{contender:?} on {capacity_bytes:?}: {note:?}");
            if let (Some(note), Some(said)) = (note, said) {
                assert!(
                    note.starts_with("the recording ran out of memory at entry 100; PyTorch's") && note.contains(said),
                    "{note}"
                );
            }
        }
    }

    /// The start state allocated afresh: said for a PyTorch contender of the other kind of memory than a mid-run
    /// recording's (by name, or by `--alloc-conf`), not for one of its kind, nor for a recording that starts empty.
    #[test]
    fn a_start_state_allocated_afresh_is_said() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/traces/pytorch/frag_oom-default.pickle.gz");
        let whole = Recording::open(&path, 0).unwrap();
        let mut snapshot = whole.snapshot.clone().unwrap();
        snapshot.device_traces[0].drain(..30);
        let cut = Recording::from_snapshot("cut", snapshot, 0).unwrap();
        let pytorch = Contender::Pytorch { expandable: false };
        let expandable = Contender::Pytorch { expandable: true };
        let flipped = CompareConfig { alloc_conf: Some("expandable_segments:True".to_owned()), ..CompareConfig::default() };
        // (recording, contenders, config, who is named)
        let cases: [(&Recording, &[Contender], &CompareConfig, Option<&str>); 5] = [
            (&cut, &[pytorch, expandable], &CompareConfig::default(), Some("`pytorch-expandable` (the other kind")),
            (&cut, &[pytorch], &CompareConfig::default(), None),
            (&cut, &[pytorch], &flipped, Some("`pytorch` (the other kind")),
            (&whole, &[pytorch, expandable], &CompareConfig::default(), None),
            (&cut, &[Contender::Heap(PolicyKind::Tlsf)], &CompareConfig::default(), None),
        ];
        for (recording, contenders, config, said) in cases {
            let note = start_afresh(recording, contenders, config);
            assert_eq!(note.is_some(), said.is_some(), "{contenders:?}: {note:?}");
            if let (Some(note), Some(said)) = (note, said) {
                assert!(note.starts_with(said) && note.contains("afresh, in address order"), "{note}");
            }
        }
    }

    /// Whole segments and mapped pages in one trace, or only the kind the recorded settings do not use: expandable
    /// segments were switched during or after the recording, unless the whole segments are a private pool's.
    #[test]
    fn a_switch_of_expandable_segments_is_said() {
        let (whole, pages) = (0x7000_0000_0000_u64, 0x7100_0000_0000_u64);
        let e = |action, addr, size, pool: u8| TraceEntry::new(action, addr, size).with_pool_id(PoolId(pool));
        let reserve = |pool| vec![e(Action::SegmentAlloc, whole, 2 << 20, pool), e(Action::Alloc, whole, 512, pool)];
        let map = || vec![e(Action::SegmentMap, pages, 2 << 20, 0), e(Action::Alloc, pages, 512, 0)];
        let both = "the trace both reserves whole segments (`segment_alloc`, first at entry";
        // (trace, the recorded expandable_segments, the note's start or none)
        let cases: [(Vec<TraceEntry>, Option<bool>, Option<&str>); 9] = [
            (
                [reserve(0), map()].concat(),
                None,
                Some(
                    "the trace both reserves whole segments (`segment_alloc`, first at entry 0) and maps pages of \
                     expandable ones (`segment_map`, first at entry 2)",
                ),
            ),
            ([map(), reserve(0)].concat(), Some(true), Some(both)),
            (map(), None, None),
            (map(), Some(true), None),
            (reserve(0), Some(false), None),
            // A CUDA graph's pool reserved whole under expandable segments (PyTorch before 2.5).
            ([reserve(1), map()].concat(), Some(true), None),
            (reserve(1), Some(true), None),
            // The recorded setting (its value at the end) is not the trace's kind.
            (
                reserve(0),
                Some(true),
                Some(
                    "the recorded settings have expandable segments on (their value when the snapshot was taken), yet \
                     the trace reserves whole segments (`segment_alloc`, first at entry 0)",
                ),
            ),
            (
                map(),
                Some(false),
                Some(
                    "the recorded settings have expandable segments off (their value when the snapshot was taken), yet \
                     the trace maps pages of expandable segments (`segment_map`, first at entry 0)",
                ),
            ),
        ];
        for (trace, expandable, said) in cases {
            let settings =
                expandable.map(|expandable_segments| RecordedSettings { expandable_segments, ..RecordedSettings::default() });
            let snapshot =
                Snapshot { device_traces: vec![trace], pool_ids: vec![(0, 0), (0, 1)], settings, ..Snapshot::default() };
            let recording = Recording::from_snapshot("t.pickle", snapshot, 0).unwrap();
            let note = switched_memory(&recording);
            assert_eq!(note.is_some(), said.is_some(), "{expandable:?}: {note:?}");
            if let (Some(note), Some(said)) = (note, said) {
                assert!(note.starts_with(said) && note.contains("_set_allocator_settings"), "{note}");
            }
        }
    }

    /// Every caveat together: the pools' first, then the streams', none for a plain recording.
    #[test]
    fn all_lists_the_caveats_in_order() {
        let entry = |addr: u64, stream: u64, pool: u8| {
            TraceEntry::new(Action::Alloc, addr, 512).with_stream(stream).with_pool_id(PoolId(pool))
        };
        let free = |addr: u64, stream: u64| TraceEntry::new(Action::FreeCompleted, addr, 512).with_stream(stream);
        let recording = |trace: Vec<TraceEntry>| {
            let snapshot = Snapshot { device_traces: vec![trace], pool_ids: vec![(0, 0), (1, 0)], ..Snapshot::default() };
            Recording::from_snapshot("t.pickle", snapshot, 0).unwrap()
        };
        let tlsf = [Contender::Heap(PolicyKind::Tlsf)];
        // (trace, how many caveats, the first's start)
        let cases: [(Vec<TraceEntry>, usize, &str); 6] = [
            (vec![entry(0, 7, 0), free(0, 7)], 0, ""),
            // A snapshot taken without recording the history: nothing to replay.
            (Vec::new(), 1, "the file records no allocation history for device 0 (its trace is empty"),
            // Marks alone are no history either.
            (
                vec![TraceEntry::new(Action::Snapshot, 0, 0); 2],
                1,
                "the file records no allocation history for device 0 (its trace holds 2 marks and no allocation",
            ),
            (vec![entry(0, 7, 0), entry(512, 9, 0), free(0, 7), free(512, 9)], 1, "the recording uses 2 CUDA streams"),
            (
                vec![entry(0, 7, 1), entry(512, 9, 0), free(0, 7), free(512, 9)],
                2,
                "1 request of the recording went to 1 private memory pool",
            ),
            // Left live with no final segment to show it.
            (
                vec![entry(0, 7, 1), entry(512, 9, 0), free(0, 7)],
                3,
                "the file's final segments do not match the end of its trace",
            ),
        ];
        for (trace, count, start) in cases {
            let said = all(&recording(trace), &tlsf, &CompareConfig::default());
            assert_eq!(said.len(), count, "{said:?}");
            assert!(said.first().is_none_or(|first| first.starts_with(start)), "{said:?}");
        }
    }

    /// Final segments that disagree with the end of the trace are said: how many each way, the first address.
    #[test]
    fn final_segments_that_disagree_with_the_trace_are_said() {
        use heapscope_pytorch::{Block, BlockState, Pool, Segment};
        let live = |address| Block::new(address, 512, 512, BlockState::ActiveAllocated);
        let alloc = |addr: u64| TraceEntry::new(Action::Alloc, addr, 512);
        let free = |addr: u64| TraceEntry::new(Action::FreeCompleted, addr, 512);
        let cases: [(Vec<Block>, Vec<TraceEntry>, Option<&str>); 4] = [
            (vec![live(0)], vec![alloc(0)], None),
            (
                vec![],
                vec![alloc(4096), alloc(8192)],
                Some(
                    "the file's final segments do not match the end of its trace: 2 allocations the trace leaves live are \
                      in none of them (the first at 0x1000); ",
                ),
            ),
            (
                vec![live(0)],
                vec![alloc(0), free(0)],
                Some(
                    "the file's final segments do not match the end of its trace: 1 block they show allocated was freed by \
                      the trace (the first at 0x0); ",
                ),
            ),
            (
                vec![live(0), live(512)],
                vec![free(0), free(512), alloc(4096)],
                Some(
                    "the file's final segments do not match the end of its trace: 1 allocation the trace leaves live is in \
                      none of them, 2 blocks they show allocated were freed by the trace (the first at 0x0); ",
                ),
            ),
        ];
        for (blocks, trace, start) in cases {
            let segment = Segment::from_blocks(0, 0, 2 << 20, Pool::Large, blocks);
            let snapshot = Snapshot { segments: vec![segment], device_traces: vec![trace], ..Snapshot::default() };
            let recording = Recording::from_snapshot("t.pickle", snapshot, 0).unwrap();
            let said = final_state(&recording);
            assert_eq!(said.as_deref().map(|said| &said[..start.map_or(0, str::len)]), start, "{said:?}");
        }
    }

    /// Entries of actions heapscope does not know are said for the device shown: how many, the names (each once, cut
    /// when long), the first.
    #[test]
    fn unknown_actions_are_said() {
        use heapscope_pytorch::UnknownAction;
        let long = "x".repeat(100);
        let unknown = |device: usize, entry: usize, name: &str| UnknownAction { device, entry, name: name.into() };
        let cases = [
            (vec![], None),
            (vec![unknown(1, 0, "nope")], None),
            (
                vec![unknown(0, 1, "nope")],
                Some("1 entry of an action heapscope does not know (\"nope\", the first at entry 1) was read as marks"),
            ),
            (
                vec![unknown(0, 1, "nope"), unknown(0, 2, &long), unknown(0, 3, "nope")],
                Some("3 entries of actions heapscope does not know (\"nope\", \"xxxx"),
            ),
        ];
        for (entries, start) in cases {
            let trace = vec![TraceEntry::new(Action::Unknown, 0, 0); 4];
            let snapshot =
                Snapshot { device_traces: vec![trace.clone(), trace], unknown_actions: entries, ..Snapshot::default() };
            let recording = Recording::from_snapshot("t.pickle", snapshot, 0).unwrap();
            let said = unknown_actions(&recording);
            assert_eq!(said.as_deref().map(|said| &said[..start.map_or(0, str::len)]), start, "{said:?}");
            if let Some(said) = said.filter(|said| said.contains("xxx")) {
                assert!(said.contains("... (100 characters), the first at entry 1) were read as marks"), "{said}");
            }
        }
    }

    /// The emulation's departure from the recorded decisions is said, with why it may be: nothing for an exact replay
    /// or none scored; a device smaller than the recorded run's peak reserved (2 MiB here) named first, then the file's
    /// missing settings where it records none.
    #[test]
    fn an_emulation_that_departs_from_the_recording_is_said() {
        const MIB: u64 = 1 << 20;
        let exact = Fidelity { recorded: 20, matched: 20, allocs: 40, placement_matched: 40, ..Fidelity::default() };
        let departs = Fidelity { matched: 0, ..exact };
        let with_settings = Snapshot { settings: Some(RecordedSettings::default()), ..Snapshot::default() };
        let matched = "PyTorch's emulation under the recorded settings matched";
        let placements = |segments: &str, placed: &str, why: &str| {
            format!("{matched} {segments} of 20 recorded segment events and {placed} of 40 placements ({why}")
        };
        let small = "the device of 1.00 MiB is smaller than the 2.00 MiB the recorded run reserved at its peak";
        // (snapshot, fidelity, capacity, the note's start)
        let cases = [
            (Snapshot::default(), None, None, None),
            (Snapshot::default(), Some(exact), Some(MIB), None),
            (Snapshot::default(), Some(departs), None, Some(placements("0", "40", "the file records no allocator settings"))),
            (Snapshot::default(), Some(departs), Some(MIB), Some(placements("0", "40", small))),
            (Snapshot::default(), Some(departs), Some(2 * MIB), Some(placements("0", "40", "the file records no"))),
            (
                with_settings.clone(),
                Some(Fidelity { placement_matched: 39, ..exact }),
                Some(2 * MIB),
                Some(placements("20", "39", "settings changed")),
            ),
            (with_settings, Some(Fidelity { placement_matched: 39, ..exact }), Some(MIB), Some(placements("20", "39", small))),
        ];
        for (snapshot, fidelity, capacity, start) in cases {
            let trace =
                vec![TraceEntry::new(Action::SegmentAlloc, 1 << 30, 2 * MIB), TraceEntry::new(Action::Alloc, 1 << 30, 512)];
            let snapshot = Snapshot { device_traces: vec![trace], ..snapshot };
            let recording = Recording::from_snapshot("t.pickle", snapshot, 0).unwrap();
            let said = emulation_departs(&recording, fidelity.as_ref(), capacity);
            let start = start.as_deref();
            assert_eq!(said.as_deref().map(|said| &said[..start.map_or(0, str::len)]), start, "{said:?}");
        }
        // Expandable segments the file shows without recording settings: taken from it, not assumed off.
        let trace = vec![TraceEntry::new(Action::SegmentMap, 1 << 30, 2 * MIB), TraceEntry::new(Action::Alloc, 1 << 30, 512)];
        let recording =
            Recording::from_snapshot("t.pickle", Snapshot { device_traces: vec![trace], ..Snapshot::default() }, 0).unwrap();
        let said = emulation_departs(&recording, Some(&departs), None).unwrap_or_default();
        let why = "the file records no allocator settings: expandable segments were taken from its segments and PyTorch's \
                   defaults for the rest";
        assert!(said.starts_with(&placements("0", "40", why)), "{said}");
    }
}
