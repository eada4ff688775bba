#!/usr/bin/env python3
"""Where a decode step's time goes, kernel by kernel, read from `infer --trace` files: for each
kernel of the decode steps (in start order), its share of the step's critical path, counted from
the end of the kernels before it in its step, whatever stream ran them (a kernel launched to overlap
its predecessor counts from that one's end, as the CUPTI profile does; of two kernels of a step's
branches running at once, the first started gets the time), and its gap: start minus the
predecessor's end
(negative where it was launched under it, positive where the stream sat idle). Summed by kernel
name (and op) over every step, divided by the steps. With two files the rows sit side by side, so
that two builds or settings of one workload can be read against each other: which kernel's path
grew, which gaps opened.

    python3 scripts/trace_steps.py A.json [B.json] [--layer N] [--seq] [--top N] > table.txt

--layer keeps one decoder layer's kernels (the others and those outside layers are left out).
--seq keeps the kernels apart by their place in their layer's sequence (the k-th kernel a step
ran for the layer), listed in that order: one kernel serving two ops of a layer (linear_stream for
o_proj and down) then has a row each.
Needs nothing beyond the standard library, so it runs here or on the GPU machine. Exit 2 on bad
usage, 1 on a file that is not a --trace file.
"""
import argparse
import collections
import json
import sys

GPU_PID = 2  # chrometrace.PidGPU
STREAM0 = 100  # chrometrace.TidStream0: kernel tracks are 100 + the stream


def load(path, layer, seq=False):
    try:
        with open(path) as f:
            doc = json.load(f)
        events = doc["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"trace_steps.py: {path}: not a --trace file ({e})", file=sys.stderr)
        sys.exit(1)
    by_stream = collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or e.get("pid") != GPU_PID or e.get("tid", 0) < STREAM0 or e.get("cat") != "kernel":
            continue
        # A decode step's kernels are one lane whatever stream the trace
        # names: a graph with branches (work queued aside) runs on streams
        # the driver picks, and its chain moves between them at a join.
        a = e.get("args", {})
        lane = ("step", a.get("step")) if a.get("phase") == "decode" else ("stream", e["tid"])
        by_stream[lane].append(e)
    rows = collections.defaultdict(lambda: [0, 0.0, 0.0])  # calls, critical µs, gap µs
    place = collections.Counter()  # (lane, layer): the kernels counted so far
    steps = set()
    total = 0.0
    for lane, evs in by_stream.items():
        evs.sort(key=lambda e: e["ts"])
        prev_end = None
        for e in evs:
            start, end = e["ts"], e["ts"] + e.get("dur", 0.0)
            a = e.get("args", {})
            if a.get("phase") == "decode" and (layer is None or a.get("layer") == layer):
                crit = end - (start if prev_end is None else max(start, prev_end))
                gap = 0.0 if prev_end is None else start - prev_end
                key = (e["name"], a.get("op", ""))
                if seq:
                    at = (lane, a.get("layer"))
                    key = (place[at],) + key
                    place[at] += 1
                r = rows[key]
                r[0] += 1
                r[1] += max(crit, 0.0)
                r[2] += gap
                total += max(crit, 0.0)
                steps.add(a.get("step"))
            prev_end = end if prev_end is None else max(prev_end, end)
    if not steps:
        print(f"trace_steps.py: {path}: no decode kernels" + (f" in layer {layer}" if layer is not None else ""),
              file=sys.stderr)
        sys.exit(1)
    n = len(steps)
    return {k: (v[0] / n, v[1] / n, v[2] / n) for k, v in rows.items()}, total / n, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", metavar="TRACE")
    ap.add_argument("--layer", type=int, default=None)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--seq", action="store_true")
    args = ap.parse_args()
    if len(args.traces) > 2:
        ap.error("one or two trace files")
    loaded = [load(p, args.layer, args.seq) for p in args.traces]
    keys = set()
    for rows, _, _ in loaded:
        keys |= set(rows)
    if args.seq:
        order = sorted(keys)
    else:
        order = sorted(keys, key=lambda k: -max(r[0].get(k, (0, 0, 0))[1] for r in loaded))
    head = f"{'kernel':<48} {'op':<18}"
    for i, (_, tot, n) in enumerate(loaded):
        tag = "AB"[i] if len(loaded) > 1 else ""
        head += f" | {tag} a step  µs path  µs gap"
    print(head)
    for k in order[: args.top]:
        name = k[-2] if not args.seq else f"#{k[0]} {k[-2]}"
        line = f"{name[:48]:<48} {k[-1][:18]:<18}"
        for rows, _, _ in loaded:
            c, p, g = rows.get(k, (0, 0, 0))
            line += f" | {c:8.1f} {p:9.1f} {g:7.1f}"
        print(line)
    if len(order) > args.top:
        print(f"({len(order) - args.top} more kernels)")
    line = f"{'a decode step':<67}"
    for rows, tot, n in loaded:
        line += f" | {sum(r[0] for r in rows.values()):8.1f} {tot:9.1f} {sum(r[2] for r in rows.values()):7.1f}"
    print(line)
    print("steps: " + ", ".join(f"{p}: {n}" for p, (_, _, n) in zip(args.traces, loaded)), file=sys.stderr)


if __name__ == "__main__":
    main()
