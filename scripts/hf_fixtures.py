#!/usr/bin/env python3
"""Write fuselm's HF reference fixtures: tokenizer golden ids and tiny random-weight checkpoints.

Run on the GPU machine (torch, transformers 5.x, tokenizers):

    python3 scripts/hf_fixtures.py --out OUTDIR

OUTDIR receives the same layout as the repository's testdata/:
  tokenizer/golden.json        ids HF `tokenizers` gives every corpus text, for both real tokenizer files
  models/<name>/               a tiny checkpoint written by save_pretrained, its tokenizer.json, and
  models/<name>/reference.json HF's logits for a prefill and several greedy decode steps

reference.json: {"prompts": [[ids]], "steps": N, "dtype": "...", "rows": [{"prefill_logits": [V],
"tokens": [N ids], "decode_logits": [[V] * N]}]}. Each row is run alone (batch 1, no padding):
tokens[0] = argmax(prefill_logits), decode_logits[i] are the logits after feeding tokens[i], and
tokens[i+1] = argmax(decode_logits[i]).
"""
import argparse
import gzip
import json
import os
import shutil
import sys
import zlib

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
import transformers
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, Qwen2Config, Qwen2ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.join(HERE, "..", "testdata")

STEPS = 6
PROMPT_LENGTHS = [5, 9, 13]
VOCAB = 512


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def real_tokenizer(name):
    with gzip.open(os.path.join(TESTDATA, "tokenizer", f"{name}.tokenizer.json.gz"), "rb") as f:
        return f.read().decode("utf-8")


def golden(out):
    corpus = json.load(open(os.path.join(TESTDATA, "tokenizer", "corpus.json"), encoding="utf-8"))
    result = {}
    for name in ["qwen2", "deepseek-v2"]:
        tok = Tokenizer.from_str(real_tokenizer(name))
        rows = []
        for text in corpus:
            enc = tok.encode(text)
            rows.append({
                "text": text,
                "ids": enc.ids,
                "ids_no_special": tok.encode(text, add_special_tokens=False).ids,
                "decoded": tok.decode(enc.ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
            })
        result[name] = rows
        log(f"golden {name}: {len(rows)} texts, {sum(len(r['ids']) for r in rows)} ids")
    os.makedirs(os.path.join(out, "tokenizer"), exist_ok=True)
    with open(os.path.join(out, "tokenizer", "golden.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": __import__("tokenizers").__version__, **result}, f, ensure_ascii=False)


def tiny_tokenizer(family):
    """A small byte-level BPE trained on the TileGym prompt, with the family's real
    normalizer, pre-tokenizer, decoder and special tokens; fits a 512-entry vocabulary."""
    real = json.loads(real_tokenizer(family))
    if family == "qwen2":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    else:
        specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]
    text = open(os.path.join(HERE, "..", "bench", "prompts", "input_prompt_small.txt"), encoding="utf-8").read() \
        if os.path.exists(os.path.join(HERE, "..", "bench", "prompts", "input_prompt_small.txt")) else \
        " ".join(json.load(open(os.path.join(TESTDATA, "tokenizer", "corpus.json"), encoding="utf-8")))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 16, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text], trainer)
    data = json.loads(tok.to_str())
    for key in ["normalizer", "pre_tokenizer", "decoder"]:
        data[key] = real[key]
    for t in data["added_tokens"]:
        t["normalized"] = False
    ids = {t["content"]: t["id"] for t in data["added_tokens"]}
    if family == "qwen2":
        data["post_processor"] = real["post_processor"]
        bos, eos = None, ids["<|endoftext|>"]
    else:
        bos_tok = specials[0]
        pp = real["post_processor"]
        pp["special_tokens"][bos_tok]["ids"] = [ids[bos_tok]]
        data["post_processor"] = pp
        bos, eos = ids[bos_tok], ids[specials[1]]
    out = json.dumps(data, ensure_ascii=False)
    Tokenizer.from_str(out)  # must load
    return out, bos, eos


def qwen2_config(dtype, tied, dialect_v4=False):
    return Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-6,
        tie_word_embeddings=tied, initializer_range=0.1, dtype=dtype,
    )


def deepseek_config(dtype, q_lora, method, mscale=0.707):
    kw = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=160, moe_intermediate_size=48,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=48 if q_lora else None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=12, first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=2,
        num_experts_per_tok=3, topk_method=method, n_group=4 if method == "group_limited_greedy" else 1,
        topk_group=2 if method == "group_limited_greedy" else 1, norm_topk_prob=False,
        routed_scaling_factor=1.5, max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 128, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": mscale, "mscale_all_dim": 0.707},
        tie_word_embeddings=False, initializer_range=0.1, dtype=dtype,
    )
    return DeepseekV2Config(**kw)


def to_v4_dialect(path):
    """Rewrite a transformers-5 config.json in the 4.x dialect the hub's files use."""
    cfg = json.load(open(path))
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    kind = rp.pop("rope_type")
    if kind != "default":
        rp["type"] = kind
        cfg["rope_scaling"] = rp
    cfg["torch_dtype"] = cfg.pop("dtype")
    if cfg.get("model_type") == "deepseek_v2":
        cfg["moe_layer_freq"] = 1  # in the hub's files; transformers 5 has no such field
    cfg["transformers_version"] = "4.39.3"
    json.dump(cfg, open(path, "w"), indent=2)


def to_hub_expert_layout(model_dir):
    """Split transformers-5 fused expert tensors into the hub's per-expert layout."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = [os.path.join(model_dir, f) for f in
             sorted(set(json.load(open(index))["weight_map"].values()))] if os.path.exists(index) \
        else [os.path.join(model_dir, "model.safetensors")]
    changed = False
    weight_map = {}
    for fpath in files:
        sd = load_file(fpath)
        out = {}
        for k, v in sd.items():
            if k.endswith("mlp.experts.gate_up_proj"):
                prefix = k[: -len("gate_up_proj")]
                inter = v.shape[1] // 2
                for e in range(v.shape[0]):
                    out[f"{prefix}{e}.gate_proj.weight"] = v[e, :inter].contiguous()
                    out[f"{prefix}{e}.up_proj.weight"] = v[e, inter:].contiguous()
                changed = True
            elif k.endswith("mlp.experts.down_proj"):
                prefix = k[: -len("down_proj")]
                for e in range(v.shape[0]):
                    out[f"{prefix}{e}.down_proj.weight"] = v[e].contiguous()
                changed = True
            else:
                out[k] = v
        save_file(out, fpath, metadata={"format": "pt"})
        for k in out:
            weight_map[k] = os.path.basename(fpath)
    if os.path.exists(index):
        idx = json.load(open(index))
        idx["weight_map"] = dict(sorted(weight_map.items()))
        json.dump(idx, open(index, "w"), indent=2)
    return changed


@torch.no_grad()
def reference(model, prompts):
    rows = []
    for p in prompts:
        ids = torch.tensor([p], device=model.device)
        out = model(input_ids=ids, use_cache=True)
        past = out.past_key_values
        prefill = out.logits[0, -1].float()
        tok = int(prefill.argmax())
        tokens, dec = [], []
        for _ in range(STEPS):
            tokens.append(tok)
            out = model(input_ids=torch.tensor([[tok]], device=model.device), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()
            dec.append([round(x, 7) for x in logits.tolist()])
            tok = int(logits.argmax())
        rows.append({"prefill_logits": [round(x, 7) for x in prefill.tolist()], "tokens": tokens, "decode_logits": dec})
    return rows


def make_model(out, name, cls, cfg, family, shard=None, v4=False, hub_experts=False):
    torch.manual_seed(zlib.crc32(name.encode()))
    model = cls(cfg).to(cfg.dtype).eval()
    tok_json, bos, eos = tiny_tokenizer(family)
    model.config.bos_token_id = bos
    model.config.eos_token_id = eos
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    d = os.path.join(out, "models", name)
    shutil.rmtree(d, ignore_errors=True)
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(d, **kw)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok_json)
    if v4:
        to_v4_dialect(os.path.join(d, "config.json"))
    if hub_experts:
        log(f"{name}: experts rewritten in the hub layout: {to_hub_expert_layout(d)}")
    # The reference comes from the checkpoint as HF loads it back, so the fixture
    # holds exactly what from_pretrained reads.
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    loaded = cls.from_pretrained(d, dtype=cfg.dtype).to(dev).eval()
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, VOCAB - 16, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    rows = reference(loaded, prompts)
    # the same checkpoint before any rewrite must give the same numbers
    # (up to the rounding of another attention implementation in bf16).
    base = torch.tensor(reference(model.to(dev), prompts[:1])[0]["prefill_logits"])
    diff = float((base - torch.tensor(rows[0]["prefill_logits"])).norm() / base.norm())
    assert diff < (1e-5 if cfg.dtype == torch.float32 else 2e-2), \
        f"{name}: reloaded checkpoint differs from the saved model by {diff} (relative)"
    log(f"{name}: reloaded vs saved model: relative difference {diff:.2e}")
    json.dump({"prompts": prompts, "steps": STEPS, "dtype": str(cfg.dtype), "transformers": transformers.__version__,
               "rows": rows}, open(os.path.join(d, "reference.json"), "w"))
    files = sorted(os.listdir(d))
    log(f"{name}: {files}, config keys: {sorted(json.load(open(os.path.join(d, 'config.json'))))[:8]}...")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated parts: golden,models")
    a = ap.parse_args()
    parts = a.only.split(",") if a.only else ["golden", "models"]
    log(f"torch {torch.__version__}, transformers {transformers.__version__}")
    if "golden" in parts:
        golden(a.out)
    if "models" in parts:
        make_model(a.out, "qwen2-tiny", Qwen2ForCausalLM, qwen2_config(torch.float32, False), "qwen2", v4=True)
        make_model(a.out, "qwen2-tiny-bf16", Qwen2ForCausalLM, qwen2_config(torch.bfloat16, True), "qwen2",
                   shard="100KB")
        make_model(a.out, "deepseek-v2-tiny", DeepseekV2ForCausalLM,
                   deepseek_config(torch.float32, False, "greedy"), "deepseek-v2", v4=True, hub_experts=True)
        make_model(a.out, "deepseek-v2-tiny-qlora", DeepseekV2ForCausalLM,
                   deepseek_config(torch.float32, True, "group_limited_greedy", mscale=1.0), "deepseek-v2",
                   shard="200KB")
        make_model(a.out, "deepseek-v2-tiny-bf16", DeepseekV2ForCausalLM,
                   deepseek_config(torch.bfloat16, True, "greedy"), "deepseek-v2")


if __name__ == "__main__":
    main()
