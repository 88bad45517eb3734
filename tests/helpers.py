"""Helpers shared by the test modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m client ARGS`` in the repository, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "client", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
