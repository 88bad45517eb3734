"""Move a rollout's shares on a running gateway: rewrite its shares file, nothing else.

gateway/rollout.js reads the shares for every request, so a move is the new file put in
place with a rename (atomic: a request reads the old shares or the new, never half of
either). Nothing reloads: no worker is replaced and no client connection is closed, so no
request is dropped, and a request that starts after ``move`` returns meets the new shares.

    python -m gateway.nginx rollout --file PREFIX/rollout.json embed=5    # 5 % to the canary
    python -m gateway.nginx rollout --file PREFIX/rollout.json embed=0    # all back
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gateway.nginx import config

__all__ = ["add_arguments", "current", "from_args", "move", "write"]


def current(path: Path) -> config.Shares:
    """The shares in force in ``path``.

    Raises:
        FileNotFoundError: no rollout there.
    """
    return config.Shares.from_json(path.read_text())


def write(path: Path, shares: config.Shares) -> None:
    """Put ``shares`` in ``path`` at once (a file beside it, renamed over it)."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_text(shares.as_json() + "\n")
    os.replace(staged, path)


def move(
    path: Path, changes: dict[str, float], sticky: bool | None = None
) -> tuple[config.Shares, config.Shares]:
    """Apply ``changes`` (model → percent to the canary) to the shares in ``path``.

    Args:
        path: the running gateway's shares file.
        changes: the models to move and their new shares; the others keep theirs.
        sticky: per tenant (True) or per request (False); None: as it is.

    Returns:
        The shares before and after.

    Raises:
        ValueError: a share out of range or a model the gateway does not serve (nothing
            changed then).
        FileNotFoundError: no rollout at ``path``.
    """
    before = current(path)
    after = before.moved(changes, sticky)
    write(path, after)
    return before, after


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


def from_args(args: argparse.Namespace, shares_file: Path | None = None) -> config.Rollout | None:
    """The rollout of ``add_arguments``' options; None without any canary or share.

    ``shares_file``: where nginx will read the shares (made absolute); default: the config's.
    """
    if not (args.canary_http or args.canary_grpc or args.rollout):
        return None
    shares = config.Shares(tuple(args.rollout), args.sticky)
    canaries = (tuple(args.canary_http), tuple(args.canary_grpc))
    where = str(shares_file.resolve()) if shares_file else config.ROLLOUT_FILE
    return config.Rollout(
        *canaries, shares, shares_file=where, shadow=args.shadow, sample=args.sample
    )
