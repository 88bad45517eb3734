"""Render every variant's overlay into the full config Triton reads (``make models`` runs it).

Either way, every config and every variant is held to its model's signature
(``model_config.signatures``): a drifted input or output is an error, not a rendered file.

Examples:
    python -m model_config           # configs/<name>.overlay.pbtxt -> configs/<name>.pbtxt
    python -m model_config --check   # exit 1 if a config is out of date or off its signature
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import model_config
from model_config import signatures

log = logging.getLogger("model_config")


def main(argv: list[str] | None = None) -> int:
    """Render every variant, or (``--check``) say which are stale; exit 1 on a problem."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m model_config", description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any is out of date"
    )
    args = parser.parse_args(argv)
    try:
        drifted = signatures.check_repository(args.repository)
    except model_config.OverlayError as exc:
        log.error("%s", exc)
        return 1
    for problem in drifted:
        log.error("%s", problem)
    if args.check:
        problems = model_config.stale(args.repository)
        for problem in problems:
            log.error("%s", problem)
        if problems:
            log.error("run `python -m model_config` (make models) to render them")
        return 1 if problems or drifted else 0
    if drifted:
        return 1
    try:
        paths = model_config.render_repository(args.repository)
    except model_config.OverlayError as exc:
        log.error("%s", exc)
        return 1
    log.info("rendered %d configs from the overlays in %s/*/configs/", len(paths), args.repository)
    return 0


if __name__ == "__main__":
    sys.exit(main())
