"""docker/kubernetes/prometheus-rules.yaml: the compose Prometheus' rule files, as a ConfigMap.

``python -m monitoring rules`` writes it after slo-rules.yml (``--check`` fails while either is
stale). The files are those docker/prometheus/prometheus.yml loads (``rule_files``), byte for
byte, one key each. They are copied because kustomize reads no file outside docker/kubernetes/
(its load restrictor) and ``kubectl apply -k`` cannot lift that; tests/unit/test_kubernetes.py
fails while a copy differs from its source.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from paths import DOCKER

KUBERNETES = DOCKER / "kubernetes"
PROMETHEUS = KUBERNETES.parent / "prometheus" / "prometheus.yml"
OUTPUT = KUBERNETES / "prometheus-rules.yaml"
NAME = "triton-prometheus-rules"
NAMESPACE = "monitoring"

HEADER = f"""\
# Made by `python -m monitoring rules` from the rule files that
# docker/prometheus/prometheus.yml loads: edit those (or slos.yml), then run it again.
#
# The alerts and SLO rules of the compose stack, for the cluster's Prometheus. With the
# prometheus-community chart, helm/prometheus-values.yaml mounts this ConfigMap, loads every
# file of it and sends the alerts to alertmanager.yaml's Alertmanager. With the Prometheus
# Operator, put each file's groups in a PrometheusRule instead (not included: its CRD is not a
# core Kubernetes resource). It lives in Prometheus' namespace (`{NAMESPACE}` here: change it to
# yours) and has a name of its own, so applying it replaces no rules already there.
"""


def rule_files(prometheus: Path = PROMETHEUS) -> dict[str, str]:
    """{file name: text} of each rule file the Prometheus config loads, in its order."""
    config = yaml.safe_load(prometheus.read_text())
    return {name: (prometheus.parent / name).read_text() for name in config["rule_files"]}


def block(text: str) -> str:
    """A YAML literal block (the indicator line, then the text indented) that reads as ``text``."""
    chomping = "-" if not text.endswith("\n") else "+" if text.endswith("\n\n") else ""
    # Where the text starts indented, YAML cannot guess the block's indentation: say it.
    indentation = "2" if text.lstrip("\n").startswith(" ") else ""
    lines = "".join("\n" if line == "\n" else f"    {line}" for line in text.splitlines(True))
    return f"|{indentation}{chomping}\n{lines}" + ("" if text.endswith("\n") else "\n")


def render(files: dict[str, str]) -> str:
    """The ConfigMap manifest holding ``files``.

    Raises:
        ValueError: a file that the rendered YAML would not give back unchanged.
    """
    out = HEADER + (
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        f"  name: {NAME}\n"
        f"  namespace: {NAMESPACE}\n"
        "  labels:\n"
        "    app.kubernetes.io/name: triton-model-repository\n"
        "    app.kubernetes.io/component: prometheus-rules\n"
        "data:\n"
    )
    for name, text in files.items():
        out += f"  {name}: {block(text)}"
    data = yaml.safe_load(out)["data"]
    for name, text in files.items():
        if data.get(name) != text:
            raise ValueError(f"{name}: no YAML literal block gives its text back unchanged")
    return out
