#!/usr/bin/env python3
"""Writes the seed corpus of the `snapshot` fuzz target (seeds/snapshot/, a few KB each at most).

Standard library only; run from the repository root: allocator/core/fuzz/seeds/make_snapshot_seeds.py.
Well-formed seeds: small synthetic snapshots (scripts/synthetic_snapshot.py, both layouts, protocols 2 to 5,
raw and gzip), the shared H200 frag_oom recordings cut to their first entries and segments, the legacy (<= 2.0)
schema and torch.cuda.memory_snapshot()'s list of segments, types no key holds and undecodable text, an expandable
recording whose end unmapped every page. Hostile seeds (hostile-*, refused): the inputs of issue 17 and their
kin, which the reader must refuse cleanly (deep nesting where the schema wants no nesting, memo gaps and sharing, bytes after the pickle, a cut
gzip stream, protocol 0, a class-building pickle, huge and negative sizes).
"""
import gzip
import os
import pickle
import struct
import subprocess
import sys
import tempfile

OUT = "allocator/core/fuzz/seeds/snapshot"
SHARED = "assets/traces/pytorch"


def write(name, data):
    assert len(data) <= 6000, f"{name}: {len(data)} bytes, more than a seed should hold"
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def gz(data):
    return gzip.compress(data, mtime=0)


def synthetic(events, *flags):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.pickle")
        subprocess.run([sys.executable, "scripts/synthetic_snapshot.py", path, "--events", str(events), *flags], check=True,
                       stdout=subprocess.DEVNULL)
        with open(path, "rb") as f:
            return f.read()


def cut(name, entries, segments):
    with gzip.open(os.path.join(SHARED, name)) as f:
        snapshot = pickle.load(f)
    snapshot["device_traces"] = [trace[:entries] for trace in snapshot["device_traces"]]
    snapshot["segments"] = snapshot["segments"][:segments]
    return pickle.dumps(snapshot, protocol=4)


def main():
    os.makedirs(OUT, exist_ok=True)
    write("synthetic-classic-p4.pickle", synthetic(12, "--protocol", "4", "--seed", "1"))
    write("synthetic-classic-p2.pickle", synthetic(8, "--protocol", "2", "--seed", "2"))
    write("synthetic-classic-p5.pickle.gz", gz(synthetic(30, "--protocol", "5", "--seed", "3")))
    write("synthetic-pytorch-layout.pickle", synthetic(12, "--layout", "pytorch", "--seed", "4"))
    write("synthetic-pytorch-no-frames.pickle", synthetic(20, "--layout", "pytorch", "--no-frames", "--one-stream", "--seed", "5"))
    write("frag_oom-default-cut.pickle", cut("frag_oom-default.pickle.gz", 24, 4))
    write("frag_oom-expandable-cut.pickle", cut("frag_oom-expandable.pickle.gz", 24, 2))
    block = {"size": 1 << 20, "state": "active_allocated", "history": [{"addr": 1 << 40, "real_size": 1000, "frames": [
        {"filename": "train.py", "line": 7, "name": "step"}]}]}
    legacy = {"segments": [{"device": 0, "address": 1 << 40, "total_size": 2 << 20, "allocated_size": 1 << 20,
                            "active_size": 1 << 20, "stream": 0, "segment_type": "small",
                            "blocks": [block, {"size": 1 << 20, "state": "inactive", "history": []}]}],
              "device_traces": [[{"action": "alloc", "addr": 1 << 40, "size": 1000, "stream": 0, "frames": []}]]}
    write("legacy-history.pickle", pickle.dumps(legacy, protocol=2))
    entry_frames = {"action": "alloc", "addr": 1 << 40, "size": 1000, "stream": 0, "time_us": 1}
    write("memory-snapshot-segments.pickle", pickle.dumps(legacy["segments"], protocol=4))
    # Types no snapshot key holds under keys added by hand, a file name Python could not decode (a lone surrogate),
    # and one empty list as the traces of three devices: all read.
    odd = {"segments": [], "device_traces": [[dict(entry_frames, frames=[{"filename": "bad\udcffname.py", "line": 3,
                                                                             "name": "f"}])]] + [[]] * 3,
           "notes": b"\x00\xff", "tags": {"a", "b"}, "frozen": frozenset([1]), "raw": bytearray(b"xy")}
    write("odd-types-and-text.pickle", pickle.dumps(odd, protocol=5))
    # An expandable recording whose end unmapped every page: its start state comes from the trace's maps alone.
    with gzip.open(os.path.join(SHARED, "frag_oom-expandable.pickle.gz")) as f:
        unmapped = pickle.load(f)
    last = unmapped["device_traces"][0][-1]
    unmapped["device_traces"][0] = unmapped["device_traces"][0][70:] + [
        dict(last, action="segment_unmap", addr=s["address"], size=s["total_size"]) for s in unmapped["segments"]]
    unmapped["segments"] = []
    write("expandable-unmapped-end.pickle", pickle.dumps(unmapped, protocol=4))
    # PyTorch 2.12: every trace entry names its memory pool (`pool_id`), some a CUDA graph's private pool, one as a
    # list; a final segment of that pool.
    graph = pickle.loads(cut("frag_oom-default.pickle.gz", 24, 4))
    for i, e in enumerate(graph["device_traces"][0]):
        e["pool_id"] = (0, 1) if 8 <= i < 16 else (0, 0)
    graph["device_traces"][0][-1]["pool_id"] = [0, 2]
    graph["segments"][-1]["segment_pool_id"] = (0, 1)
    write("pytorch-2.12-pool-ids.pickle", pickle.dumps(graph, protocol=4))

    # Hostile: each must end in a clean error (or a correct result), fast, in bounded memory.
    empty = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]]a"
    write("deep-tuples-in-ignored-key.pickle.gz",
          gz(empty + b"\x8c\x14external_annotationsN" + b"\x85" * 200000 + b"u."))
    write("hostile-deep-lists.pickle", b"\x80\x04" + b"]" * 2000 + b"a" * 1999 + b".")
    write("hostile-memo-gaps.pickle",
          b"\x80\x04N" + b"".join(b"r" + struct.pack("<I", (i + 1) << 20) for i in range(100)) + b".")
    entry = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0}
    trace = [entry] * 50
    write("hostile-shared-trace-list.pickle", pickle.dumps({"segments": [], "device_traces": [trace, trace, trace]}, protocol=4))
    blocks = [{"size": 512, "state": "active_allocated", "address": 4096}] * 4
    segment = {"device": 0, "address": 4096, "total_size": 2048, "stream": 0, "segment_type": "small", "blocks": blocks}
    write("hostile-shared-segment.pickle", pickle.dumps({"segments": [segment] * 4, "device_traces": [[]]}, protocol=4))
    small = pickle.dumps({"segments": [], "device_traces": [[entry]]}, protocol=4)
    write("hostile-trailing-pickle.pickle", small + small)
    write("hostile-second-gzip-member.pickle.gz", gz(small) + gz(small))
    write("hostile-cut-gzip.pickle.gz", gz(small)[:-6])
    write("hostile-protocol-0.pickle", pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=0))
    write("hostile-global-reduce.pickle", b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94\x8c\x04true\x94\x85\x94R\x94.")
    huge = {"action": "alloc", "addr": 2**64 - 512, "size": 2**64 - 512, "stream": 0}
    write("hostile-huge-sizes.pickle", pickle.dumps({"segments": [], "device_traces": [[huge, dict(huge, size=2**80)]]}, protocol=4))
    negative = {"action": "free_completed", "addr": -4096, "size": -1, "stream": -1}
    write("hostile-negative.pickle", pickle.dumps({"segments": [], "device_traces": [[negative]]}, protocol=4))
    write("hostile-nan-settings.pickle", pickle.dumps({"segments": [], "device_traces": [[]], "allocator_settings": {
        "garbage_collection_threshold": float("nan"), "roundup_power2_divisions": {"1": 3}}}, protocol=4))
    write("hostile-empty", b"")


if __name__ == "__main__":
    main()
