#!/usr/bin/env python3
"""Encoder oracle fixtures from Hugging Face transformers / sentence-transformers.

Random-init tiny encoders (BERT, RoBERTa, BERT with a sequence-classification head), each run in
float32 with eager attention on a padded batch (so the attention mask is exercised), written as

    <out>/<name>/config.json, model.safetensors        (save_pretrained, f32)
    <out>/<name>/modules.json, 1_Pooling/config.json   (sentence-transformers pooling config)
    <out>/<name>/oracle.json   {"inputs": [{"ids", "hidden_states": [layers+1][T][H],
                                "embedding": [H], "logits"?: [labels]}], "pooling", versions}

hidden_states[0] is the embedding output (after its LayerNorm), entry i the output of layer i-1;
only the input's own (unpadded) positions are kept. "embedding" applies the fixture's pooling
and normalisation to the last hidden state, as sentence-transformers does.

With --real MODEL_DIR it instead runs sentence-transformers on the built-in sentences and
writes the real fixture (token ids and embeddings) to tests/fixtures/real/<name>.json.

Usage (by hand; CI never runs this — the outputs are committed):
    python tools/oracle/make_encoder_fixtures.py
    python tools/oracle/make_encoder_fixtures.py --real models/all-minilm-l6-v2
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
import transformers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    ModernBertConfig,
    ModernBertForSequenceClassification,
    ModernBertModel,
    RobertaConfig,
    RobertaModel,
)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "oracle-encoders"

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France.",
    "A man is playing a guitar on stage.",
    "Embeddings map sentences to vectors.",
    "Le chat dort sur le canapé.",
    "Der Zug nach Berlin fährt um acht Uhr ab.",
    "東京は日本の首都です。",
    "hi",
    "What is the boiling point of water at sea level, and why does it change at altitude?",
    "Rust's ownership rules make data races a compile-time error rather than a runtime surprise, "
    "which is why many systems programmers reach for it when correctness under concurrency matters.",
]


def pooled(hidden: torch.Tensor, mask: torch.Tensor, mode: str, normalize: bool) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "mean":
        out = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    elif mode == "cls":
        out = hidden[:, 0]
    elif mode == "lasttoken":
        last = mask.sum(1) - 1
        out = hidden[torch.arange(hidden.shape[0]), last]
    else:
        raise ValueError(mode)
    if normalize:
        out = torch.nn.functional.normalize(out, p=2, dim=1)
    return out


def write_pooling(d: Path, hidden: int, mode: str, normalize: bool) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    (d / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (d / "1_Pooling").mkdir(exist_ok=True)
    cfg = {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_lasttoken": mode == "lasttoken",
    }
    (d / "1_Pooling" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def write_word_tokenizer(d: Path, vocab_size: int) -> None:
    """A whitespace word-level tokenizer over `w4 … w{vocab-1}` with BERT's [CLS] … [SEP]
    templates (pairs: `[CLS] A [SEP] B [SEP]`, type id 1 from B on, as bert-base's
    tokenizer.json), so the CLI can be driven with text on the tiny checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}
    vocab.update({f"w{i}": i for i in range(4, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tok.save(str(d / "tokenizer.json"))


def rounded(t: torch.Tensor):
    return [round(float(v), 7) for v in t.flatten().tolist()]


def make(out: Path, name: str, model, pad_id: int, lengths, mode: str, normalize: bool, seed: int):
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    model.eval()
    model.save_pretrained(d, safe_serialization=True)
    cfg = model.config
    write_pooling(d, cfg.hidden_size, mode, normalize)
    g = torch.Generator().manual_seed(seed + 1)
    low = max(pad_id + 1, 3)
    seqs = [torch.randint(low, cfg.vocab_size, (n,), generator=g).tolist() for n in lengths]
    t = max(lengths)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    with torch.no_grad():
        if model.config.model_type == "modernbert":
            res, hs = modernbert_states(model, ids, mask)
        else:
            res = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            hs = res.hidden_states
    emb = pooled(hs[-1], mask, mode, normalize)
    inputs = []
    for i, s in enumerate(seqs):
        n = len(s)
        entry = {
            "ids": s,
            "hidden_states": [[rounded(h[i, p]) for p in range(n)] for h in hs],
            "embedding": rounded(emb[i]),
        }
        if getattr(res, "logits", None) is not None:
            entry["logits"] = rounded(res.logits[i])
        inputs.append(entry)
    oracle = {
        "pooling": mode,
        "normalize": normalize,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "inputs": inputs,
    }
    (d / "oracle.json").write_text(json.dumps(oracle) + "\n")
    print(f"{name}: {sum(p.numel() for p in model.parameters())} params, lengths {lengths}")


def modernbert_states(model, ids, mask):
    """ModernBERT: embeddings output, every layer's output, then the final norm (hooks, so the
    list does not depend on how transformers records hidden states)."""
    base = model.model if hasattr(model, "model") else model
    states = []
    hooks = [base.embeddings.register_forward_hook(lambda m, i, o: states.append(o))]
    for layer in base.layers:
        hooks.append(layer.register_forward_hook(lambda m, i, o: states.append(o)))
    hooks.append(base.final_norm.register_forward_hook(lambda m, i, o: states.append(o)))
    res = model(input_ids=ids, attention_mask=mask)
    for h in hooks:
        h.remove()
    return res, states


def perturb(model, seed: int) -> None:
    """Random-init ModernBERT zeroes biases and sets norms to 1; move every parameter so biases
    and norm weights are exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def pair_fixture(out: Path) -> None:
    """A cross-encoder: BertForSequenceClassification with one label (a reranker score) run on
    text pairs through the fixture's tokenizer (token types 1 for the second segment)."""
    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(4)
    cfg = BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=48, type_vocab_size=2,
        layer_norm_eps=1e-12, num_labels=1, attn_implementation="eager",
    )
    model = BertForSequenceClassification(cfg)
    perturb(model, 40)
    name = "bert_pair_reranker"
    make(out, name, model, 0, [7, 12], "cls", False, 4)
    d = out / name
    write_word_tokenizer(d, cfg.vocab_size)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"), pad_token="[PAD]")
    pairs = [
        ("w5 w9 w12", "w7 w30 w31 w40"),
        ("w60", "w4 w4 w8"),
        ("w11 w12 w13 w14 w15 w16", "w17"),
    ]
    enc = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_token_type_ids=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    items = []
    for i, (a, b) in enumerate(pairs):
        n = int(enc["attention_mask"][i].sum())
        items.append({
            "a": a, "b": b,
            "ids": enc["input_ids"][i, :n].tolist(),
            "type_ids": enc["token_type_ids"][i, :n].tolist(),
            "logits": rounded(logits[i]),
        })
    oracle = json.loads((d / "oracle.json").read_text())
    oracle["pairs"] = items
    (d / "oracle.json").write_text(json.dumps(oracle) + "\n")


def modernbert_fixtures(out: Path) -> None:
    common = dict(
        vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=64, local_attention=8,
        global_attn_every_n_layers=3, pad_token_id=0, bos_token_id=2, eos_token_id=3,
        cls_token_id=2, sep_token_id=3, attn_implementation="eager",
    )
    torch.manual_seed(5)
    model = ModernBertModel(ModernBertConfig(**common))
    perturb(model, 50)
    make(out, "modernbert_mean", model, 0, [13, 5, 20], "mean", True, 5)
    write_word_tokenizer(out / "modernbert_mean", 96)

    torch.manual_seed(6)
    cfg = ModernBertConfig(
        **common, norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True,
        classifier_pooling="mean", num_labels=3, id2label={0: "a", 1: "b", 2: "c"},
        label2id={"a": 0, "b": 1, "c": 2},
    )
    model = ModernBertForSequenceClassification(cfg)
    perturb(model, 60)
    make(out, "modernbert_classifier", model, 0, [6, 17, 11], "cls", False, 6)
    write_word_tokenizer(out / "modernbert_classifier", 96)


def tiny_fixtures(out: Path) -> None:
    torch.manual_seed(0)
    bert = BertConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
        layer_norm_eps=1e-12, attn_implementation="eager",
    )
    make(out, "bert_mean_norm", BertModel(bert, add_pooling_layer=False), 0, [9, 4, 13], "mean", True, 0)
    write_word_tokenizer(out / "bert_mean_norm", bert.vocab_size)

    torch.manual_seed(1)
    cls = BertConfig(
        vocab_size=80, hidden_size=48, num_hidden_layers=3, num_attention_heads=3,
        intermediate_size=96, max_position_embeddings=40, type_vocab_size=2,
        layer_norm_eps=1e-12, num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"},
        label2id={"neg": 0, "neu": 1, "pos": 2}, attn_implementation="eager",
    )
    make(out, "bert_cls_classifier", BertForSequenceClassification(cls), 0, [6, 11, 3], "cls", False, 1)

    torch.manual_seed(2)
    rob = RobertaConfig(
        vocab_size=72, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=40, type_vocab_size=1, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5, attn_implementation="eager",
    )
    make(out, "roberta_lasttoken", RobertaModel(rob, add_pooling_layer=False), 1, [5, 12, 8], "lasttoken", False, 2)

    pair_fixture(out)
    modernbert_fixtures(out)


def real_fixture(model_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir), device="cpu")
    tok = st.tokenizer
    emb = st.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=False)
    items = []
    for s, e in zip(SENTENCES, emb):
        items.append({"text": s, "ids": tok(s)["input_ids"], "embedding": rounded(e)})
    import sentence_transformers

    name = model_dir.name
    out = REPO / "tests" / "fixtures" / "real" / f"{name}.embeddings.json"
    doc = {
        "model": name,
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "inputs": items,
    }
    out.write_text(json.dumps(doc) + "\n")
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--real", type=Path)
    ap.add_argument("--only", choices=["pairs", "modernbert"], help="write only these new fixtures")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.real:
        real_fixture(a.real)
    elif a.only == "pairs":
        pair_fixture(a.out)
    elif a.only == "modernbert":
        modernbert_fixtures(a.out)
    else:
        tiny_fixtures(a.out)


if __name__ == "__main__":
    main()
