"""Unit tests import the Python-backend glue against a stand-in ``triton_python_backend_utils``."""

from __future__ import annotations

import sys
from pathlib import Path

# What the stub provides inside Triton; here the fake in tests/fake_triton/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fake_triton"))
