"""Service-level objectives → Prometheus recording rules and multi-window burn-rate alerts.

The objectives are written once, in ``docker/prometheus/slos.yml``; ``render`` makes the rule
file Prometheus loads (``docker/prometheus/slo-rules.yml``, committed; a test checks it is what
``render`` makes). Two kinds of objective per served model:

- **availability**: the share of the gateway's answers that are not server errors, from its
  counter of every inference answer (``gateway_requests_total``, ``gateway/access_log.py``):
  ``outcome="failed"`` (5xx, and gRPC's server-side statuses) ÷ every answer but a refusal.
  What users get is measured where they get it: a request shed by a Triton queue policy fails,
  and so does each 502/503/504 the gateway answers while no Triton answers it (Triton's own
  counters, the causes, see none of those). A refusal of a token bucket (429) counts neither
  way: the gateway holding a tenant to the rate it was given is the service working, and one
  tenant over its limit must not spend every tenant's budget nor page anyone;
- **latency**: the share of admitted requests the gateway answers within a bound, from its
  histogram (``gateway_request_duration_seconds``): the bucket at the bound ÷ all of them.

Every objective gets the same recorded series, told apart by their ``slo`` label:
``slo:sli_error:ratio_rate<w>`` (the share of bad events over window ``w``) and
``slo:sli_events:rate<w>`` (events per second), for each window an alert or the dashboard uses,
plus ``slo:objective:ratio`` and ``slo:error_budget:ratio`` (constants the dashboard divides by).

Alerts follow the multi-window, multi-burn-rate recipe of Google's SRE workbook (chapter
"Alerting on SLOs"): the error ratio over a long and a short window both above ``burn`` times
the budget (1 - objective). The short window makes the alert stop soon after the burning stops.

=========  ===========  ============  ========
severity   long window  short window  burn
=========  ===========  ============  ========
page       1h           5m            14.4x
page       6h           30m           6x
ticket     3d           6h            1x
=========  ===========  ============  ========

A page also needs ``min_requests`` requests in its long window: over a few requests one failure
is a large ratio that hurts nobody.

``scale`` divides every window and ``for`` by a factor: the same rules, made fast enough for a
test to watch an alert fire and resolve (``python -m monitoring rules --scale 60``);
``scaled`` does the same to a hand-written rule file (``alerts.yml``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from gateway import access_log
from paths import DOCKER

SLOS = DOCKER / "prometheus" / "slos.yml"
RULES = DOCKER / "prometheus" / "slo-rules.yml"

AVAILABILITY = "availability"
LATENCY = "latency"
# The gateway's counter of its inference answers (a Counter: Prometheus sees it with _total).
ANSWERS = f"{access_log.METRIC}_total"


@dataclass(frozen=True)
class BurnRate:
    """One alerting condition: both windows burning faster than ``burn`` times the budget."""

    severity: str
    long: str
    short: str
    burn: float


# The SRE workbook's recommended parameters: a page when 2 % of a 30-day budget goes in an hour
# or 5 % in six hours, a ticket when 10 % goes in three days.
BURN_RATES = (
    BurnRate("page", "1h", "5m", 14.4),
    BurnRate("page", "6h", "30m", 6.0),
    BurnRate("ticket", "3d", "6h", 1.0),
)
# How long a condition must hold before it notifies: a page within minutes of the burning, a
# ticket once it has lasted.
FOR = {"page": "2m", "ticket": "1h"}
ALERT_NAMES = {
    (AVAILABILITY, "page"): "SLOAvailabilityFastBurn",
    (AVAILABILITY, "ticket"): "SLOAvailabilitySlowBurn",
    (LATENCY, "page"): "SLOLatencyFastBurn",
    (LATENCY, "ticket"): "SLOLatencySlowBurn",
}

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")
# Where a PromQL expression holds a duration: a range or subquery ("[5m]", "[1h:1m]") and an
# offset. A number or a name (slo:sli_error:ratio_rate5m) is never one.
_ONE = r"\d+(?:ms|s|m|h|d)"
_RANGE = re.compile(rf"\[({_ONE})(?::({_ONE})?)?\]")
_OFFSET = re.compile(rf"\boffset\s+({_ONE})\b")


def seconds(duration: str) -> float:
    """A Prometheus duration of one unit ("5m", "3d") in seconds."""
    match = _DURATION.match(duration)
    if match is None:
        raise ValueError(f"not a duration of one unit: {duration!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def duration(value_s: float) -> str:
    """Seconds as the shortest exact Prometheus duration ("300" → "5m", "0.5" → "500ms")."""
    ms = round(value_s * 1000)
    if ms <= 0:
        raise ValueError(f"a window must be longer than 0 s: {value_s}")
    for unit in ("d", "h", "m", "s"):
        size = round(_UNITS[unit] * 1000)
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def bucket_label(bound_s: float) -> str:
    """The ``le`` label prometheus_client writes for a bucket bound (0.25 → "0.25", 1 → "1.0")."""
    return repr(float(bound_s))


@dataclass(frozen=True)
class Objective:
    """One SLO: a model, a kind, the share of good events it promises, and for latency a bound."""

    model: str
    kind: str
    percent: float
    under_ms: float | None = None

    @property
    def name(self) -> str:
        """The ``slo`` label: "embed-availability"."""
        return f"{self.model}-{self.kind}"

    @property
    def ratio(self) -> float:
        """The objective as a share (0.999)."""
        return round(self.percent / 100, 12)

    @property
    def budget(self) -> float:
        """The error budget: the share of bad events allowed (0.001)."""
        return round(1 - self.ratio, 12)

    def events(self, window: str) -> str:
        """PromQL: events per second over ``window``."""
        model = f'model="{self.model}"'
        if self.kind == AVAILABILITY:
            # Every answer but a refusal (the module's docstring says why).
            answers = f'{ANSWERS}{{{model},outcome!="{access_log.REFUSED}"}}'
            return f"sum by (model) (rate({answers}[{window}]))"
        return f"sum by (model) (rate({access_log.DURATION_METRIC}_count{{{model}}}[{window}]))"

    def errors(self, window: str) -> str:
        """PromQL: the share of bad events over ``window`` (no result without events)."""
        model = f'model="{self.model}"'
        if self.kind == AVAILABILITY:
            # The exporter starts a label set's failed series at 0 with its first answer, so
            # that the ratio is 0 rather than absent, and a first failure is an increase.
            failed = f'{ANSWERS}{{{model},outcome="{access_log.FAILED}"}}'
            return f"sum by (model) (rate({failed}[{window}]))\n/\n{self.events(window)}"
        le = bucket_label(self.under_ms / 1000)
        bucket = f'{access_log.DURATION_METRIC}_bucket{{{model},le="{le}"}}'
        good = f"sum by (model) (rate({bucket}[{window}]))"
        return f"1 - (\n  {good}\n  /\n  {self.events(window)}\n)"


@dataclass(frozen=True)
class Slos:
    """The SLO file: service label, budget period, a page's traffic floor, runbooks, objectives."""

    service: str
    runbooks: str
    period: str
    min_requests: int
    objectives: tuple[Objective, ...]


def load(path: Path = SLOS) -> Slos:
    """Read and check an SLO file.

    Raises:
        ValueError: an unknown key or kind, a share outside (0, 100), or a latency bound that is
            not one of the gateway histogram's buckets (no ratio could be read at it).
    """
    raw = yaml.safe_load(path.read_text())
    unknown = set(raw) - {"service", "period", "min_requests", "runbooks", "objectives"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
    objectives = []
    for model, kinds in raw["objectives"].items():
        for kind, value in kinds.items():
            if kind == AVAILABILITY:
                objective = Objective(model, kind, float(value))
            elif kind == LATENCY:
                if set(value) != {"percent", "under_ms"}:
                    raise ValueError(f"{path}: {model} latency needs percent and under_ms")
                objective = Objective(model, kind, float(value["percent"]), value["under_ms"])
                if value["under_ms"] / 1000 not in access_log.DURATION_BUCKETS:
                    raise ValueError(
                        f"{path}: {model} latency bound {value['under_ms']} ms is not a bucket "
                        f"of {access_log.DURATION_METRIC}: {access_log.DURATION_BUCKETS} s"
                    )
            else:
                raise ValueError(f"{path}: {model}: unknown objective kind {kind!r}")
            if not 0 < objective.percent < 100:
                raise ValueError(f"{path}: {objective.name}: percent must be within (0, 100)")
            objectives.append(objective)
    seconds(raw["period"])  # checks it
    return Slos(
        raw["service"],
        raw["runbooks"],
        raw["period"],
        int(raw["min_requests"]),
        tuple(objectives),
    )


def windows(slos: Slos) -> list[str]:
    """Every window a rule or the dashboard reads, shortest first."""
    found = {w for b in BURN_RATES for w in (b.long, b.short)} | {slos.period}
    return sorted(found, key=seconds)


def render(slos: Slos, scale: float = 1) -> dict:
    """The rule file (as YAML data) for ``slos``; ``scale`` divides every window and ``for``."""

    def shorter(d: str) -> str:
        return duration(seconds(d) / scale)

    groups = []
    for objective in slos.objectives:
        labels = {"slo": objective.name, "slo_kind": objective.kind}
        rules: list[dict] = [
            {"record": "slo:objective:ratio", "expr": f"vector({objective.ratio})", "labels":
             {**labels, "model": objective.model}},
            {"record": "slo:error_budget:ratio", "expr": f"vector({objective.budget})", "labels":
             {**labels, "model": objective.model}},
        ]  # fmt: skip
        for window in windows(slos):
            w = shorter(window)
            rules.append(
                {"record": f"slo:sli_error:ratio_rate{window}", "expr": objective.errors(w),
                 "labels": labels}
            )  # fmt: skip
            rules.append(
                {"record": f"slo:sli_events:rate{window}", "expr": objective.events(w),
                 "labels": labels}
            )  # fmt: skip
        for severity in ("page", "ticket"):
            rules.append(alert(slos, objective, severity, shorter))
        groups.append({"name": f"slo-{objective.name}", "rules": rules})
    return {"groups": groups}


def scaled(rules: dict, scale: float) -> dict:
    """A rule file (as YAML data) with every ``for``, range and offset divided by ``scale``.

    For a hand-written file (``alerts.yml``) what ``render``'s ``scale`` is for the SLO rules:
    the same rules, fast enough for a test to watch them fire.
    """

    def shorter(d: str) -> str:
        return duration(seconds(d) / scale)

    def window(match: re.Match) -> str:
        step = match.group(2)
        if ":" not in match.group(0):
            return f"[{shorter(match.group(1))}]"
        return f"[{shorter(match.group(1))}:{shorter(step) if step else ''}]"

    groups = []
    for group in rules["groups"]:
        group_rules = []
        for rule in group["rules"]:
            expr = _RANGE.sub(window, rule["expr"])
            expr = _OFFSET.sub(lambda m: f"offset {shorter(m.group(1))}", expr)
            rule = {**rule, "expr": expr}
            if "for" in rule:
                rule["for"] = shorter(rule["for"])
            group_rules.append(rule)
        groups.append({**group, "rules": group_rules})
    return {**rules, "groups": groups}


def alert(slos: Slos, objective: Objective, severity: str, shorter) -> dict:
    """One objective's alert of one severity: any of its burn-rate conditions.

    ``shorter`` turns a duration of the rules into the one the scaled rules use.
    """
    selector = f'{{slo="{objective.name}"}}'
    conditions = []
    for b in (b for b in BURN_RATES if b.severity == severity):
        threshold = round(b.burn * objective.budget, 12)
        condition = [
            f"slo:sli_error:ratio_rate{b.long}{selector} > {threshold}",
            f"and slo:sli_error:ratio_rate{b.short}{selector} > {threshold}",
        ]
        if severity == "page":
            # Events in the long window (its rate times its length), as the rules see it.
            condition.append(
                f"and slo:sli_events:rate{b.long}{selector} * {seconds(shorter(b.long)):g}"
                f" >= {slos.min_requests}"
            )
        conditions.append("(\n  " + "\n  ".join(condition) + "\n)")
    name = ALERT_NAMES[objective.kind, severity]
    what = (
        "requests failed"
        if objective.kind == AVAILABILITY
        else (f"requests slower than {objective.under_ms:g} ms")
    )
    return {
        "alert": name,
        "expr": "\nor\n".join(conditions),
        "for": shorter(FOR[severity]),
        "labels": {"severity": severity, "service": slos.service, "slo": objective.name},
        "annotations": {
            "summary": (
                f"{objective.model}: {{{{ $value | humanizePercentage }}}} of {what} "
                f"(objective {objective.percent:g} %, budget {objective.budget * 100:g} %)"
            ),
            "runbook_url": f"{slos.runbooks}#{name.lower()}",
        },
    }


HEADER = """\
# Made by `python -m monitoring rules` from slos.yml: edit that file, then run it again
# (tests/unit/test_slo.py fails while this file differs from what it makes).
"""


def dump(rules: dict) -> str:
    """The rule file's text: the header, then YAML with multi-line expressions as blocks."""

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    Dumper.ignore_aliases = lambda self, data: True  # each rule whole, no &id001 anchors
    return HEADER + yaml.dump(rules, Dumper=Dumper, sort_keys=False, width=100)
