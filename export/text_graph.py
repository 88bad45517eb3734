"""Text in, sentence embedding out, in one ONNX graph: the tokenizer as a graph op.

onnxruntime-extensions' ``BertTokenizer`` op (domain ``ai.onnx.contrib``) takes the model's own
vocabulary and tokenizes inside onnxruntime; merged in front of the encoder (which pools in its
graph) it makes ``embed_graph``: UTF-8 texts → unit vectors with no Python step at all. Triton's
onnxruntime backend loads the op library through ``model_operations { op_library_filename }``.

The op tokenizes one text (or one sentence pair) per call, so the graph loops over the batch,
pads each text's ids to ``MAX_TOKENS`` and cuts the batch back to its longest text.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, compose, helper

from pipelines import embedding, minilm_weights, tokenization

CONTRIB = "ai.onnx.contrib"
OPSET = 17
DEFAULT_OUTPUT = Path("model_repository") / embedding.GRAPH_ENSEMBLE / "1" / "model.onnx"


def vocabulary() -> str:
    """The word pieces of the model's tokenizer.json, one per line in id order (vocab.txt)."""
    model = json.loads(minilm_weights.read_member("tokenizer.json"))["model"]
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError("tokenizer.json: word-piece ids are not 0..n-1")
    return "\n".join(piece for piece, _ in by_id)


def _const(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node(
        "Constant",
        [],
        [name],
        value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values),
    )


def _loop_body() -> onnx.GraphProto:
    """One text → its ids and mask padded to MAX_TOKENS (the Loop's scan outputs)."""
    nodes = [
        helper.make_node("Gather", ["texts", "i"], ["text"], axis=0),
        _const("axis0", [0]),
        helper.make_node("Unsqueeze", ["text", "axis0"], ["one_text"]),
        # Lower-casing and accent stripping as BertNormalizer(lowercase=True) does.
        helper.make_node(
            "BertTokenizer",
            ["one_text"],
            ["ids", "type_ids", "mask"],
            domain=CONTRIB,
            vocab_file=vocabulary(),
            do_lower_case=1,
            strip_accents=1,
            max_length=embedding.MAX_TOKENS,
        ),
        helper.make_node("Shape", ["ids"], ["count"]),
        _const("max_tokens", [embedding.MAX_TOKENS]),
        helper.make_node("Sub", ["max_tokens", "count"], ["missing"]),
        helper.make_node("Concat", ["axis0", "missing"], ["pads"], axis=0),
        helper.make_node("Pad", ["ids", "pads"], ["ids_row"]),
        helper.make_node("Pad", ["mask", "pads"], ["mask_row"]),
        helper.make_node("Identity", ["cond"], ["cond_out"]),
    ]
    return helper.make_graph(
        nodes,
        "tokenize_one",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("ids_row", TensorProto.INT64, [embedding.MAX_TOKENS]),
            helper.make_tensor_value_info("mask_row", TensorProto.INT64, [embedding.MAX_TOKENS]),
        ],
    )


def tokenizer_model() -> onnx.ModelProto:
    """TEXT [batch, 1] string → INPUT_IDS, ATTENTION_MASK int64 [batch, longest]."""
    nodes = [
        _const("flat", [-1]),
        helper.make_node("Reshape", [embedding.TEXT, "flat"], ["texts"]),
        helper.make_node("Shape", ["texts"], ["batch"]),
        helper.make_node("Squeeze", ["batch"], ["trips"]),
        helper.make_node(
            "Constant", [], ["go"], value=helper.make_tensor("go", TensorProto.BOOL, [], [True])
        ),
        helper.make_node("Loop", ["trips", "go"], ["ids_all", "mask_all"], body=_loop_body()),
        # Cut the padding back to the longest text of the batch.
        _const("tokens_axis", [1]),
        helper.make_node("ReduceSum", ["mask_all", "tokens_axis"], ["lengths"], keepdims=0),
        helper.make_node("ReduceMax", ["lengths"], ["longest_scalar"], keepdims=1),
        _const("start", [0]),
        helper.make_node(
            "Slice", ["ids_all", "start", "longest_scalar", "tokens_axis"], [embedding.INPUT_IDS]
        ),
        helper.make_node(
            "Slice",
            ["mask_all", "start", "longest_scalar", "tokens_axis"],
            [embedding.ATTENTION_MASK],
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "tokenizer",
        [helper.make_tensor_value_info(embedding.TEXT, TensorProto.STRING, ["batch", 1])],
        [
            helper.make_tensor_value_info(
                embedding.INPUT_IDS, TensorProto.INT64, ["batch", "sequence"]
            ),
            helper.make_tensor_value_info(
                embedding.ATTENTION_MASK, TensorProto.INT64, ["batch", "sequence"]
            ),
        ],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(CONTRIB, 1)]
    )


def embedding_model(encoder: Path) -> onnx.ModelProto:
    """The tokenizer graph merged in front of the (pooling) encoder: TEXT → EMBEDDING."""
    encoder_model = onnx.load(str(encoder))
    tokenizer = tokenizer_model()
    tokenizer.ir_version = encoder_model.ir_version
    merged = compose.merge_models(
        tokenizer,
        encoder_model,
        io_map=[
            (embedding.INPUT_IDS, embedding.INPUT_IDS),
            (embedding.ATTENTION_MASK, embedding.ATTENTION_MASK),
        ],
        prefix1="tokenizer/",
        prefix2="",
    )
    # merge_models prefixed the tokenizer's graph input too; the served name is TEXT.
    for graph_input in merged.graph.input:
        if graph_input.name == f"tokenizer/{embedding.TEXT}":
            graph_input.name = embedding.TEXT
    for node in merged.graph.node:
        node.input[:] = [
            embedding.TEXT if n == f"tokenizer/{embedding.TEXT}" else n for n in node.input
        ]
    return merged


def check_ids(texts: list[str], session) -> int:
    """Texts whose graph-made ids differ from ``tokenizers``' (compared without padding)."""
    ids, mask = session.run(None, {embedding.TEXT: np.array(texts, dtype=object).reshape(-1, 1)})
    expected = tokenization.encode(texts)[0]
    return sum(
        1 for row, m, want in zip(ids, mask, expected, strict=True) if list(row[m == 1]) != want
    )


def main(encoder: Path, output: Path) -> None:
    """Write the one-graph embedding model; check its ids and vectors against the Python path.

    Raises:
        SystemExit: a sample text tokenized differently, or an embedding below MIN_COSINE.
    """
    from export import minilm, onnx_export
    from pipelines import onnx_runner

    texts = minilm.parity_texts()
    with onnx_export.staged(output) as path:
        onnx.save(embedding_model(encoder), str(path))
        onnx.checker.check_model(str(path))
        tokenizer = onnx_runner.create_session(
            tokenizer_model().SerializeToString(), custom_ops=True
        )
        if differ := check_ids(texts, tokenizer):
            raise SystemExit(f"{differ} of {len(texts)} sample texts tokenized differently")
        session = onnx_runner.create_session(path, intra_op_threads=2, custom_ops=True)
        got = onnx_runner.run(
            session,
            {embedding.TEXT: np.array(texts, dtype=object).reshape(-1, 1)},
            [embedding.EMBEDDING],
        )[0]
        minilm.check_parity(minilm.onnx_embeddings(encoder, texts), got, minilm.MIN_COSINE)
