#!/usr/bin/env python3
"""Turns nomic-embed-text-v1.5 as GPT4All ships it (`nomic-embed-text-v1.5.f16.gguf`) into the
model directory Recollect loads: model.safetensors (f32), config.json and tokenizer.json.

    convert-nomic-gguf.py MODEL.gguf BERT_TOKENIZER_DIR OUT_DIR

The GGUF holds nomic-bert (12 layers of 768, rotary positions, SwiGLU, no biases but the layer
norms') in f16, and the bert-base-uncased WordPiece vocabulary in llama.cpp's spelling (a word
start as "\u2581word", a continuation without its "##"). The weights are widened to f32 (exact)
under the GGUF's own tensor names; config.json gives the shapes and constants the GGUF states.
The tokenizer is BERT_TOKENIZER_DIR's tokenizer.json (all-MiniLM-L6-v2's, itself
bert-base-uncased), used only after every one of its 30,522 entries is checked against the
GGUF's vocabulary, so the token ids are the ones the model was trained with.

Needs numpy and safetensors. Writes into OUT_DIR (created), overwriting those three files.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np
from safetensors.numpy import save_file

SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
F32, F16 = 0, 1


def read_gguf(path):
    """GGUF v2/v3: metadata and the F32/F16 tensors, in the file's order."""
    b = open(path, "rb").read()
    if b[:4] != b"GGUF":
        sys.exit(f"convert-nomic-gguf: {path} is not a GGUF file")
    pos = 4

    def unpack(fmt):
        nonlocal pos
        (v,) = struct.unpack_from("<" + fmt, b, pos)
        pos += struct.calcsize("<" + fmt)
        return v

    def string():
        nonlocal pos
        n = unpack("Q")
        v = b[pos : pos + n].decode("utf-8")
        pos += n
        return v

    def value(kind):
        if kind == 8:
            return string()
        if kind == 9:
            item, n = unpack("I"), unpack("Q")
            return [value(item) for _ in range(n)]
        return unpack(SCALARS[kind])

    version = unpack("I")
    if version not in (2, 3):
        sys.exit(f"convert-nomic-gguf: GGUF version {version}, expected 2 or 3")
    n_tensors, n_meta = unpack("Q"), unpack("Q")
    meta = {}
    for _ in range(n_meta):
        key = string()
        meta[key] = value(unpack("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [unpack("Q") for _ in range(unpack("I"))]
        infos.append((name, dims, unpack("I"), unpack("Q")))
    align = meta.get("general.alignment", 32)
    data = (pos + align - 1) // align * align
    tensors = {}
    for name, dims, kind, offset in infos:
        if kind not in (F32, F16):
            sys.exit(f"convert-nomic-gguf: tensor {name} has GGML type {kind}, expected F32 or F16")
        dtype = np.float32 if kind == F32 else np.float16
        a = np.frombuffer(b, dtype, int(np.prod(dims)), data + offset)
        # GGUF lists dimensions innermost first.
        tensors[name] = a.reshape(list(reversed(dims))).astype(np.float32)
    return meta, tensors


def main():
    gguf, tokenizer_dir, out = sys.argv[1:4]
    meta, tensors = read_gguf(gguf)
    arch = meta.get("general.architecture")
    if arch != "nomic-bert":
        sys.exit(f"convert-nomic-gguf: architecture {arch}, expected nomic-bert")

    vocab = [line.rstrip("\n") for line in open(os.path.join(tokenizer_dir, "vocab.txt"), encoding="utf-8")]
    gguf_vocab = meta["tokenizer.ggml.tokens"]

    def llama_spelling(piece):
        if piece.startswith("[") and piece.endswith("]"):
            return piece
        return piece[2:] if piece.startswith("##") else "\u2581" + piece

    differ = [i for i, (a, g) in enumerate(zip(vocab, gguf_vocab)) if llama_spelling(a) != g]
    if len(vocab) != len(gguf_vocab) or differ:
        sys.exit(f"convert-nomic-gguf: the vocabulary of {tokenizer_dir} is not the model's "
                 f"({len(vocab)} against {len(gguf_vocab)} entries, {len(differ)} differ)")

    prefix = "nomic-bert."
    config = {
        "model_type": "nomic_bert",
        "hidden_size": meta[prefix + "embedding_length"],
        "num_attention_heads": meta[prefix + "attention.head_count"],
        "num_hidden_layers": meta[prefix + "block_count"],
        "intermediate_size": meta[prefix + "feed_forward_length"],
        "layer_norm_eps": meta[prefix + "attention.layer_norm_epsilon"],
        "rotary_emb_base": meta[prefix + "rope.freq_base"],
        "max_position_embeddings": meta[prefix + "context_length"],
        "vocab_size": len(gguf_vocab),
        "source": os.path.basename(gguf),
    }
    os.makedirs(out, exist_ok=True)
    weights = os.path.join(out, "model.safetensors")
    save_file(tensors, weights)
    os.chmod(weights, 0o644)  # save_file creates it readable by its owner only
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    shutil.copyfile(os.path.join(tokenizer_dir, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    print(out, len(tensors), "tensors")


if __name__ == "__main__":
    main()
