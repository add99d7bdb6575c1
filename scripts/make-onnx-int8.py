"""all-MiniLM-L6-v2 or all-mpnet-base-v2 with int8 arithmetic for ONNX Runtime: the fused f32
graph of make-onnx.py, smoothed (SmoothQuant, Xiao et al. 2023) and then dynamically quantised
(int8 weights per output channel, activations per tensor at run time).

Plain dynamic quantisation loses too much here (cosine to f32 down to 0.983): a few activation
channels carry outliers, and one per-tensor scale spends its range on them. SmoothQuant moves
them into the weights, which are quantised per channel: for each quantised op with activation X
and weight W it picks, per input channel j, s_j = max|X_j|^a / max|W_j,:|^(1-a) (a = 0.7),
feeds X/s (an inserted Mul) and uses diag(s)W, which is exact in f32. The two MatMuls that lose
most even then (the FFN down-projections of layers 0 and 2) stay f32. Min cosine to the f32
model: 0.996 on single texts (shared/embed/tests/onnx.rs checks it).

MPNet's Attention takes a relative position bias, which ONNX Runtime's quantised QAttention
cannot, so its QKV projection is first split out of each Attention into three MatMuls feeding a
MultiHeadAttention (which takes the bias): the same vectors in f32, to cosine 1.000000. Then its
MatMuls are quantised like MiniLM's, but for the FFN down-projections of layers 0 and 3, which
lose most. Min cosine to the f32 model 0.984, mean 0.995 over 250 LoCoMo utterances and
questions; all quantised it is 0.962 / 0.993 for 1.2 ms less a question (docs/EVALUATION.md).

max|X| comes from the calibration texts (shared/embed/calibration-texts.json): hand-written
chat turns and questions of the kind Recollect stores (none from any evaluation set).
usage: make-onnx-int8.py model_dir fused_f32.onnx out.onnx
(run by scripts/setup-onnx.sh; numpy, onnx, onnxruntime, tokenizers)"""
import json
import logging
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from tokenizers import Tokenizer

ALPHA = 0.7
# Output tensors (make-onnx.py's names) of the MatMuls left in f32, most sensitive first, by the
# graph's name (make-onnx.py names it after the model directory).
KEEP_F32 = {"all-MiniLM-L6-v2-fused": ["l0_fo", "l2_fo"], "all-mpnet-base-v2-fused": ["l0_fo", "l3_fo"]}
# The least cosine to the f32 model, over the calibration texts, below which the graph is refused
# (each model's measured minimum on them, less a margin; docs/EVALUATION.md has the LoCoMo ones).
MIN_COSINE = {"all-MiniLM-L6-v2-fused": 0.99, "all-mpnet-base-v2-fused": 0.97}
# Hand-written chat questions and turns, and one long text (shared/embed/calibration-texts.json,
# which the embed tests read too).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shared", "embed",
                       "calibration-texts.json"), encoding="utf-8") as _f:
    _texts = json.load(_f)
CALIBRATION = _texts["questions"] + _texts["turns"] + [_texts["long"]]


def split_biased_attention(model: onnx.ModelProto) -> None:
    """Each Attention with an attention_bias (MPNet's) becomes MatMuls for Q, K and V and a
    MultiHeadAttention taking the QKV bias, the mask and the attention bias, in place."""
    inits = {t.name: t for t in model.graph.initializer}
    nodes = []
    for n in model.graph.node:
        if n.op_type != "Attention" or len(n.input) < 6 or not n.input[5]:
            nodes.append(n)
            continue
        x, w, b, mask, _, bias = n.input[:6]
        qkv = numpy_helper.to_array(inits[w])
        h = qkv.shape[0]
        layer = n.output[0].split("_")[0]
        projected = []
        for i, t in enumerate("qkv"):
            model.graph.initializer.append(
                numpy_helper.from_array(np.ascontiguousarray(qkv[:, i * h:(i + 1) * h]), f"{layer}_{t}_w"))
            nodes.append(helper.make_node("MatMul", [x, f"{layer}_{t}_w"], [f"{layer}_{t}"], name=f"{layer}_{t}_matmul"))
            projected.append(f"{layer}_{t}")
        heads = next(a.i for a in n.attribute if a.name == "num_heads")
        nodes.append(helper.make_node("MultiHeadAttention", projected + [b, mask, bias], list(n.output),
                                      name=n.name, domain="com.microsoft", num_heads=heads))
        model.graph.initializer.remove(inits[w])
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def main() -> None:
    model_dir, src, out = sys.argv[1:4]
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)

    model = onnx.load(src)
    keep_f32 = KEEP_F32[model.graph.name]
    split_biased_attention(model)
    weights = {t.name for t in model.graph.initializer}
    # (op name, activation input, weight) of every op to be quantised.
    targets = [
        (n.name, n.input[0], n.input[1])
        for n in model.graph.node
        if n.op_type in ("MatMul", "Attention") and n.input[1] in weights and n.output[0] not in keep_f32
    ]

    # Per-channel max|X| of each activation, over the calibration texts, in f32.
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for x in dict.fromkeys(x for _, x, _ in targets):
        probe.graph.output.append(helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    amax: dict[str, np.ndarray] = {}
    for text in CALIBRATION:
        ids = np.array([tok.encode(text).ids], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        for name, o in zip(names, sess.run(None, feeds)):
            a = np.abs(o.reshape(-1, o.shape[-1])).max(0)
            amax[name] = np.maximum(amax.get(name, 0), a)

    inits = {t.name: t for t in model.graph.initializer}
    smooth = []
    for name, x, w in targets:
        wt = numpy_helper.to_array(inits[w])
        s = (np.power(np.maximum(amax[x], 1e-5), ALPHA)
             / np.power(np.maximum(np.abs(wt).max(1), 1e-5), 1 - ALPHA)).astype(np.float32)
        inits[w].CopyFrom(numpy_helper.from_array((wt * s[:, None]).astype(np.float32), w))
        inv = f"{name}_smooth_inv"
        model.graph.initializer.append(numpy_helper.from_array((1.0 / s).astype(np.float32), inv))
        smoothed = f"{x}_smoothed_for_{name}"
        for n in model.graph.node:
            if n.name == name:
                n.input[0] = smoothed
        smooth.append(helper.make_node("Mul", [x, inv], [smoothed], name=f"{name}_smooth"))
    # Each Mul right before its consumer, so the graph stays topologically sorted.
    ordered = []
    for n in model.graph.node:
        ordered += [m for m in smooth if m.output[0] in n.input]
        ordered.append(n)
    del model.graph.node[:]
    model.graph.node.extend(ordered)

    keep = [n.name for n in model.graph.node if n.output[0] in keep_f32]
    # quantize_dynamic suggests its shape pre-processing, which the contrib ops do not need.
    logging.getLogger().setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        smoothed_f32 = os.path.join(tmp, "smoothed.onnx")
        onnx.save(model, smoothed_f32)
        quantize_dynamic(
            smoothed_f32, out, weight_type=QuantType.QInt8, per_channel=True,
            op_types_to_quantize=["MatMul", "Attention"], nodes_to_exclude=keep,
            # No shape inference through the com.microsoft ops.
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    worst = least_cosine(src, out, tok)
    if worst < MIN_COSINE[model.graph.name]:
        sys.exit(f"{out}: least cosine to the f32 model {worst:.4f} < {MIN_COSINE[model.graph.name]}")
    print(out, f"{len(targets)} ops quantised, {len(keep)} kept f32, least cosine to f32 {worst:.4f}")


def least_cosine(f32: str, int8: str, tok: Tokenizer) -> float:
    """The least cosine between the two graphs' mean-pooled vectors of the calibration texts:
    the graph's bytes follow the CPU's float kernels (the calibration runs ONNX Runtime), so
    what setup checks is that it embeds as the f32 model does."""
    sessions = [ort.InferenceSession(g, providers=["CPUExecutionProvider"]) for g in (f32, int8)]
    worst = 1.0
    for text in CALIBRATION:
        ids = np.array([tok.encode(text).ids], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        a, b = (s.run(None, feeds)[0][0].mean(0) for s in sessions)
        worst = min(worst, float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
    return worst


if __name__ == "__main__":
    main()
