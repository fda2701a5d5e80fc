"""Writes corpus/gguf/tiny-llama.gguf: a complete one-layer llama GGUF (v3, f32 tensors) that
the reader accepts, as a fuzz seed beside the header of a real model."""
import struct
import sys

H, FFN, HEADS, KV, VOCAB = 16, 24, 4, 2, 32
HD = H // HEADS


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


kvs = [
    ("general.architecture", 8, s("llama")),
    ("general.alignment", 4, struct.pack("<I", 32)),
    ("llama.embedding_length", 4, struct.pack("<I", H)),
    ("llama.block_count", 4, struct.pack("<I", 1)),
    ("llama.feed_forward_length", 4, struct.pack("<I", FFN)),
    ("llama.attention.head_count", 4, struct.pack("<I", HEADS)),
    ("llama.attention.head_count_kv", 4, struct.pack("<I", KV)),
    ("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
    ("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5)),
    ("llama.context_length", 4, struct.pack("<I", 64)),
    ("llama.vocab_size", 4, struct.pack("<I", VOCAB)),
]
# ggml ne is innermost first: [in, out]
tensors = [
    ("token_embd.weight", [H, VOCAB]),
    ("output_norm.weight", [H]),
    ("blk.0.attn_norm.weight", [H]),
    ("blk.0.attn_q.weight", [H, H]),
    ("blk.0.attn_k.weight", [H, KV * HD]),
    ("blk.0.attn_v.weight", [H, KV * HD]),
    ("blk.0.attn_output.weight", [H, H]),
    ("blk.0.ffn_norm.weight", [H]),
    ("blk.0.ffn_gate.weight", [H, FFN]),
    ("blk.0.ffn_up.weight", [H, FFN]),
    ("blk.0.ffn_down.weight", [FFN, H]),
]
out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
for k, t, v in kvs:
    out += s(k) + struct.pack("<I", t) + v
data, offsets = b"", []
for name, ne in tensors:
    n = 1
    for d in ne:
        n *= d
    offsets.append(len(data))
    data += struct.pack(f"<{n}f", *[((i * 37) % 17 - 8) / 64 for i in range(n)])
    data += b"\0" * (-len(data) % 32)
for (name, ne), off in zip(tensors, offsets):
    out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
    out += struct.pack("<IQ", 0, off)
out += b"\0" * (-len(out) % 32)
out += data
open(sys.argv[1] if len(sys.argv) > 1 else "corpus/gguf/tiny-llama.gguf", "wb").write(out)
