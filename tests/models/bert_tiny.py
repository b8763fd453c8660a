"""Tiny random BERT models as Hugging Face / sentence-transformers directories, for tests that need no download.

    write_tiny_bert_hf(tmp_path / "bert")     # config.json, model.safetensors, vocab.txt, tokenizer_config.json,
                                              # modules.json, 1_Pooling/config.json, sentence_bert_config.json

The weights are random but not trivial: matrices ~ N(0, 1/n_in) (token and position embeddings ~ N(0, 1)),
layer-norm gains 1 + 0.3 N(0, 1), biases 0.1 N(0, 1), so every op of the graph changes the result. The same
arguments always give the same files.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SPECIAL = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "man", "woman", "is", "are", "eat", "play", "ride", "food", "horse", "music", "cat", "dog",
         "hello", "world", "red", "blue", "big", "small", "on", "in", "and", "of", "to", "bread", "drum", "violin",
         ".", ",", "!", "?", "'", "-", "un", "re"]
PIECES = ["##s", "##ing", "##ed", "##er", "##ly", "##a", "##e", "##o", "##n", "##t"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
VOCAB = (SPECIAL + WORDS + PIECES + [c for c in LETTERS if c not in WORDS]
         + ["##" + c for c in LETTERS if "##" + c not in PIECES])

TEXTS = ["the man is eating food.", "a woman plays the violin!", "hello world", "dogs and cats",
         "the big red horse rides on and on and on, unridden.", "x", "Music?"]


def write_tiny_bert_hf(path, *, n_embd=64, n_layer=2, n_head=4, n_ff=128, n_ctx=24, n_token_types=2,
                       pooling="mean", max_seq_length=None, hidden_act="gelu", seed=0, masked_lm=False,
                       drop=(), extra=None, config=None):
    """Write a BERT directory with random weights; returns its Path.

    pooling         "mean", "cls", "lasttoken" (sentence-transformers' names) or None (no sentence-transformers
                    files: no modules.json / 1_Pooling)
    masked_lm       name tensors as BertForMaskedLM does ("bert." prefix, with an MLM head to be dropped)
    drop            Hugging Face tensor names (without prefix) to leave out
    extra           {name: array} written as well
    config          config.json keys to override
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n_vocab = len(VOCAB)

    def w(*shape, scale=None):
        return (rng.standard_normal(shape) * (scale or shape[-1] ** -0.5)).astype(np.float32)

    def gain(n):
        return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    def bias(n):
        return (0.1 * rng.standard_normal(n)).astype(np.float32)

    t = {"embeddings.word_embeddings.weight": w(n_vocab, n_embd, scale=1.0),
         "embeddings.position_embeddings.weight": w(n_ctx, n_embd, scale=1.0),
         "embeddings.token_type_embeddings.weight": w(n_token_types, n_embd, scale=1.0),
         "embeddings.LayerNorm.weight": gain(n_embd), "embeddings.LayerNorm.bias": bias(n_embd)}
    for i in range(n_layer):
        p = f"encoder.layer.{i}."
        for n in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            t[p + n + ".weight"] = w(n_embd, n_embd)
            t[p + n + ".bias"] = bias(n_embd)
        t[p + "intermediate.dense.weight"] = w(n_ff, n_embd)
        t[p + "intermediate.dense.bias"] = bias(n_ff)
        t[p + "output.dense.weight"] = w(n_embd, n_ff)
        t[p + "output.dense.bias"] = bias(n_embd)
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + n + ".weight"] = gain(n_embd)
            t[p + n + ".bias"] = bias(n_embd)
    t["pooler.dense.weight"] = w(n_embd, n_embd)
    t["pooler.dense.bias"] = bias(n_embd)
    t["embeddings.position_ids"] = np.arange(n_ctx, dtype=np.int64)[None]
    for n in drop:
        del t[n]
    if masked_lm:
        t = {"bert." + k: v for k, v in t.items()}
        t["cls.predictions.bias"] = bias(n_vocab)
        t["cls.predictions.transform.dense.weight"] = w(n_embd, n_embd)
    t.update(extra or {})
    from safetensors.numpy import save_file
    save_file(t, str(path / "model.safetensors"))

    cfg = {"architectures": ["BertForMaskedLM" if masked_lm else "BertModel"], "model_type": "bert",
           "hidden_size": n_embd, "num_hidden_layers": n_layer, "num_attention_heads": n_head,
           "intermediate_size": n_ff, "hidden_act": hidden_act, "layer_norm_eps": 1e-12,
           "max_position_embeddings": n_ctx, "type_vocab_size": n_token_types, "vocab_size": n_vocab,
           "pad_token_id": 0, "position_embedding_type": "absolute", "_name_or_path": "tiny-random-bert"}
    cfg.update(config or {})
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    (path / "vocab.txt").write_text("".join(v + "\n" for v in VOCAB), encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"do_lower_case": True, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
         "cls_token": "[CLS]", "mask_token": "[MASK]", "tokenize_chinese_chars": True, "strip_accents": None,
         "tokenizer_class": "BertTokenizer", "model_max_length": n_ctx}))
    if pooling is not None:
        (path / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        (path / "1_Pooling").mkdir(exist_ok=True)
        (path / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": n_embd, "pooling_mode_cls_token": pooling == "cls",
             "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
             "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_lasttoken": pooling == "lasttoken"}))
        (path / "sentence_bert_config.json").write_text(json.dumps(
            {"max_seq_length": max_seq_length or n_ctx, "do_lower_case": False}))
    return path
