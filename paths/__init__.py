"""Where the repository's parts are on disk: one module that every layer may import.

The code runs from the checkout (``python -m ...`` in its root; the images copy the same tree to
/opt/app), so the repository root is the folder above this package.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
DOCKER = REPO_ROOT / "docker"
DOCS = REPO_ROOT / "docs"
