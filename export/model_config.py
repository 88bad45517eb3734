"""Read model configs with Triton's own protobuf schema, as the server resolves them."""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc


def parse(path: Path) -> mc.ModelConfig:
    """A config.pbtxt (text format) as a ``ModelConfig`` message; raises on any schema error."""
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def resolve(model_dir: Path, config_name: str | None) -> mc.ModelConfig:
    """The config Triton loads with ``--model-config-name=config_name``.

    ``configs/<config_name>.pbtxt`` where the model has one, ``config.pbtxt`` otherwise.
    """
    if config_name and (model_dir / "configs" / f"{config_name}.pbtxt").exists():
        return parse(model_dir / "configs" / f"{config_name}.pbtxt")
    return parse(model_dir / "config.pbtxt")


def to_json(config: mc.ModelConfig) -> str:
    """The JSON form that Triton's model-control API accepts as a config override."""
    return json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))
