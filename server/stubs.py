"""tritonserver's Python-backend stubs, told apart by the model each one serves."""

from __future__ import annotations

from pathlib import Path

from processes.managed import argv, children

STUB_NAME = "triton_python_backend_stub"


def stub_model(pid: int) -> tuple[str, str] | None:
    """(model, version) served by a Python-backend stub process, None for any other process.

    The stub's first argument is its model file, ``<repository>/<model>/<version>/model.py``.
    Only that argument is looked at: the rest of the command line holds other paths (the
    backend directory, the repository's own folders) that could contain a model's name.
    """
    args = argv(pid)
    if len(args) < 2 or not args[0].endswith(STUB_NAME):
        return None
    parts = Path(args[1]).parts
    return (parts[-3], parts[-2]) if len(parts) >= 3 else None


def stub_pids(server_pid: int, model: str | None = None) -> list[int]:
    """Python-backend stub processes of a server, optionally only those of one model."""
    pids = []
    for pid in children(server_pid):
        served = stub_model(pid)
        if served is not None and (model is None or served[0] == model):
            pids.append(pid)
    return pids
