"""Revive Python-backend stubs that die while their model is loaded.

tritonserver 2.51 does not restart a dead stub (python_backend r24.10 has only a TODO there, and
main still had it in July 2026). The dead instance fails every request routed to it ("Stub
process '<instance>' is not healthy.") while the server and the model still report ready, so no
readiness probe notices. The dead stub stays a zombie child of tritonserver, which reaps its
stubs only when it unloads them. That is the signal used here: a stub process seen alive, then
a zombie in two polls in a row (an unload reaps at once, so one sighting could be an unload
in progress).

The cure is what an operator would do: reload the model through the model-control API with a
config that differs from the loaded one by a parameter the model ignores (an unchanged config is
a no-op in 2.51). Triton starts new instances and swaps them in. This needs explicit model
control (``--model-control-mode=explicit``) and, where the admin APIs are restricted, the key.

Run inside ``python -m server`` (``make serve``) and the container's entrypoint, or on its own:
``python -m server.supervisor --pid <tritonserver pid> --url 127.0.0.1:8001`` (gRPC), the key in
``$TRITON_ADMIN_KEY``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from processes.managed import children, state
from server.launcher import ADMIN_HEADER, ADMIN_KEY_ENV, GRPC_HEADER_PREFIX
from server.stubs import stub_model

log = logging.getLogger(__name__)

# The parameter changed on each revival; Python models read only the parameters they know.
REVIVAL_PARAMETER = "supervisor_revival"
ZOMBIE = psutil.STATUS_ZOMBIE


def explicit_control(args: Sequence[str]) -> list[str] | None:
    """The tritonserver ``args`` with what the supervisor needs: explicit model control.

    Returns ``args`` as they are if they choose explicit mode already, ``args`` with
    ``--model-control-mode=explicit --load-model=*`` (every model loaded at start, as without
    the flags) if they choose no mode, and None if they choose another mode (then a dead stub
    cannot be reloaded).
    """
    modes = []
    for i, arg in enumerate(args):
        if arg.startswith("--model-control-mode="):
            modes.append(arg.split("=", 1)[1])
        elif arg == "--model-control-mode" and i + 1 < len(args):
            modes.append(args[i + 1])
    if not modes:
        return ["--model-control-mode=explicit", "--load-model=*", *args]
    return list(args) if modes[-1] == "explicit" else None


@dataclass(frozen=True)
class Revival:
    """One dead stub and the reload that replaced it."""

    model: str
    version: str
    dead_pid: int
    noticed_at: float  # time.monotonic() when the death was confirmed
    reload_s: float  # how long the load_model call took
    error: str | None = None  # the reload's error, if it failed


class StubSupervisor:
    """Polls a tritonserver's stubs and reloads the model of any stub that died.

    Args:
        server_pid: the tritonserver process (its stubs are its children).
        grpc_url: host:port of its gRPC endpoint.
        headers: what opens the model-control API (``Server.admin_headers("grpc")``).
        interval_s: time between polls; a death is confirmed within two of them.
        reload: ``reload(model, dead_pid)`` brings a model back; default: through the server's
            model-control API (``reload_model``).
    """

    def __init__(
        self,
        server_pid: int,
        grpc_url: str,
        headers: dict[str, str] | None = None,
        interval_s: float = 0.5,
        reload: Callable[[str, int], None] | None = None,
    ):
        self.server_pid = server_pid
        self.grpc_url = grpc_url
        self.headers = headers or {}
        self.interval_s = interval_s
        self.reload = reload or self.reload_model
        self.revivals: list[Revival] = []
        self._alive: dict[int, tuple[str, str]] = {}  # stub pid -> (model, version)
        self._suspects: set[int] = set()  # seen alive, then a zombie once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def of(cls, server, interval_s: float = 0.5) -> StubSupervisor:
        """A supervisor for a started ``server.Server``."""
        return cls(server.process.pid, server.grpc_url, server.admin_headers("grpc"), interval_s)

    def poll(self) -> list[Revival]:
        """Look at the stubs once; reload the model of each stub confirmed dead."""
        dead: dict[str, tuple[str, int]] = {}  # model -> (version, pid): one reload per model
        pids = set(children(self.server_pid))
        for pid in pids:
            if state(pid) != ZOMBIE:
                served = stub_model(pid)
                if served is not None:
                    self._alive[pid] = served
            elif pid in self._suspects:
                self._suspects.discard(pid)
                model, version = self._alive.pop(pid)
                dead.setdefault(model, (version, pid))
            elif pid in self._alive:
                self._suspects.add(pid)
        # Reaped stubs (unloaded models) are forgotten; a zombie already revived stays out of
        # _alive, so it is handled once however long it lingers.
        for pid in set(self._alive) - pids:
            del self._alive[pid]
        self._suspects &= pids
        found = [self._revive(model, version, pid) for model, (version, pid) in dead.items()]
        self.revivals.extend(found)
        return found

    def reload_model(self, model: str, dead_pid: int) -> None:
        """Load ``model`` again with a config changed by one parameter (else 2.51 does nothing).

        Raises:
            InferenceServerException: the server refused or failed the reload.
        """
        # gRPC: the client the container has too (its tritonclient has no HTTP extras).
        import tritonclient.grpc as grpc

        with grpc.InferenceServerClient(self.grpc_url) as client:
            config = client.get_model_config(model, as_json=True, client_timeout=30)["config"]
            revision = {"string_value": str(dead_pid)}
            config.setdefault("parameters", {})[REVIVAL_PARAMETER] = revision
            client.load_model(
                model, config=json.dumps(config), headers=self.headers, client_timeout=300
            )

    def _revive(self, model: str, version: str, pid: int) -> Revival:
        noticed = time.monotonic()
        log.warning("stub of %s/%s (pid %d) died; reloading %s", model, version, pid, model)
        error = None
        try:
            self.reload(model, pid)
        except Exception as exc:  # noqa: BLE001 - a refusal or a lost connection: report, go on
            error = str(exc)
            log.error("reloading %s failed: %s", model, error)
        took = time.monotonic() - noticed
        if error is None:
            log.warning("%s reloaded in %.1f s", model, took)
        return Revival(model, version, pid, noticed, took, error)

    def start(self) -> StubSupervisor:
        """Poll every ``interval_s`` in a daemon thread until ``stop()``."""
        self.poll()  # know the live stubs before anything can die unseen
        self._thread = threading.Thread(target=self._run, name="stub-supervisor", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception:  # a supervisor that dies helps nobody: log it and go on
                log.exception("stub supervisor poll failed")

    def stop(self, timeout: float | None = None) -> None:
        """Stop polling; wait up to ``timeout`` (None: for ever) for a reload in progress.

        The thread is a daemon: one still reloading after ``timeout`` ends with the program.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> StubSupervisor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """Supervise the stubs of a tritonserver started elsewhere until it exits."""
    parser = argparse.ArgumentParser(prog="python -m server.supervisor", description=__doc__)
    parser.add_argument("--pid", type=int, required=True, help="the tritonserver process")
    parser.add_argument("--url", default="127.0.0.1:8001", help="its gRPC endpoint, host:port")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between polls")
    parser.add_argument(
        "--admin-key-env",
        default=ADMIN_KEY_ENV,
        help="environment variable holding the admin key (unset: no key sent)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="supervisor: %(message)s")
    key = os.environ.get(args.admin_key_env)
    headers = {GRPC_HEADER_PREFIX + ADMIN_HEADER: key} if key else {}
    with StubSupervisor(args.pid, args.url, headers, args.interval):
        while state(args.pid) not in (None, ZOMBIE):
            time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
