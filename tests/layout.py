"""The import graph between the top-level folders, as ``make imports`` prints it.

The rules live in pyproject.toml (``[tool.importlinter]``) and import-linter checks them
(``lint-imports``). This module prints the graph those rules constrain, built by grimp (the
library import-linter runs on), and checks the one folder import-linter cannot see: a
Python-backend ``model.py`` is no package module (Triton loads it by path inside the stub), so
its imports are read here. It may import ``pipelines`` and nothing else of ours.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

import grimp

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
_CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES = _CONFIG["root_packages"]


# The export's modules, as its layers contract lists them (exhaustively).
EXPORT_MODULES = [
    module.strip()
    for contract in _CONFIG["contracts"]
    if contract.get("containers") == ["export"]
    for layer in contract["layers"]
    for module in re.split(r"[|:]", layer)
]


def package_edges() -> dict[tuple[str, str], set[str]]:
    """(importer, imported) top-level package → the importer's modules behind that edge."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for module in graph.modules:
        source = module.split(".")[0]
        for imported in graph.find_modules_directly_imported_by(module):
            target = imported.split(".")[0]
            if target != source:
                edges[(source, target)].add(module)
    return edges


def model_imports(root: Path = REPO / "model_repository") -> dict[str, set[str]]:
    """Each ``model.py`` → the packages of ours it imports other than ``pipelines``."""
    found = {}
    for path in sorted(root.glob("*/*/model.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(root.parent))] = names & (set(PACKAGES) - {"pipelines"})
    return found


def main() -> int:
    """Print the graph and any model.py that imports more than ``pipelines``; exit 1 if so."""
    for (source, target), modules in sorted(package_edges().items()):
        print(f"{source:10s} -> {target:10s} {len(modules):3d} module(s)")
    found = model_imports()
    print(f"model_repository -> pipelines ({len(found)} model.py files)")
    broken = {path: names for path, names in found.items() if names}
    for path, names in broken.items():
        print(f"NOT ALLOWED: {path} imports {', '.join(sorted(names))}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
