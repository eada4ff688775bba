#!/usr/bin/env python3
"""Time PyTorch's bf16 F.linear (cuBLASLt, chosen by its own heuristics) on DeepSeek-V2-Lite's
decode projections at 1 and 16 rows, for reading fuselm's decode chain against: which cuBLAS
kernel a framework gets for each shape, and what it costs back to back in a CUDA graph.

Run on the GPU machine (torch only; no checkpoint):

    python3 scripts/torch_linear.py > record.json

Each shape: 200 calls captured in one CUDA graph and replayed five times, the median replay over
200 (no host time between the calls, but no overlap either: each kernel starts when the one before
has ended, as a graph without programmatic edges runs them). The calls rotate through copies of
the weight matrix that hold over 200 MB together, so each call reads its weights from DRAM, not
from the L2 where the call before left them. The floor is the weights' bytes at 4.23 TB/s (the
H200's measured copy rate). The kernels of one call come from torch.profiler.

stdout is one JSON object (torch's version, the device, and each shape's µs, floor, share and
kernels); one line a shape goes to stderr.
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

SHAPES = {"q+kv_a": (3648, 2048), "o": (2048, 2048), "shared gate_up": (5632, 2048), "shared down": (2048, 2816),
          "router": (64, 2048)}


def main():
    out = {}
    for rows in (1, 16):
        for name, (n, k) in SHAPES.items():
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            copies = max(2, int(200e6 // (n * k * 2)) + 1)
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for i in range(3):
                    F.linear(x, ws[i % copies])
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(200):
                    F.linear(x, ws[i % copies])
            ts = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                g.replay()
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) * 1000 / 200)
            us = statistics.median(ts)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                F.linear(x, ws[1 % copies])
                torch.cuda.synchronize()
            kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            floor = n * k * 2 / 4.23e12 * 1e6
            out[f"{name} M={rows}"] = {"us": round(us, 2), "floor_us": round(floor, 2), "share": round(floor / us, 3),
                                       "kernels": kernels}
            print(f"{name:16s} M={rows:2d} N={n:5d} K={k}: {us:6.2f} us, floor {floor:5.2f} us ({floor / us:.0%}) "
                  f"{[kn.split('(')[0] for kn in kernels]}", file=sys.stderr, flush=True)
            del ws
    json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "shapes": out}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
