#!/usr/bin/env python3
"""Time HF transformers on a benchmark workload of DESIGN.md (W1-W5): the reference row of the
workload table beside fuselm's naive and fused.

Run on the GPU machine, on a checkpoint written by scripts/hf_checkpoint.py:

    python3 scripts/hf_bench.py --model /tmp/deepseek-v2-lite --workload W5 \\
        --prompts bench/prompts/prompts_w5.jsonl --new-tokens 50 > record.json

The workloads' arguments (scripts/bench.sh's table; `bench.sh ... hf` runs this script with them):

    W1      --model /tmp/qwen2-7b         --prompt-file bench/prompts/input_prompt_small.txt --batch 16 --new-tokens 50
    W2-b16  --model /tmp/qwen2-7b         --prompt-file bench/prompts/prompt_128.txt         --batch 16 --new-tokens 50
    W2-b1   --model /tmp/qwen2-7b         --prompt-file bench/prompts/prompt_128.txt         --batch 1  --new-tokens 100
    W3      --model /tmp/deepseek-v2-lite --prompt-file bench/prompts/input_prompt_small.txt --batch 1  --new-tokens 100
    W4      --model /tmp/deepseek-v2-lite --prompt-file bench/prompts/prompt_128.txt         --batch 16 --new-tokens 50
    W5      --model /tmp/deepseek-v2-lite --prompts bench/prompts/prompts_w5.jsonl           --new-tokens 50

The rows' prompts are read as infer reads them: --prompt-file's lines stripped and joined with
newlines, the text repeated on --batch rows; --prompts' JSONL, one object a line whose "text" (or
"prompt") is one row's prompt (--batch, if given, must be their count). They are tokenized by the
checkpoint's tokenizer.json with HF tokenizers (the ids infer's Go tokenizer gives), padded on the
left to the longest row with the pad token (the config's pad_token_id, else its EOS), and given
an attention mask that hides the padding: rows of different lengths run as one batch, the way
batched HF generation is done.

Generation: model.generate, greedy, min_new_tokens = max_new_tokens = --new-tokens (EOS does not
end a row early), the KV cache on, the model's default attention (SDPA), bf16 weights. --warmup
untimed generations (default 1), then --repeat timed ones (default 3), each between two CUDA
events after a synchronize, the whole generation (prefill included); the median is reported.
tokens/s = rows x new tokens / wall time (TileGym's definition, as infer reports it).

stdout is one JSON record in bench/runs' form (command, commit, date, gpu, driver, workload,
kernels "hf", model, batch, prompt lengths, tokens_per_s, wall_s, runs_wall_s and their spread,
torch and transformers versions, the attention implementation, the first 20 new tokens of every
row); logs go to stderr.
"""
import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def read_prompt_file(path):
    """A prompt as TileGym's benchmarks (and infer's --prompt-file) read it."""
    with open(path, encoding="utf-8") as f:
        return "\n".join(line.strip() for line in f)


def read_prompts(path):
    """The prompts of a JSONL file as infer's --prompts reads it: one a non-blank line."""
    prompts = []
    with open(path, encoding="utf-8-sig") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"hf_bench.py: {path}: line {n}: not JSON: {e}")
            if not isinstance(obj, dict) or ("text" in obj) == ("prompt" in obj):
                sys.exit(f'hf_bench.py: {path}: line {n}: not an object with one of "text" and "prompt"')
            text = obj.get("text", obj.get("prompt"))
            if not isinstance(text, str) or not text.strip():
                sys.exit(f"hf_bench.py: {path}: line {n}: the prompt is not a non-empty string")
            prompts.append(text)
    if not prompts:
        sys.exit(f"hf_bench.py: {path}: no prompts")
    return prompts


def rows_of(a):
    """Every row's prompt text, from the command line."""
    if a.prompts:
        texts = read_prompts(a.prompts)
        if a.batch is not None and a.batch != len(texts):
            sys.exit(f"hf_bench.py: --batch {a.batch}, but {a.prompts} holds {len(texts)} prompts")
        return texts
    return [read_prompt_file(a.prompt_file)] * (a.batch or 1)


def batch_of(model_dir, texts):
    """The rows as the checkpoint's model takes them in a batch: its config, EOS and pad ids (the
    config's pad_token_id, else its EOS), each row's token count, and the ids and attention mask on
    the GPU, padded on the left to the longest row (the ids infer's Go tokenizer gives)."""
    for f in ("config.json", "tokenizer.json"):
        if not os.path.isfile(os.path.join(model_dir, f)):
            sys.exit(f"{os.path.basename(sys.argv[0])}: {model_dir}: no {f} (a checkpoint of scripts/hf_checkpoint.py?)")
    import torch
    from tokenizers import Tokenizer

    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    eos = cfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    pad = cfg.get("pad_token_id")
    pad = eos if pad is None else pad
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_truncation()
    lens = [len(e.ids) for e in tok.encode_batch(texts)]
    tok.enable_padding(direction="left", pad_id=pad, pad_token=tok.id_to_token(pad) or "")
    enc = tok.encode_batch(texts)
    input_ids = torch.tensor([e.ids for e in enc], device="cuda")
    mask = torch.tensor([e.attention_mask for e in enc], device="cuda")
    return cfg, eos, pad, lens, input_ids, mask


def gpu_and_driver():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout
        name, driver = [s.strip() for s in out.splitlines()[0].split(",")]
        return name, driver
    except (OSError, IndexError, ValueError):
        return None, None


def git_commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
        return out.stdout.strip() or None
    except OSError:
        return None


def spread(xs):
    """The summary infer's JSON gives of its runs' wall times (wall_s_spread)."""
    mean = statistics.fmean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs), "mean": mean,
            "stddev": sd, "rel_stddev": sd / mean if mean else None}


def workload_args(description):
    """A parser of a workload's arguments as bench.sh passes them (--model, --prompt-file or
    --prompts, --batch, --new-tokens, --workload), for a script to add its own to."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", required=True, help="checkpoint directory (scripts/hf_checkpoint.py's --out)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-file", help="one prompt, repeated on --batch rows")
    src.add_argument("--prompts", help="JSONL, one prompt a row")
    ap.add_argument("--batch", type=int, help="rows (default: 1, or --prompts' count)")
    ap.add_argument("--new-tokens", type=int, required=True, help="new tokens per row")
    ap.add_argument("--workload", default=None, help="the workload's name in the record (W1 ... W5)")
    return ap


def main():
    ap = workload_args(__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if a.new_tokens < 1 or a.repeat < 1 or a.warmup < 0 or (a.batch is not None and a.batch < 1):
        ap.error("--new-tokens, --repeat and --batch must be at least 1, --warmup at least 0")
    texts = rows_of(a)

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    cfg, eos, pad, lens, input_ids, mask = batch_of(a.model, texts)
    log(f"hf_bench.py: {len(texts)} rows of {min(lens)}-{max(lens)} prompt tokens, padded on the left to {input_ids.shape[1]}")

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
    attn = getattr(model.config, "_attn_implementation", None)
    log(f"hf_bench.py: {a.model} loaded, attention {attn}")
    kw = dict(input_ids=input_ids, attention_mask=mask, do_sample=False, max_new_tokens=a.new_tokens,
              min_new_tokens=a.new_tokens, pad_token_id=pad, eos_token_id=eos, use_cache=True)

    @torch.no_grad()
    def generate():
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = model.generate(**kw)
        end.record()
        end.synchronize()
        new = out[:, input_ids.shape[1]:]
        if new.shape[1] != a.new_tokens:
            sys.exit(f"hf_bench.py: generate made {new.shape[1]} new tokens a row, not {a.new_tokens}")
        return start.elapsed_time(end) / 1000, new

    for i in range(a.warmup):
        s, _ = generate()
        log(f"hf_bench.py: warm-up {i + 1}/{a.warmup}: {s:.3f} s")
    walls = []
    for i in range(a.repeat):
        s, new = generate()
        walls.append(s)
        log(f"hf_bench.py: run {i + 1}/{a.repeat}: {s:.3f} s")
    wall = statistics.median(walls)
    rows = len(texts)
    gpu, driver = gpu_and_driver()
    rec = {
        "command": shlex.join([sys.executable, *sys.argv]), "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": gpu, "driver": driver, "workload": a.workload, "kernels": "hf",
        "model": os.path.basename(os.path.normpath(a.model)), "device": torch.cuda.get_device_name(),
        "batch": rows, "new_tokens_per_row": a.new_tokens,
        "prompt_tokens": max(lens), "prompt_tokens_rows": lens, "prompt_tokens_total": sum(lens),
        "padded_prompt_tokens": int(input_ids.numel()), "new_tokens": rows * a.new_tokens,
        "tokens_per_s": rows * a.new_tokens / wall, "wall_s": wall, "runs_wall_s": walls,
        "wall_s_spread": spread(walls), "warmup_runs": a.warmup,
        "torch": torch.__version__, "transformers": transformers.__version__, "attn_implementation": attn,
        "dtype": "bf16", "rows_first_ids": new[:, :20].tolist(),
    }
    log(f"hf_bench.py: {rec['workload'] or ''} hf | {rec['tokens_per_s']:.2f} tokens/s | {wall:.3f} s")
    json.dump(rec, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
