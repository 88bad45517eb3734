"""``python -m gateway limits FILE``: the committed limits with a fresh key per tenant."""

from __future__ import annotations

import stat

from gateway import __main__ as gateway_main
from gateway import shaping


def test_writes_the_limits_with_fresh_keys_a_gateway_serves_with(tmp_path, capsys):
    out = tmp_path / "my-limits.toml"
    assert gateway_main.main(["limits", str(out)]) == 0
    assert "team-a, team-b" in capsys.readouterr().out  # which tenants got keys, never the keys
    written = shaping.load_limits(out)  # as `serve --limits` reads it: no placeholder left
    committed = shaping.load_limits(shaping.LIMITS, placeholders=True)
    assert written.tenants == committed.tenants and written.models == committed.models
    assert sorted(written.keys.values()) == sorted(committed.keys.values())
    assert not set(written.keys) & set(committed.keys)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # secrets: the owner's only

    again = tmp_path / "other.toml"
    assert gateway_main.main(["limits", str(again)]) == 0
    assert not set(shaping.load_limits(again).keys) & set(written.keys)  # fresh each time


def test_never_overwrites_a_file(tmp_path, capsys):
    out = tmp_path / "my-limits.toml"
    out.write_text("keys in use")
    assert gateway_main.main(["limits", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert out.read_text() == "keys in use"


def test_refuses_a_source_a_gateway_would_refuse_and_writes_nothing(tmp_path, capsys):
    source = tmp_path / "limits.toml"
    source.write_text('[anonymous]\nrate = 5\ncapacity = 10\n[tenants.a]\nkeys = ["short"]\n')
    out = tmp_path / "my-limits.toml"
    assert gateway_main.main(["limits", str(out), "--from", str(source)]) == 2
    assert "needs both rate and capacity" in capsys.readouterr().err
    assert not out.exists()
