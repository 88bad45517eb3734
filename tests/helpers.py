"""Helpers shared by the test modules."""

from __future__ import annotations

import os
import shutil
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


def prometheus_tool(name: str) -> str:
    """Path of Debian's ``prometheus`` or ``promtool`` (``$PROMETHEUS``/``$PROMTOOL`` override).

    `make test` installs the package (`make tools`); a missing tool fails the test that needs it.
    """
    import pytest

    found = os.environ.get(name.upper()) or shutil.which(name)
    if not found:
        pytest.fail(
            f"{name} not found: `make tools` installs Debian's `prometheus` package "
            f"(apt-get install -y --no-install-recommends prometheus), or set ${name.upper()}"
        )
    return found
