#!/usr/bin/env python3
"""Time torch's scaled_dot_product_attention on the GPU machine, per backend, on the shapes of
`infer bench attn_prefill`'s TileGym table, so that flash_hopper's rows can be read against the
field's kernels measured on the same device the same day.

    python3 scripts/sdpa_bench.py [--backends cudnn,flash] [--n 1024,2048,...] > record.json

Shapes: B=4, H=32, D=128, N in --n, causal and not, bf16 and fp16. For each shape every backend's
output is first held against the flash backend's (or, where flash is the one timed, cuDNN's): a
backend whose output differs by more than 2e-2 (bf16) or 5e-3 (fp16), relative to the largest
output, is reported and not timed. Timing: CUDA events around groups of --group calls issued back
to back (so that the time is the GPU's, not the gaps while Python launches the next call), 3
warm-up groups, then the median of --repeat groups, divided by --group. TFLOP/s = 4·B·H·N²·D / t, halved when causal (cuDNN's row of issue 9 is
counted the same way). stdout is one JSON record (command, date, GPU, driver, torch and cuDNN
versions, rows); logs go to stderr.
"""
import argparse
import datetime
import json
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(backend, q, k, v, causal):
    with sdpa_kernel([BACKENDS[backend]]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def median_ms(backend, q, k, v, causal, repeat, group):
    def timed():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(group):
            run(backend, q, k, v, causal)
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / group

    for _ in range(3):
        timed()
    return statistics.median(timed() for _ in range(repeat))


def driver():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="cudnn,flash")
    ap.add_argument("--n", default="1024,2048,4096,8192,16384")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--group", type=int, default=10)
    args = ap.parse_args()
    if args.repeat < 1 or args.group < 1:
        print("sdpa_bench.py: --repeat and --group must be at least 1", file=sys.stderr)
        sys.exit(2)
    backends = args.backends.split(",")
    for b in backends:
        if b not in BACKENDS:
            print(f"sdpa_bench.py: unknown backend {b} (have {', '.join(BACKENDS)})", file=sys.stderr)
            sys.exit(2)
    try:
        ns = [int(x) for x in args.n.split(",")]
    except ValueError:
        print(f"sdpa_bench.py: --n must be comma-separated integers, not {args.n}", file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print("sdpa_bench.py: no CUDA device", file=sys.stderr)
        sys.exit(1)
    B, H, D = 4, 32, 128
    rows = []
    for dt in (torch.bfloat16, torch.float16):
        for n in ns:
            for causal in (True, False):
                g = torch.Generator(device="cuda").manual_seed(1)
                q, k, v = (torch.randn(B, H, n, D, device="cuda", dtype=dt, generator=g) for _ in range(3))
                outs = {}
                for b in backends:
                    try:
                        outs[b] = run(b, q, k, v, causal).float()
                    except RuntimeError as e:
                        outs[b] = e
                flops = 4 * B * H * n * n * D / (2 if causal else 1)
                for b in backends:
                    row = {"shape": f"B={B},H={H},D={D},N={n},causal={int(causal)}", "dtype": str(dt).removeprefix("torch."), "backend": b}
                    ref = next((r for r in ("flash", "cudnn") if r != b and isinstance(outs.get(r), torch.Tensor)), None)
                    if isinstance(outs[b], Exception):
                        row["error"] = str(outs[b]).splitlines()[0][:200]
                    elif ref is not None and (err := ((outs[b] - outs[ref]).abs().max() / outs[ref].abs().max()).item()) > TOL[dt]:
                        row["error"] = f"differs from {ref} by {err:.3g} (relative to the largest output): not timed"
                    else:
                        if ref is not None:
                            row["checked"] = f"{ref} {err:.1e}"
                        ms = median_ms(b, q, k, v, causal, args.repeat, args.group)
                        row.update(ms=ms, tflop_s=flops / ms / 1e9)
                    log(json.dumps(row))
                    rows.append(row)
                del q, k, v, outs
                torch.cuda.empty_cache()
    rec = {
        "command": " ".join(["python3", "scripts/sdpa_bench.py"] + sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": torch.cuda.get_device_name(),
        "driver": driver(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "workload": "torch SDPA, TileGym's attention table",
        "rows": rows,
    }
    json.dump(rec, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
