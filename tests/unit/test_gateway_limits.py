"""``python -m gateway limits FILE``: the committed limits with a fresh key per tenant."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from gateway import shaping
from paths import REPO_ROOT


def test_writes_the_limits_with_fresh_keys_a_gateway_serves_with(tmp_path):
    out = tmp_path / "my-limits.toml"
    shaping.write_with_secret_keys(shaping.LIMITS, out)
    written = shaping.load_limits(out)  # as `serve --limits` reads it: no placeholder left
    committed = shaping.load_limits(shaping.LIMITS, placeholders=True)
    assert written.tenants == committed.tenants and written.models == committed.models
    assert sorted(written.keys.values()) == sorted(committed.keys.values())
    assert not set(written.keys) & set(committed.keys)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # secrets: the owner's only

    again = tmp_path / "other.toml"
    shaping.write_with_secret_keys(shaping.LIMITS, again)
    assert not set(shaping.load_limits(again).keys) & set(written.keys)  # fresh each time


def test_never_overwrites_a_file(tmp_path):
    out = tmp_path / "my-limits.toml"
    out.write_text("keys in use")
    with pytest.raises(FileExistsError):
        shaping.write_with_secret_keys(shaping.LIMITS, out)
    assert out.read_text() == "keys in use"


def test_refuses_a_source_a_gateway_would_refuse_and_writes_nothing(tmp_path):
    source = tmp_path / "limits.toml"
    source.write_text('[anonymous]\nrate = 5\ncapacity = 10\n[tenants.a]\nkeys = ["short"]\n')
    out = tmp_path / "my-limits.toml"
    with pytest.raises(ValueError, match="needs both rate and capacity"):
        shaping.write_with_secret_keys(source, out)
    assert not out.exists()


def test_the_command_names_the_tenants_never_the_keys(tmp_path):
    def gateway_limits(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "limits", *args],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    made = gateway_limits("my-limits.toml")
    assert made.returncode == 0, made.stderr
    assert "team-a, team-b" in made.stdout
    keys = shaping.load_limits(tmp_path / "my-limits.toml").keys
    assert not any(key in made.stdout + made.stderr for key in keys)
    again = gateway_limits("my-limits.toml")
    assert again.returncode == 2 and "exists" in again.stderr
