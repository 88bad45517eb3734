"""The SLO file, the rules made from it, the alerts' unit tests, and their runbooks.

``promtool test rules`` runs every alert's cases (docker/prometheus/tests/); the tests here make
sure those cases exist for every alert, both ways, and that they catch a broken rule.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gateway import access_log
from gateway.served import SERVED
from monitoring import slo
from paths import DOCS
from tests import promql
from tests.helpers import REPO, prometheus_tool

PROMETHEUS = REPO / "docker" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.test.yml"))
OPERATIONS = DOCS / "operations.md"


def promtool_test(folder: Path, rules: str | None = None) -> subprocess.CompletedProcess:
    """``promtool test rules`` on ``folder``'s tests, run where they are: promtool 2.42 reads
    their ``rule_files`` relative to its working directory. ``rules``: only the tests of that
    rule file (``alerts.yml`` → ``tests/alerts.test.yml``)."""
    tests = sorted(p.name for p in (folder / "tests").glob("*.test.yml"))
    if rules is not None:
        tests = [f"{Path(rules).stem}.test.yml"]
    return subprocess.run(
        [prometheus_tool("promtool"), "test", "rules", *tests],
        cwd=folder / "tests",
        capture_output=True,
        text=True,
        timeout=120,
    )


def alert_rules() -> list[dict]:
    rules = []
    for path in (ALERTS, slo.RULES):
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules += [r for r in group["rules"] if "alert" in r]
    return rules


def test_the_committed_rules_are_what_the_slo_file_makes():
    assert slo.RULES.read_text() == slo.dump(slo.render(slo.load())), (
        "stale: run python -m monitoring rules"
    )


def test_every_objective_is_of_a_served_model_and_its_bound_a_gateway_bucket():
    objectives = slo.load().objectives
    assert {o.model for o in objectives} <= set(SERVED)
    kinds = {(o.model, o.kind) for o in objectives}
    assert {("embed", slo.AVAILABILITY), ("embed", slo.LATENCY)} <= kinds
    for o in objectives:
        if o.kind == slo.LATENCY:
            assert o.under_ms / 1000 in access_log.DURATION_BUCKETS


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda raw: raw["objectives"]["embed"]["latency"].update(under_ms=300), "not a bucket"),
        (lambda raw: raw["objectives"]["embed"].update(speed=1), "unknown objective kind"),
        (lambda raw: raw["objectives"]["embed"].update(availability=100), "within \\(0, 100\\)"),
        (lambda raw: raw.update(owner="x"), "unknown keys"),
    ],
)
def test_a_wrong_slo_file_is_refused(tmp_path, edit, message):
    raw = yaml.safe_load(slo.SLOS.read_text())
    edit(raw)
    path = tmp_path / "slos.yml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=message):
        slo.load(path)


def test_a_scaled_render_divides_every_window_and_nothing_else():
    slos = slo.load()
    full, fast = slo.render(slos), slo.render(slos, scale=60)
    assert [g["name"] for g in full["groups"]] == [g["name"] for g in fast["groups"]]
    for big, small in zip(full["groups"], fast["groups"], strict=True):
        for a, b in zip(big["rules"], small["rules"], strict=True):
            assert a.get("record") == b.get("record") and a.get("alert") == b.get("alert")
            assert a.get("labels") == b.get("labels")
            if "alert" in a:
                assert slo.seconds(a["for"]) == 60 * slo.seconds(b["for"])
    page = next(
        r for r in fast["groups"][0]["rules"] if r.get("alert") == "SLOAvailabilityFastBurn"
    )
    # 1h → 1m and 5m → 5s in the expressions; the thresholds and the request floor unchanged.
    assert "[1m]" not in page["expr"]  # the alert reads recorded series, never raw windows
    assert "slo:sli_events:rate1h" in page["expr"] and "* 60 >= 100" in page["expr"]
    record = next(r for r in fast["groups"][0]["rules"] if r.get("record", "").endswith("rate1h"))
    assert "[1m]" in record["expr"] and "[1h]" not in record["expr"]
    assert slo.duration(0.5) == "500ms" and slo.duration(21600) == "6h"


def test_a_scaled_rule_file_divides_its_durations_and_nothing_else():
    rules = yaml.safe_load(ALERTS.read_text())
    fast = slo.scaled(rules, 20)
    (down,) = [r for g in fast["groups"] for r in g["rules"] if r.get("alert") == "TritonDown"]
    assert down["for"] == "6s"
    # 1h → 3m, offset 30m → 90s; the comparisons with 0 and 1 and the labels as they were.
    assert "max_over_time(up[3m]) == 1" in down["expr"] and "up offset 90s" in down["expr"]
    assert 'up{job="triton"} == 0' in down["expr"]
    assert (
        down["labels"]
        == next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "TritonDown")[
            "labels"
        ]
    )
    # A subquery's range and step, and a recorded name with a window in it, untouched.
    (rule,) = slo.scaled(
        {"groups": [{"name": "g", "rules": [{"record": "r", "expr":
         "max_over_time(slo:sli_error:ratio_rate5m[1h:1m]) > 5"}]}]}, 60,
    )["groups"][0]["rules"]  # fmt: skip
    assert rule["expr"] == "max_over_time(slo:sli_error:ratio_rate5m[1m:1s]) > 5"
    assert "for" not in rule
    for group in fast["groups"]:
        for r in group["rules"]:
            promql.metric_names(r["expr"])  # parses, as Prometheus must


def test_every_alert_has_a_case_that_fires_and_one_that_stays_silent():
    firing, silent = set(), set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert names - firing == set(), "alerts never seen firing"
    assert names - silent == set(), "alerts never seen silent"


def test_promtool_passes_every_alerts_unit_tests():
    result = promtool_test(PROMETHEUS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS) >= 2


def copy_rules(tmp_path: Path) -> Path:
    folder = tmp_path / "prometheus"
    shutil.copytree(PROMETHEUS, folder)
    return folder


@pytest.mark.parametrize(
    ("path", "old", "new"),
    [
        # A page ten times too slow to come, a page with no floor of traffic, a ticket read off
        # the wrong window, 429s spending the budget, a TritonDown that fires for a server that
        # is up, one that pages a first start, and one that pages half an hour late.
        ("slo-rules.yml", "> 0.0144", "> 0.144"),
        ("slo-rules.yml", "* 3600 >= 100", "* 3600 >= 0"),
        ("slo-rules.yml", "slo:sli_error:ratio_rate3d{", "slo:sli_error:ratio_rate5m{"),
        ("slo-rules.yml", 'outcome="failed"', 'outcome=~"failed|refused"'),
        ("alerts.yml", 'up{job="triton"} == 0', 'up{job="triton"} == 1'),
        ("alerts.yml", "max_over_time(up[1h]) == 1", "max_over_time(up[1h]) >= 0"),
        ("alerts.yml", "group_wait.\n        for: 2m", "group_wait.\n        for: 30m"),
    ],
)
def test_the_unit_tests_catch_a_broken_rule(tmp_path, path, old, new):
    folder = copy_rules(tmp_path)
    text = (folder / path).read_text()
    assert old in text
    (folder / path).write_text(text.replace(old, new))
    # The broken file's own tests: the other file's do not read it, and take seconds.
    result = promtool_test(folder, path)
    assert result.returncode != 0 and "FAILED" in result.stderr, result.stdout + result.stderr


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings (lower case, spaces to dashes, punctuation gone)."""
    found = set()
    for heading in re.findall(r"^#+\s+(.+)$", markdown, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_every_alert_links_a_runbook_section_that_exists():
    sections = anchors(OPERATIONS.read_text())
    for rule in alert_rules():
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "docs/operations.md" and anchor == rule["alert"].lower(), url
        assert anchor in sections, f"docs/operations.md has no section #{anchor}"
