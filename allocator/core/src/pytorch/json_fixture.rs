//! TEMPORARY test-only loader: builds a [`Snapshot`] from a JSON dump of a pickled snapshot (same keys,
//! frames stripped) in `/tmp/heapscope-json/`. It stands in for the pickle importer
//! (`heapscope_core::pytorch::read_snapshot`) until that is merged; then the tests should read the
//! `.pickle.gz` files in `/work/shared/traces/pytorch-2.11-h200/` with the real importer and this file
//! should be deleted.

use std::path::Path;

use serde_json::Value;

use super::Pool;
use super::snapshot::{Action, Block, BlockState, RecordedSettings, Segment, Snapshot, StackId, TraceEntry};

fn u(v: &Value, key: &str) -> u64 {
    match &v[key] {
        Value::Number(n) => n.as_u64().or_else(|| n.as_i64().map(|i| i as u64)).unwrap_or(0),
        _ => 0,
    }
}

/// Loads a JSON dump; `None` when the file is missing (tests then skip).
pub(crate) fn load(path: &Path) -> Option<Snapshot> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: Value = serde_json::from_str(&text).expect("valid json");
    let segments = v["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .map(|s| Segment {
            device: u(s, "device") as u32,
            address: u(s, "address"),
            total_size: u(s, "total_size"),
            allocated_size: u(s, "allocated_size"),
            active_size: u(s, "active_size"),
            requested_size: u(s, "requested_size"),
            stream: u(s, "stream"),
            segment_type: if s["segment_type"] == "small" { Pool::Small } else { Pool::Large },
            segment_pool_id: (0, 0),
            is_expandable: s["is_expandable"].as_bool().unwrap_or(false),
            frames: StackId::NONE,
            blocks: s["blocks"]
                .as_array()
                .expect("blocks")
                .iter()
                .map(|b| Block {
                    address: u(b, "address"),
                    size: u(b, "size"),
                    requested_size: b.get("requested_size").map_or(u(b, "size"), |_| u(b, "requested_size")),
                    state: match b["state"].as_str() {
                        Some("active_allocated") => BlockState::ActiveAllocated,
                        Some("active_pending_free") => BlockState::ActivePendingFree,
                        _ => BlockState::Inactive,
                    },
                    frames: StackId::NONE,
                })
                .collect(),
        })
        .collect();
    let device_traces = v["device_traces"]
        .as_array()
        .expect("device_traces")
        .iter()
        .map(|t| {
            t.as_array()
                .expect("trace")
                .iter()
                .map(|e| TraceEntry {
                    action: Action::from_name(e["action"].as_str().expect("action")).expect("known action"),
                    addr: u(e, "addr"),
                    size: u(e, "size"),
                    stream: u(e, "stream"),
                    time_us: e["time_us"].as_i64(),
                    device_free: e.get("device_free").map(|_| u(e, "device_free")),
                    frames: StackId::NONE,
                })
                .collect()
        })
        .collect();
    let s = &v["allocator_settings"];
    let max_split = s["max_split_size"].as_i64().unwrap_or(-1);
    let mut roundup: Vec<(u64, u64)> = s["roundup_power2_divisions"]
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.parse().unwrap_or(0), v.as_u64().unwrap_or(0))).collect())
        .unwrap_or_default();
    roundup.sort_unstable();
    let settings = RecordedSettings {
        alloc_conf: s["PYTORCH_CUDA_ALLOC_CONF"].as_str().unwrap_or("").to_string(),
        max_split_size: (max_split > 0 && max_split < i64::MAX).then_some(max_split as u64),
        garbage_collection_threshold: s["garbage_collection_threshold"].as_f64().unwrap_or(0.0),
        expandable_segments: s["expandable_segments"].as_bool().unwrap_or(false),
        roundup_power2_divisions: roundup,
    };
    Some(Snapshot { segments, device_traces, settings: Some(settings), frame_stacks: vec![Vec::new()] })
}
