"""Models no one here wrote, for the tests of ``python -m export torch`` (docs/your-model.md).

Each is built with random weights from a library's own architecture (Hugging Face
transformers), or is a small module with what the repository's models lack: two inputs, a
dynamic axis that is not the batch, a mapping of outputs. And a few that must be refused.
"""

from __future__ import annotations

import torch


def resnet() -> torch.nn.Module:
    """A small ResNet (transformers' ResNetForImageClassification), random weights, 10 classes."""
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    config = ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32, 64], depths=[1, 1, 1], num_labels=10
    )
    return ResNetForImageClassification(config)


class TokensAndScale(torch.nn.Module):
    """Two inputs (token ids of any length, a scale per row), two outputs in a dict."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embedding = torch.nn.Embedding(50, 16)
        self.project = torch.nn.Linear(16, 8)

    def forward(self, tokens: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
        """``pooled`` [batch, 8] and ``per_token`` [batch, tokens]."""
        hidden = self.embedding(tokens)
        return {
            "pooled": self.project(hidden.mean(1) * scale),
            "per_token": hidden.sum(-1),
        }


class CentersTheBatch(torch.nn.Module):
    """Refused: each row's answer depends on the other rows (a batch statistic)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` minus the batch's mean."""
        return x - x.mean(0, keepdim=True)


class BakesTheBatch(torch.nn.Module):
    """Refused: the export fixes the example's batch size (a Python int from ``.shape``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` plus a zero per row, counted in Python."""
        rows = int(x.shape[0])
        return x + torch.zeros(rows, 1)


class ReturnsText(torch.nn.Module):
    """Refused: an output of a type Triton does not carry (complex)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as complex numbers."""
        return torch.complex(x, x)


def sentence_model(folder) -> None:
    """A BERT encoder with random weights, saved as sentence-transformers lays a model out.

    transformers' BertModel from a small config; MiniLM's tokenizer.json (its vocabulary fits
    the config's); mean pooling and normalization as modules.json and 1_Pooling say.
    """
    import json
    from pathlib import Path

    from transformers import BertConfig, BertModel

    from pipelines import minilm_weights

    folder = Path(folder)
    torch.manual_seed(2)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=512,
    )
    BertModel(config).save_pretrained(folder)
    (folder / "tokenizer.json").write_bytes(minilm_weights.read_member("tokenizer.json"))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 48, "pooling_mode_mean_tokens": True})
    )
