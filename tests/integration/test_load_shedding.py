"""Load shedding at 4x capacity: every request answered, the excess refused fast, goodput held.

Two servers of one ensemble, both pinned to one core with the open-loop sender on the other (as
``python -m bench.overload`` runs them): one with the ``local-shed`` configs, and a control with
the same configs less their queue policies, which admits everything. Capacity and the SLO are
measured as the benchmark measures them, before each round; both servers are then offered 4x
that rate in turn, so that whatever else the machine is doing weighs on both alike. Both
ensembles: ``classify`` sheds at its entrance (preprocess, 16 waiting), ``embed`` at its costly
step (the encoder, 64 waiting); every step with a policy also has a 1 s queue timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import multiprocessing
import os
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import scrape, stop_together

pytestmark = pytest.mark.integration


# The exported ONNX files each service serves.
MODELS = {"classify": "classifier_onnx", "embed": "encoder_onnx"}
FACTOR = 4.0
ROUNDS = 3
CAPACITY_SECONDS = 2.0  # the closed loop before each round
# Every text sent in a run is new (the serial), on either server and in every round: embed's
# response cache then answers none of them, and a hit is no work shed.
_SERIAL = itertools.count()


def new_texts(service):
    """``service`` whose requests never repeat a text in this process (images are unchanged:
    classify has no response cache)."""
    from client import embed
    from export import text_samples
    from pipelines import embedding

    if service.ensemble != embedding.ENSEMBLE:
        return service
    sentences = text_samples.SENTENCES

    def inputs(grpc):
        return lambda i: embed.build_inputs(
            grpc, [f"{sentences[i % len(sentences)]} (#{next(_SERIAL)})"]
        )

    return dataclasses.replace(service, inputs=inputs)


def control_configs(service) -> dict:
    """``local-shed`` of each of ``service``'s steps with its queue policy taken out."""
    import model_config
    from bench import overload
    from paths import MODEL_REPOSITORY

    configs = {}
    for model in service.steps:
        config = model_config.resolve(MODEL_REPOSITORY / model, overload.SHED_CONFIG)
        config.dynamic_batching.ClearField("default_queue_policy")
        configs[model] = config
    return configs


def idle(server, within_s: float = 60.0) -> None:
    """Return once no request waits in any of the server's queues.

    A control round leaves a backlog whose clients gave up (Triton then cancels the requests
    still queued): it must not take the core from the next round.
    """
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        pending = [
            v
            for (name, _), v in scrape(server).items()
            if name == "nv_inference_pending_request_count"
        ]
        if not any(pending):
            return
        time.sleep(0.2)
    raise AssertionError(f"requests still queued {within_s:.0f} s after the round")


def summary(outcomes, seconds: float, slo: float) -> dict:
    """One server's round, latencies in SLOs, goodput counted over the round's second half.

    Goodput: requests answered with a result within the SLO, per second, of those due in the
    second half (a round lasts two SLOs; "due", as a sender that fell behind on a busy core
    sends the late ones at once). By then a server that admits everything holds a queue of
    more than an SLO of work (at 4x it grows by 3 s of work a second), so what it still answers
    in time is what shedding is for; in the first half any server answers from a queue that
    was empty. ``completed``: the rate of results that came back during that half, late or
    not, the work the server finished in that window.
    """
    from bench import load

    start = outcomes[0].sent_at
    half = seconds / 2
    due_late = outcomes[len(outcomes) // 2 :]  # sent in order, at a fixed rate
    rejected: dict[str, list[float]] = {}
    for o in outcomes:
        if o.error is not None and o.latency_s is not None:
            rejected.setdefault(load.classify_error(o.error), []).append(o.latency_s / slo)
    finished = [o.sent_at - start + o.latency_s for o in outcomes if o.ok]
    return {
        "goodput": sum(o.ok and o.latency_s <= slo for o in due_late) / half,
        "completed": sum(half <= t <= seconds for t in finished) / half,
        "tally": dataclasses.asdict(load.tally(outcomes, seconds)),
        "rejected_slos": rejected,
        "ok_slos": [o.latency_s / slo for o in outcomes if o.ok],
    }


def compare(service_name: str, out: Path) -> None:
    """Measure both servers in alternating rounds and write every figure to ``out`` (JSON).

    Runs in a process of its own: it pins itself to the sender's core.
    """
    import tritonclient.grpc as grpc

    import model_config
    from bench import overload
    from bench.harness import affinity
    from server import Server

    server_cpus, load_cpus = affinity.split(server_cores=1)
    os.sched_setaffinity(0, load_cpus)
    service = new_texts(overload.SERVICES[service_name])
    shed_config = overload.server_config(service, server_cpus)
    # Nothing loaded at start: the steps are loaded once, with the control's configs.
    bare = dataclasses.replace(shed_config, extra_args=["--model-control-mode=explicit"])
    with contextlib.ExitStack() as stack:
        servers = {
            "shed": stack.enter_context(Server(shed_config)),
            "control": stack.enter_context(Server(bare)),
        }
        stack.callback(stop_together, *servers.values())
        control = servers["control"]
        with grpc.InferenceServerClient(control.grpc_url) as admin:
            headers = control.admin_headers("grpc")
            for model, config in control_configs(service).items():
                admin.load_model(model, config=model_config.to_json(config), headers=headers)
            admin.load_model(service.ensemble, headers=headers)
        # The control's first executions, which initialize lazily, are not part of a round.
        overload.measure_capacity(control.grpc_url, service, 4, 1.0)
        rounds = []
        for i in range(ROUNDS):
            # Capacity and the SLO as the benchmark measures them, on the shedding server,
            # right before the round: the rate and the bound follow what the machine can do.
            capacity = overload.measure_capacity(
                servers["shed"].grpc_url, service, 4, CAPACITY_SECONDS
            )
            slo = overload.slo_s(service, overload.SHED_CONFIG, capacity)
            round_ = {"capacity": capacity, "slo_s": slo}
            for arm in ("shed", "control") if i % 2 == 0 else ("control", "shed"):
                # The control's clients give up after two SLOs: later answers are no goodput.
                outcomes, offered = overload.overload(
                    servers[arm].grpc_url, service, FACTOR * capacity, 2 * slo,
                    client_timeout_s=(4 if arm == "shed" else 2) * slo,
                )  # fmt: skip
                idle(servers[arm])
                round_[arm] = {"offered": offered, **summary(outcomes, 2 * slo, slo)}
            rounds.append(round_)
    out.write_text(json.dumps(rounds))


def measured(service: str, out: Path) -> list[dict]:
    """``compare`` in a child process; its rounds."""
    process = multiprocessing.get_context("spawn").Process(target=compare, args=(service, out))
    process.start()
    process.join(timeout=270)
    if process.is_alive():
        process.terminate()  # its servers' guards stop them
        process.join(10)
        pytest.fail("the rounds did not finish in 270 s")
    assert process.exitcode == 0, f"the rounds failed (exit status {process.exitcode})"
    return json.loads(out.read_text())


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``; infinite over 0, and 0 where both are 0 (nothing done)."""
    return numerator / denominator if denominator else math.inf if numerator else 0.0


@pytest.mark.parametrize("service", sorted(MODELS))
def test_at_4x_capacity_every_request_is_answered_excess_refused_fast_goodput_held(
    tmp_path, request, service
):
    request.getfixturevalue(MODELS[service])
    rounds = measured(service, tmp_path / "rounds.json")
    for i, r in enumerate(rounds):
        print(
            f"round {i}: capacity {r['capacity']:.1f} req/s, SLO {r['slo_s']:.2f} s; "
            + "; ".join(
                f"{arm} offered {r[arm]['offered']:.0f}/s goodput {r[arm]['goodput']:.1f}/s "
                f"completed {r[arm]['completed']:.1f}/s errors {r[arm]['tally']['errors']}"
                for arm in ("shed", "control")
            )
        )
    # Every request the shedding server was sent is answered, with a result or a queue
    # rejection, none hung, and it was really overloaded.
    for r in rounds:
        t = r["shed"]["tally"]
        assert r["shed"]["offered"] >= 3.5 * r["capacity"], r["capacity"]
        assert t["sent"] == t["ok"] + sum(t["errors"].values()) and t["hung"] == 0, t
        assert set(t["errors"]) <= {"queue-full", "queue-timeout"}, t
    shed = [r["shed"] for r in rounds]
    # Latencies are in SLOs of their round. Admitted requests within the SLO the configs imply
    # (the queue timeouts on the path plus the executions, which grow on a slower machine).
    admitted_p99 = np.percentile([x for r in shed for x in r["ok_slos"]], 99)
    assert admitted_p99 <= 1, admitted_p99
    # The excess is refused at once, at the entrance, before the costly work is spent on it;
    # queue timeouts further on are a backstop. Without the queue-size limit every rejection is
    # a timeout after a second (0 % queue-full); the shares seen: docs/operations.md.
    errors = {
        kind: sum(r["tally"]["errors"].get(kind, 0) for r in shed)
        for kind in ("queue-full", "queue-timeout")
    }
    assert errors["queue-full"] >= 0.75 * sum(errors.values()) > 0, errors
    # Fast: a queue-full rejection is answered at the entrance, a timeout rejection takes at
    # least 1 s (0.4 of the SLO): the bound is half that, on the median. Refusals that come
    # late by design (behind a queue or a costly step) are late as a whole and move the
    # median; the sender's clock also counts its own core, the busy one in CI, whose stalls
    # hold up a burst of answers and decide the tail (the figures: docs/operations.md).
    full = [x for r in shed for x in r["rejected_slos"].get("queue-full", [])]
    print(f"queue-full: p50 {np.median(full):.4f} SLO, p99 {np.percentile(full, 99):.4f} SLO")
    assert np.median(full) <= 0.2, np.median(full)
    # Every rejection, backstop included, came back within the SLO plus 1 s.
    for r in rounds:
        bound = 1 + 1 / r["slo_s"]
        assert all(x <= bound for xs in r["shed"]["rejected_slos"].values() for x in xs)

    # Goodput, against the control in the same rounds: with no queue limit its queue only grows
    # and it answers (nearly) nothing in time, while the shedding server goes on answering what
    # it admits. The median over rounds: a round that a burst of other work on the machine
    # left short of an overload does not decide. Both bounds and what they guard against are
    # measured, busy machine included, in docs/operations.md#load-shedding.
    goodput = [(r["shed"]["goodput"], r["control"]["goodput"]) for r in rounds]
    assert statistics.median(ratio(*pair) for pair in goodput) >= 2, goodput
    # And near what the server can do meanwhile: at least half the rate at which the control,
    # working flat out in the same rounds, completes requests (late ones included).
    done = sum(r["control"]["completed"] for r in rounds)
    assert sum(shed_goodput for shed_goodput, _ in goodput) >= 0.5 * done, (goodput, done)
