"""The repository's import graph between its top-level packages, and the rules it must keep.

``python -m tests.layout`` (``make imports``) prints which package imports which, with the
files behind each edge, and exits 1 if a rule is broken. Data flows one way:
export → model_repository → server → client, with the benchmarks on top; ``pipelines`` holds
the plain functions and names every stage shares, and imports none of them.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Each package, and the packages of ours it may import.
ALLOWED = {
    "pipelines": set(),
    "export": {"pipelines"},
    "model_repository": {"pipelines"},
    "server": {"pipelines", "export"},
    "client": {"pipelines"},
    "bench": {"pipelines", "export", "server", "client"},
    "tests": {"pipelines", "export", "server", "client", "bench"},
}
PACKAGES = set(ALLOWED)


def imports() -> dict[tuple[str, str], set[str]]:
    """(importer, imported) package → the files of the importer that import it."""
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    target = name.split(".")[0]
                    if target in PACKAGES and target != package:
                        edges[(package, target)].add(str(path.relative_to(REPO)))
    return edges


def problems(edges: dict[tuple[str, str], set[str]]) -> list[str]:
    """Imports that break the rules, and cycles between packages."""
    found = [
        f"{a} imports {b} ({', '.join(sorted(files))})"
        for (a, b), files in sorted(edges.items())
        if b not in ALLOWED[a]
    ]
    graph = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(
            n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start]
        )

    found += [f"cycle through {a}" for a in sorted(graph) if reaches(a, a, {a})]
    return found


def main() -> int:
    """Print the graph and the broken rules; exit 1 if there is any."""
    edges = imports()
    for (a, b), files in sorted(edges.items()):
        print(f"{a:17s} -> {b:10s} {len(files):3d} file(s)")
    broken = problems(edges)
    for problem in broken:
        print(f"NOT ALLOWED: {problem}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
