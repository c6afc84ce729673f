//! Tests: the four shared PyTorch 2.11 traces replayed exactly, and each rule on small hand-made traces.

use super::*;
use crate::pytorch::json_fixture;
use crate::pytorch::snapshot::Snapshot;

fn load(name: &str) -> Option<(Snapshot, serde_json::Value)> {
    let snap = json_fixture::load(std::path::Path::new(&format!("/tmp/heapscope-json/{name}.json")))?;
    let truth_text = std::fs::read_to_string(format!("/work/shared/traces/pytorch-2.11-h200/{name}.json")).ok()?;
    Some((snap, serde_json::from_str(&truth_text).unwrap()))
}

fn run(name: &str, capacity: Option<u64>) -> Option<(Emulation, serde_json::Value, Snapshot)> {
    let (snap, truth) = load(name)?;
    let conf = AllocConf::from_recorded(snap.settings.as_ref().unwrap());
    Some((emulate(&snap, 0, &conf, capacity), truth, snap))
}

#[test]
fn shared_traces_replay_exactly() {
    for name in ["frag_oom-default", "frag_oom-expandable", "gpt2_train_fixed-default", "gpt2_train_fixed-expandable"] {
        let Some((em, truth, snap)) = run(name, None) else {
            eprintln!("skipping {name}: fixture missing");
            continue;
        };
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

fn strip(s: &Segment) -> Segment {
    let mut s = s.clone();
    s.frames = StackId::NONE;
    for b in &mut s.blocks {
        b.frames = StackId::NONE;
        if b.state == BlockState::Inactive {
            b.requested_size = 0;
        }
    }
    s
}
