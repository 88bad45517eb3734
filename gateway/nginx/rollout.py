"""Move a rollout's shares on a running gateway: rewrite ``rollout.conf``, check, reload.

nginx reloads on SIGHUP without dropping a request: the master starts workers with the new
config, and the old ones finish every request they hold, close their idle connections and
exit. ``move`` returns once new workers run and the old ones accept nothing more: requests sent
from then on see the new shares.

    python -m gateway.nginx rollout --conf PREFIX/nginx.conf embed=5     # 5 % to the canary
    python -m gateway.nginx rollout --conf PREFIX/nginx.conf embed=0     # all back
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import psutil

from gateway.nginx import config

__all__ = ["add_arguments", "current", "from_args", "move"]

# How long a reload may take to start its new workers.
RELOAD_TIMEOUT_S = 10.0


def rollout_file(conf: Path) -> Path:
    """The ``rollout.conf`` that ``conf`` includes (beside it)."""
    return conf.with_name(config.ROLLOUT_FILE)


def current(conf: Path) -> config.Shares:
    """The shares in force beside ``conf`` (from ``rollout.conf``'s first line).

    Raises:
        FileNotFoundError: no rollout beside this config.
    """
    first = rollout_file(conf).read_text().split("\n", 1)[0]
    return config.Shares.from_json(first.removeprefix("# "))


def _nginx(conf: Path, prefix: Path, *args: str, nginx: str | None = None):
    command = [nginx or config.find_nginx(), "-p", f"{prefix}/", "-c", str(conf), "-e", "stderr"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=30)


def _workers(master: int) -> dict[int, bool]:
    """The master's workers: pid → still accepting (not titled "shutting down")."""
    workers = {}
    try:
        children = psutil.Process(master).children()
    except psutil.NoSuchProcess:
        return workers
    for child in children:
        try:
            workers[child.pid] = "shutting down" not in " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
    return workers


def move(
    conf: Path,
    changes: dict[str, float],
    sticky: bool | None = None,
    prefix: Path | None = None,
    nginx: str | None = None,
) -> tuple[config.Shares, config.Shares]:
    """Apply ``changes`` (model → percent to the canary) to the running gateway of ``conf``.

    The new ``rollout.conf`` replaces the old one at once (a rename), ``nginx -t`` checks the
    whole config with it, and nginx reloads; a config nginx refuses is put back untouched.

    Args:
        conf: the gateway's nginx.conf.
        changes: the models to move and their new shares; the others keep theirs.
        sticky: per tenant (True) or per request (False); None: as it is.
        prefix: nginx's prefix (its pid file is ``nginx.pid`` there); default: conf's folder.
        nginx: the nginx binary; default: the one found here.

    Returns:
        The shares before and after.

    Raises:
        ValueError: a share out of range, a model the gateway does not serve, or a config
            nginx refused (nothing changed then).
        RuntimeError: nginx does not run, or started no new worker in time.
    """
    prefix = prefix or conf.parent
    before = current(conf)
    after = before.moved(changes, sticky)
    path = rollout_file(conf)
    old_text = path.read_text()
    staged = path.with_name(f".{path.name}.new")
    staged.write_text(config.render_rollout(after))
    os.replace(staged, path)
    checked = _nginx(conf, prefix, "-t", nginx=nginx)
    if checked.returncode != 0:
        path.write_text(old_text)
        raise ValueError(f"nginx -t refused the new shares, kept the old:\n{checked.stderr}")
    try:
        master = int((prefix / "nginx.pid").read_text())
    except (FileNotFoundError, ValueError):
        raise RuntimeError(f"no nginx runs from {prefix} (no nginx.pid there)") from None
    old_workers = _workers(master)
    reloaded = _nginx(conf, prefix, "-s", "reload", nginx=nginx)
    if reloaded.returncode != 0:
        raise RuntimeError(f"nginx -s reload failed:\n{reloaded.stderr}")
    # Done when new workers run and no old one accepts any more: an old worker keeps a
    # client's connection, with the old shares, until it is told to shut down (then it
    # finishes the request at hand and closes the connection).
    deadline = time.monotonic() + RELOAD_TIMEOUT_S
    while True:
        workers = _workers(master)
        new = set(workers) - set(old_workers)
        if new and not any(accepting for pid, accepting in workers.items() if pid not in new):
            return before, after
        if time.monotonic() > deadline:
            raise RuntimeError(f"nginx did not reload within {RELOAD_TIMEOUT_S:.0f} s")
        time.sleep(0.01)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """A command line's rollout options (``from_args`` reads them)."""
    parser.add_argument(
        "--canary-http", action="append", default=[], help="a canary server's HTTP host:port"
    )
    parser.add_argument(
        "--canary-grpc", action="append", default=[], help="a canary server's gRPC host:port"
    )
    parser.add_argument(
        "--rollout",
        action="append",
        type=config.parse_share,
        default=[],
        metavar="MODEL=PERCENT",
        help="a model the canaries serve in its new version, and its share of requests sent "
        "there (repeatable; 0: none yet)",
    )
    parser.add_argument(
        "--sticky", action="store_true", help="shares per tenant rather than per request"
    )
    parser.add_argument("--shadow", help="host:port of the comparator (python -m gateway.shadow)")
    parser.add_argument(
        "--sample",
        type=float,
        default=1.0,
        help="percent of the rollout's requests copied to the comparator (default 1)",
    )


def from_args(args: argparse.Namespace) -> config.Rollout | None:
    """The rollout of ``add_arguments``' options; None without any canary or share."""
    if not (args.canary_http or args.canary_grpc or args.rollout):
        return None
    shares = config.Shares(tuple(args.rollout), args.sticky)
    canaries = (tuple(args.canary_http), tuple(args.canary_grpc))
    return config.Rollout(*canaries, shares, args.shadow, args.sample)
