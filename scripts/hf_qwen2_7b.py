#!/usr/bin/env python3
"""Write a full-size Qwen2-7B random-weight checkpoint and HF's reference logits for it.

Run on the GPU machine:

    python3 scripts/hf_qwen2_7b.py --out /tmp/qwen2-7b [--steps 10]

The checkpoint has the real Qwen2-7B config (bf16, save_pretrained shards), HF's default
initialisation from a fixed seed, and the real Qwen2 tokenizer. reference.json has the layout
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
import json
import os
import shutil
import sys
import time

import torch
from tokenizers import Tokenizer
from transformers import Qwen2Config, Qwen2ForCausalLM

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


def log(*a):
    print(*a, file=sys.stderr, flush=True)


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lengths", default="7,64,128,300,600,1000,2048,4096")
    a = ap.parse_args()

    t0 = time.time()
    cfg = Qwen2Config(**{k: v for k, v in QWEN2_7B.items() if k not in ("torch_dtype", "rope_theta")},
                      rope_parameters={"rope_type": "default", "rope_theta": QWEN2_7B["rope_theta"]},
                      dtype=torch.bfloat16)
    torch.manual_seed(2026)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    log(f"model built on the GPU in {time.time() - t0:.1f}s")

    t0 = time.time()
    shutil.rmtree(a.out, ignore_errors=True)
    model.save_pretrained(a.out, max_shard_size="4GB")
    # The hub's config.json, in the transformers 4.x dialect, next to the weights.
    json.dump({**QWEN2_7B, "transformers_version": "4.37.2"}, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    with gzip.open(os.path.join(ROOT, "testdata", "tokenizer", "qwen2.tokenizer.json.gz"), "rb") as f:
        tok_json = f.read()
    open(os.path.join(a.out, "tokenizer.json"), "wb").write(tok_json)
    shutil.copy(os.path.join(ROOT, "testdata", "tokenizer", "qwen2.tokenizer_config.json"),
                os.path.join(a.out, "tokenizer_config.json"))
    log(f"saved to {a.out} in {time.time() - t0:.1f}s: {sorted(os.listdir(a.out))}")

    tok = Tokenizer.from_str(tok_json.decode("utf-8"))
    text = open(os.path.join(ROOT, "bench", "prompts", "input_prompt_small.txt"), encoding="utf-8").read()
    ids = tok.encode(text).ids
    prompts = [ids[: int(n)] for n in a.lengths.split(",")]

    # The references come from the checkpoint as HF loads it back from disk
    # (the hub's config.json), which is what fuselm reads too.
    built = model.config.rope_parameters
    del model
    torch.cuda.empty_cache()
    model = Qwen2ForCausalLM.from_pretrained(a.out, dtype=torch.bfloat16).cuda().eval()
    log(f"rope parameters: built with {built}, loaded back with {model.config.rope_parameters}")

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
    ref = {"prompts": prompts, "steps": a.steps, "vocab": cfg.vocab_size, "rows": rows}
    write_reference(a.out, "reference", {**ref, "dtype": "torch.bfloat16"}, bf16)
    log(f"bf16 reference for prompt lengths {a.lengths} x {a.steps} steps in {time.time() - t0:.1f}s")

    t0 = time.time()
    del model
    torch.cuda.empty_cache()
    model = Qwen2ForCausalLM.from_pretrained(a.out, dtype=torch.float32).cuda().eval()
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
    logits.cpu().numpy().astype("<f4").tofile(os.path.join(out, f"{name}_logits.f32"))
    json.dump({**meta, "logits_file": f"{name}_logits.f32"}, open(os.path.join(out, f"{name}.json"), "w"))


if __name__ == "__main__":
    main()
