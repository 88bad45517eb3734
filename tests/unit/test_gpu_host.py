"""The GPU check's first step: what a host lacks, named before anything is started."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from server.launcher import find_installation
from tests import gpu_check

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture
def bundle(tmp_path):
    """A bundle made for this Python, unpacked: this venv's server and stub, numpy 1.26."""
    bundle_dir, unpacked = tmp_path / "bundle", tmp_path / "site"
    bundle_dir.mkdir()
    (bundle_dir / "manifest.json").write_text(json.dumps({"python": PYTHON, "photos": []}))
    root = find_installation().binary.parent.parent  # pytriton/tritonserver
    server = unpacked / "pytriton" / "tritonserver"
    (server / "bin").mkdir(parents=True)
    (server / "bin" / "tritonserver").symlink_to(root / "bin" / "tritonserver")
    # A copy, as in a bundle: ldd follows its RPATH from where it lies.
    stub = server / "python_backend_stubs" / PYTHON / gpu_check.STUB
    stub.parent.mkdir(parents=True)
    shutil.copy2(root / "python_backend_stubs" / PYTHON / gpu_check.STUB, stub)
    (unpacked / "nvidia_pytriton.libs").symlink_to(root.parent.parent / "nvidia_pytriton.libs")
    (unpacked / "numpy-1.26.4.dist-info").mkdir()
    return bundle_dir, unpacked


def test_a_host_with_everything_passes(bundle):
    assert gpu_check.host_problems(*bundle, need_gpu=False) == []


def test_each_missing_piece_is_named(bundle, monkeypatch):
    bundle_dir, unpacked = bundle
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    (bundle_dir / "manifest.json").write_text(json.dumps({**manifest, "python": "3.9"}))
    (unpacked / "numpy-1.26.4.dist-info").rename(unpacked / "numpy-2.2.6.dist-info")
    real_run = subprocess.run

    def run(command, *args, **kwargs):
        if command[0] == "ldd":  # a host whose Python has no shared libpython
            return subprocess.CompletedProcess(command, 0, "\tlibpython3.12.so.1.0 => not found\n")
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(gpu_check.subprocess, "run", run)
    problems = gpu_check.host_problems(bundle_dir, unpacked, need_gpu=True)
    text = "\n".join(problems)
    assert f"the bundle is for Python 3.9 and {sys.executable} is {PYTHON}" in text
    assert "no numpy<2 for the stub (found ['2.2.6'])" in text
    assert "cannot load libpython3.12.so.1.0" in text and "shared libpython" in text
    assert "sees no GPU" in text  # this machine has none


def test_no_bundle_for_a_python_without_numpy_1_wheels(tmp_path):
    with pytest.raises(SystemExit, match=r"no bundle for Python 3\.13"):
        gpu_check.bundle(tmp_path, "3.13")


def test_icu_data_becomes_a_stub_with_its_name_symbol_and_an_empty_table(tmp_path):
    """The bundle's ICU data library: ICU's own header and no entries, a few KiB, not 29 MB."""
    import ctypes

    root = find_installation().binary.parent.parent.parent.parent  # site-packages
    (real,) = (root / "nvidia_pytriton.libs").glob(gpu_check.ICU_DATA)
    shutil.copy2(real, tmp_path / real.name)
    gpu_check.stub_icu_data(tmp_path)
    stub = tmp_path / real.name
    assert stub.stat().st_size < 64 << 10 < real.stat().st_size
    soname = subprocess.run(["readelf", "-d", str(stub)], capture_output=True, text=True).stdout
    assert f"[{real.name}]" in soname
    symbol = next(
        s
        for s in subprocess.run(
            ["nm", "-D", str(real)], capture_output=True, text=True
        ).stdout.split()
        if s.startswith("icudt")
    )
    header = (ctypes.c_uint8 * 40).in_dll(ctypes.CDLL(str(stub)), symbol)
    assert bytes(header[:4]) == bytes([32, 0, 0xDA, 0x27])  # header size, ICU's magic
    assert bytes(header[12:16]) == b"ToCP" and bytes(header[32:36]) == bytes(4)  # no entries
