#!/usr/bin/env python3
"""Write a synthetic PyTorch memory snapshot (the schema of torch.cuda.memory._snapshot(), PyTorch >= 2.1).

Standard library only. For benchmarks and tests of snapshot readers: a plausible caching-allocator story
(segment_alloc of 2 MiB small and 20 MiB+ large segments, alloc / free_requested / free_completed of blocks
carved out of them, addresses in device-pointer range, a few streams), the final segments with their
blocks, and allocator_settings. Frames: a third of the entries have none (like a recording without
stacks), the rest share one of a few dozen frame-list objects (the pickle memo shares them, as in a file
where PyTorch's frame lists repeat) and one in ten has its own copy of an equal list.

    scripts/synthetic_snapshot.py OUT.pickle [--events N] [--gzip] [--protocol P] [--seed S]
"""
import argparse
import gzip
import pickle
import random

SMALL = 1 << 20
SMALL_SEGMENT = 2 << 20
LARGE_SEGMENT = 20 << 20
ROUND = 512


def make_stacks(rng, count):
    files = ["train.py", "model.py", "torch/nn/modules/module.py", "torch/nn/functional.py", "optim.py"]
    functions = ["forward", "backward", "step", "_call_impl", "linear", "attention", "<module>", "main"]
    stacks = []
    for _ in range(count):
        depth = rng.randint(1, 12)
        stacks.append([
            {"name": rng.choice(functions), "filename": rng.choice(files), "line": rng.randint(1, 3000)}
            for _ in range(depth)
        ])
    return stacks


def generate(events, seed):
    rng = random.Random(seed)
    stacks = make_stacks(rng, 40)
    streams = [0, 0, 0, 0x55d0c0ffee00]
    trace = []
    segments = {}  # base -> [total_size, next_offset, is_small, stream, live blocks]
    by_kind = {}  # (is_small, stream) -> bases, newest last
    live = {}  # addr -> (size, rounded, segment base)
    pending = []
    next_base = 0x7F3A00000000
    time_us = 1_795_981_000_000_000

    def entry(action, addr, size, stream):
        nonlocal time_us
        time_us += rng.randint(1, 40)
        item = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": time_us,
                "compile_context": "N/A", "user_metadata": ""}
        roll = rng.random()
        if roll < 0.6:
            item["frames"] = rng.choice(stacks)
        elif roll < 0.67:
            item["frames"] = [dict(frame) for frame in rng.choice(stacks)]
        trace.append(item)

    held = []  # live and not yet freed by the caller
    while len(trace) < events:
        roll = rng.random()
        if pending and (roll < 0.3 or len(live) > 3000 or len(trace) + 2 >= events):
            index = rng.randrange(len(pending))
            pending[index], pending[-1] = pending[-1], pending[index]
            addr = pending.pop()
            size, _, base = live.pop(addr)
            segment = segments[base]
            segment[4] -= 1
            if segment[4] == 0:
                segment[1] = 0  # empty again: the allocator reuses it from the start
                by_kind[(segment[2], segment[3])].append(base)
            entry("free_completed", addr, size, segment[3])
            continue
        if held and (roll < 0.62 or len(live) > 3000):
            index = rng.randrange(len(held))
            held[index], held[-1] = held[-1], held[index]
            addr = held.pop()
            entry("free_requested", addr, live[addr][0], segments[live[addr][2]][3])
            pending.append(addr)
            continue
        size = rng.choice([rng.randint(1, SMALL), rng.randint(SMALL, 64 << 20)])
        rounded = max(ROUND, (size + ROUND - 1) // ROUND * ROUND)
        small = rounded <= SMALL
        stream = rng.choice(streams)
        kind = by_kind.setdefault((small, stream), [])
        base = next((b for b in reversed(kind[-16:]) if segments[b][0] - segments[b][1] >= rounded), None)
        if base is None:
            total = SMALL_SEGMENT if small else max(LARGE_SEGMENT, (rounded + SMALL_SEGMENT - 1) // SMALL_SEGMENT * SMALL_SEGMENT)
            base = next_base
            next_base += total + (64 << 20)
            segments[base] = [total, 0, small, stream, 0]
            kind.append(base)
            entry("segment_alloc", base, total, stream)
            if len(trace) >= events:
                break
        addr = base + segments[base][1]
        segments[base][1] += rounded
        segments[base][4] += 1
        live[addr] = (size, rounded, base)
        held.append(addr)
        entry("alloc", addr, size, stream)

    pending_set = set(pending)
    final_segments = []
    for base, (total, _, small, stream, _) in sorted(segments.items()):
        blocks = []
        offset = 0
        for addr in sorted(a for a, (_, _, b) in live.items() if b == base):
            size, rounded, _ = live[addr]
            if addr - base > offset:
                blocks.append({"address": base + offset, "size": addr - base - offset, "requested_size": 0,
                               "state": "inactive", "frames": []})
            state = "active_pending_free" if addr in pending_set else "active_allocated"
            blocks.append({"address": addr, "size": rounded, "requested_size": size, "state": state,
                           "frames": rng.choice(stacks)})
            offset = addr - base + rounded
        if offset < total:
            blocks.append({"address": base + offset, "size": total - offset, "requested_size": 0,
                           "state": "inactive", "frames": []})
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        active = sum(b["size"] for b in blocks if b["state"] != "inactive")
        final_segments.append({
            "device": 0, "address": base, "total_size": total, "allocated_size": allocated,
            "active_size": active, "requested_size": sum(b["requested_size"] for b in blocks if b["state"] != "inactive"),
            "stream": stream, "segment_type": "small" if small else "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": blocks,
        })
    settings = {
        "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
        "expandable_segments": False,
        "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
    }
    return {"segments": final_segments, "device_traces": [trace], "allocator_settings": settings,
            "external_annotations": []}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--gzip", action="store_true", help="gzip the pickle (name it .pickle.gz)")
    parser.add_argument("--protocol", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    snapshot = generate(args.events, args.seed)
    opener = gzip.open if args.gzip else open
    with opener(args.out, "wb") as handle:
        pickle.dump(snapshot, handle, protocol=args.protocol)


if __name__ == "__main__":
    main()
