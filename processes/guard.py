"""A guard process per server: nothing a server started outlives it or the program that owns it.

tritonserver runs in a process group of its own, with its Python-backend stubs. Two ways that
group can be left behind, both seen with 2.51:

* **the owner dies** (an exception that skips ``stop()``, a SIGKILL, a crashed benchmark):
  tritonserver keeps serving with nobody to stop it;
* **tritonserver dies** (it aborts, or is killed): its stubs stay alive. A stub checks its parent
  with ``kill(ppid, 0)``, which succeeds on a zombie, so it lives as long as nobody reaps the
  server; and every stub holds the server's sockets (inherited from the fork), so clients of the
  dead server wait for their timeout instead of seeing the connection close.

The guard is a small process in a session of its own (a Ctrl-C aimed at the owner does not reach
it), started beside the server. It reads a pipe from the owner and watches the group's leader:

* the owner writes to the pipe when it has stopped the server itself: the guard exits;
* the pipe closes without a word (the owner died): the guard sends SIGTERM to the server, waits
  ``grace`` seconds, then SIGKILLs what is left of the group and removes its shared memory;
* the leader exits (a zombie or gone): the guard SIGKILLs what is left of the group at once.

Run by path with the standard library only (``python -I -S guard.py PGID GRACE``), so it starts
in tens of milliseconds and depends on no installed package: it is the one process that must
work while the environment it watches is broken. With ``-S`` there are no site-packages, so it
reads /proc itself where ``processes.managed`` uses psutil; ``processes.managed`` imports the group
and shared-memory helpers from here.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from pathlib import Path

SHM_PREFIX = "/dev/shm/triton_python_backend_shm_region"
POLL_S = 0.1


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (None if the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields follow the last ")".
    return text.rsplit(")", 1)[1].split()


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (tells a process from a later one with its pid)."""
    fields = _stat(pid)
    return fields[19] if fields else None


def running(pid: int, started: str | None = None) -> bool:
    """True while ``pid`` runs (not a zombie), and is the process that started at ``started``."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return started is None or fields[19] == started


def group_members(pgid: int) -> list[int]:
    """Processes of the group ``pgid`` that still run (zombies are done: nothing to stop)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        # fields[2] is the process group; zombies hold nothing but their pid.
        if fields and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def shm_regions(pids: list[int]) -> set[Path]:
    """Python-backend shared-memory files mapped by these processes."""
    found: set[Path] = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            path = line.split()[-1]
            if path.startswith(SHM_PREFIX):
                found.add(Path(path))
    return found


def orphan_regions(candidates: set[Path]) -> set[Path]:
    """Those of ``candidates`` that still exist and that no running process maps.

    tritonserver maps each stub's region from the moment it creates it, so an unmapped one is
    left over from a server that is gone.
    """
    existing = {region for region in candidates if region.exists()}
    if not existing:
        return set()
    mapped: set[Path] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and running(int(entry.name)):
            mapped |= shm_regions([int(entry.name)])
    return existing - mapped


def all_regions() -> set[Path]:
    """Every Python-backend shared-memory file on this machine."""
    shm = Path(SHM_PREFIX).parent
    return set(shm.glob(Path(SHM_PREFIX).name + "*"))


def sweep(pgid: int, regions: set[Path] = frozenset()) -> list[int]:
    """SIGKILL what still runs in group ``pgid``; remove its shared memory and ``regions``.

    A killed stub cannot unlink its region, and no other server maps it: removing it is safe.

    Returns:
        The pids that were killed.
    """
    members = group_members(pgid)
    regions = set(regions) | shm_regions(members)
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(running(pid) for pid in members) and time.monotonic() < deadline:
        time.sleep(0.01)
    for region in regions:
        with contextlib.suppress(FileNotFoundError):
            region.unlink()
    return members


def stop_group(pgid: int, started: str | None, grace_s: float) -> None:
    """SIGTERM the leader, give it ``grace_s`` to stop its stubs, then sweep the group."""
    regions = shm_regions(group_members(pgid))
    if running(pgid, started):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while running(pgid, started) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    sweep(pgid, regions)


def watch(pgid: int, grace_s: float, pipe: int = 0) -> str:
    """Guard group ``pgid`` until the owner releases it; returns what ended the watch."""
    started = start_time(pgid)
    while True:
        readable, _, _ = select.select([pipe], [], [], POLL_S)
        if readable:
            if os.read(pipe, 64):
                return "released"
            stop_group(pgid, started, grace_s)
            return "owner gone"
        if not running(pgid, started):
            sweep(pgid)
            return "leader exited"


def main(argv: list[str]) -> int:
    """``guard.py PGID GRACE_S``: guard the group until released on stdin."""
    # Its own session already keeps terminal signals away; a hang-up must not end it either.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    watch(int(argv[1]), float(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
