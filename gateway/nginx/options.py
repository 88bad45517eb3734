"""The command-line options that describe parts of a gateway, for both commands that build one.

``python -m gateway.nginx render`` renders a config from them, and ``python -m gateway serve``
runs nginx with them: each adds these options to its parser and reads them back here, so that
the two describe a rollout and TLS alike.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from gateway.nginx.config import TLS
from gateway.nginx.rollout import SHARES_FILE, Rollout, Shares, parse_share

__all__ = ["add_rollout", "add_tls", "repeated", "rollout_of", "tls_of"]


def repeated(
    parser: argparse.ArgumentParser,
    flag: str,
    help: str,
    parse: Callable[[str], object] = str,
    metavar: str | None = None,
    required: bool = False,
) -> None:
    """An option given once per value: ``parse``d, each use adds one to a list (empty if none)."""
    parser.add_argument(
        flag,
        action="append",
        type=parse,
        default=[],
        required=required,
        metavar=metavar,
        help=help,
    )


def add_rollout(parser: argparse.ArgumentParser) -> None:
    """A rollout's options (``rollout_of`` reads them)."""
    repeated(parser, "--canary-http", "a canary server's HTTP host:port")
    repeated(parser, "--canary-grpc", "a canary server's gRPC host:port")
    repeated(
        parser,
        "--rollout",
        "a model the canaries serve in its new version, and its share of requests sent there "
        "(repeatable; 0: none yet)",
        parse_share,
        "MODEL=PERCENT",
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


def rollout_of(args: argparse.Namespace, shares_file: Path | None = None) -> Rollout | None:
    """The rollout of ``add_rollout``'s options; None without any canary or share.

    ``shares_file``: where nginx will read the shares (made absolute); default: the config's.

    Raises:
        ValueError: a share out of range, a model the gateway does not serve, no canary.
    """
    if not (args.canary_http or args.canary_grpc or args.rollout):
        return None
    shares = Shares(tuple(args.rollout), args.sticky)
    canaries = (tuple(args.canary_http), tuple(args.canary_grpc))
    where = str(shares_file.resolve()) if shares_file else SHARES_FILE
    return Rollout(*canaries, shares, shares_file=where, shadow=args.shadow, sample=args.sample)


def add_tls(parser: argparse.ArgumentParser) -> None:
    """TLS's options (``tls_of`` reads them)."""
    parser.add_argument("--tls-cert", help="PEM certificate (chain): both ports speak TLS only")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")


def tls_of(args: argparse.Namespace, here: bool = False) -> TLS | None:
    """TLS of ``add_tls``'s options; None without them.

    Args:
        args: the parsed command line.
        here: nginx runs on this machine: both files must exist, and nginx gets their absolute
            paths. Else (a config rendered for elsewhere) the paths are as nginx will see them.

    Raises:
        ValueError: one of the two options without the other.
        FileNotFoundError: ``here``, and a file that is not there (the message names it).
    """
    if not (args.tls_cert or args.tls_key):
        return None
    if not (args.tls_cert and args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    if not here:
        return TLS(args.tls_cert, args.tls_key)
    certificate, key = (
        str(Path(path).resolve(strict=True)) for path in (args.tls_cert, args.tls_key)
    )
    return TLS(certificate, key)
