"""infinity-emb as an embedding peer: command lines, affinities, the unavailable path, report.

Nothing here installs or starts infinity-emb.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from bench.harness import affinity, inputs
from bench.harness.plan import Case, Plan, perf_args
from bench.harness.runner import Runner
from bench.peers import infinity
from bench.report.markdown import embedding_servers
from bench.report.ratios import metric_table
from export import text_samples
from tests.helpers import embed_report_row


def test_server_command_serves_our_folder_with_mean_pooling_and_the_default_batch():
    cmd = infinity.server_command(Path("/v"), 8123)
    assert cmd[:2] == ["/v/bin/infinity_emb", "v2"]
    options = dict(zip(cmd[2::2], cmd[3::2], strict=True))
    assert options == {
        "--model-id": ".",
        "--served-model-name": "embed",
        "--engine": "optimum",
        "--device": "cpu",
        "--pooling-method": "mean",
        "--batch-size": "32",
        "--host": "127.0.0.1",
        "--port": "8123",
        "--log-level": "warning",
    }


def test_server_runs_in_the_model_folder_behind_taskset_offline():
    server = infinity.InfinityServer(Path("/v"), Path("/m/onnx"), cpus=[1], port=9000)
    assert server.command()[:3] == ["taskset", "-c", "1"]
    assert server.command()[3] == "/v/bin/infinity_emb"
    assert server.ready_url == "http://127.0.0.1:9000/health"
    env = server.environment()
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["DO_NOT_TRACK"] == "1"
    assert infinity.InfinityServer(Path("/v"), Path("/m")).command()[0] == "/v/bin/infinity_emb"


def test_install_makes_its_own_environment_with_the_pinned_packages():
    venv = infinity.TOOL.venv()
    assert venv == infinity.HOME / "venv" and infinity.HOME.name == "infinity"
    create, install = infinity.TOOL.install_commands(venv, python="/usr/bin/python3")
    assert create == ["/usr/bin/python3", "-m", "venv", str(venv)]
    assert install[:4] == [str(venv / "bin" / "python"), "-m", "pip", "install"]
    assert "infinity-emb[server,optimum]==0.0.78" in install
    assert "torch==2.13.0" in install
    assert infinity.TOOL.command == "infinity_emb"


def test_venv_choice(monkeypatch):
    monkeypatch.delenv(infinity.VENV_VARIABLE, raising=False)
    assert infinity.venv_dir() == infinity.HOME / "venv"
    monkeypatch.setenv(infinity.VENV_VARIABLE, "/tmp/other")
    assert infinity.venv_dir() == Path("/tmp/other")
    assert infinity.venv_dir(Path("/x")) == Path("/x")


def test_export_writes_token_embeddings_for_infinity_to_pool():
    cmd = infinity.export_command(Path("/v"), Path("/src"), Path("/out"))
    assert cmd[:3] == ["/v/bin/optimum-cli", "export", "onnx"]
    assert cmd[cmd.index("--task") + 1] == "feature-extraction"
    assert cmd[cmd.index("--library-name") + 1] == "transformers"
    assert cmd[-1] == "/out"


@pytest.mark.parametrize(
    ("cores", "text"),
    [({1}, "1"), ({0, 1, 2, 3}, "0-3"), ({0, 1, 4, 6, 7}, "0-1,4,6-7"), (set(), "")],
)
def test_cpu_lists(cores, text):
    assert affinity.cpu_list(cores) == text


def test_thread_affinities_read_every_thread_of_a_live_process():
    started = threading.Event()
    stop = threading.Event()
    worker = threading.Thread(target=lambda: (started.set(), stop.wait(10)))
    worker.start()
    started.wait(5)
    try:
        found = affinity.thread_affinities([os.getpid(), 2**22 + 7])  # the second: no such pid
    finally:
        stop.set()
        worker.join()
    assert {threading.get_native_id(), worker.native_id} <= set(found)
    assert set(found.values()) == {frozenset(os.sched_getaffinity(0))}


def test_summaries_say_when_a_thread_left_the_core():
    one, both = frozenset({1}), frozenset({0, 1})
    assert affinity.summarize({1: one, 2: one}, [1]) == "2 threads: all on cores 1"
    moved = affinity.summarize({1: one, 2: one, 3: both}, [1])
    assert moved == "3 threads: 2 on 1, 1 on 0-1 (NOT all on cores 1)"
    assert affinity.summarize({}, [1]) == "no threads found"


def test_pin_command_covers_every_thread():
    assert affinity.pin_command(42, [3, 1]) == ["taskset", "-a", "-p", "-c", "1,3", "42"]
    # One prefix for every process the benchmarks start pinned.
    assert affinity.pinned([3, 1], ["prog", "-x"]) == ["taskset", "-c", "1,3", "prog", "-x"]


def test_openai_bodies_carry_the_same_texts_in_the_same_order():
    bodies = inputs.openai_entries("embed")
    ours = inputs.entries("embed")
    assert [b["payload"][0]["input"] for b in bodies] == [e["TEXT"]["content"] for e in ours]
    assert {b["payload"][0]["model"] for b in bodies} == {"embed"}
    assert len(bodies) == len(text_samples.SENTENCES)


def test_perf_analyzer_options_per_case():
    def case(payload, calls="sync", system="triton"):
        return Case(system, "-", "embed", "http", payload, "concurrency", 8, calls=calls)

    assert perf_args(case("json")) == []
    assert perf_args(case("json", "async")) == ["--async"]
    openai = perf_args(case("openai", "async", "infinity"))
    assert openai == ["--service-kind=openai", "--endpoint=embeddings", "--async"]


def test_embed_peers_plan_measures_only_the_embedding_servers():
    plan = Plan.embed_peers()
    cases = list(plan.triton_cases("batching"))
    assert {c.model for c in cases} == {"embed"}
    assert {c.calls for c in cases} == {"sync", "async"}
    assert plan.infinity_levels == [1, 8, 32]
    assert {c.dataset for c in cases} == {"samples", "mixed"}
    # The raw engine's embedding curves only: the limits the embedding targets name.
    assert plan.raw and not plan.raw_model_batches and not plan.raw_pipeline_batches
    assert plan.raw_embed_batches and plan.raw_mixed_batches
    assert not list(plan.triton_cases("no-batching"))


class _NoServer:
    def __init__(self, *args, **kwargs):
        pass

    def start(self):
        raise RuntimeError("port in use")


def test_an_unavailable_infinity_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    def unavailable(*args, **kwargs):
        raise infinity.InfinityUnavailableError("`pip install` exited with 1: no torch wheel")

    monkeypatch.setattr(infinity, "start", unavailable)
    monkeypatch.setattr(infinity, "NullOpenAIServer", _NoServer)
    plan = Plan.embed_peers()
    runner = Runner(plan, tmp_path, [1], [0], progress=lambda line: None)
    runner._infinity(1, tmp_path / "embed-openai.json")
    runner._infinity(2, tmp_path / "embed-openai.json")  # not tried again
    rows = [r for r in runner.rows if r.case.system == "infinity"]
    # Short texts at 1, 8, 32, then mixed lengths at 8, 32; in both rounds.
    levels = [(r.case.dataset, r.case.level) for r in rows]
    assert levels == 2 * [
        ("samples", 1),
        ("samples", 8),
        ("samples", 32),
        ("mixed", 8),
        ("mixed", 32),
    ]
    assert all(r.point is None and "no torch wheel" in r.error for r in rows)
    assert len([n for n in runner.notes if "not measured" in n]) == 1
    nulls = [r for r in runner.rows if r.case.system == "null-peer"]
    assert nulls and all("port in use" in r.error for r in nulls)


def _row(round_, system, level, throughput, p99, payload="json", calls="async", error=""):
    return embed_report_row(
        round_, system, level, throughput, p99, payload=payload, calls=calls, error=error
    )


def _rows(infinity_texts_per_s):
    rows = []
    for r in (1, 2):
        for level in (1, 8, 32):
            rows.append(_row(r, "triton", level, 300, 40))
            rows.append(_row(r, "peer", level, 250, 30))
            rows.append(_row(r, "infinity", level, infinity_texts_per_s, 80, payload="openai"))
        rows.append(_row(r, "null-peer", 1, 6000, 0.3, payload="openai"))
    return rows


def test_report_compares_embed_with_infinity_at_each_level():
    rows = _rows(150)
    table = {item["metric"].name: item for item in metric_table(rows, {})}
    ratio = table["embed ÷ infinity-emb texts/s at concurrency 8 (async calls, same core)"]
    assert ratio["median"] == pytest.approx(2.0)
    assert ratio["met"] is True
    assert table["embed p99 ÷ infinity-emb p99 at concurrency 8 (async calls)"]["median"] == 0.5
    lines = "\n".join(embedding_servers(rows))
    assert "| infinity-emb | 8 | 150.0 [150.0 – 150.0]" in lines
    assert "| embed ÷ infinity-emb, texts/s | 2.00 [2.00 – 2.00]" in lines
    assert "Target embed ≥ 1.5x infinity-emb" in lines and ": met (lowest 2.00x)" in lines


def test_report_says_when_the_target_is_missed_or_infinity_was_not_measured():
    assert "**not met**" in "\n".join(embedding_servers(_rows(250)))
    assert embedding_servers([_row(1, "triton", 8, 300, 40)]) == []
    failed = [
        _row(1, "triton", 8, 300, 40),
        _row(1, "infinity", 8, "", 0, payload="openai", error="infinity-emb: no wheel"),
    ]
    assert "not measured: infinity-emb: no wheel" in "\n".join(embedding_servers(failed))
