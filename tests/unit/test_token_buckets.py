"""nginx's token buckets: the limits file (gateway/shaping.py), its nginx config, the exporter."""

from __future__ import annotations

import json
import os
import re

import pytest
import tomllib
from prometheus_client import generate_latest

from gateway import access_log, shaping
from gateway.access_log import AccessLogExporter
from gateway.nginx.config import Gateway, Listen, Shaping, Upstreams, check_config, render
from gateway.shaping import LIMITS
from tests.helpers import limits_with_secret_keys

SECTIONS = {
    "anonymous": {"rate": 1, "capacity": 2},
    "tenants": {
        "a": {"keys": ["key-of-a-1", "key-of-a-2"], "rate": 2, "capacity": 10},
        "b": {"keys": ["key-of-b-1"], "rate": 0.5, "capacity": 1},
    },
    "models": {"embed": {"rate": 4, "capacity": 3}},
}


def test_the_repository_limits_file_loads_and_names_every_tenant():
    limits = shaping.load_limits(LIMITS, placeholders=True)
    assert shaping.ANONYMOUS in limits.tenants and len(limits.tenants) >= 2
    assert set(limits.keys.values()) <= set(limits.tenants)


def test_a_gateway_refuses_the_committed_placeholder_keys(tmp_path):
    with pytest.raises(ValueError, match="team-a-change-me' is the committed placeholder"):
        shaping.load_limits(LIMITS)
    secret = shaping.load_limits(limits_with_secret_keys(tmp_path / "limits.toml"))
    assert set(secret.keys.values()) == {"team-a", "team-b"}
    assert not any(shaping.PLACEHOLDER in key for key in secret.keys)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"anonymous": None}, "[anonymous] is required"),
        ({"tenants": {"a": {"keys": ["key-of-a-1"], "rate": 0, "capacity": 1}}}, "rate must"),
        ({"tenants": {"a": {"keys": ["key-of-a-1"], "rate": 1, "capacity": 0}}}, "capacity"),
        ({"tenants": {"a": {"keys": ["key-of-a-1"], "rate": 1, "capacity": 1.5}}}, "whole"),
        ({"tenants": {"a": {"rate": 1, "capacity": 1}}}, "needs keys"),
        ({"tenants": {"a": {"keys": ['bad"key-123'], "rate": 1, "capacity": 1}}}, "quotes"),
        ({"tenants": {"a b": {"keys": ["key-of-a-1"], "rate": 1, "capacity": 1}}}, "name"),
        ({"tenants": {"anonymous": {"keys": ["key-of-a-1"], "rate": 1, "capacity": 1}}}, "twice"),
        ({"models": {"embed": {"rate": 1}}}, "both rate and capacity"),
        ({"models": {"embed": {"rate": 1, "capacity": 1, "burst": 3}}}, "unknown"),
        ({"limits": {}}, "unknown top-level"),
    ],
)
def test_bad_limits_are_refused_with_a_message_naming_the_setting(change, message):
    data = {**SECTIONS, **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        shaping.parse_limits(data)


def test_a_key_given_to_two_tenants_is_refused():
    data = json.loads(json.dumps(SECTIONS))
    data["tenants"]["b"]["keys"] = ["key-of-a-1"]
    with pytest.raises(ValueError, match="also a key of tenant 'a'"):
        shaping.parse_limits(data)


# nginx's config -------------------------------------------------------------------------------
def config(limits: shaping.Limits | None) -> Gateway:
    """One server behind the gateway, shaped by ``limits`` (None: not shaped)."""
    return Gateway(
        Upstreams(("127.0.0.1:9",), ("127.0.0.1:10",)),
        Listen(18000, 18001),
        shaping=None if limits is None else Shaping(limits),
    )


def test_rendered_limits_are_nginx_buckets_with_capacity_minus_one_burst():
    text = render(config(shaping.parse_limits(SECTIONS)))
    assert "limit_req_zone $shaping_tenant_1 zone=tenant_a:1m rate=2r/s;" in text
    assert "zone=tenant_b:1m rate=30r/m;" in text  # 0.5/s
    assert "limit_req zone=tenant_b nodelay;" in text  # capacity 1: no burst
    assert "limit_req zone=tenant_a burst=9 nodelay;" in text
    assert "limit_req zone=model_embed burst=2 nodelay;" in text
    assert r'"~^key\\x2dof\\x2da\\x2d2$" a;' in text  # exactly, not ignoring case
    assert '"b embed" 2;' in text  # Retry-After: the slower of the two buckets
    assert render(config(None)).count("limit_req") == 0


def test_the_rendered_shaping_config_passes_nginx_t(nginx_binary):
    limits = shaping.load_limits(LIMITS, placeholders=True)
    check_config(render(config(limits)), nginx_binary)
    # And nginx -t is a check that fails: a zone used twice with different rates.
    broken = render(config(limits))
    broken = broken.replace(
        "limit_req_status 429;", "limit_req_zone $tenant zone=tenant_team-a:1m rate=1r/s;"
    )
    with pytest.raises(ValueError, match="nginx -t refused"):
        check_config(broken, nginx_binary)


# The exporter ---------------------------------------------------------------------------------
def line(tenant: str, limit: str, model: str = "embed", protocol: str = "http") -> str:
    entry = {"tenant": tenant, "model": model, "protocol": protocol, "limit": limit}
    return json.dumps({"msec": "1.0", **entry, "status": "200"}) + "\n"


def count(exporter: AccessLogExporter, tenant: str, outcome: str) -> float:
    value = exporter.registry.get_sample_value(
        f"{access_log.METRIC}_total",
        {"gateway": "nginx", "tenant": tenant, "model": "embed", "protocol": "http",
         "outcome": outcome, "version": ""},
    )  # fmt: skip
    return value or 0.0


def test_the_exporter_counts_each_line_once_across_partial_writes(tmp_path):
    log = tmp_path / "shaping.log"
    exporter = AccessLogExporter(log)
    assert exporter.poll() == 0  # no file yet
    log.write_text(line("a", "PASSED") + line("a", "REJECTED") + line("a", "PASSED")[:20])
    assert exporter.poll() == 2
    with log.open("a") as f:
        f.write(line("a", "PASSED")[20:] + "not json\n")
    assert exporter.poll() == 1
    assert exporter.poll() == 0
    assert (count(exporter, "a", "admitted"), count(exporter, "a", "refused")) == (2, 1)
    assert exporter.skipped == 1
    assert b"gateway_requests_total" in generate_latest(exporter.registry)


def test_the_exporter_times_admitted_requests_by_tenant_and_model(tmp_path):
    log = tmp_path / "shaping.log"
    timed = [
        {"limit": "PASSED", "request_time": "0.030", "upstream_time": "0.020"},
        # nginx tried a second server: upstream is both tries together.
        {"limit": "PASSED", "request_time": "0.300", "upstream_time": "0.100, 0.200"},
        # Refused before any server: counted, never timed.
        {"limit": "REJECTED", "request_time": "0.000", "upstream_time": ""},
    ]
    log.write_text(
        "".join(
            json.dumps(
                {
                    "msec": "1.0",
                    "tenant": "a",
                    "model": "embed",
                    "protocol": "http",
                    "status": "200",
                    **t,
                }
            )
            + "\n"
            for t in timed
        )
        + line("a", "PASSED")  # a line from before the times were logged
    )
    exporter = AccessLogExporter(log)
    assert exporter.poll() == 4
    labels = {"gateway": "nginx", "tenant": "a", "model": "embed", "version": ""}

    def sample(name: str, suffix: str, **extra) -> float:
        return exporter.registry.get_sample_value(f"{name}{suffix}", {**labels, **extra})

    assert count(exporter, "a", "admitted") == 3 and count(exporter, "a", "refused") == 1
    assert sample(access_log.DURATION_METRIC, "_count") == 2
    assert sample(access_log.DURATION_METRIC, "_sum") == pytest.approx(0.33)
    assert sample(access_log.DURATION_METRIC, "_bucket", le="0.05") == 1
    assert sample(access_log.DURATION_METRIC, "_bucket", le="0.5") == 2
    assert sample(access_log.UPSTREAM_METRIC, "_sum") == pytest.approx(0.32)
    assert sample(access_log.UPSTREAM_METRIC, "_bucket", le="0.25") == 1


def test_the_exporter_follows_a_rotated_and_a_truncated_log(tmp_path):
    log = tmp_path / "shaping.log"
    log.write_text(line("a", "PASSED") * 3)
    exporter = AccessLogExporter(log)
    assert exporter.poll() == 3
    os.rename(log, tmp_path / "shaping.log.1")
    log.write_text(line("a", "REJECTED"))
    assert exporter.poll() == 1
    log.write_text("")
    assert exporter.poll() == 0
    log.write_text(line("b", "PASSED"))
    assert exporter.poll() == 1
    assert count(exporter, "a", "refused") == 1 and count(exporter, "b", "admitted") == 1


def test_the_exporter_gives_counted_lines_back_to_the_disk_and_loses_none(tmp_path):
    log = tmp_path / "shaping.log"
    one = line("a", "PASSED")
    exporter = AccessLogExporter(log, release_bytes=64 * 1024)
    with log.open("ab") as writer:  # nginx's file: opened once, appended to
        for _ in range(8):
            writer.write((one * 2000).encode())
            writer.flush()
            exporter.poll()
    size, on_disk = log.stat().st_size, log.stat().st_blocks * 512
    assert size == 8 * 2000 * len(one)
    assert on_disk < 2 * exporter.release_bytes + 2000 * len(one)
    assert count(exporter, "a", "admitted") == 8 * 2000
    # Lines it has not counted yet are kept: a restarted exporter starts where the data does
    # and counts each of them once.
    with log.open("ab") as writer:
        writer.write((one * 300).encode())
    again = AccessLogExporter(log, release_bytes=0)
    assert again.poll() == 300 and again.skipped == 0


def test_the_exporter_counts_a_rollout_s_versions_and_server_errors_apart(tmp_path):
    log = tmp_path / "shaping.log"
    entries = [
        {"version": "stable", "status": "200"},
        {"version": "canary", "status": "200"},
        {"version": "canary", "status": "503"},
        {"version": "beta", "status": "200"},  # not a version a gateway writes: "other"
    ]
    common = {"tenant": "a", "model": "embed", "protocol": "grpc", "limit": ""}
    times = {"request_time": "0.010", "upstream_time": "0.009"}
    log.write_text("".join(json.dumps({**common, **e, **times}) + "\n" for e in entries))
    exporter = AccessLogExporter(log)
    assert exporter.poll() == 4
    base = {"gateway": "nginx", "tenant": "a", "model": "embed"}

    def requests(version: str, outcome: str) -> float:
        labels = {**base, "protocol": "grpc", "outcome": outcome, "version": version}
        return exporter.registry.get_sample_value(f"{access_log.METRIC}_total", labels) or 0.0

    assert requests("stable", "admitted") == 1 and requests("canary", "admitted") == 1
    assert requests("canary", "failed") == 1 and requests("other", "admitted") == 1
    # A failed request took time too: both versions' latencies, side by side.
    timed = {**base, "version": "canary"}
    assert exporter.registry.get_sample_value(f"{access_log.DURATION_METRIC}_count", timed) == 2


def test_the_exporter_fails_grpc_server_errors_and_starts_every_outcome_at_0(tmp_path):
    log = tmp_path / "shaping.log"
    # gRPC answers are 200 (204: the gateway's own): their grpc-status says how they ended.
    entries = [
        ("PASSED", "200", "0", "admitted"),  # OK (Triton's trailer)
        ("PASSED", "200", "3", "admitted"),  # INVALID_ARGUMENT: the caller's
        ("PASSED", "200", "14", "failed"),  # UNAVAILABLE: Triton shed it
        ("PASSED", "200", "13", "failed"),  # INTERNAL
        ("", "204", "8", "failed"),  # RESOURCE_EXHAUSTED, no bucket: the connection limit
        ("REJECTED", "204", "8", "refused"),  # RESOURCE_EXHAUSTED from a bucket
        ("PASSED", "502", "", "failed"),  # no server answered the gateway
    ]
    common = {"tenant": "a", "model": "embed", "protocol": "grpc"}
    lines = [
        json.dumps({**common, "limit": limit, "status": status, "grpc_status": grpc_status})
        for limit, status, grpc_status, _ in entries
    ]
    log.write_text("\n".join(lines) + "\n" + line("b", "PASSED"))
    exporter = AccessLogExporter(log)
    assert exporter.poll() == len(entries) + 1

    def requests(tenant: str, protocol: str, outcome: str) -> float | None:
        labels = {"gateway": "nginx", "tenant": tenant, "model": "embed", "protocol": protocol,
                  "outcome": outcome, "version": ""}  # fmt: skip
        return exporter.registry.get_sample_value(f"{access_log.METRIC}_total", labels)

    for outcome in ("admitted", "failed", "refused"):
        expected = sum(e[3] == outcome for e in entries)
        assert requests("a", "grpc", outcome) == expected, outcome
    # One admitted answer, and its failed and refused series are there at 0 already.
    assert [requests("b", "http", o) for o in ("admitted", "failed", "refused")] == [1, 0, 0]


def test_the_exporter_keeps_unknown_models_out_of_its_labels(tmp_path):
    log = tmp_path / "shaping.log"
    log.write_text(line("a", "PASSED", model="tokenize") + line("a", "PASSED", model="x" * 99))
    exporter = AccessLogExporter(log)
    assert exporter.poll() == 2
    other = {"gateway": "nginx", "tenant": "a", "model": "other", "protocol": "http", "version": ""}
    assert (
        exporter.registry.get_sample_value(
            f"{access_log.METRIC}_total", {**other, "outcome": "admitted"}
        )
        == 2
    )


def test_the_exporter_can_skip_what_the_log_already_holds(tmp_path):
    log = tmp_path / "shaping.log"
    log.write_text(line("a", "PASSED") * 3)
    exporter = AccessLogExporter(log, from_start=False)
    assert exporter.poll() == 0
    with log.open("a") as f:
        f.write(line("a", "PASSED"))
    assert exporter.poll() == 1


def comment_block_above(lines: list[str], index: int) -> list[str]:
    """The comment lines directly above ``lines[index]`` (none if a blank line comes first)."""
    block = []
    for above in reversed(lines[:index]):
        if not above.startswith("#"):
            break
        block.append(above)
    return block


def test_the_limits_file_is_toml_with_comments_for_each_setting():
    text = LIMITS.read_text()
    data = tomllib.loads(text)
    lines = text.splitlines()
    comments = " ".join(line.lstrip("# ") for line in lines if line.startswith("#"))
    # Every top-level setting and the first table of each kind have a comment of their own
    # right above them (later tables of the same kind share it).
    uncommented, kinds_seen = [], set()
    for index, line in enumerate(lines):
        table = re.fullmatch(r"\[([\w-]+)(?:\.[\w-]+)?\]", line)
        if table:
            kind = table.group(1)
            if kind in kinds_seen:
                continue
            kinds_seen.add(kind)
        elif not (kinds_seen == set() and re.match(r"[\w-]+ *=", line)):
            continue  # a setting inside a table: its name is explained below
        if not comment_block_above(lines, index):
            uncommented.append(line)
    assert kinds_seen == {"anonymous", "tenants", "models"}, kinds_seen
    assert not uncommented, f"no comment right above: {uncommented}"
    # And the settings of a table are explained in a comment by name.
    in_tables = {key for kind in ("anonymous",) for key in data[kind]}
    in_tables |= {key for kind in ("tenants", "models") for t in data[kind].values() for key in t}
    assert in_tables == {"rate", "capacity", "keys"}, in_tables
    unexplained = [key for key in in_tables if not re.search(rf"\b{key}\b", comments)]
    assert not unexplained, f"named in no comment: {unexplained}"
