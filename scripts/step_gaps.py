#!/usr/bin/env python3
"""Where a decode step's wall time goes beyond its kernels, read from an `infer --trace` file:
for each decode step, the span from its first kernel's start to its last kernel's end, the
kernels' busy time within it (the union of their intervals, whatever stream), and the gap from
its last kernel's end to the next step's first kernel's start (the graph's launch, the step's
copies, the host): the medians over the steps. A trace holds kernels only on the GPU's side, so
what fills a gap is not named here.

    python3 scripts/step_gaps.py TRACE.json

Needs nothing beyond the standard library. Exit 2 on bad usage, 1 on a file that is not a
--trace file or holds no decode kernels.
"""
import collections
import json
import statistics
import sys

GPU_PID = 2  # chrometrace.PidGPU


def main():
    if len(sys.argv) != 2:
        print("usage: step_gaps.py TRACE.json", file=sys.stderr)
        sys.exit(2)
    try:
        with open(sys.argv[1]) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"step_gaps.py: {sys.argv[1]}: not a --trace file ({e})", file=sys.stderr)
        sys.exit(1)
    steps = collections.defaultdict(list)
    try:
        for e in events:
            if e.get("ph") != "X" or e.get("pid") != GPU_PID or e.get("cat") != "kernel":
                continue
            a = e.get("args", {})
            if a.get("phase") == "decode":
                ts = float(e["ts"])
                steps[a.get("step")].append((ts, ts + float(e.get("dur", 0.0))))
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        print(f"step_gaps.py: {sys.argv[1]}: not a --trace file (an event without a time: {err!r})", file=sys.stderr)
        sys.exit(1)
    if not steps:
        print(f"step_gaps.py: {sys.argv[1]}: no decode kernels", file=sys.stderr)
        sys.exit(1)
    order = sorted(steps, key=lambda s: min(t0 for t0, _ in steps[s]))
    spans, busy, gaps = [], [], []
    for i, s in enumerate(order):
        iv = sorted(steps[s])
        t0, t1 = iv[0][0], max(b for _, b in iv)
        covered, cur0, cur1 = 0.0, iv[0][0], iv[0][1]
        for a, b in iv[1:]:
            if a > cur1:
                covered += cur1 - cur0
                cur0, cur1 = a, b
            else:
                cur1 = max(cur1, b)
        covered += cur1 - cur0
        spans.append(t1 - t0)
        busy.append(covered)
        if i + 1 < len(order):
            n0 = min(a for a, _ in steps[order[i + 1]])
            gaps.append(n0 - t1)
    med = statistics.median
    print(f"{len(order)} decode steps: span {med(spans):.1f} µs, kernels busy {med(busy):.1f} µs within it "
          f"(idle {med(spans) - med(busy):.1f}), gap to the next step {med(gaps) if gaps else 0:.1f} µs "
          f"(min {min(gaps) if gaps else 0:.1f}, max {max(gaps) if gaps else 0:.1f}); medians")


if __name__ == "__main__":
    main()
