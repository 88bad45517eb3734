"""The rows of a run: points.csv and raw.csv read back, and picked out by their fields."""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

TEXT_FIELDS = {
    "system",
    "variant",
    "model",
    "protocol",
    "payload",
    "mode",
    "dataset",
    "calls",
    "error",
    "classifier_batch_histogram",
    "cpu_ms_per_item",
    "raw_stage_ms",
    "raw_reference",
}


CASE_FIELDS = (
    "system",
    "variant",
    "model",
    "dataset",
    "protocol",
    "payload",
    "calls",
    "mode",
    "level",
)


def load(points_csv: Path, raw_csv: Path) -> tuple[list[dict], dict[int, dict]]:
    """Rows of points.csv (numbers parsed) and raw curves per round."""
    rows = []
    with open(points_csv, newline="") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key not in TEXT_FIELDS and value != "":
                    row[key] = float(value)
            row["round"] = int(row["round"])
            row.setdefault("dataset", "samples")  # reports written before the field existed
            row.setdefault("calls", "sync")  # likewise
            rows.append(row)
    raw: dict[int, dict] = defaultdict(lambda: defaultdict(dict))
    with open(raw_csv, newline="") as f:
        for row in csv.DictReader(f):
            raw[int(row["round"])][row["kind"]][int(row["batch_size"])] = float(row["throughput"])
    return rows, {r: dict(curves) for r, curves in raw.items()}


def find(rows: Iterable[dict], **match) -> list[dict]:
    """Rows whose fields equal every given value and that measured something."""
    return [
        r
        for r in rows
        if r.get("throughput") not in ("", None) and all(r.get(k) == v for k, v in match.items())
    ]


def one(rows: Iterable[dict], **match) -> dict | None:
    """The single matching row (None if absent)."""
    found = find(rows, **match)
    return found[0] if found else None
