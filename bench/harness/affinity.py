"""Which cores every thread of a server may run on: pin them all, read it back, summarize it.

``taskset -c`` at start pins a process and what it starts, but a library may change its own
threads' affinity afterwards (onnxruntime pins its thread pool to cores by itself when it sizes
the pool on its own). So after a server is up, every thread of it and of its child processes is
pinned again with ``taskset -a -p`` and each thread's allowed cores are read back (psutil), for
the report.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable

import psutil

from processes.managed import children

log = logging.getLogger(__name__)


def split(
    server_cores: int | None = None, cores: list[int] | None = None
) -> tuple[list[int], list[int]]:
    """(server cores, load-generator cores) out of ``cores`` (default: those we may use).

    The load generator gets the first quarter, at least one core, and the server the rest; with
    ``server_cores`` the server gets that many of the last cores and the generator the others.
    Apart, so that what the generator spends never comes out of what the server is measured on.
    With one core both share it.
    """
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    if len(cores) < 2:
        return cores, cores
    server = server_cores or len(cores) - max(1, len(cores) // 4)
    return cores[-server:], cores[:-server]


def chosen(server: str | None, client: str | None) -> tuple[list[int], list[int]]:
    """Cores given as ``--server-cpus 1 --client-cpus 0`` (comma lists), else ``split()``."""
    server_cpus, client_cpus = split()
    as_list = lambda text: [int(c) for c in text.split(",")]  # noqa: E731
    return (as_list(server) if server else server_cpus, as_list(client) if client else client_cpus)


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process it started."""
    return [pid, *children(pid)]


def thread_affinities(pids: Iterable[int]) -> dict[int, frozenset[int]]:
    """{thread id: cores it may run on} of every thread of ``pids``; what exits is skipped."""
    found: dict[int, frozenset[int]] = {}
    for pid in pids:
        try:
            threads = psutil.Process(pid).threads()
        except psutil.Error:
            continue
        for thread in threads:
            try:  # a thread id is a process id to the kernel, and so to psutil
                found[thread.id] = frozenset(psutil.Process(thread.id).cpu_affinity())
            except psutil.Error:
                continue
    return found


def cpu_list(cores: Iterable[int]) -> str:
    """Cores as the kernel writes them (``0-2,5``)."""
    ranges: list[list[int]] = []
    for core in sorted(cores):
        if ranges and core == ranges[-1][1] + 1:
            ranges[-1][1] = core
        else:
            ranges.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def pinned(cpus: Iterable[int], command: list[str]) -> list[str]:
    """``command`` behind ``taskset -c <cores>``: it and what it starts run on ``cpus``."""
    if shutil.which("taskset") is None:
        raise FileNotFoundError("taskset (util-linux) is needed to pin a process to CPUs")
    return ["taskset", "-c", ",".join(map(str, sorted(cpus))), *command]


def pin_command(pid: int, cpus: Iterable[int]) -> list[str]:
    """``taskset -a -p -c <cores> <pid>``: every thread of one process."""
    return ["taskset", "-a", "-p", "-c", ",".join(map(str, sorted(cpus))), str(pid)]


def pin(pid: int, cpus: Iterable[int]) -> list[int]:
    """Pin every thread of ``pid`` and of its descendants to ``cpus``; the processes pinned."""
    cpus = list(cpus)
    pids = process_tree(pid)
    for p in pids:
        done = subprocess.run(pin_command(p, cpus), capture_output=True, text=True)
        if done.returncode != 0:  # a process that exited in between: nothing left to pin
            log.info("taskset on %d: %s", p, done.stderr.strip())
    return pids


def summarize(affinities: dict[int, frozenset[int]], cpus: Iterable[int]) -> str:
    """``15 threads: all on cores 1`` or ``15 threads: 14 on 1, 1 on 0-1 (NOT all on 1)``."""
    wanted = frozenset(cpus)
    label = ",".join(map(str, sorted(wanted)))
    counts = Counter(affinities.values())
    if not counts:
        return "no threads found"
    if all(cores <= wanted for cores in counts):
        return f"{len(affinities)} threads: all on cores {label}"
    spread = ", ".join(f"{n} on {cpu_list(cores)}" for cores, n in counts.most_common())
    return f"{len(affinities)} threads: {spread} (NOT all on cores {label})"


def pin_and_report(name: str, pid: int, cpus: Iterable[int]) -> str:
    """Pin a server's threads, and say what they were allowed before and after, in one line."""
    cpus = list(cpus)
    before = thread_affinities(process_tree(pid))
    pids = pin(pid, cpus)
    after = thread_affinities(process_tree(pid))
    return (
        f"{name} (pid {pid}, {len(pids)} process(es)): before `taskset -a -p`: "
        f"{summarize(before, cpus)}; after: {summarize(after, cpus)}"
    )
