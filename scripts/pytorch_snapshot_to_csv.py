#!/usr/bin/env python3
"""Convert a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) to heapscope's compact CSV trace.

Uses only the standard library, and unpickles with a restricted unpickler that refuses every class, so a
hostile file cannot run code: snapshots hold only dicts, lists, tuples, strings, numbers, booleans and None.

    scripts/pytorch_snapshot_to_csv.py SNAPSHOT[.pickle[.gz]] OUT.csv [--device N]

Writes one `a,<id>,<size_bytes>` line per `alloc` and one `f,<id>` line per `free_completed` (when PyTorch
returns the memory to its pool) of the device's trace. Ids are the addresses. Frees of allocations the
recording never saw (it started mid-run) are dropped and counted in the header.
"""
import argparse
import gzip
import io
import pickle
import sys


class _BuiltinsOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: snapshots hold only builtin types")


def load_snapshot(path):
    with open(path, "rb") as handle:
        data = handle.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    try:
        return _BuiltinsOnly(io.BytesIO(data)).load()
    except Exception as error:  # noqa: BLE001 - reported with the file name
        sys.exit(f"{path}: not a PyTorch memory snapshot: {error}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot")
    parser.add_argument("out")
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()

    snapshot = load_snapshot(args.snapshot)
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        sys.exit(f"{args.snapshot}: missing key 'device_traces' (not a PyTorch >= 2.1 snapshot)")
    traces = snapshot["device_traces"]
    if args.device >= len(traces):
        sys.exit(f"{args.snapshot}: no device {args.device} (the file has {len(traces)})")

    live = set()
    lines = []
    dropped = 0
    for index, event in enumerate(traces[args.device]):
        action = event.get("action")
        if action == "alloc":
            addr, size = event["addr"], event["size"]
            if addr in live:
                sys.exit(f"{args.snapshot}: event {index}: alloc at {addr:#x}, which is already live")
            live.add(addr)
            lines.append(f"a,{addr},{size}")
        elif action == "free_completed":
            addr = event["addr"]
            if addr in live:
                live.remove(addr)
                lines.append(f"f,{addr}")
            else:
                dropped += 1

    allocs = sum(1 for line in lines if line[0] == "a")
    with open(args.out, "w") as out:
        out.write(f"# heapscope trace v1: {args.snapshot.rsplit('/', 1)[-1]} device {args.device}\n")
        out.write(f"# converted by scripts/pytorch_snapshot_to_csv.py: {allocs} allocs, {len(lines) - allocs} frees, "
                  f"{dropped} frees of allocations before the recording dropped, {len(live)} live at the end\n")
        out.write("\n".join(lines))
        out.write("\n")


if __name__ == "__main__":
    main()
