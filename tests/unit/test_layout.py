"""The layout rules of tests/layout.py hold, and the check catches what breaks them."""

from __future__ import annotations

from tests import layout


def test_packages_import_only_downstream_and_form_no_cycle():
    edges = layout.imports()
    assert layout.problems(edges) == []
    # The user-facing client needs neither the server nor the benchmarks.
    assert not {b for a, b in edges if a == "client"} & {"server", "bench", "export"}


def test_a_backward_import_and_a_cycle_are_reported():
    edges = {("client", "pipelines"): {"client/x.py"}, ("export", "server"): {"export/t.py"}}
    edges[("server", "export")] = {"server/c.py"}
    broken = layout.problems(edges)
    assert "export imports server (export/t.py)" in broken
    assert "cycle through export" in broken and "cycle through server" in broken
