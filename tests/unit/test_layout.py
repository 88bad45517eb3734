"""The import rules in pyproject.toml hold, and import-linter and tests/layout.py catch a break."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(
    ("package", "imported"),
    [
        ("pipelines", "server"),  # the stubs' package reaching up: what the layers forbid
        ("export", "gateway"),
        ("client", "export"),  # below it in the layers, but the client SDK must not need it
        ("bench", "tune"),  # the tuner builds on the benchmark's harness, never the reverse
        ("model_config", "export"),  # the overlay library serves the export, not the reverse
        ("gateway", "containers"),  # the stack runs the gateway; the gateway knows no container
        ("server", "containers"),
        ("gateway", "monitoring"),  # the rules read the gateway's metric names, not the reverse
        ("containers", "monitoring"),  # two rooms side by side: neither needs the other
        ("processes", "server"),  # the process manager serves every room and knows none
        ("paths", "pipelines"),  # the paths module names places, it imports nothing of ours
        ("gateway", "server.__main__"),  # a command's __main__ is run, never imported
        ("containers", "gateway.nginx.__main__"),  # the layers allow it; the commands rule not
        (
            "export",
            "export.tensorrt",
        ),  # engines are built from the export's graphs, not the reverse
    ],
)
def test_a_forbidden_import_breaks_a_contract(tmp_path, package, imported):
    """Empty packages under the repository's own contracts, and one import that breaks them."""
    skeleton(tmp_path)
    (tmp_path / package / "bad.py").write_text(f"import {imported}\n")
    if package == "export":  # its modules are listed one by one
        (tmp_path / package / "bad.py").rename(tmp_path / package / "minilm.py")
        package = "export.minilm"
    else:
        package = f"{package}.bad"
    result = lint_imports(tmp_path)
    assert result.returncode == 1
    assert f"{package} -> {imported}" in result.stdout


def test_an_export_module_the_contract_does_not_list_breaks_it(tmp_path):
    """The export's layers are exhaustive: a new module must say where it stands."""
    skeleton(tmp_path)
    (tmp_path / "export" / "new_model.py").write_text("")
    result = lint_imports(tmp_path)
    assert result.returncode == 1
    assert "export.new_model" in result.stdout


def skeleton(root: Path) -> None:
    """Empty packages and modules for every name the repository's contracts give."""
    shutil.copy(layout.REPO / "pyproject.toml", root)
    for name in layout.PACKAGES:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text("")
        (root / name / "__main__.py").write_text("")  # the contract names them
    for sub in ("export/tensorrt", "gateway/nginx"):  # commands of their own
        (root / sub).mkdir()
        for module in ("__init__", "__main__"):
            (root / sub / f"{module}.py").write_text("")
    for module in layout.EXPORT_MODULES:
        (root / "export" / f"{module}.py").touch()


def test_the_graph_has_every_edge_and_the_gateway_in_front_of_the_server():
    edges = layout.package_edges()
    # The gateway runs in front of the servers (their launcher is its own) and needs no
    # client: the one client-side router lives in client/.
    assert ("gateway", "server") in edges and ("gateway", "client") not in edges
    assert {("server", "processes"), ("server", "paths"), ("gateway", "processes")} <= set(edges)
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
