"""Builds model.onnx for sentence-transformers/all-MiniLM-L6-v2 from its safetensors weights.

A BERT encoder written out with the onnx helper API (numpy for the weights): embeddings
(word + position + token type, LayerNorm), 6 encoder layers (12-head self-attention, GELU
feed-forward, post-LayerNorm), output `last_hidden_state` [batch, sequence, 384]. Inputs:
`input_ids`, `attention_mask`, `token_type_ids` (int64, [batch, sequence]). Pooling (mean,
L2) is done by the embedder, not here.

Usage: python build_onnx.py MODEL_DIR  (reads MODEL_DIR/model.safetensors and config.json,
writes MODEL_DIR/model.onnx atomically).
"""

import json
import math
import os
import struct
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DTYPES = {"F32": np.float32, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        data = handle.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        array = np.frombuffer(data[start:end], dtype=DTYPES[info["dtype"]])
        tensors[name] = array.reshape(info["shape"])
    return tensors


class Graph:
    def __init__(self, weights):
        self.weights = weights
        self.nodes = []
        self.initializers = []
        self.count = 0

    def name(self, prefix):
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, name, array):
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, key, transpose=False):
        array = self.weights[key]
        if transpose:
            array = np.ascontiguousarray(array.T)
        return self.const(key + (".T" if transpose else ""), array)

    def op(self, op_type, inputs, **attributes):
        output = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [output], **attributes))
        return output

    def linear(self, x, prefix):
        product = self.op("MatMul", [x, self.weight(prefix + ".weight", transpose=True)])
        return self.op("Add", [product, self.weight(prefix + ".bias")])

    def layer_norm(self, x, prefix, epsilon):
        return self.op(
            "LayerNormalization",
            [x, self.weight(prefix + ".weight"), self.weight(prefix + ".bias")],
            axis=-1,
            epsilon=epsilon,
        )


def build(model_dir):
    config = json.load(open(os.path.join(model_dir, "config.json")))
    weights = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = hidden // heads
    epsilon = config["layer_norm_eps"]
    g = Graph(weights)

    # Embeddings. Position ids are the first `sequence` rows of the position table, sliced by
    # the input's shape (Range + Gather fails under ONNX Runtime 1.31).
    words = g.op("Gather", [g.weight("embeddings.word_embeddings.weight"), "input_ids"], axis=0)
    types = g.op(
        "Gather", [g.weight("embeddings.token_type_embeddings.weight"), "token_type_ids"], axis=0
    )
    shape = g.op("Shape", ["input_ids"])
    sequence = g.op(
        "Slice",
        [shape, g.const("one_i64", np.array([1], np.int64)), g.const("two_i64", np.array([2], np.int64))],
    )
    positions = g.op(
        "Slice",
        [
            g.weight("embeddings.position_embeddings.weight"),
            g.const("zero_i64", np.array([0], np.int64)),
            sequence,
            g.const("axis0_i64", np.array([0], np.int64)),
        ],
    )
    embedded = g.op("Add", [g.op("Add", [words, types]), positions])
    h = g.layer_norm(embedded, "embeddings.LayerNorm", epsilon)

    # Additive attention mask: 0 where attended, a large negative number where padded.
    mask = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    inverted = g.op("Sub", [g.const("one_f32", np.array(1.0, np.float32)), mask])
    bias = g.op("Mul", [inverted, g.const("mask_min", np.array(np.finfo(np.float32).min, np.float32))])
    bias = g.op("Unsqueeze", [bias, g.const("mask_axes", np.array([1, 2], np.int64))])

    split_shape = g.const("split_shape", np.array([0, 0, heads, head_dim], np.int64))
    merge_shape = g.const("merge_shape", np.array([0, 0, hidden], np.int64))
    scale = g.const("scale", np.array(1.0 / math.sqrt(head_dim), np.float32))
    sqrt2 = g.const("sqrt2", np.array(math.sqrt(2.0), np.float32))
    half = g.const("half", np.array(0.5, np.float32))
    one = "one_f32"

    for index in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{index}"
        q = g.op("Reshape", [g.linear(h, p + ".attention.self.query"), split_shape])
        k = g.op("Reshape", [g.linear(h, p + ".attention.self.key"), split_shape])
        v = g.op("Reshape", [g.linear(h, p + ".attention.self.value"), split_shape])
        q = g.op("Transpose", [q], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [k], perm=[0, 2, 3, 1])
        v = g.op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), scale]), bias])
        probabilities = g.op("Softmax", [scores], axis=-1)
        context = g.op("Transpose", [g.op("MatMul", [probabilities, v])], perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, merge_shape])
        attended = g.linear(context, p + ".attention.output.dense")
        h1 = g.layer_norm(g.op("Add", [attended, h]), p + ".attention.output.LayerNorm", epsilon)
        inner = g.linear(h1, p + ".intermediate.dense")
        erf = g.op("Erf", [g.op("Div", [inner, sqrt2])])
        gelu = g.op("Mul", [g.op("Mul", [inner, half]), g.op("Add", [erf, one])])
        out = g.linear(gelu, p + ".output.dense")
        h = g.layer_norm(g.op("Add", [out, h1]), p + ".output.LayerNorm", epsilon)

    g.nodes.append(helper.make_node("Identity", [h], ["last_hidden_state"]))
    dims = ["batch", "sequence"]
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, dims)
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    output = helper.make_tensor_value_info(
        "last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden]
    )
    graph = helper.make_graph(g.nodes, "all-MiniLM-L6-v2", inputs, [output], g.initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17)],
        producer_name="cairn scripts/model/build_onnx.py",
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    target = os.path.join(model_dir, "model.onnx")
    temporary = target + ".tmp"
    with open(temporary, "wb") as handle:
        handle.write(model.SerializeToString())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)


if __name__ == "__main__":
    build(sys.argv[1])
