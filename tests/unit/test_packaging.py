"""The installed package declares what it imports, and the client package exports its clients."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata

import tomllib

import client
from paths import REPO_ROOT

# Given by tritonserver's Python backend to the stubs, not by pip.
PROVIDED_BY_TRITON = {"triton_python_backend_utils"}


def top_level_imports(package: str) -> set[str]:
    """Every top-level module that ``package``'s files import, at any depth of the code."""
    found = set()
    for path in (REPO_ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def declared_distributions() -> set[str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    return {normal(re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0]) for spec in specs}


def normal(name: str) -> str:
    """A distribution's name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_import_of_the_installed_package_is_declared():
    imported = top_level_imports("pipelines") - set(sys.stdlib_module_names)
    imported -= {"pipelines", "__future__", *PROVIDED_BY_TRITON}
    by_module = metadata.packages_distributions()
    # onnxruntime_extensions is looked up by name (importlib.util.find_spec), not imported.
    imported.add("onnxruntime_extensions")
    missing = {
        module
        for module in imported
        if not {normal(d) for d in by_module.get(module, [module])} & declared_distributions()
    }
    assert {"cachetools", "redis", "pybreaker", "numpy"} <= imported
    assert not missing, f"imported by pipelines/ but not in pyproject.toml: {sorted(missing)}"


def test_the_client_package_exports_the_clients():
    assert {"ClassifyClient", "EmbedClient", "Router"} <= set(client.__all__)
    assert all(hasattr(client, name) for name in client.__all__)
