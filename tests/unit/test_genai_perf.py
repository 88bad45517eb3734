"""genai-perf beside perf_analyzer: its pins, command line, inputs, export and the table.

Nothing here installs or runs genai-perf (``python -m bench.genai_perf`` does, with a server).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from bench import genai_perf
from bench.harness import inputs, perf_analyzer
from export import text_samples
from paths import REPO_ROOT
from pipelines import embedding

# genai-perf 0.0.8's profile_export_genai_perf.json of an embeddings run, as it writes it
# (its input_config left out).
EXPORT = {
    "request_throughput": {"unit": "requests/sec", "avg": 101.25},
    "request_latency": {
        "unit": "ms",
        **{"avg": 9.9, "p25": 8.1, "p50": 9.5, "p75": 10.4, "p90": 11.8, "p95": 12.6},
        **{"p99": 17.25, "min": 6.0, "max": 30.1, "std": 2.1},
    },
}


def run(**changes) -> genai_perf.GenAIPerfRun:
    options = {
        "venv": Path("/g"),
        "model": "embed",
        "url": "127.0.0.1:8080",
        "texts": Path("/t/texts.jsonl"),
        "tokenizer": Path("/t/tokenizer"),
        "batch": 1,
        "measurement_ms": 5000,
        "cpus": None,
        **changes,
    }
    return genai_perf.GenAIPerfRun(**options)


def test_pins_drive_the_same_perf_analyzer_as_the_main_environment():
    pins = dict(line.split("==") for line in genai_perf.requirements())
    assert pins["genai-perf"] == "0.0.8"
    main = re.search(
        r"^tritonclient\[[a-z,]+\]==(\S+)$", (REPO_ROOT / "requirements.txt").read_text(), re.M
    )
    assert main and pins["tritonclient"] == main.group(1)
    assert genai_perf.TOOL.requirements == genai_perf.requirements()
    assert genai_perf.TOOL.venv() == REPO_ROOT / ".peers" / "genai-perf" / "venv"


def test_requirements_skip_comments_and_blank_lines(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text("# why\n\ngenai-perf==0.0.8  # the tool\n  pandas==3.0.6\n")
    assert genai_perf.requirements(path) == ("genai-perf==0.0.8", "pandas==3.0.6")


def test_command_profiles_openai_embeddings_with_our_texts_tokenizer_and_window():
    cmd = run(batch=4).command(8, Path("/out/r1-c8"))
    assert cmd[:2] == ["/g/bin/genai-perf", "profile"]
    end = cmd.index("--")
    options = dict(zip(cmd[2:end:2], cmd[3:end:2], strict=True))
    assert options == {
        "-m": "embed",
        "--endpoint-type": "embeddings",
        "--service-kind": "openai",
        "-u": "127.0.0.1:8080",
        "--batch-size-text": "4",
        "--concurrency": "8",
        "--measurement-interval": "5000",
        "--stability-percentage": "999",
        "--input-file": "/t/texts.jsonl",
        "--tokenizer": "/t/tokenizer",
        "--artifact-dir": "/out/r1-c8",
    }
    # What genai-perf passes on to its perf_analyzer as it is: that tool's own CSV of the run.
    assert cmd[end + 1 :] == ["-f", "/out/r1-c8/perf_analyzer.csv", "--verbose-csv"]


def test_command_is_pinned_to_the_load_generators_cores():
    cmd = run(cpus=[0]).command(1, Path("/out"))
    assert cmd[:3] == ["taskset", "-c", "0"] and cmd[3] == "/g/bin/genai-perf"


def test_environment_puts_its_own_bin_first_and_keeps_perf_analyzers_libraries():
    env = run().environment({"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/libs"})
    assert env["PATH"].split(os.pathsep) == ["/g/bin", "/usr/bin"]
    assert env["LD_LIBRARY_PATH"] == "/libs"
    assert env["HF_HUB_OFFLINE"] == "1"


def test_parse_profile_reads_throughput_and_latency_percentiles():
    got = genai_perf.parse_profile(json.dumps(EXPORT))
    assert got == genai_perf.Figures(throughput=101.25, p50_ms=9.5, p99_ms=17.25)


def test_parse_profile_refuses_other_units_and_missing_metrics():
    seconds = {**EXPORT, "request_latency": {**EXPORT["request_latency"], "unit": "s"}}
    with pytest.raises(genai_perf.GenAIPerfError, match="units"):
        genai_perf.parse_profile(json.dumps(seconds))
    with pytest.raises(genai_perf.GenAIPerfError, match="request_latency"):
        genai_perf.parse_profile(json.dumps({"request_throughput": EXPORT["request_throughput"]}))


def test_perf_analyzers_point_gives_the_same_figures():
    point = perf_analyzer.Point(1, 120.0, 8.0, 9.0, 10.0, 15.0, 8.5, 0.0, 0.0)
    assert genai_perf.from_perf_analyzer(point) == genai_perf.Figures(120.0, 8.0, 15.0)


def test_one_text_a_request_is_the_harness_bodies_of_the_same_texts():
    texts = list(text_samples.SENTENCES)
    lines = genai_perf.input_file(texts).splitlines()
    assert [json.loads(line)["text"] for line in lines] == texts
    data = genai_perf.openai_input_data(embedding.ENSEMBLE, texts, 1)
    assert data["data"] == inputs.openai_entries(embedding.ENSEMBLE)


def test_batches_rotate_through_distinct_texts_and_stay_within_them():
    texts = ["a", "b", "c"]
    data = genai_perf.openai_input_data("embed", texts, 2)
    assert [d["payload"][0]["input"] for d in data["data"]] == [["a", "b"], ["b", "c"], ["c", "a"]]
    for batch in (0, 4):
        with pytest.raises(ValueError, match=r"batch must be 1\.\.3"):
            genai_perf.openai_input_data("embed", texts, batch)


def test_tokenizer_folder_holds_minilms_own_files(tmp_path):
    folder = genai_perf.write_tokenizer(tmp_path / "tok")
    assert sorted(p.name for p in folder.iterdir()) == sorted(genai_perf.TOKENIZER_FILES)
    encoded = Tokenizer.from_file(str(folder / "tokenizer.json")).encode("A man is eating food.")
    assert encoded.tokens[:3] == ["[CLS]", "a", "man"]


def test_table_gives_each_round_and_the_median_of_ratios_within_rounds():
    f = genai_perf.Figures
    results = {
        ("perf_analyzer", 8): [f(100.0, 10.0, 20.0), f(110.0, 10.0, 22.0)],
        ("genai-perf", 8): [f(95.0, 10.5, 21.0), f(115.0, 10.5, 21.0)],
        (genai_perf.SAME_RUN, 8): [f(95.0, 10.0, 21.0), f(115.0, 10.0, 21.0)],
    }
    durations = {("perf_analyzer", 8): [16.0, 18.0], ("genai-perf", 8): [24.0, 26.0]}
    lines = genai_perf.table(results, durations, [8]).splitlines()
    assert lines[2:5] == [
        "| 8 | perf_analyzer | 100.0, 110.0 | 10.0, 10.0 | 20.0, 22.0 | 17 |",
        "| 8 | genai-perf | 95.0, 115.0 | 10.5, 10.5 | 21.0, 21.0 | 25 |",
        "| 8 | genai-perf's perf_analyzer | 95.0, 115.0 | 10.0, 10.0 | 21.0, 21.0 | – |",
    ]
    assert lines[8:] == [
        "| 8 | perf_analyzer's run, the same round "
        "| 1.00x [0.95 – 1.05] | 1.05x [1.05 – 1.05] | 1.00x [0.95 – 1.05] |",
        "| 8 | the same requests "
        "| 1.00x [1.00 – 1.00] | 1.05x [1.05 – 1.05] | 1.00x [1.00 – 1.00] |",
    ]


def test_one_round_gives_its_ratios_without_a_spread():
    f = genai_perf.Figures
    results = {
        ("perf_analyzer", 1): [f(50.0, 20.0, 40.0)],
        ("genai-perf", 1): [f(40.0, 25.0, 50.0)],
        (genai_perf.SAME_RUN, 1): [f(40.0, 25.0, 50.0)],
    }
    durations = {("perf_analyzer", 1): [18.0], ("genai-perf", 1): [23.0]}
    lines = genai_perf.table(results, durations, [1]).splitlines()
    assert lines[-2].endswith("| 0.80x | 1.25x | 1.25x |")
    assert lines[-1].endswith("| 1.00x | 1.00x | 1.00x |")


def _tool(venv: Path, script: str) -> genai_perf.GenAIPerfRun:
    binary = venv / "bin" / "genai-perf"
    binary.parent.mkdir(parents=True)
    binary.write_text(f"#!/bin/sh\n{script}\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return run(venv=venv)


def test_a_failed_run_says_why_with_its_output(tmp_path):
    tool = _tool(tmp_path / "g", "echo 'Thread [0] had error: HTTP code 400'; exit 99")
    with pytest.raises(genai_perf.GenAIPerfError, match=r"failed \(99\).*HTTP code 400"):
        genai_perf.measure(tool, 1, tmp_path / "a")
    assert "HTTP code 400" in (tmp_path / "a" / "output.log").read_text()


def test_a_run_that_writes_no_export_is_an_error_not_a_figure(tmp_path):
    with pytest.raises(genai_perf.GenAIPerfError, match=r"failed \(0\)"):
        genai_perf.measure(_tool(tmp_path / "g", "exit 0"), 1, tmp_path / "a")


def test_the_pins_point_at_the_section_that_measured_them():
    anchor = re.search(r"performance\.md#([\w-]+)", genai_perf.REQUIREMENTS_FILE.read_text())
    headings = re.findall(r"^#+ (.+)$", (REPO_ROOT / "docs" / "performance.md").read_text(), re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
    assert anchor and anchor.group(1) in slugs
