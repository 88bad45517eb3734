"""Every command the docs show runs as written: parsed by its own command line, the cheap ones run.

What counts as a command (the convention the docs follow):

- a fenced block marked ```bash, ```sh, ```shell or ```console is runnable, line by line (a
  trailing backslash continues a line; ``$ `` prompts and ``#`` comments are dropped); any
  other block (```text, ```toml, ```python, or none) is shown, not run. Output, diagrams and
  file trees go in unmarked or ```text blocks;
- an inline code span that starts with ``python -m``, ``.venv/bin/python -m`` or ``make `` (after
  ``time`` or ``VAR=value`` prefixes) names a command; it may leave out required arguments;
- the examples in the docstrings of the repository's modules (what ``--help`` prints), lines
  that start with ``python -m``, and the commands in the comments of docker/nginx/limits.toml and
  of the config overlays (``Written by `python -m tune ...```).

Placeholders: ``<anything>`` stands for a value, ``[--option VALUE]`` for an optional part
(taken), ``a|b`` inside one for a choice (the first taken), a word ``...`` or ``…`` for words
left out (with the option just before it; what remains is checked, required arguments aside).
A file named ``my-...`` is the reader's own, made by an earlier command of the same page (here
in a scratch folder of the page's own).

How each is checked: ``python -m MODULE ...`` of this repository is parsed by that module's own
argparse (its ``main`` runs up to its first full parse, in this process: nothing is served);
another module must be importable (pytest's paths must exist). ``make ...``: its targets must
exist, and the ``python -m`` lines of their recipes (``make -n``) are parsed too. A runnable
block must be valid bash (``bash -n``). ``--help`` and the commands that only write the
reader's files or check the repository's (``CHEAP``) run for real, in this process, in order,
page by page. A failure names the file and the line.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import io
import logging
import os
import re
import runpy
import shlex
import signal
import subprocess
import sys
import threading
import warnings
from argparse import ArgumentParser
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from paths import REPO_ROOT

PAGES = sorted(
    {
        REPO_ROOT / "README.md",
        *(REPO_ROOT / "docs").glob("*.md"),
        *(REPO_ROOT / "docker").rglob("*.md"),
    }
)
RUNNABLE = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PYTHON = re.compile(r"^(?:\S*/)?python3?$")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PLACEHOLDER = re.compile(r"<[^<>\n]+>")
OPTIONAL = re.compile(r"\[([^\[\]]*)\]")
ELLIPSIS = {"...", "…"}
MODULE = re.compile(r"^[A-Za-z_][\w.]*$")
# (module, a word of its command line): commands that only write the reader's files or check
# the repository's, quick enough to run here for real.
CHEAP = {
    ("gateway", "limits"),
    ("gateway.nginx", "render"),
    ("model_config", "--check"),
    ("monitoring", "--check"),
}

# Modules of ours whose arguments are another program's: importable is all that is checked.
NO_PARSER = {"server.container"}  # tritonserver's own flags, then an exec


@dataclass
class Command:
    """One documented command line and where it is written."""

    where: str  # file:line
    text: str
    complete: bool  # every required argument is given (fenced blocks, docstrings)
    page: str


def _joined(
    lines: list[tuple[int, str]],
    open_after: Callable[[str], str | None],
    join: Callable[[str, str], str],
) -> list[tuple[int, str]]:
    """Lines joined (``join(so_far, next)``) while ``open_after(line)`` says the line goes on.

    ``open_after`` returns the line as it is carried into the next (None: the line is whole);
    each joined line keeps the number of its first.
    """
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in lines:
        if pending is not None:
            number, line = pending[0], join(pending[1], line)
        carried = open_after(line)
        if carried is not None:
            pending = (number, carried)
            continue
        pending = None
        joined.append((number, line))
    if pending is not None:
        joined.append(pending)
    return joined


def _continued(line: str) -> str | None:
    """A shell line ending in a backslash goes on, without it."""
    return line.rstrip()[:-1] if line.rstrip().endswith("\\") else None


def _space_joined(line: str, more: str) -> str:
    return f"{line} {more.strip()}"


def _quote_open(line: str) -> str | None:
    """A line with a quote still open (``python -c '...'`` over several lines) goes on."""
    try:
        shlex.split(line)
    except ValueError:
        return line
    return None


def fenced_blocks(path: Path) -> list[tuple[int, str, list[tuple[int, str]]]]:
    """``(line of the opening fence, language, [(line, text)])`` for each fenced block."""
    lines = path.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, language = match.groups()
        body = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(
                (j + 1, lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            )
            j += 1
        blocks.append((i + 1, language.lower(), body))
        i = j + 1
    return blocks


def _strip_comment(line: str) -> str:
    """The line without a shell comment (a ``#`` that starts a word, outside quotes)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def page_commands(path: Path, root: Path = REPO_ROOT) -> list[Command]:
    """The commands of one page: runnable blocks' lines and command-like inline spans, in order
    (each named by its path relative to ``root`` and its line)."""
    name = str(path.relative_to(root))
    found: list[tuple[int, Command]] = []
    fenced_lines: set[int] = set()
    for _, language, body in fenced_blocks(path):
        fenced_lines.update(number for number, _ in body)
        fenced_lines.update({body[0][0] - 1, body[-1][0] + 1} if body else set())
        if language not in RUNNABLE:
            continue
        for number, line in _joined(
            _joined(body, _continued, _space_joined),
            _quote_open,
            lambda a, b: f"{a}\n{b}",
        ):
            line = _strip_comment(line.strip().removeprefix("$ "))
            if line:
                found.append((number, Command(f"{name}:{number}", line, True, name)))
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if number in fenced_lines or line.lstrip().startswith(("```", "~~~")):
            continue
        for span in SPAN.findall(line):
            if _is_command(span):
                found.append((number, Command(f"{name}:{number}", span, False, name)))
    return [command for _, command in sorted(found, key=lambda pair: pair[0])]


def _is_command(span: str) -> bool:
    try:
        words = _words(span)
    except ValueError:
        return False
    return bool(words) and (words[0] == "make" or _python_module(words) is not None)


def docstring_commands() -> list[Command]:
    """The ``python -m`` examples in the module docstrings of the repository's packages."""
    commands = []
    packages = [
        folder
        for folder in sorted(REPO_ROOT.iterdir())
        if (folder / "__init__.py").exists() and folder.name not in {"tests", "results"}
    ]
    for path in (path for package in packages for path in sorted(package.rglob("*.py"))):
        relative = path.relative_to(REPO_ROOT)
        source = path.read_text()
        try:
            docstring = ast.get_docstring(ast.parse(source), clean=False)
        except SyntaxError:
            continue
        if not docstring or "python -m" not in docstring:
            continue
        first = source.index(docstring.splitlines()[0]) if docstring.strip() else 0
        offset = source[:first].count("\n")
        lines = [(offset + i + 1, line) for i, line in enumerate(docstring.splitlines())]
        for number, line in _joined(lines, _continued, _space_joined):
            text = _strip_comment(line.strip())
            if re.match(r"^(\.venv/bin/)?python -m ", text):
                commands.append(Command(f"{relative}:{number}", text, True, str(relative)))
    return commands


def _segments(text: str) -> list[list[str]]:
    """The simple commands of a line (split at ``&&``, ``||``, ``;``, ``|``, ``&``), each as its
    words: placeholders filled, optional parts taken, redirections and prefixes dropped."""
    text = OPTIONAL.sub(lambda m: m.group(1).split("|")[0], text)
    text = PLACEHOLDER.sub("x", text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    tokens = list(lexer)
    segments: list[list[str]] = [[]]
    skip = 0
    for i, word in enumerate(tokens):
        if skip:
            skip -= 1
        elif word in {"&&", "||", ";", "|", "&", ";;"}:
            segments.append([])
        elif set(word) <= set("<>&"):
            skip = 1  # the redirection's target
        elif word.isdigit() and i + 1 < len(tokens) and set(tokens[i + 1]) & set("<>"):
            continue  # a descriptor: 2>&1
        else:
            segments[-1].append(word)
    out = []
    for words in segments:
        while words and (
            words[0] in {"time", "/usr/bin/time", "sudo"} or ASSIGNMENT.match(words[0])
        ):
            words.pop(0)
        if words:
            out.append(words)
    return out


def comment_commands(path: Path) -> list[Command]:
    """The commands in a config file's ``#`` comments: lines ``#   python -m ...`` (whole
    commands) and command-like inline spans (``Written by `python -m tune ...```)."""
    relative = str(path.relative_to(REPO_ROOT))
    commands = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("#"):
            continue
        comment = line.lstrip("#").strip()
        if re.match(r"^(\.venv/bin/)?python -m ", comment):
            text = _strip_comment(comment)
            commands.append(Command(f"{relative}:{number}", text, True, relative))
        for span in SPAN.findall(comment):
            if _is_command(span):
                commands.append(Command(f"{relative}:{number}", span, False, relative))
    return commands


COMMENTED = sorted(
    {
        REPO_ROOT / "docker" / "nginx" / "limits.toml",
        *(REPO_ROOT / "model_repository").glob("*/configs/*.overlay.pbtxt"),
    }
)


def _words(text: str) -> list[str]:
    """The words of the line's first simple command (see ``_segments``)."""
    segments = _segments(text)
    return segments[0] if segments else []


def _python_module(words: list[str]) -> tuple[str, list[str]] | None:
    """``(module, its arguments)`` of ``python -m MODULE ...``; None for another command."""
    if len(words) >= 3 and PYTHON.match(words[0]) and words[1] == "-m" and MODULE.match(words[2]):
        return words[2], words[3:]
    return None


def _is_ours(module: str) -> bool:
    top = module.split(".")[0]
    return (REPO_ROOT / top / "__init__.py").exists() or (REPO_ROOT / f"{top}.py").exists()


class _Parsed(BaseException):  # a BaseException: the main's `except Exception` lets it by
    """The command line parsed: stop the module's ``main`` there."""


class _Started(BaseException):
    """The module's ``main`` started a process before its command line was parsed."""


_depth = threading.local()


def _stop_after_parse(method):
    """Wrap ``ArgumentParser.parse_args``/``parse_known_args``: raise ``_Parsed`` once the
    outermost call returns (a subcommand's parser is called from inside its parent's).

    A top-level ``parse_known_args`` hands the rest on to another parser (``python -m gateway
    serve`` to the launcher's): the main goes on, through what it checks before serving (the
    limits file, TLS files), to that parser.
    """

    def wrapped(self, *args, **kwargs):
        _depth.value = getattr(_depth, "value", 0) + 1
        try:
            result = method(self, *args, **kwargs)
        finally:
            _depth.value -= 1
        if _depth.value == 0 and method.__name__ == "parse_args":
            raise _Parsed
        return result

    return wrapped


@contextlib.contextmanager
def _parse_only():
    """While inside: a main stops once its command line is parsed (``_Parsed``) and may start
    no process (``_Started``): only the command line is checked, nothing is served."""
    parsers = {name: getattr(ArgumentParser, name) for name in ("parse_args", "parse_known_args")}
    execute_child = subprocess.Popen._execute_child
    execs = {name: getattr(os, name) for name in ("execv", "execve", "system")}

    def no_process(*args, **kwargs):
        raise _Started(" ".join(map(str, args[1])) if isinstance(args[1], list) else args[1])

    def no_exec(*args, **kwargs):
        raise _Started(" ".join(map(str, args[1])) if len(args) > 1 else args[0])

    try:
        for name, method in parsers.items():
            setattr(ArgumentParser, name, _stop_after_parse(method))
        subprocess.Popen._execute_child = no_process
        for name in execs:
            setattr(os, name, no_exec)
        yield
    finally:
        subprocess.Popen._execute_child = execute_child
        for name, function in execs.items():
            setattr(os, name, function)
        for name, method in parsers.items():
            setattr(ArgumentParser, name, method)


def run_error(module: str, args: list[str], complete: bool, parse_only: bool) -> str | None:
    """Why ``python -m module args`` fails (its stderr), or None if it does not.

    It runs in this process, from the repository's root: with ``parse_only``, its ``main`` up
    to where its argparse has parsed the whole line (``complete=False`` lets required arguments
    be missing); else all of it (the cheap commands).
    """
    stderr = io.StringIO()
    argv, cwd = sys.argv, os.getcwd()
    # What a main may set up before it parses, for the process: put back for the next tests.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    signals = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        sys.argv = [module, *args]
        os.chdir(REPO_ROOT)
        with (
            contextlib.redirect_stderr(stderr),
            contextlib.redirect_stdout(io.StringIO()),
            warnings.catch_warnings(),
            _parse_only() if parse_only else contextlib.nullcontext(),
        ):
            warnings.simplefilter("ignore")
            runpy.run_module(module, run_name="__main__", alter_sys=False)
        if parse_only:
            return f"returned without parsing its command line\n{stderr.getvalue()}"
        return None
    except _Parsed:
        return None
    except _Started as exc:
        return f"started a process before its command line was parsed: {exc}"
    except SystemExit as exc:
        if exc.code in (0, None):
            return None
        message = stderr.getvalue() or str(exc.code)
        if not complete and "the following arguments are required" in message:
            return None
        return f"exited {exc.code}: {message.strip()}"
    except Exception as exc:  # noqa: BLE001 - the command's own crash is its failure
        return f"raised {type(exc).__name__}: {exc}"
    finally:
        sys.argv = argv
        os.chdir(cwd)
        root.handlers[:], root.level = handlers, level
        for sig, handler in signals.items():
            signal.signal(sig, handler)


def _without_ellipses(words: list[str]) -> list[str]:
    """The words without ``...``/``…`` (an option just before one lost its value: dropped)."""
    out: list[str] = []
    for word in words:
        if word in ELLIPSIS:
            if out and out[-1].startswith("-"):
                out.pop()
        else:
            out.append(word)
    return out


def _scratch(words: list[str], folder: Path) -> list[str]:
    """The reader's own files (``my-...``) in the scratch folder."""
    out = []
    for word in words:
        name, sep, rest = word.partition("=")
        target = rest if sep else word
        if Path(target).name.startswith("my-") and "/" not in target:
            target = str(folder / target)
        out.append(f"{name}={target}" if sep else target)
    return out


def check_python(where: str, module: str, args: list[str], complete: bool, folder: Path) -> None:
    """Parse (and for CHEAP commands, run) one ``python -m`` command; fail naming ``where``."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise AssertionError(f"{where}: python -m {module}: no such module")
    if not _is_ours(module):
        if module == "pytest":
            missing = [
                a for a in args if not a.startswith("-") and a.startswith("tests/")
                and not (REPO_ROOT / a.split("::")[0]).exists()
            ]  # fmt: skip
            assert not missing, f"{where}: pytest: no such test file {missing}"
        elif importlib.util.find_spec(module) is None:
            raise AssertionError(f"{where}: python -m {module}: no such module")
        return
    if importlib.util.find_spec(module) is None:
        raise AssertionError(f"{where}: python -m {module}: no such module")
    if module in NO_PARSER:
        return
    args = _scratch(args, folder)
    cheap = _cheap(module, args)
    error = run_error(module, args, complete, parse_only=not cheap)
    assert error is None, f"{where}: python -m {module} {shlex.join(args)}:\n{error}"


def _cheap(module: str, args: list[str]) -> bool:
    return "--help" in args or "-h" in args or any((module, word) in CHEAP for word in args)


MAKE_RECIPES: dict[tuple[str, ...], str] = {}
MAKE_RULE = re.compile(r"^([^\s#:=][^:=]*?)::?(?!=)\s*([^;]*)$")


@functools.cache
def make_targets() -> dict[str, list[str]]:
    """Each target of the Makefile and its prerequisites, from make's own database (``-p``;
    ``-q .DEFAULT`` runs nothing)."""
    run = subprocess.run(
        ["make", "-npq", "--no-print-directory", ".DEFAULT"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    targets = {}
    for line in run.stdout.splitlines():
        match = MAKE_RULE.match(line)
        if match:
            targets[match.group(1)] = match.group(2).replace("|", " ").split()
    return targets


def check_make(where: str, args: list[str], folder: Path) -> None:
    """``make ARGS``: each target must exist, and the ``python -m`` lines of their recipes
    (``make -n``, with the variables given) must parse.

    The prerequisites are taken as made (``-o``): only the targets' own recipes are printed,
    and none of the Makefile's recursive lines (which run even under ``-n``) is reached.
    """
    targets = [a for a in args if not a.startswith("-") and not ASSIGNMENT.match(a)]
    known = make_targets()
    for target in targets:
        if target not in known:
            raise AssertionError(f"{where}: make {shlex.join(args)}: no target {target!r}")
    key = tuple(args)
    if key not in MAKE_RECIPES:
        old = [f"-o{p}" for t in targets for p in known[t]]
        run = subprocess.run(
            ["make", "-n", "--no-print-directory", *old, *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, f"{where}: make {shlex.join(args)}:\n{run.stderr[-2000:]}"
        MAKE_RECIPES[key] = run.stdout
    for line in MAKE_RECIPES[key].replace("\\\n", " ").splitlines():
        for words in _segments(line):
            python = _python_module(words)
            if python is not None:
                check_python(f"{where} (make {shlex.join(args)}: {line.strip()[:80]})",
                             *python, True, folder)  # fmt: skip


def check(command: Command, folder: Path) -> None:
    """Check one documented command line (see the module's docstring); the reader's files
    (``my-...``) go in a folder of the page's own under ``folder``."""
    folder = folder / re.sub(r"\W", "_", command.page)
    folder.mkdir(exist_ok=True)
    try:
        segments = _segments(command.text)
    except ValueError as exc:
        raise AssertionError(f"{command.where}: {command.text!r}: {exc}") from None
    for words in segments:
        complete = command.complete and not ELLIPSIS & set(words)
        words = _without_ellipses(words)
        if not words:
            continue
        python = _python_module(words)
        if python is not None:
            check_python(command.where, *python, complete, folder)
        elif words[0] == "make":
            check_make(command.where, words[1:], folder)
        elif command.complete and words[0].startswith(".venv/bin/"):
            assert (REPO_ROOT / words[0]).exists(), f"{command.where}: no {words[0]} (make venv)"


def _syntax(block: list[tuple[int, str]]) -> str:
    return "\n".join(PLACEHOLDER.sub("x", line) for _, line in block)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_command_of_the_page_parses(page, tmp_path):
    for command in page_commands(page):
        check(command, tmp_path)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_runnable_block_is_valid_bash(page):
    for start, language, body in fenced_blocks(page):
        if language in RUNNABLE and body:
            run = subprocess.run(
                ["bash", "-n"], input=_syntax(body), capture_output=True, text=True, timeout=30
            )
            assert run.returncode == 0, (
                f"{page.relative_to(REPO_ROOT)}:{start}: not valid bash:\n{run.stderr}"
                "(a block marked bash is run; output and sketches go in a ```text block)"
            )


def test_every_help_example_parses(tmp_path):
    commands = docstring_commands()
    assert len(commands) > 20  # the extraction finds them
    for command in commands:
        check(command, tmp_path)


def test_every_command_in_a_config_comment_parses(tmp_path):
    commands = [c for path in COMMENTED for c in comment_commands(path)]
    assert any("python -m tune" in c.text for c in commands)  # the tuned configs' headers
    for command in commands:
        check(command, tmp_path)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("`python -m bench tune embed --p99-ms 50`", "invalid choice: 'tune'"),
        ("```bash\nmake perf\nmake no-such-target\n```", "no target 'no-such-target'"),
        (
            "```bash\n.venv/bin/python -m gateway serve --limits docker/nginx/limits.toml\n```",
            "committed placeholder",
        ),
        (
            "```bash\npython -m gateway.nginx render --http a:8000 --grpc a:8001 \\\n"
            "    --limits my-limits.toml > nginx.conf\n```",
            "my-limits.toml",  # no earlier `python -m gateway limits my-limits.toml` made it
        ),
        ("```sh\n$ python -m client embed --no-such-flag x\n```", "unrecognized arguments"),
        ("`python -m no_such_module --help`", "no such module"),
        ("`make perf PERF_ARGS=--no-such-flag`", "unrecognized arguments: --no-such-flag"),
    ],
)
def test_a_command_that_does_not_run_fails_with_its_line(tmp_path, line, why):
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\nText, then\n{line}\n")
    failures = []
    for command in page_commands(page, tmp_path):
        try:
            check(command, tmp_path)
        except AssertionError as exc:
            failures.append(str(exc))
    assert len(failures) == 1, failures
    assert failures[0].startswith(("page.md:4", "page.md:5", "page.md:6")), failures[0]
    assert why in failures[0]


def test_the_documented_limits_example_runs(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\npython -m gateway limits my-limits.toml\n"
        "python -m gateway.nginx render --http a:8000 --grpc a:8001 --limits my-limits.toml\n```\n"
    )
    for command in page_commands(page, tmp_path):
        check(command, tmp_path)
    written = (tmp_path / "page_md" / "my-limits.toml").read_text()
    assert "change-me" not in written and "[tenants.team-a]" in written
