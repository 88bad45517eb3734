"""The documented client commands answer, run as written against the test run's server.

``tests/unit/test_docs_commands.py`` parses every documented command; here the runnable lines
(fenced ```bash blocks) of ``python -m client embed|classify`` that need nothing but a server
run for real: only the address is this server's (the docs say ``localhost:8000``), and the
sample photos they name are written where they name them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from export import samples
from paths import REPO_ROOT
from tests.unit.test_docs_commands import PAGES, Command, _python_module, _segments, page_commands

pytestmark = pytest.mark.integration

# Options that need what a reader makes first (a file, a key, a CA, another model or server).
NEEDS_MORE = {"--file", "--out", "--model", "--api-key", "--ca-file"}


def served(command: Command) -> list[str] | None:
    """The arguments of ``python -m client`` for a line that needs only a server, else None."""
    if not command.complete or "$(" in command.text:
        return None
    segments = _segments(command.text)
    python = _python_module(segments[0]) if len(segments) == 1 else None
    if python is None or python[0] != "client" or not python[1]:
        return None
    args = python[1]
    if args[0] not in {"embed", "classify"} or NEEDS_MORE & set(args):
        return None
    if "--url" in args and not args[args.index("--url") + 1].startswith("localhost:"):
        return None
    return args


EXAMPLES = [
    (command.where, args)
    for page in PAGES
    for command in page_commands(page)
    if (args := served(command)) is not None
]


def test_the_docs_have_served_examples():
    assert {args[0] for _, args in EXAMPLES} == {"embed", "classify"}


@pytest.mark.parametrize(("where", "args"), EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_documented_client_command_answers(server, tmp_path, where, args):
    grpc = "--protocol" in args and args[args.index("--protocol") + 1] == "grpc"
    url = server.grpc_url if grpc else server.http_url
    if "--url" in args:
        args = [*args[: args.index("--url") + 1], url, *args[args.index("--url") + 2 :]]
    else:
        args = [*args, "--url", url]
    for arg in args:
        if arg.startswith("samples/"):
            (tmp_path / "samples").mkdir(exist_ok=True)
            (tmp_path / arg).write_bytes(samples.photo_bytes(arg.removeprefix("samples/")[:-4]))
    run = subprocess.run(
        [sys.executable, "-m", "client", *args],
        cwd=tmp_path,  # the samples as `make samples` writes them; nothing else of the checkout
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"{where}: python -m client {' '.join(args)}:\n{run.stderr}"
    assert run.stdout.strip(), f"{where}: no output"
    if args[0] == "embed":
        texts = [a for a in args[1:] if not a.startswith("-") and a != url]
        lines = [json.loads(line) for line in run.stdout.splitlines()]
        assert [line["text"] for line in lines] == texts
        assert all(len(line["embedding"]) == 384 for line in lines)
    else:  # chelsea.jpg is a cat; the top labels name one
        assert run.stdout.splitlines()[0] == next(a for a in args if a.startswith("samples/"))
        assert "cat" in run.stdout, run.stdout
