"""Traffic shaping at the gateway: token buckets per tenant and per model, from one TOML file.

``docker/nginx/limits.toml`` sets a rate and a capacity for every tenant and every model. nginx
enforces it with ``limit_req`` (``gateway/nginx/`` renders the zones); this module reads and
checks the file (``gateway/access_log.py`` counts nginx's decisions).

A bucket holds at most ``capacity`` tokens and gains ``rate`` tokens a second; it starts full.
A request takes one token from its tenant's bucket and one from its model's; when either is
empty, it is refused (HTTP 429, gRPC ``RESOURCE_EXHAUSTED``) and takes nothing from either.
So a tenant that sends faster than its rate is admitted ``capacity`` requests at once and then
``rate`` a second, whatever it sends. nginx's ``limit_req zone=... burst=B nodelay`` is the
same bucket with ``capacity = B + 1``.

Tenants are told apart by an API key in a header (``X-Api-Key``; gRPC metadata ``x-api-key``),
compared exactly. Requests without a known key belong to the ``anonymous`` tenant, which has a
bucket of its own. The committed file's keys are placeholders: a gateway refuses to start with
them (``parse_limits``).
"""

from __future__ import annotations

import math
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from paths import REPO_ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (the NGC container): the same parser from PyPI
    import tomli as tomllib

__all__ = [
    "ANONYMOUS",
    "LIMITS",
    "Limit",
    "Limits",
    "load_limits",
    "retry_after_s",
    "with_secret_keys",
    "write_with_secret_keys",
]

# The repository's limits file (with placeholder keys); deployments mount one of their own.
LIMITS = REPO_ROOT / "docker" / "nginx" / "limits.toml"
ANONYMOUS = "anonymous"
DEFAULT_HEADER = "X-Api-Key"
# Names become nginx zone and variable names: keep them to what both accept.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
# Keys are written into nginx's config inside double quotes.
KEY = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]{8,256}$")
# The committed limits.toml names its keys "<tenant>-change-me": never a deployment's key.
PLACEHOLDER = "change-me"
NEW_KEY_HINT = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"


@dataclass(frozen=True)
class Limit:
    """A token bucket's settings: ``rate`` tokens per second, at most ``capacity`` stored."""

    rate: float
    capacity: int

    def __post_init__(self) -> None:
        if not (isinstance(self.rate, int | float) and math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"rate must be a number > 0 (requests per second), got {self.rate!r}")
        if not isinstance(self.capacity, int) or isinstance(self.capacity, bool):
            raise ValueError(f"capacity must be a whole number, got {self.capacity!r}")
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")

    @property
    def retry_after(self) -> int:
        """Whole seconds in which an empty bucket gains a token: the ``Retry-After`` hint."""
        return retry_after_s(1.0 / self.rate)


def retry_after_s(seconds: float) -> int:
    """``Retry-After`` in whole seconds (what the header allows), never 0."""
    return max(1, math.ceil(seconds - 1e-9))


@dataclass(frozen=True)
class Limits:
    """Every tenant's and every model's bucket, and how tenants are identified.

    Attributes:
        tenants: tenant name → its limit (``anonymous`` included).
        keys: API key → tenant name.
        models: model name → its limit (models not listed are not limited per model).
        header: the HTTP header with the API key (gRPC: the same name, lower case, as metadata).
    """

    tenants: Mapping[str, Limit]
    keys: Mapping[str, str]
    models: Mapping[str, Limit]
    header: str = DEFAULT_HEADER


def _limit(section: object, where: str) -> Limit:
    if not isinstance(section, dict):
        raise ValueError(f"{where} must be a table with rate and capacity")
    unknown = set(section) - {"rate", "capacity", "keys"}
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {sorted(unknown)}")
    if "rate" not in section or "capacity" not in section:
        raise ValueError(f"{where} needs both rate and capacity")
    try:
        return Limit(section["rate"], section["capacity"])
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _name(name: str, where: str) -> str:
    if not NAME.match(name):
        raise ValueError(f"{where} name {name!r}: use letters, digits, '-' and '_' (at most 63)")
    return name


def parse_limits(data: Mapping[str, object], placeholders: bool = False) -> Limits:
    """Limits from the parsed TOML document.

    Args:
        data: the document.
        placeholders: take keys with ``PLACEHOLDER`` in them (the committed file's); a gateway
            that serves never does, so that it cannot start with keys anyone can read.

    Raises:
        ValueError: a missing, unknown or invalid setting; the message names it.
    """
    unknown = set(data) - {"header", "anonymous", "tenants", "models"}
    if unknown:
        raise ValueError(f"unknown top-level setting(s) {sorted(unknown)}")
    header = data.get("header", DEFAULT_HEADER)
    if not isinstance(header, str) or not re.match(r"^[A-Za-z][A-Za-z0-9-]*$", header):
        raise ValueError(f"header must be an HTTP header name, got {header!r}")
    if "anonymous" not in data:
        raise ValueError("[anonymous] is required: the bucket of requests without a known key")
    tenants = {ANONYMOUS: _limit(data["anonymous"], "[anonymous]")}
    keys: dict[str, str] = {}
    for name, section in dict(data.get("tenants", {})).items():
        where = f"[tenants.{name}]"
        if _name(name, "tenant") in tenants:
            raise ValueError(f"{where}: {name!r} is reserved or given twice")
        tenants[name] = _limit(section, where)
        tenant_keys = section.get("keys")
        if not isinstance(tenant_keys, list) or not tenant_keys:
            raise ValueError(f"{where} needs keys = [...] (the API keys of that tenant)")
        for key in tenant_keys:
            if not isinstance(key, str) or not KEY.match(key):
                raise ValueError(
                    f"{where}: a key must be 8-256 printable ASCII characters without quotes, "
                    "backslashes or spaces"
                )
            if PLACEHOLDER in key and not placeholders:
                raise ValueError(
                    f"{where}: {key!r} is the committed placeholder, which anyone can read: "
                    f"give the tenant a secret key of its own (e.g. {NEW_KEY_HINT})"
                )
            if key in keys:
                raise ValueError(f"{where}: key is also a key of tenant {keys[key]!r}")
            keys[key] = name
    models = {}
    for name, section in dict(data.get("models", {})).items():
        models[_name(name, "model")] = _limit(section, f"[models.{name}]")
        if "keys" in section:
            raise ValueError(f"[models.{name}]: keys belong to tenants")
    return Limits(tenants, keys, models, header)


def load_limits(path: str | Path, placeholders: bool = False) -> Limits:
    """Read and check the limits file (TOML); ``placeholders`` as in :func:`parse_limits`.

    Raises:
        ValueError: the file is not valid TOML or a setting is wrong (the message says which).
    """
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    try:
        return parse_limits(data, placeholders)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def write_with_secret_keys(source: Path, out: Path) -> Limits:
    """Write ``source`` to ``out`` with a fresh key for each placeholder key, mode 0600.

    ``python -m gateway limits`` runs it; 0600: the keys are readable by their owner only.

    Raises:
        FileExistsError: ``out`` exists (its keys may be in use: never overwritten).
        ValueError: the result is not a limits file a gateway serves with (the message says why).
    """
    text = with_secret_keys(Path(source).read_text())
    limits = parse_limits(tomllib.loads(text))  # refuses what a gateway would refuse
    with os.fdopen(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(text)
    return limits


def with_secret_keys(text: str) -> str:
    """A limits file's text with a fresh random key in place of each committed placeholder.

    A gateway refuses the placeholders; a deployment (or a test, or ``make up``) puts keys of
    its own in a copy. Each key keeps its tenant's prefix (``team-a-...``), for the reader.
    """
    for placeholder in sorted(set(re.findall(rf'"([^"]*){PLACEHOLDER}"', text))):
        key = f"{placeholder}{secrets.token_urlsafe(24)}"
        text = text.replace(f'"{placeholder}{PLACEHOLDER}"', f'"{key}"')
    return text
