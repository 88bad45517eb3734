"""The import rules in pyproject.toml hold, and import-linter and tests/layout.py catch a break."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests import layout

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_repository_keeps_its_import_contracts():
    result = lint_imports(layout.REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_backward_import_breaks_the_layers_contract(tmp_path):
    shutil.copy(layout.REPO / "pyproject.toml", tmp_path)
    for package in layout.PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    # pipelines reaching up into the server: the break the first contract exists for.
    (tmp_path / "pipelines" / "bad.py").write_text("import server\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1
    assert "pipelines.bad -> server" in result.stdout


def test_the_client_importing_the_export_breaks_its_contract(tmp_path):
    shutil.copy(layout.REPO / "pyproject.toml", tmp_path)
    for package in layout.PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "client" / "bad.py").write_text("import export\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1
    assert "client.bad -> export" in result.stdout


def test_the_graph_has_every_edge_and_the_gateway_in_front_of_client_and_server():
    edges = layout.package_edges()
    assert ("gateway", "client") in edges and ("gateway", "server") in edges
    assert not {target for source, target in edges if source == "pipelines"}
    assert not {target for source, target in edges if source == "client"} - {"pipelines"}


def test_every_model_py_imports_only_pipelines_of_ours():
    found = layout.model_imports()
    assert len(found) >= 7
    assert all(not names for names in found.values()), found


def test_a_model_py_importing_the_server_is_reported(tmp_path):
    model = tmp_path / "classifier" / "1" / "model.py"
    model.parent.mkdir(parents=True)
    model.write_text(textwrap.dedent("import numpy\nfrom server import launcher\n"))
    found = layout.model_imports(tmp_path)
    assert list(found.values()) == [{"server"}]
