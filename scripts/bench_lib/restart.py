"""The restart figure (issue 33, doc/SEMANTICS.md "Restarts and upgrades"): how long a supervised
mount keeps its clients waiting when its worker is killed.

Each kill: SIGKILL of the worker (the supervisor's one child) of a fresh mount of the bench's
``big`` dataset, then at once (as soon as the worker is dead) a ``stat`` of a name never looked
up before, a LOOKUP only a worker can answer: the time from the SIGKILL to that answer is the
time to the first request served by the new worker; the time to the new worker's process
existing is the supervisor's part. ``KILLS`` kills, ``PER_MOUNT`` on each mount (the
supervisor ends a mount whose worker dies 5 times within 60 s: ``CRASH_LOOP``), p50 and p99.

The cost of supervision on the read path is the peers figure run with ``--baseline`` on a copy
of this checkout whose ``shardfs.app.run.supervised`` answers False (doc/BENCHMARKING.md).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from typing import Any

import numpy as np

from bench_lib.harness import Row

KILLS = 20
PER_MOUNT = 4  # < shardfs.app.supervisor.CRASH_LOOP
LABELS = ["restart: SIGKILL of the worker to its successor started, p50", "  same, p99",
          "restart: SIGKILL of the worker to the first request served, p50", "  same, p99"]


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] in "ZX"
    except OSError:
        return True


def kill_once(supervisor: int, mnt: Any) -> tuple[float, float]:
    """SIGKILL the worker of ``supervisor``; (seconds until another worker process exists,
    seconds until a LOOKUP sent once the worker is dead is answered)."""
    (old,) = children(supervisor)
    probe = mnt / f".restart-probe-{uuid.uuid4().hex}"
    done: list[float] = []

    def lookup() -> None:
        try:
            os.stat(probe)
        except FileNotFoundError:
            pass
        done.append(time.perf_counter())

    t0 = time.perf_counter()
    os.kill(old, signal.SIGKILL)
    while not dead(old):  # no request of the probe may reach the old worker
        pass
    client = threading.Thread(target=lookup, daemon=True)
    client.start()
    started = None
    deadline = time.monotonic() + 60
    while started is None and time.monotonic() < deadline:
        if any(c != old for c in children(supervisor)):
            started = time.perf_counter() - t0
        else:
            time.sleep(0.0005)
    client.join(60)
    if not done or started is None:
        raise RuntimeError("no new worker served the mount within 60 s of a SIGKILL of its worker")
    return started, done[0] - t0


def figure(b: Any) -> list[Row]:
    kills = 4 if b.smoke else KILLS
    started: list[float] = []
    served: list[float] = []
    n = 0
    while len(served) < kills:
        with b.mounted(b.big, f"restart-{n}") as m:
            os.listdir(m.mnt / "vol")  # the mount at work: the ledger holds what the kernel was given
            for _ in range(min(PER_MOUNT, kills - len(served))):
                s, v = kill_once(m.pid, m.mnt)
                started.append(s)
                served.append(v)
                b.log(f"restart: worker killed, successor started {s * 1e3:.0f} ms, "
                      f"first request served {v * 1e3:.0f} ms")
                time.sleep(0.5)
        n += 1
    b.raw["restart"] = {"started": started, "served": served}

    def row(label: str, values: list[float], q: float, target: float | None) -> Row:
        v = float(np.percentile(values, q))
        r = Row(label, "s", v, note=f"{len(values)} kills, {PER_MOUNT} per mount; max {max(values):.3f} s")
        return b.abs_check(r, target, "<", f"< {target:g} s") if target is not None else r

    return [row(LABELS[0], started, 50, 1.0), row(LABELS[1], started, 99, 1.0),
            row(LABELS[2], served, 50, None), row(LABELS[3], served, 99, None)]
