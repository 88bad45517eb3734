"""Metric names out of PromQL, Grafana dashboards, Prometheus rules and a /metrics page.

The queries are parsed with ``promql-parser`` (a PromQL parser, the Rust one of GreptimeDB), not
matched with regular expressions: function names, aggregation keywords, label names, durations
and string values are never mistaken for metrics, and a query that Prometheus would reject fails
to parse here too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import promql_parser

# Grafana's built-in variables that stand where PromQL wants a duration or a number; each is
# replaced by a value of that kind before parsing. Dashboard variables such as $model are left
# as they are: inside a label matcher's string they are valid PromQL, anywhere else the parse
# fails, as it should.
GRAFANA_DURATIONS = ("__rate_interval", "__interval", "__range")
GRAFANA_NUMBERS = ("__interval_ms", "__range_ms", "__range_s")

# Series that Prometheus adds itself for every scrape target: they are not on any /metrics page.
# https://prometheus.io/docs/concepts/jobs_instances/#automatically-generated-labels-and-time-series
PROMETHEUS_SCRAPE_SERIES = frozenset(
    {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
        "scrape_series_added",
    }
)

_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<selector>.+?)\s*,\s*\w+\s*\)\s*$", re.S)
_SAMPLE_NAME = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)")


class QueryError(ValueError):
    """A query that does not parse, or whose metric names cannot be known statically."""


@dataclass(frozen=True)
class Query:
    """One PromQL expression and where it comes from (for failure messages)."""

    where: str
    expr: str


def expand_grafana_variables(expr: str) -> str:
    """Replace Grafana's built-in interval variables with a value PromQL accepts there."""
    for name in GRAFANA_NUMBERS:  # before the durations: __interval is a prefix of __interval_ms
        expr = re.sub(rf"\$\{{{name}\}}|\${name}\b", "300", expr)
    for name in GRAFANA_DURATIONS:
        expr = re.sub(rf"\$\{{{name}\}}|\${name}\b", "5m", expr)
    return expr


def metric_names(expr: str) -> set[str]:
    """Every metric name that a PromQL expression selects.

    Raises:
        QueryError: the expression does not parse, or selects metrics by a ``__name__`` pattern
            (a regex or a negative match), whose names cannot be checked.
    """
    try:
        tree = promql_parser.parse(expand_grafana_variables(expr))
    except ValueError as exc:
        raise QueryError(f"not valid PromQL ({exc}): {expr}") from None
    names: set[str] = set()
    problems: list[str] = []

    def visit(node) -> None:
        if not isinstance(node, promql_parser.VectorSelector):
            return
        if node.name:
            names.add(node.name)
        matcher_sets = [node.matchers.matchers, *node.matchers.or_matchers]
        for matchers in matcher_sets:
            for matcher in matchers:
                if matcher.name != "__name__":
                    continue
                if matcher.op == promql_parser.MatchOp.Equal:
                    names.add(matcher.value)
                else:
                    problems.append(f"__name__ {matcher.op} {matcher.value!r}")

    promql_parser.walk(tree, visit)
    if problems:
        raise QueryError(f"metric names chosen by pattern cannot be checked ({problems}): {expr}")
    if not names:
        raise QueryError(f"selects no metric: {expr}")
    return names


def variable_query_expr(query: str) -> str:
    """The PromQL part of a Grafana Prometheus variable query (``label_values(sel, label)``)."""
    match = _LABEL_VALUES.match(query)
    return match.group("selector") if match else query


def _panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        # A collapsed row keeps its panels inside itself.
        yield from _panels(panel.get("panels", []))


def dashboard_panels(dashboard: dict) -> list[dict]:
    """Every panel of a dashboard, rows and the panels of collapsed rows included."""
    return list(_panels(dashboard.get("panels", [])))


def dashboard_queries(dashboard: dict) -> list[Query]:
    """Every PromQL expression of a dashboard: panel targets and query variables."""
    queries = []
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", []):
            where = f"panel {panel.get('title')!r} target {target.get('refId')}"
            queries.append(Query(where, target.get("expr", "")))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else query or ""
        queries.append(Query(f"variable ${variable.get('name')}", variable_query_expr(text)))
    return queries


_CONSTANT = re.compile(r"^\s*vector\(\s*[-+0-9.eE]+\s*\)\s*$")


def rule_queries(rules: dict) -> list[Query]:
    """Every expression of a Prometheus rule file (alerting and recording rules).

    Recorded constants (``vector(0.999)``, an objective) select no metric and are left out.
    """
    queries = []
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            if _CONSTANT.match(rule["expr"]):
                continue
            name = rule.get("alert") or rule.get("record")
            queries.append(Query(f"rule {name!r} of group {group.get('name')!r}", rule["expr"]))
    return queries


def exported_metric_names(exposition: str) -> set[str]:
    """Metric names on a Prometheus text-format page: families (``# TYPE``) and sample names.

    Sample names matter for histograms and summaries, whose queries use ``_bucket``, ``_sum``
    and ``_count``.
    """
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            match = _SAMPLE_NAME.match(line)
            if match:
                names.add(match.group(1))
    return names


def unknown_metrics(queries: list[Query], known: set[str]) -> dict[str, set[str]]:
    """``{where: names}`` for every query that names a metric outside ``known``."""
    unknown = {}
    for query in queries:
        missing = metric_names(query.expr) - known
        if missing:
            unknown[query.where] = missing
    return unknown
