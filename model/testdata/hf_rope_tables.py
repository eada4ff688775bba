#!/usr/bin/env python3
"""Write model/testdata/hf_rope.json: HF transformers' rotary tables at chosen positions.

Run on the GPU machine (torch, transformers 5.x): python3 model/testdata/hf_rope_tables.py OUT.json

For each case: the config (as config.json holds it), the positions, and HF's cos and sin
[len(positions), rope_dim/2] from the model's own *RotaryEmbedding run on the GPU, with
attention_scaling folded in; for DeepSeek-V2 also DeepseekV2Attention's softmax scale.
model/rope_test.go holds fuselm's tables against them.
"""
import json
import sys

import torch
import transformers
from transformers import DeepseekV2Config, Qwen2Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention, DeepseekV2RotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

POSITIONS = [0, 1, 2, 7, 100, 1000, 4095, 4096, 10000, 11040, 32767]
dev = "cuda" if torch.cuda.is_available() else "cpu"
pos = torch.tensor([POSITIONS], device=dev)
x = torch.zeros(1, dtype=torch.float32, device=dev)
cases = []


def qwen2(name, **kw):
    cfg = Qwen2Config(**kw)
    cos, sin = Qwen2RotaryEmbedding(cfg).to(dev)(x, pos)
    half = cos.shape[-1] // 2  # cos = cat(freqs, freqs)
    cases.append({"name": name, "config": json.loads(cfg.to_json_string()), "positions": POSITIONS,
                  "cos": cos[0, :, :half].tolist(), "sin": sin[0, :, :half].tolist()})


def deepseek(name, **kw):
    cfg = DeepseekV2Config(**kw)
    fc = DeepseekV2RotaryEmbedding(cfg).to(dev)(x, pos)
    cases.append({"name": name, "config": json.loads(cfg.to_json_string()), "positions": POSITIONS,
                  "cos": fc.real[0].tolist(), "sin": fc.imag[0].tolist(),
                  "softmax_scale": DeepseekV2Attention(cfg, 0).scaling})


small = dict(vocab_size=64, hidden_size=512, intermediate_size=64, num_hidden_layers=1)
qwen2("qwen2-default", **small, num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=32768,
      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
qwen2("qwen2-7b", **small, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32768,
      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
qwen2("qwen2-yarn", **small, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=131072,
      rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                       "original_max_position_embeddings": 32768})
ds = dict(vocab_size=64, hidden_size=256, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=1,
          num_attention_heads=4, kv_lora_rank=64, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
          v_head_dim=128, n_routed_experts=8, num_experts_per_tok=2, max_position_embeddings=163840)
deepseek("deepseek-v2-lite", **ds, rope_parameters={
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
    "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707})
deepseek("deepseek-mscale-ratio", **ds, rope_parameters={
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
    "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.707})
deepseek("deepseek-no-truncate", **ds, rope_parameters={
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0, "original_max_position_embeddings": 8192,
    "truncate": False})
deepseek("deepseek-default", **ds, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})

json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "device": dev, "cases": cases},
          open(sys.argv[1], "w"))
print(f"{len(cases)} cases, transformers {transformers.__version__}, on {dev}")
