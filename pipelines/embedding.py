"""The text-embedding service's contract (all-MiniLM-L6-v2): its models and their tensors.

Model names, tensor names, types and sizes are written here once; export/, the configs (held to
``SIGNATURES`` by ``python -m model_config --check``), the Python-backend steps, the clients and
the tests read them from here. The jobs around it have their own modules: the weights package
(``pipelines.minilm_weights``), texts to word pieces (``pipelines.tokenization``), and padding,
sub-batching and pooling (``pipelines.padding``).
"""

from __future__ import annotations

from pipelines.tensors import Signature, Tensor

# Models in model_repository/.
ENSEMBLE = "embed"
TOKENIZE = "tokenize"
ENCODER = "encoder"  # pools in its graph: ids and mask in, EMBEDDING out
# TEXT → EMBEDDING in one ONNX graph (tokenizer op + encoder): export/text_graph.py.
GRAPH_ENSEMBLE = "embed_graph"
# TEXT → EMBEDDING in one Python step (tokenizers, then the encoder's graph on onnxruntime on
# length-sorted sub-batches): embed's step on the CPU configs, where a second stub would cost
# more than the batch it forms (docs/models.md, "One step on the CPU").
TOKENIZE_ENCODE = "tokenize_encode"
# embed for clients that send a 1-D batch of texts (LiteLLM's `triton/` provider, LlamaIndex's
# NvidiaTritonEmbedding): TEXTS [N] → EMBEDDING [N, 384]; TEXT_ROWS turns the texts into
# embed's [N, 1] rows.
TEXTS_ENSEMBLE = "text_embeddings"
TEXT_ROWS = "texts_as_batch"
INT8_ENSEMBLE = "embed_int8"
# The OpenAI-compatible API (gateway/openai.js): its model ids, and the ensemble each one calls,
# which also answers TOKENS for the usage (model_repository/embed_with_tokens says why not embed).
OPENAI_MODELS = {ENSEMBLE: "embed_with_tokens", INT8_ENSEMBLE: "embed_int8_with_tokens"}
# What clients call over Triton's APIs; the other models are steps of these, or the OpenAI
# API's (which the gateway calls itself), and the gateway does not pass them on.
SERVED = (ENSEMBLE, INT8_ENSEMBLE, GRAPH_ENSEMBLE, TEXTS_ENSEMBLE)

# Tensor names, after what they hold; their types and dims are in SIGNATURES.
TEXT = "TEXT"  # one UTF-8 text per batch item
INPUT_IDS = "INPUT_IDS"  # word-piece ids, padded with pipelines.padding.PAD_ID
ATTENTION_MASK = "ATTENTION_MASK"  # 1 for real tokens, 0 for padding
EMBEDDING = "EMBEDDING"  # mean over real tokens, L2-normalized
TOKENS = "TOKENS"  # word pieces the text became (with [CLS], [SEP]; truncated)
TEXTS = "input_text"  # a 1-D batch of texts, LiteLLM's name for it
# Optional, one flag per text: true embeds the first MAX_TOKENS word pieces of a longer text;
# false or absent refuses such a text (INVALID_ARG naming it, its word pieces and the limit),
# and nothing else of the batch fails. An input, not a request parameter, because Triton's
# response cache keys a request by its inputs alone (docs/triton-2.51.md): a cut vector must
# never answer a request that asked for none.
TRUNCATE = "TRUNCATE"
# The most texts one request may carry: embed's max_batch_size.
MAX_TEXTS = 64
# The most texts one call of the OpenAI-compatible API may carry (OpenAI's own limit); the
# gateway sends them to Triton MAX_TEXTS at a time.
MAX_OPENAI_INPUTS = 2048

HIDDEN_SIZE = 384
# sentence-transformers' max_seq_length for this model, [CLS] and [SEP] included: a longer
# text is refused unless its request sets TRUNCATE (then its first MAX_TOKENS are embedded).
MAX_TOKENS = 256

_TEXT = Tensor(TEXT, "BYTES", (1,))
_TRUNCATE = Tensor(TRUNCATE, "BOOL", (1,), optional=True)
_IDS = (Tensor(INPUT_IDS, "INT64", (-1,)), Tensor(ATTENTION_MASK, "INT64", (-1,)))
_EMBEDDING = Tensor(EMBEDDING, "FP32", (HIDDEN_SIZE,))
_TOKENS = Tensor(TOKENS, "INT32", (1,))
_TEXTS = Tensor(TEXTS, "BYTES", (-1,))
_EMBED = Signature((_TEXT, _TRUNCATE), (_EMBEDDING,))
_COUNTED = Signature((_TEXT, _TRUNCATE), (_EMBEDDING, _TOKENS))  # and their word pieces

# Each model's inputs and outputs, in every config variant.
SIGNATURES = {
    TOKENIZE: Signature((_TEXT, _TRUNCATE), (*_IDS, _TOKENS)),
    ENCODER: Signature(_IDS, (_EMBEDDING,)),
    TOKENIZE_ENCODE: _COUNTED,
    ENSEMBLE: _EMBED,
    INT8_ENSEMBLE: _EMBED,
    # One ONNX graph, tokenizer op included: it cuts every text at MAX_TOKENS (no TRUNCATE).
    GRAPH_ENSEMBLE: Signature((_TEXT,), (_EMBEDDING,)),
    **{ensemble: _COUNTED for ensemble in OPENAI_MODELS.values()},
    # 1-D batches of texts: no batch dimension of Triton's, the texts' own instead.
    # TRUNCATE there is one flag for every text of the request, TEXT_ROWS copies it to each row.
    TEXT_ROWS: Signature((_TEXTS, _TRUNCATE), (_TEXT.rows(), _TRUNCATE.rows())),
    TEXTS_ENSEMBLE: Signature((_TEXTS, _TRUNCATE), (_EMBEDDING.rows(),)),
}
