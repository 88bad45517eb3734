"""A rollout: its types, and moving its shares on a running gateway (its shares file).

``Rollout`` is the part of the gateway's config (``gateway.nginx.config.Gateway``) that sends a
share of some models' requests to canary servers; ``Shares`` is what its shares file holds.
gateway/rollout.js reads the shares for every request, so a move is the new file put in place
with a rename (atomic: a request reads the old shares or the new, never half of either).
Nothing reloads: no worker is replaced and no client connection is closed, so no request is
dropped, and a request that starts after ``move`` returns meets the new shares.

    python -m gateway.nginx rollout --shares-file PREFIX/rollout.json embed=5  # 5 % to the canary
    python -m gateway.nginx rollout --shares-file PREFIX/rollout.json embed=0  # all back
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from gateway.served import SERVED

__all__ = [
    "CANARY",
    "SHARES_FILE",
    "STABLE",
    "Rollout",
    "Shares",
    "current",
    "move",
    "parse_share",
    "write",
]

# The versions a request can go to in a rollout (its log line's "version").
STABLE = "stable"
CANARY = "canary"
# The shares file: a rollout's shares (JSON), which gateway/rollout.js reads for each request
# and a move rewrites. Its name where nothing else is given (nginx's prefix).
SHARES_FILE = "rollout.json"


def parse_share(text: str) -> tuple[str, float]:
    """``MODEL=PERCENT`` (a command line's share) as (model, percent).

    Raises:
        ValueError: not of that form.
    """
    model, _, percent = text.partition("=")
    try:
        return model, float(percent.rstrip("%"))
    except ValueError:
        raise ValueError(f"{text!r}: give MODEL=PERCENT, e.g. embed=5") from None


@dataclass(frozen=True)
class Shares:
    """Each model's share of requests sent to a rollout's canary servers: its shares file.

    Each request of a model with a share goes to the canary with that probability (the first
    bits of its random request id), or, ``sticky``, every request of one tenant (with
    shaping; else of one ``X-User-Id``) goes the same way (a hash of tenant and model). A share
    of 0 keeps the model in the rollout (compared, logged per version) with no traffic on the
    canary.

    Attributes:
        models: (model, percent of its requests sent to the canary), per served model.
        sticky: per tenant rather than per request.
    """

    models: tuple[tuple[str, float], ...] = ()
    sticky: bool = False

    def __post_init__(self) -> None:
        for model, share in self.models:
            if model not in SERVED:
                raise ValueError(f"no rollout of {model!r}: the gateway serves {', '.join(SERVED)}")
            if not 0 <= share <= 100:
                raise ValueError(f"{model}: a share is a percent, 0 to 100, not {share}")

    def moved(self, changes: dict[str, float], sticky: bool | None = None) -> Shares:
        """These shares with ``changes`` applied (a model not named keeps its share)."""
        models = dict(self.models) | changes
        return Shares(tuple(models.items()), self.sticky if sticky is None else sticky)

    def as_json(self) -> str:
        """The file gateway/rollout.js reads, and ``from_json`` too."""
        return json.dumps({"models": dict(self.models), "sticky": self.sticky})

    @classmethod
    def from_json(cls, text: str) -> Shares:
        """The shares ``as_json`` wrote."""
        state = json.loads(text)
        return cls(tuple(state["models"].items()), bool(state["sticky"]))


@dataclass(frozen=True)
class Rollout:
    """A new version of some served models on servers of their own (the canary), taking a share.

    The canary servers serve the new version under the same model names (KServe's canary
    revision; e.g. ``embed`` whose encoder is INT8), so a request needs no rewriting: the
    gateway picks the servers. The shares live in the shares file, which gateway/rollout.js
    reads for every request, so that moving them is a rewrite of that file (``move``): no
    reload, no connection closed.

    Attributes:
        http: the canary servers' HTTP endpoints.
        grpc: their gRPC endpoints.
        shares: the models in the rollout and their shares at start.
        shares_file: where nginx reads the shares (``Shares.as_json``), as nginx sees it: an
            absolute path.
        shadow: host:port of the comparator (``python -m gateway.shadow``), which receives a
            sampled copy of the models' requests and compares the two versions' answers;
            None: none.
        sample: percent of a model's requests copied to the comparator.
    """

    http: tuple[str, ...]
    grpc: tuple[str, ...]
    shares: Shares = Shares()
    shares_file: str = SHARES_FILE
    shadow: str | None = None
    sample: float = 1.0

    def __post_init__(self) -> None:
        if not self.http or not self.grpc:
            raise ValueError("a rollout needs at least one canary server")
        if not 0 < self.sample <= 100:
            raise ValueError(f"the sample is a percent, over 0 and at most 100, not {self.sample}")


def current(path: Path) -> Shares:
    """The shares in force in ``path``.

    Raises:
        FileNotFoundError: no rollout there.
    """
    return Shares.from_json(path.read_text())


def write(path: Path, shares: Shares) -> None:
    """Put ``shares`` in ``path`` at once (a file beside it, renamed over it)."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_text(shares.as_json() + "\n")
    os.replace(staged, path)


def move(
    path: Path, changes: dict[str, float], sticky: bool | None = None
) -> tuple[Shares, Shares]:
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
