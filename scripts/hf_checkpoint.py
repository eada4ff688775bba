#!/usr/bin/env python3
"""Write a full-size random-weight checkpoint (Qwen2-7B or DeepSeek-V2-Lite) and HF's reference
logits for it.

Run on the GPU machine:

    python3 scripts/hf_checkpoint.py --model qwen2-7b --out /tmp/qwen2-7b [--steps 10]
    python3 scripts/hf_checkpoint.py --model deepseek-v2-lite --out /tmp/deepseek-v2-lite [--no-references]

The weights are written into OUT.partial and renamed to OUT once whole, with MARKER last, so that
a write cut short leaves no directory that looks like a checkpoint. A whole checkpoint of the same
model and build already at OUT is kept (--rewrite writes it again): then only the references are
computed. --no-references writes the checkpoint alone (what the benchmarks need; a later run
without it adds the references). A directory this script did not write, or holding another
model's checkpoint, is refused unless --rewrite; every reference file is written whole or not at
all, reference_f32.json last.

The checkpoint has the real model's config as the hub publishes it (bf16, save_pretrained
shards), HF's default initialisation from a fixed seed, and the real tokenizer. reference.json has the layout
scripts/hf_fixtures.py documents (for each prompt, run alone at batch 1: the logits of the last
prompt position, then of `steps` greedy decode steps fed HF's own tokens), except that the logits
are in reference_logits.f32 (float32 little-endian, [rows][1 + steps][vocab]) named by
"logits_file". The prompts are prefixes of TileGym's benchmark prompt of several lengths.

reference_f32.json (logits in reference_logits_f32.f32) holds the same positions computed by HF
with the weights upcast to float32, fed the same tokens: exact math, against which both HF's
bf16 logits and fuselm's can be measured. The script prints how far HF's bf16 logits are from it.
"""
import argparse
import gzip
import hashlib
import json
import os
import shutil
import sys
import time

import torch
from tokenizers import Tokenizer
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, Qwen2Config, Qwen2ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")

# Qwen/Qwen2-7B config.json as published on the hub.
QWEN2_7B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
    "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 152064,
}


# deepseek-ai/DeepSeek-V2-Lite config.json as published on the hub (the fields transformers reads).
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
    "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False,
    "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                                             "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                                             "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
    "use_cache": True, "v_head_dim": 128, "vocab_size": 102400,
}

# What differs between the models: the hub config, how transformers 5 builds it, the tokenizer.
MODELS = {
    "qwen2-7b": dict(hub=QWEN2_7B, cls=Qwen2ForCausalLM, tokenizer="qwen2.tokenizer.json.gz",
                     tokenizer_config="qwen2.tokenizer_config.json", hub_version="4.37.2"),
    "deepseek-v2-lite": dict(hub=DEEPSEEK_V2_LITE, cls=DeepseekV2ForCausalLM, tokenizer="deepseek-v2.tokenizer.json.gz",
                             tokenizer_config=None, hub_version="4.39.3"),
}


def build_config(name):
    """The hub config in transformers 5's terms (rope_parameters, dtype)."""
    hub = MODELS[name]["hub"]
    rope = {"rope_type": "default", "rope_theta": float(hub["rope_theta"])}
    if hub.get("rope_scaling"):
        scaling = dict(hub["rope_scaling"])
        rope = {"rope_type": scaling.pop("type"), "rope_theta": float(hub["rope_theta"]),
                **{k: float(v) if k != "original_max_position_embeddings" else v for k, v in scaling.items()}}
    drop = ("torch_dtype", "rope_theta", "rope_scaling", "moe_layer_freq", "scoring_func", "seq_aux")
    kw = {k: v for k, v in hub.items() if k not in drop}
    cls = Qwen2Config if name == "qwen2-7b" else DeepseekV2Config
    return cls(**kw, rope_parameters=rope, dtype=torch.bfloat16)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# MARKER is written last into a whole checkpoint: which model it holds and how it was made.
MARKER = "fuselm_checkpoint.json"
SEED = 2026


def build_id(name):
    """What makes model name's checkpoint: its hub config, tokenizer, transformers dialect and seed."""
    spec = MODELS[name]
    what = json.dumps({"hub": spec["hub"], "version": spec["hub_version"], "tokenizer": spec["tokenizer"],
                       "tokenizer_config": spec["tokenizer_config"], "seed": SEED}, sort_keys=True)
    return hashlib.sha256(what.encode()).hexdigest()


def marker(out):
    """The marker of the checkpoint at out, None where there is none."""
    try:
        with open(os.path.join(out, MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def whole_checkpoint(out, name):
    """Whether out holds a whole checkpoint of model name as this script writes it now."""
    m = marker(out)
    return m is not None and m.get("model") == name and m.get("build") == build_id(name)


def write_json(path, obj, **kw):
    """Write obj as JSON to path whole or not at all (a temporary file renamed into place)."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, **kw)
    os.replace(path + ".tmp", path)


def write_checkpoint(a, spec):
    """Build the model from the seed and write it, the hub's config.json and the tokenizer to a.out.

    What was at a.out goes first (its marker before the rest, so that it never looks whole
    half-removed; and the disk holds one checkpoint at a time); the new one is written into
    a.out.partial and renamed into place once whole, its marker last."""
    if os.path.isdir(a.out):
        if os.path.exists(os.path.join(a.out, MARKER)):
            os.remove(os.path.join(a.out, MARKER))
        shutil.rmtree(a.out)
    t0 = time.time()
    cfg = build_config(a.model)
    torch.manual_seed(SEED)
    with torch.device("cuda"):
        model = spec["cls"](cfg).to(torch.bfloat16).eval()
    log(f"model built on the GPU in {time.time() - t0:.1f}s")

    t0 = time.time()
    part = a.out.rstrip("/") + ".partial"
    shutil.rmtree(part, ignore_errors=True)
    model.save_pretrained(part, max_shard_size="4GB")
    # The hub's config.json, in the transformers 4.x dialect, next to the weights.
    write_json(os.path.join(part, "config.json"), {**spec["hub"], "transformers_version": spec["hub_version"]}, indent=2)
    with gzip.open(os.path.join(ROOT, "testdata", "tokenizer", spec["tokenizer"]), "rb") as f, \
            open(os.path.join(part, "tokenizer.json"), "wb") as g:
        g.write(f.read())
    if spec["tokenizer_config"]:
        shutil.copy(os.path.join(ROOT, "testdata", "tokenizer", spec["tokenizer_config"]),
                    os.path.join(part, "tokenizer_config.json"))
    write_json(os.path.join(part, MARKER), {"model": a.model, "seed": SEED, "build": build_id(a.model)})
    os.rename(part, a.out)
    log(f"saved to {a.out} in {time.time() - t0:.1f}s: {sorted(os.listdir(a.out))}")
    log(f"rope parameters: built with {model.config.rope_parameters}")


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="qwen2-7b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lengths", default="7,64,128,300,600,1000,2048,4096")
    ap.add_argument("--no-references", action="store_true", help="write the checkpoint only")
    ap.add_argument("--rewrite", action="store_true", help="write the checkpoint even where a whole one is at --out")
    a = ap.parse_args()

    spec = MODELS[a.model]
    Model = spec["cls"]
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        log(f"hf_checkpoint.py: {a.out} is not a directory")
        sys.exit(2)
    m = marker(a.out) if os.path.isdir(a.out) else None
    if not a.rewrite:
        if os.path.isdir(a.out) and os.listdir(a.out) and m is None:
            log(f"hf_checkpoint.py: {a.out} holds files this script did not write: give another --out, or --rewrite to replace them")
            sys.exit(2)
        if m is not None and m.get("model") != a.model:
            log(f"hf_checkpoint.py: {a.out} holds a {m.get('model')} checkpoint: give another --out, or --rewrite to replace it")
            sys.exit(2)
    if a.rewrite or not whole_checkpoint(a.out, a.model):
        write_checkpoint(a, spec)
        torch.cuda.empty_cache()
    else:
        log(f"{a.out}: a whole {a.model} checkpoint is there already (--rewrite writes it again)")
    if a.no_references:
        return

    # reference_f32.json, written last, says the references are whole.
    for name in ("reference_f32.json", "reference.json"):
        if os.path.exists(os.path.join(a.out, name)):
            os.remove(os.path.join(a.out, name))
    with open(os.path.join(a.out, "tokenizer.json"), "rb") as f:
        tok_json = f.read()
    tok = Tokenizer.from_str(tok_json.decode("utf-8"))
    with open(os.path.join(ROOT, "bench", "prompts", "input_prompt_small.txt"), encoding="utf-8") as f:
        text = f.read()
    ids = tok.encode(text).ids
    prompts = [ids[: int(n)] for n in a.lengths.split(",")]

    # The references come from the checkpoint as HF loads it back from disk
    # (the hub's config.json), which is what fuselm reads too.
    model = Model.from_pretrained(a.out, dtype=torch.bfloat16).cuda().eval()
    log(f"rope parameters: loaded back with {model.config.rope_parameters}")

    t0 = time.time()
    rows, bf16 = [], []
    for p in prompts:
        step_logits, tokens = [], []
        out = model(input_ids=torch.tensor([p], device="cuda"), use_cache=True)
        past = out.past_key_values
        step_logits.append(out.logits[0, -1].float())
        for _ in range(a.steps):
            tokens.append(int(step_logits[-1].argmax()))
            out = model(input_ids=torch.tensor([[tokens[-1]]], device="cuda"), past_key_values=past, use_cache=True)
            past = out.past_key_values
            step_logits.append(out.logits[0, -1].float())
        rows.append({"tokens": tokens})
        bf16.append(torch.stack(step_logits))
    bf16 = torch.stack(bf16)
    ref = {"prompts": prompts, "steps": a.steps, "vocab": model.config.vocab_size, "rows": rows}
    write_reference(a.out, "reference", {**ref, "dtype": "torch.bfloat16"}, bf16)
    log(f"bf16 reference for prompt lengths {a.lengths} x {a.steps} steps in {time.time() - t0:.1f}s")

    t0 = time.time()
    del model
    torch.cuda.empty_cache()
    model = Model.from_pretrained(a.out, dtype=torch.float32).cuda().eval()
    exact = torch.stack([teacher_forced(model, p, r["tokens"]) for p, r in zip(prompts, rows)])
    write_reference(a.out, "reference_f32", {**ref, "dtype": "torch.float32"}, exact)
    err = (bf16 - exact).norm(dim=-1) / exact.norm(dim=-1)
    agree = (bf16.argmax(-1) == exact.argmax(-1)).float().mean().item()
    log(f"f32 reference in {time.time() - t0:.1f}s. HF bf16 vs HF f32: relative error per prompt (mean over "
        f"positions) {[round(x, 4) for x in err.mean(1).tolist()]}, largest {err.max().item():.4f}, "
        f"argmax agreement {100 * agree:.1f}%")


@torch.no_grad()
def teacher_forced(model, prompt, tokens):
    """The logits of the last prompt position, then of each of tokens fed in turn."""
    out = model(input_ids=torch.tensor([prompt], device="cuda"), use_cache=True)
    past, steps = out.past_key_values, [out.logits[0, -1].float()]
    for tok in tokens:
        out = model(input_ids=torch.tensor([[tok]], device="cuda"), past_key_values=past, use_cache=True)
        past = out.past_key_values
        steps.append(out.logits[0, -1].float())
    return torch.stack(steps)


def write_reference(out, name, meta, logits):
    """The logits file, then the JSON that names it, each whole or not at all."""
    path = os.path.join(out, f"{name}_logits.f32")
    logits.cpu().numpy().astype("<f4").tofile(path + ".tmp")
    os.replace(path + ".tmp", path)
    write_json(os.path.join(out, f"{name}.json"), {**meta, "logits_file": f"{name}_logits.f32"})


if __name__ == "__main__":
    main()
