"""Writes a random-init Qwen3-0.6B-shaped checkpoint (bf16 safetensors) for the convert benchmark.

Usage: python convert_make_checkpoint.py OUT_DIR
"""

import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

out = sys.argv[1]
config = Qwen3Config(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=151643,
    eos_token_id=151645,
)
torch.manual_seed(0)
model = Qwen3ForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
