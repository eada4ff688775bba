#!/usr/bin/env python3
"""Count the routed experts a DeepSeek-V2 workload's decode steps touch, and the bytes and the
bandwidth floor of a step that follow from them (DESIGN.md's limits assumed a count).

Run on the GPU machine, on a checkpoint written by scripts/hf_checkpoint.py, with a workload's
arguments as scripts/hf_bench.py takes them:

    python3 scripts/moe_routing.py --model /tmp/deepseek-v2-lite --workload W5 \\
        --prompts bench/prompts/prompts_w5.jsonl --new-tokens 50 > record.json

The rows are tokenized, padded and generated greedily as hf_bench.py does (HF transformers, bf16,
the KV cache on). A pre-hook on every MoE layer's experts module reads the top-k expert ids HF
routed each call to; a call of as many tokens as rows is a decode step. For each decode step and
layer it counts the distinct experts the rows chose. A step reads, at least:

  - the routed experts it touches: distinct experts x (gate, up and down: 3 x hidden x moe_inter)
    x 2 bytes, summed over the MoE layers;
  - every other weight once (attention, norms, the shared experts, the dense layers, lm_head; the
    embedding's rows only, counted as nothing);
  - the MLA cache of every row up to its position: (kv_lora_rank + qk_rope_head_dim) x 2 bytes a
    key a layer.

The floor of a step is those bytes at --copy-rate (DESIGN.md's 4.23 TB/s, the H200's measured
copy rate), and the decode limit rows / floor. Routing follows the model's numbers, so fuselm's
fused set (which matches HF to bf16 rounding) routes nearly alike; a near-tie may differ.

stdout is one JSON record (command, commit, date, gpu, workload, model, rows, steps, and the
counts: per step, per layer, their mean, median, min and max, the bytes and the floors); logs go
to stderr. It writes nothing else.
"""
import datetime
import json
import os
import shlex
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_bench import batch_of, git_commit, gpu_and_driver, log, rows_of, workload_args  # noqa: E402


def main():
    ap = workload_args(__doc__.splitlines()[0])
    ap.add_argument("--copy-rate", type=float, default=4.23e12, help="bytes/s of the floor (default 4.23e12)")
    a = ap.parse_args()
    if a.new_tokens < 2 or (a.batch is not None and a.batch < 1) or a.copy_rate <= 0:
        ap.error("--new-tokens must be at least 2, --batch at least 1, --copy-rate positive")
    texts = rows_of(a)

    import torch
    from transformers import AutoModelForCausalLM

    cfg, eos, pad, lens, input_ids, mask = batch_of(a.model, texts)
    if cfg.get("model_type") != "deepseek_v2":
        sys.exit(f"moe_routing.py: {a.model} is a {cfg.get('model_type')} checkpoint, not deepseek_v2")
    rows = len(texts)

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
    layers = model.model.layers
    moe = [(i, l.mlp) for i, l in enumerate(layers) if hasattr(l.mlp, "experts")]
    if not moe:
        sys.exit(f"moe_routing.py: {a.model}: no MoE layer found")
    experts_params = {id(p) for _, m in moe for p in m.experts.parameters()}
    n_experts = cfg["n_routed_experts"]
    expert_bytes = sum(p.numel() * p.element_size() for p in moe[0][1].experts.parameters()) // n_experts
    embed = model.get_input_embeddings().weight
    other_bytes = sum(p.numel() * p.element_size() for p in model.parameters()
                      if id(p) not in experts_params and p is not embed)
    key_bytes = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2 * len(layers)
    log(f"moe_routing.py: {rows} rows of {min(lens)}-{max(lens)} tokens; {len(moe)} MoE layers of "
        f"{n_experts} experts, {expert_bytes / 1e6:.2f} MB an expert; other weights {other_bytes / 1e9:.3f} GB")

    calls = []  # (layer, tokens, distinct experts)

    def hook(layer):
        def pre(_module, args, kwargs):
            idx = kwargs.get("top_k_index", args[1] if len(args) > 1 else None)
            if idx is None:
                sys.exit("moe_routing.py: the experts module was called without top_k_index")
            calls.append((layer, idx.shape[0], int(torch.unique(idx).numel())))
        return pre

    handles = [m.experts.register_forward_pre_hook(hook(i), with_kwargs=True) for i, m in moe]
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                             pad_token_id=pad, eos_token_id=eos, use_cache=True)
    for h in handles:
        h.remove()
    if out.shape[1] - input_ids.shape[1] != a.new_tokens:
        sys.exit(f"moe_routing.py: generate made {out.shape[1] - input_ids.shape[1]} new tokens a row")

    decode = [c for c in calls if c[1] == rows]
    prefill = [c for c in calls if c[1] != rows]
    steps = len(decode) // len(moe)
    if steps * len(moe) != len(decode) or steps != a.new_tokens - 1:
        sys.exit(f"moe_routing.py: {len(decode)} decode calls over {len(moe)} layers, "
                 f"expected {a.new_tokens - 1} steps")
    # Decode calls come layer by layer within a step, steps in order.
    per_step = [decode[s * len(moe):(s + 1) * len(moe)] for s in range(steps)]
    counts = [c[2] for c in decode]
    per_layer = {}
    for layer, _, n in decode:
        per_layer.setdefault(layer, []).append(n)
    step_expert_bytes = [sum(n for _, _, n in st) * expert_bytes for st in per_step]
    # Step s (0-based) decodes the token after prompt + s + 1 keys: every row reads its own
    # cache (padding included, as a padded batch's rows read it) up to that position.
    step_kv_bytes = [rows * (input_ids.shape[1] + s + 1) * key_bytes for s in range(steps)]
    step_bytes = [e + other_bytes + k for e, k in zip(step_expert_bytes, step_kv_bytes)]
    step_floor = [b / a.copy_rate for b in step_bytes]

    def summary(xs):
        return {"mean": statistics.fmean(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)}

    gpu, driver = gpu_and_driver()
    mean_floor = statistics.fmean(step_floor)
    rec = {
        "command": shlex.join([sys.executable, *sys.argv]), "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": gpu, "driver": driver, "workload": a.workload, "kernels": "hf",
        "model": os.path.basename(os.path.normpath(a.model)), "rows": rows, "prompt_tokens_rows": lens,
        "new_tokens_per_row": a.new_tokens, "decode_steps": steps, "moe_layers": len(moe),
        "experts": n_experts, "top_k": cfg["num_experts_per_tok"], "expert_bytes": expert_bytes,
        "other_weight_bytes": other_bytes, "kv_bytes_a_key": key_bytes, "copy_rate": a.copy_rate,
        "decode_distinct_experts": summary(counts),
        "decode_distinct_experts_by_layer": {str(k): round(statistics.fmean(v), 2) for k, v in sorted(per_layer.items())},
        "decode_distinct_experts_by_step": [round(statistics.fmean(c[2] for c in st), 2) for st in per_step],
        "prefill_distinct_experts": summary([c[2] for c in prefill]) if prefill else None,
        "decode_step_bytes": summary(step_bytes), "decode_step_expert_bytes": summary(step_expert_bytes),
        "decode_step_floor_ms": summary([f * 1e3 for f in step_floor]),
        "moe_layer_expert_floor_us": statistics.fmean(counts) * expert_bytes / a.copy_rate * 1e6,
        "decode_limit_tokens_per_s": rows / mean_floor,
    }
    log(f"moe_routing.py: {a.workload or ''} decode: {rec['decode_distinct_experts']['mean']:.1f} distinct experts "
        f"a layer ({rec['decode_distinct_experts']['min']}-{rec['decode_distinct_experts']['max']}), "
        f"{statistics.fmean(step_bytes) / 1e9:.2f} GB a step, floor {mean_floor * 1e3:.3f} ms, "
        f"limit {rec['decode_limit_tokens_per_s']:.0f} tokens/s of decode")
    json.dump(rec, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
