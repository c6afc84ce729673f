#!/usr/bin/env python3
"""Write a synthetic PyTorch memory snapshot (the schema of torch.cuda.memory._snapshot(), PyTorch >= 2.1).

Standard library only. For benchmarks and tests of snapshot readers: a plausible caching-allocator story
(segment_alloc of 2 MiB small and 20 MiB+ large segments, alloc / free_requested / free_completed of blocks
carved out of them, addresses in device-pointer range, a few streams), the final segments with their
blocks, and allocator_settings. Frames: a third of the entries have none (like a recording without
stacks), the rest share one of a few dozen frame-list objects (the pickle memo shares them, as in a file
where PyTorch's frame lists repeat) and one in ten has its own copy of an equal list.

--layout pytorch writes the object graph of the files PyTorch >= 2.5 writes (the shared H200 files), so that
the pickle has their opcodes: every trace entry a dict of action, addr, size, stream, time_us,
compile_context, user_metadata and frames, keys and action names shared (fetched back from the memo with
BINGET / LONG_BINGET), each entry's compile_context a new str (SHORT_BINUNICODE, MEMOIZE), user_metadata the
one empty str, addr and time_us LONG1. Frames as PyTorch shares them: one dict object per distinct frame
(its strings new when it first appears), a new list of them for each segment_alloc, alloc and
free_requested, except that an alloc that made a segment shares the segment_alloc's list and a
free_completed shares its free_requested's; two frames a stack (a script's function and its module), as in
frag_oom-*.pickle.gz. --no-frames leaves frames out of the entries (a recording without stacks) and
--one-stream keeps everything on the default stream, as in gpt2_train_fixed-default.pickle.gz.
--pool-ids adds what PyTorch 2.12 writes last in every entry, its memory pool (`pool_id`, the default pools' (0, 0)
as a new tuple: BININT1 BININT1 TUPLE2 MEMOIZE, as the shared files write their segments' segment_pool_id).
--check-layout SHARED.pickle[.gz] then compares the trace entries' opcodes (pickletools) with those of a
shared file, field by field, and fails when the written file has its keys in another order, a value whose
opcodes the shared file never has under that key, or another most common entry: --no-frames against
gpt2_train_fixed-default, frames against frag_oom-default. Opcodes that depend on values rather than on the
layout are compared as one: BININT / BININT1 / BININT2 (how wide the int is), BINGET / LONG_BINGET (how many
memo slots come before: the keys are LONG_BINGET in a file with many segments before its trace); the keys'
own opcodes are left out (new or fetched, by what comes before them).

    scripts/synthetic_snapshot.py OUT.pickle [--events N] [--gzip] [--protocol P] [--seed S]
        [--layout {classic,pytorch}] [--no-frames] [--one-stream] [--pool-ids] [--check-layout SHARED]
"""
import argparse
import collections
import gzip
import pickle
import pickletools
import random
import sys

SMALL = 1 << 20
SMALL_SEGMENT = 2 << 20
LARGE_SEGMENT = 20 << 20
ROUND = 512


def fresh(text):
    """A new str object equal to `text` (PyTorch converts an entry's strings anew; the pickler memoizes each)."""
    return "".join(list(text)) if len(text) > 1 else text


def make_stacks(rng, count, new_strings=False):
    files = ["train.py", "model.py", "torch/nn/modules/module.py", "torch/nn/functional.py", "optim.py"]
    functions = ["forward", "backward", "step", "_call_impl", "linear", "attention", "<module>", "main"]
    text = fresh if new_strings else str
    stacks = []
    for _ in range(count):
        depth = rng.randint(1, 12)
        stacks.append([
            {"name": text(rng.choice(functions)), "filename": text(rng.choice(files)), "line": rng.randint(1, 3000)}
            for _ in range(depth)
        ])
    return stacks


def make_pytorch_stacks(rng, count):
    """Stacks of two frames, a function and its module, as frag_oom records them: each distinct frame one dict
    object (PyTorch shares them), its strings new, its line under 256 (BININT1)."""
    module = {"name": fresh("<module>"), "filename": fresh("train.py"), "line": rng.randint(100, 255)}
    functions = ["forward", "backward", "step", "_call_impl", "linear", "attention", "main", "wl_frag_oom"]
    frames = [{"name": fresh(name), "filename": fresh("train.py"), "line": rng.randint(1, 99)} for name in functions]
    return [[rng.choice(frames), module] for _ in range(count)]


def generate(events, seed, layout="classic", frames=True, one_stream=False, pool_ids=False):
    rng = random.Random(seed)
    pytorch = layout == "pytorch"
    stacks = make_pytorch_stacks(rng, 40) if pytorch else make_stacks(rng, 40)
    streams = [0] if one_stream else [0, 0, 0, 0x55d0c0ffee00]
    trace = []
    segments = {}  # base -> [total_size, next_offset, is_small, stream, live blocks]
    by_kind = {}  # (is_small, stream) -> bases, newest last
    live = {}  # addr -> (size, rounded, segment base)
    pending = []
    next_base = 0x7F3A00000000
    time_us = 1_795_981_000_000_000

    freed_frames = {}  # pytorch layout: addr -> the frame list of its free_requested
    made_segment = None  # pytorch layout: the frame list of the segment_alloc just written

    def entry(action, addr, size, stream):
        nonlocal time_us, made_segment
        time_us += rng.randint(1, 40)
        item = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": time_us,
                "compile_context": fresh("N/A") if pytorch else "N/A", "user_metadata": ""}
        roll = rng.random()
        if not frames:
            pass
        elif pytorch:
            if action == "alloc" and made_segment is not None:
                item["frames"] = made_segment
            elif action == "free_completed" and addr in freed_frames:
                item["frames"] = freed_frames.pop(addr)
            else:
                item["frames"] = list(rng.choice(stacks))
            made_segment = item["frames"] if action == "segment_alloc" else None
            if action == "free_requested":
                freed_frames[addr] = item["frames"]
        elif roll < 0.6:
            item["frames"] = rng.choice(stacks)
        elif roll < 0.67:
            item["frames"] = [dict(frame) for frame in rng.choice(stacks)]
        if pool_ids:
            item["pool_id"] = tuple([0, 0])
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
                           "frames": rng.choice(stacks) if frames else []})
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


def entry_shapes(raw):
    """The opcode names (FRAME left out) of every trace entry of a pickled snapshot, in order."""
    snapshot = pickle.loads(raw)
    count = sum(len(trace) for trace in snapshot["device_traces"])
    ops = [op.name for op, arg, _ in pickletools.genops(raw) if op.name != "FRAME"]
    args = [arg for op, arg, _ in pickletools.genops(raw) if op.name != "FRAME"]
    start = args.index("device_traces") + 1
    shapes, current, depth, entry_depth = [], None, 0, None
    for name in ops[start:]:
        if name in ("SETITEMS", "APPENDS"):
            depth -= 1
        if name == "EMPTY_DICT" and (entry_depth is None or depth == entry_depth):
            entry_depth = depth
            if current is not None:
                shapes.append(tuple(current))
            if len(shapes) == count:
                break
            current = []
        if current is not None and depth < entry_depth:
            shapes.append(tuple(current))
            current = None
            if len(shapes) == count:
                break
        if current is not None:
            current.append(name)
        if name == "MARK":
            depth += 1
    if current is not None and len(shapes) < count:
        shapes.append(tuple(current))
    return shapes


# Opcodes whose choice depends on a value, not on the layout: how wide an int is, how far the memo has grown.
NORMAL = {"BININT": "INT", "BININT1": "INT", "BININT2": "INT", "BINGET": "GET", "LONG_BINGET": "GET"}
CLOSE = {"MARK": None, "SETITEMS": -1, "APPENDS": -1}


def split_items(ops):
    """Splits a dict's or list's contents (the opcodes between its MARK and SETITEMS / APPENDS) into items."""
    items, index = [], 0
    while index < len(ops):
        start = index
        name = ops[index]
        index += 1
        if name in ("EMPTY_DICT", "EMPTY_LIST"):
            if index < len(ops) and ops[index] == "MEMOIZE":
                index += 1
            if index < len(ops) and ops[index] == "MARK":
                depth = 0
                while index < len(ops):
                    depth += {"MARK": 1, "SETITEMS": -1, "APPENDS": -1}.get(ops[index], 0)
                    index += 1
                    if depth == 0:
                        break
        elif index < len(ops) and ops[index] == "MEMOIZE":
            index += 1
        items.append(ops[start:index])
    return items


def entry_fields(raw):
    """Every trace entry of a pickled snapshot as (its keys in order, ((key, the value's opcodes), ...)), the
    value-dependent opcodes normalized (NORMAL); the keys' own opcodes are left out (whether a key is new or
    fetched from the memo depends on what the file holds before it)."""
    snapshot = pickle.loads(raw)
    entries = [entry for trace in snapshot["device_traces"] for entry in trace]
    fields = []
    for entry, shape in zip(entries, entry_shapes(raw)):
        inner = list(shape[3:-1]) if shape[2:3] == ("MARK",) else list(shape[2:-1])
        items = split_items(inner)
        keys = tuple(entry)
        values = items[1::2]
        fields.append((keys, tuple((key, " ".join(NORMAL.get(op, op) for op in value)) for key, value in zip(keys, values))))
    return fields


def check_layout(written, shared):
    """Compares the trace entries' opcodes of two pickles, field by field; True when they have the same layout:
    the same keys in the same order, every (key, value opcodes) of the written file in the shared one, and the
    same most common entry (the value-dependent opcodes normalized)."""
    def load(path):
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as handle:
            raw = handle.read()
        return collections.Counter(entry_shapes(raw)), entry_fields(raw)
    (ours, our_fields), (theirs, their_fields) = load(written), load(shared)
    for name, shapes in (("written", ours), ("shared", theirs)):
        total = sum(shapes.values())
        print(f"{name}: {total} entries, {len(shapes)} shapes; most common:")
        for shape, count in shapes.most_common(3):
            print(f"  {count / total:6.1%} {len(shape)} opcodes: {' '.join(shape)}")
    ok = True
    their_orders = {keys for keys, _ in their_fields}
    for keys in sorted({keys for keys, _ in our_fields} - their_orders):
        print(f"keys in an order the shared file lacks: {', '.join(keys)}")
        ok = False
    their_values = {pair for _, pairs in their_fields for pair in pairs}
    our_values = collections.Counter(pair for _, pairs in our_fields for pair in pairs)
    for (key, value), count in sorted(our_values.items()):
        if (key, value) not in their_values:
            print(f"not in the shared file ({count} entries): {key}: {value}")
            ok = False
    def top(fields):
        return collections.Counter(pairs for _, pairs in fields).most_common(1)[0][0]
    if top(our_fields) != top(their_fields):
        print("the most common entry layouts differ")
        ok = False
    print(f"{len(our_values)} field forms, all in the shared file" if ok else "layouts differ")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--gzip", action="store_true", help="gzip the pickle (name it .pickle.gz)")
    parser.add_argument("--protocol", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--layout", choices=["classic", "pytorch"], default="classic",
                        help="pytorch: the object graph (so the opcodes) of the files PyTorch >= 2.5 writes")
    parser.add_argument("--no-frames", action="store_true", help="no frames in trace entries or blocks")
    parser.add_argument("--one-stream", action="store_true", help="every entry on the default stream")
    parser.add_argument("--pool-ids", action="store_true", help="every entry's memory pool, as PyTorch 2.12 writes it")
    parser.add_argument("--check-layout", metavar="SHARED",
                        help="compare the trace entries' opcodes with those of this snapshot; exit 1 if they differ")
    args = parser.parse_args()
    snapshot = generate(args.events, args.seed, args.layout, not args.no_frames, args.one_stream, args.pool_ids)
    opener = gzip.open if args.gzip else open
    with opener(args.out, "wb") as handle:
        pickle.dump(snapshot, handle, protocol=args.protocol)
    if args.check_layout and not check_layout(args.out, args.check_layout):
        sys.exit(1)


if __name__ == "__main__":
    main()
