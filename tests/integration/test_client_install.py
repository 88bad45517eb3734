"""The client installed alone, as a user installs it, calls the real server.

``pip install "<repository>[client]"`` into a new venv (no system site packages) brings the
client, tritonclient and numpy, and nothing that the server's extras declare: torch,
onnxruntime, tokenizers and PIL do not import there. From a folder outside the checkout, the
installed client's Python API and ``python -m client`` embed and classify on the session's
server (HTTP and gRPC, sync and asyncio), and the answers equal the in-process references'.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from export import minilm as export_minilm
from export import text_samples
from paths import REPO_ROOT
from pipelines import bert, classification, embedding
from tests.helpers import CAT_CLASSES

pytestmark = pytest.mark.integration

PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
SERVER_MODULES = ("torch", "onnxruntime", "tokenizers", "PIL")
TEXTS = text_samples.SENTENCES  # short ones, accents and an emoji among them
PHOTOS = ("chelsea", "coffee")
# As tests/integration/test_embed.py holds the served vectors to PyTorch's.
MIN_COSINE = 0.9999
SCORE_ATOL = 1e-4
# A new venv's installer resolving and fetching about 25 small wheels; from its cache in seconds.
PIP_TIMEOUT_S = 240

# Run by the venv's python from a folder outside the checkout.
PROBE = """
import importlib.util, json, sys
from importlib import metadata
import client
print(json.dumps({
    "absent": [name for name in sys.argv[1:] if importlib.util.find_spec(name) is None],
    "client": client.__file__,
    "distributions": [d.metadata["Name"] for d in metadata.distributions()],
}))
"""
USE_THE_API = """
import json, sys
from dataclasses import asdict
from client import ClassifyClient, EmbedClient

http_url, grpc_url, texts, *images = sys.argv[1:]
with open(texts, encoding="utf-8") as f:
    texts = [json.loads(line) for line in f]
with EmbedClient(http_url) as c:
    c.check_ready()
    vectors = c.embed(texts)
with ClassifyClient(grpc_url, "grpc") as c:
    c.check_ready()
    predictions = c.classify([open(path, "rb").read() for path in images])
print(json.dumps({"embeddings": vectors.tolist(), "predictions": [asdict(p) for p in predictions]}))
"""


def names(specs) -> set[str]:
    """The distributions that requirement specifiers name, as PyPI compares them."""
    return {canonicalize_name(Requirement(spec).name) for spec in specs}


def server_distributions() -> set[str]:
    """What the server's extras bring and the client does not share (the base requirements)."""
    extras = PROJECT["project"]["optional-dependencies"]
    server = names(spec for extra, specs in extras.items() if extra != "client" for spec in specs)
    return server - names(PROJECT["project"]["dependencies"])


def distribution_source(dest: Path) -> Path:
    """The files the distribution is built from, as its sdist holds them, out of the checkout.

    pip builds a local folder in place, which would leave build/ and an .egg-info in the
    checkout that other test runs share.
    """
    dest.mkdir()
    shutil.copy(REPO_ROOT / "pyproject.toml", dest)
    for pattern in PROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*").split(".")[0]
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(REPO_ROOT / package, dest / package, ignore=ignore)
    return dest


def pinned_versions() -> str:
    """Every distribution of this run's environment pinned, as a pip constraints file.

    The new venv gets the tritonclient, numpy and grpcio that the rest of the suite ran with:
    this checks what the distribution declares, not PyPI's newest releases.
    """
    pins = {
        canonicalize_name(d.metadata["Name"]): d.version
        for d in metadata.distributions()
        if d.metadata["Name"]
    }
    pins.pop(canonicalize_name(PROJECT["project"]["name"]), None)
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def outside_env() -> dict[str, str]:
    """This environment without what would point an interpreter at the checkout's packages."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def run(python: Path, *args: str, cwd: Path, timeout: float = 60) -> str:
    """``python ARGS`` in ``cwd``; its stdout, or the test fails with its stderr."""
    done = subprocess.run(
        [str(python), *args],
        cwd=cwd,
        env=outside_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def client_python(tmp_path_factory) -> Path:
    """The python of a new venv where only ``<repository>[client]`` is installed."""
    root = tmp_path_factory.mktemp("client-install")
    source = distribution_source(root / "source")
    constraints = root / "constraints.txt"
    constraints.write_text(pinned_versions())
    venv = root / "venv"
    # uv (requirements.txt) makes the venv and installs as pip would, from the same metadata,
    # in a few seconds where pip took 13-35 s: the suite's time is the limit here.
    uv = Path(sys.executable).with_name("uv")
    subprocess.run(
        [str(uv), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    install = [str(uv), "pip", "install", "--quiet", "--python", str(python)]
    install += ["--constraint", str(constraints), f"{source}[client]"]
    done = subprocess.run(
        install, cwd=root, env=outside_env(), capture_output=True, text=True, timeout=PIP_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    return python


@pytest.fixture
def inputs(photos, tmp_path) -> tuple[Path, list[Path]]:
    """TEXTS as JSONL (a string a line) and the PHOTOS as JPEG files, outside the checkout."""
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps(t) + "\n" for t in TEXTS), encoding="utf-8")
    images = []
    for name in PHOTOS:
        images.append(tmp_path / f"{name}.jpg")
        images[-1].write_bytes(photos[name])
    return texts, images


@pytest.fixture(scope="module")
def reference_embeddings() -> np.ndarray:
    """TEXTS embedded in-process by the PyTorch network the encoder was exported from."""
    return export_minilm.reference_embeddings(bert.load_pretrained(), list(TEXTS))


def assert_embeddings(vectors: np.ndarray, reference: np.ndarray) -> None:
    assert vectors.shape == (len(TEXTS), embedding.HIDDEN_SIZE)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    norms = np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1)
    cosines = (vectors * reference).sum(1) / norms
    assert cosines.min() >= MIN_COSINE


def test_the_client_installs_without_the_servers_packages(client_python, tmp_path):
    found = json.loads(run(client_python, "-c", PROBE, *SERVER_MODULES, cwd=tmp_path))
    assert found["absent"] == list(SERVER_MODULES)
    # The installed copy, not the checkout's.
    assert Path(found["client"]).is_relative_to(client_python.parents[1])
    installed = names(found["distributions"])
    assert {"tritonclient", "numpy", canonicalize_name(PROJECT["project"]["name"])} <= installed
    assert not installed & server_distributions()


def test_its_python_api_embeds_and_classifies(
    client_python, server, reference, reference_embeddings, photos, inputs, tmp_path
):
    texts, images = inputs
    args = (server.http_url, server.grpc_url, str(texts), *map(str, images))
    answer = json.loads(run(client_python, "-c", USE_THE_API, *args, cwd=tmp_path))
    assert_embeddings(np.array(answer["embeddings"], np.float32), reference_embeddings)
    labels, scores, ids = reference.classify([photos[name] for name in PHOTOS])
    for got, want_labels, want_scores, want_ids in zip(
        answer["predictions"], labels, scores, ids, strict=True
    ):
        assert got["labels"] == [label.decode() for label in want_labels]
        assert got["class_ids"] == want_ids.tolist()
        np.testing.assert_allclose(got["scores"], want_scores, atol=SCORE_ATOL)
    assert answer["predictions"][0]["labels"][0] in CAT_CLASSES


def test_its_command_line_embeds_a_file_and_classifies(
    client_python, server, reference_embeddings, inputs, tmp_path
):
    texts, images = inputs
    vectors = tmp_path / "vectors.npy"
    cli = (client_python, "-m", "client")
    # --file sends concurrent batches with the asyncio client (tritonclient.http.aio here).
    run(
        *cli,
        "embed",
        "--file",
        str(texts),
        "--out",
        str(vectors),
        "--url",
        server.http_url,
        cwd=tmp_path,
    )
    assert_embeddings(np.load(vectors), reference_embeddings)
    top_k = classification.DEFAULT_TOP_K - 2
    printed = run(
        *cli,
        "classify",
        str(images[0]),
        "--top-k",
        str(top_k),
        "--protocol",
        "grpc",
        "--url",
        server.grpc_url,
        cwd=tmp_path,
    )
    # The image's path, then "  score  label (class id)" a class, the most probable first.
    assert printed.splitlines()[0] == str(images[0])
    rows = re.findall(r"^ +[0-9.]+  (.+) \((\d+)\)$", printed, re.M)
    assert len(rows) == top_k and rows[0][0] in CAT_CLASSES
