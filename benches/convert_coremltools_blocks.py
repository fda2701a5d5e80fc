"""The coremltools side of the convert benchmark: what a Python user writes to get the same
bundle shape as `anemone convert --layers-per-chunk 1` — each decoder block a stateful Core ML
package (fp16, iOS18) with a decode (T=1) and a prefill (T=PREFILL) function sharing weights.

Per block: PyTorch module over the Hugging Face layer, torch.jit.trace for each T, ct.convert with
K/V cache states, then ct.utils.save_multifunction to merge the two into one package.

Usage: python convert_coremltools_blocks.py CHECKPOINT_DIR OUT_DIR [CONTEXT] [PREFILL] [LAYERS]
"""

import os
import shutil
import sys
import time

import coremltools as ct
import numpy as np
import torch
from torch import nn
from transformers import AutoModelForCausalLM
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

ckpt, out = sys.argv[1], sys.argv[2]
context = int(sys.argv[3]) if len(sys.argv) > 3 else 512
prefill = int(sys.argv[4]) if len(sys.argv) > 4 else 64
torch.set_grad_enabled(False)

t0 = time.time()
model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float32)
cfg = model.config
layers = int(sys.argv[5]) if len(sys.argv) > 5 else cfg.num_hidden_layers
print(f"loaded {ckpt} in {time.time() - t0:.1f} s", flush=True)
nh, nkv, hd, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size


class StatefulBlock(nn.Module):
    """One decoder layer with its own K/V cache buffers, written at `position`."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.register_buffer("k_cache", torch.zeros(1, nkv, context, hd, dtype=torch.float16))
        self.register_buffer("v_cache", torch.zeros(1, nkv, context, hd, dtype=torch.float16))

    def forward(self, x, cos, sin, mask, position):
        t = x.shape[1]
        attn = self.layer.self_attn
        h = self.layer.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(h).view(1, t, nh, hd)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(h).view(1, t, nkv, hd)).transpose(1, 2)
        v = attn.v_proj(h).view(1, t, nkv, hd).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        start = position[0]
        self.k_cache[:, :, start : start + t, :] = k
        self.v_cache[:, :, start : start + t, :] = v
        keys = self.k_cache.float().repeat_interleave(nh // nkv, dim=1)
        values = self.v_cache.float().repeat_interleave(nh // nkv, dim=1)
        scores = q @ keys.transpose(2, 3) * (hd ** -0.5) + mask
        o = torch.softmax(scores, dim=-1) @ values
        o = attn.o_proj(o.transpose(1, 2).reshape(1, t, nh * hd))
        x = x + o
        return x + self.layer.mlp(self.layer.post_attention_layernorm(x))


def convert(block, t):
    example = (
        torch.zeros(1, t, hidden),
        torch.zeros(1, t, hd),
        torch.zeros(1, t, hd),
        torch.zeros(1, 1, t, context),
        torch.zeros(1, dtype=torch.int32),
    )
    traced = torch.jit.trace(block.eval(), example)
    return ct.convert(
        traced,
        inputs=[
            ct.TensorType(name="hidden_states", shape=(1, t, hidden), dtype=np.float16),
            ct.TensorType(name="cos", shape=(1, t, hd), dtype=np.float16),
            ct.TensorType(name="sin", shape=(1, t, hd), dtype=np.float16),
            ct.TensorType(name="mask", shape=(1, 1, t, context), dtype=np.float16),
            ct.TensorType(name="position", shape=(1,), dtype=np.int32),
        ],
        outputs=[ct.TensorType(name="hidden_states_out", dtype=np.float16)],
        states=[
            ct.StateType(wrapped_type=ct.TensorType(shape=(1, nkv, context, hd), dtype=np.float16), name="k_cache"),
            ct.StateType(wrapped_type=ct.TensorType(shape=(1, nkv, context, hd), dtype=np.float16), name="v_cache"),
        ],
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT16,
        skip_model_load=True,
    )


os.makedirs(out, exist_ok=True)
start = time.time()
for i in range(layers):
    t_block = time.time()
    block = StatefulBlock(model.model.layers[i])
    tmp = {}
    for name, t in (("decode", 1), ("prefill", prefill)):
        path = os.path.join(out, f"block-{i:02d}-{name}.mlpackage")
        convert(block, t).save(path)
        tmp[name] = path
    desc = ct.utils.MultiFunctionDescriptor()
    for name, path in tmp.items():
        desc.add_function(path, src_function_name="main", target_function_name=name)
    desc.default_function_name = "decode"
    ct.utils.save_multifunction(desc, os.path.join(out, f"chunk-{i:02d}.mlpackage"))
    for path in tmp.values():
        shutil.rmtree(path)
    print(f"block {i}: {time.time() - t_block:.1f} s", flush=True)
print(f"coremltools: {layers} blocks in {time.time() - start:.1f} s (after a {start - t0:.1f} s load)")
