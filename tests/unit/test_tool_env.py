"""The tools' own environments: made by our files, failures say why, ready ones are used."""

from __future__ import annotations

import sys

import pytest

from bench.harness import tool_env

TOOL = tool_env.ToolEnvironment("some-tool", ("some-tool==1.0",), "some-tool")


def test_an_environment_of_its_own_under_peers():
    venv = TOOL.venv()
    assert venv == tool_env.PEERS / "some-tool" / "venv"
    create, install = TOOL.install_commands(venv, python="/usr/bin/python3")
    assert create == ["/usr/bin/python3", "-m", "venv", str(venv)]
    assert install[:4] == [str(venv / "bin" / "python"), "-m", "pip", "install"]
    assert install[-1] == "some-tool==1.0"


def test_a_failed_install_says_why(tmp_path, monkeypatch):
    fail = [sys.executable, "-c", "import sys; print('no matching distribution'); sys.exit(3)"]
    monkeypatch.setattr(tool_env.ToolEnvironment, "install_commands", lambda self, venv: [fail])
    log = tmp_path / "install.log"
    with pytest.raises(tool_env.ToolUnavailableError, match="exited with 3") as exc:
        TOOL.ensure(tmp_path / "venv", log)
    assert "no matching distribution" in str(exc.value)
    assert "no matching distribution" in log.read_text()


def test_a_missing_interpreter_is_unavailable_not_a_crash(tmp_path, monkeypatch):
    missing = [[str(tmp_path / "none")]]
    monkeypatch.setattr(tool_env.ToolEnvironment, "install_commands", lambda self, venv: missing)
    with pytest.raises(tool_env.ToolUnavailableError, match="failed"):
        TOOL.ensure(tmp_path / "venv", tmp_path / "install.log")


def test_an_install_that_makes_no_command_is_unavailable(tmp_path, monkeypatch):
    quiet = [[sys.executable, "-c", "pass"]]
    monkeypatch.setattr(tool_env.ToolEnvironment, "install_commands", lambda self, venv: quiet)
    with pytest.raises(tool_env.ToolUnavailableError, match="bin/some-tool is missing"):
        TOOL.ensure(tmp_path / "venv", tmp_path / "install.log")


def test_a_ready_environment_is_used_as_it_is(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "some-tool").touch()
    refuse = lambda self, venv: pytest.fail("installed again")  # noqa: E731
    monkeypatch.setattr(tool_env.ToolEnvironment, "install_commands", refuse)
    assert TOOL.ensure(tmp_path, tmp_path / "install.log") == tmp_path


def test_our_environment_is_made_again_when_its_pins_change(tmp_path, monkeypatch):
    monkeypatch.setattr(tool_env, "PEERS", tmp_path)
    venv = TOOL.venv()
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "some-tool").touch()
    (venv / "installed.txt").write_text("some-tool==0.9\n")
    ran = []
    monkeypatch.setattr(
        tool_env.ToolEnvironment, "install_commands", lambda self, v: ran.append(v) or []
    )
    assert TOOL.ensure(venv, tmp_path / "install.log") == venv
    assert ran == [venv]
    assert (venv / "installed.txt").read_text() == "some-tool==1.0\n"
    ran.clear()
    TOOL.ensure(venv, tmp_path / "install.log")  # the stamp matches now: nothing to do
    assert ran == []
