"""Virtual environments of their own for the tools the benchmarks compare against.

infinity-emb and Triton Model Analyzer pin packages that are not ours (torch, transformers,
protobuf, numpy), so each gets a venv under ``.peers/<tool>/``, made on first use by these
files and nothing typed by hand. An environment can also be given ready-made.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from paths import REPO_ROOT

PEERS = REPO_ROOT / ".peers"
INSTALL_TIMEOUT_S = 1800.0


class ToolUnavailableError(RuntimeError):
    """A tool could not be installed, prepared or started here; the message says why."""


@dataclass(frozen=True)
class ToolEnvironment:
    """A venv with pinned packages and the command that shows they are installed.

    Attributes:
        name: the tool's folder under ``.peers/``.
        requirements: what ``pip install`` gets, pinned.
        command: an executable in the venv's ``bin/`` that the install must have made.
    """

    name: str
    requirements: tuple[str, ...]
    command: str

    @property
    def home(self) -> Path:
        """``.peers/<name>``: the venv and whatever else the tool keeps between runs."""
        return PEERS / self.name

    def venv(self, override: Path | None = None) -> Path:
        """The environment to run from: ``override`` (ready-made), else ``home/venv``."""
        return Path(override) if override is not None else self.home / "venv"

    def install_commands(self, venv: Path, python: str = sys.executable) -> list[list[str]]:
        """Create the environment, then install the pinned packages into it."""
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        return [[python, "-m", "venv", str(venv)], [*pip, *self.requirements]]

    def installed(self, venv: Path) -> bool:
        """True if ``venv`` has the tool's command."""
        return (venv / "bin" / self.command).exists()

    def ensure(self, venv: Path, log_path: Path, timeout_s: float = INSTALL_TIMEOUT_S) -> Path:
        """Install into ``venv`` unless it is there; pip's output goes to ``log_path``.

        Our own venv counts as installed once its stamp (the requirements installed) matches;
        a ready-made one once it has the command.

        Raises:
            ToolUnavailableError: a step failed or ran out of time; the message has its last
                lines.
        """
        stamp = venv / "installed.txt"
        wanted = "\n".join(self.requirements) + "\n"
        own = venv == self.venv()
        if self.installed(venv) and (not own or (stamp.exists() and stamp.read_text() == wanted)):
            return venv
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as out:
            for cmd in self.install_commands(venv):
                run_logged(cmd, out, log_path, timeout_s)
        if not self.installed(venv):
            raise ToolUnavailableError(f"pip finished but {venv}/bin/{self.command} is missing")
        stamp.write_text(wanted)
        return venv


def run_logged(cmd: Sequence[str], out, log_path: Path, timeout_s: float) -> None:
    """Run ``cmd`` with its output appended to ``out`` (the open ``log_path``).

    Raises:
        ToolUnavailableError: it could not run, ran out of time or failed; with the log's tail.
    """
    out.write(f"$ {' '.join(cmd)}\n")
    out.flush()
    try:
        done = subprocess.run(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolUnavailableError(f"`{' '.join(cmd)}` failed: {exc}") from None
    if done.returncode != 0:
        what = f"`{' '.join(cmd)}` exited with {done.returncode}"
        raise ToolUnavailableError(f"{what}: {tail(log_path)}")


def tail(path: Path, lines: int = 5) -> str:
    """The last lines of a log, on one line."""
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
