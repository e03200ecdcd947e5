"""The restart figure (issue 33, doc/SEMANTICS.md "Restarts and upgrades"): how long a supervised
mount keeps its clients waiting when its worker is killed.

Each kill: ``PENDING`` chunk files written again (journalled, pending: the dead worker's journal),
then SIGKILL of the worker of a fresh mount of the bench's ``big`` dataset, then at once (as
soon as the worker is dead) a ``stat`` of a name never looked up before, a LOOKUP only a
worker can answer: the time from the SIGKILL to that answer is the time to the first request
served by the new worker; the time to the new worker's process existing is the supervisor's
part. ``KILLS`` kills, ``PER_MOUNT`` on each mount (the
supervisor ends a mount whose worker dies 5 times within 60 s: ``CRASH_LOOP``), p50 and p99.

With ``--baseline DIR`` the same kills on mounts running the package in DIR, alternated with
this one's, side by side (before/after a change); and ``shardfs mount`` to live on each side.
The cost of supervision on the read path is the peers figure run with ``--baseline`` on a copy
of this checkout whose ``shardfs.app.run.supervised`` answers False (doc/BENCHMARKING.md).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from dataclasses import replace
from typing import Any

import numpy as np

from bench_lib.harness import Row

KILLS = 20
PER_MOUNT = 4  # < shardfs.app.supervisor.CRASH_LOOP
PENDING = 8  # chunks written again just before each kill: the dead worker's journal
LABELS = ["restart: SIGKILL of the worker to its successor started, p50", "  same, p99",
          "restart: SIGKILL of the worker to the first request served, p50", "  same, p99",
          "restart: shardfs mount to live, p50"]


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


def worker(supervisor: int) -> int:
    """The supervisor's worker (named ``shardfs-worker``; a zygote, if any, is another child;
    a ``--baseline`` package without one names no process: its only child)."""
    kids = [pid for pid in children(supervisor) if not dead(pid)]
    for pid in kids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "shardfs-worker":
                    return pid
        except OSError:
            pass
    if len(kids) == 1:
        return kids[0]
    raise RuntimeError(f"no worker of supervisor {supervisor}: {kids}")


def rewrite(mnt: Any, names: list[str]) -> None:
    """Write each chunk file of ``names`` again with its own bytes: journalled, pending (not
    folded yet: the kill comes at once), the data unchanged."""
    for name in names:
        path = mnt / "vol" / name
        data = path.read_bytes()
        with open(path, "r+b") as f:
            f.write(data)


def kill_once(supervisor: int, mnt: Any) -> tuple[float, float]:
    """SIGKILL the worker of ``supervisor``; (seconds until another worker process exists,
    seconds until a LOOKUP sent once the worker is dead is answered)."""
    old = worker(supervisor)
    before = set(children(supervisor))
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
        if set(children(supervisor)) - before:
            started = time.perf_counter() - t0
        else:
            time.sleep(0.0005)
    client.join(60)
    if not done or started is None:
        raise RuntimeError("no new worker served the mount within 60 s of a SIGKILL of its worker")
    return started, done[0] - t0


def figure(b: Any) -> list[Row]:
    kills = 4 if b.smoke else KILLS
    sides = ["shardfs", *["shardfs-base"] * bool(b.args.baseline)]  # alternated: the same load on both
    started: dict[str, list[float]] = {side: [] for side in sides}
    served: dict[str, list[float]] = {side: [] for side in sides}
    mounting: dict[str, list[float]] = {side: [] for side in sides}
    n = 0
    while min(len(v) for v in served.values()) < kills:
        for side in sides:
            with b.mounted(b.big, f"restart-{side}-{n}",
                           package=b.args.baseline if side == "shardfs-base" else None) as m:
                mounting[side].append(m.seconds)
                names = sorted(os.listdir(m.mnt / "vol"))  # the ledger holds what the kernel was given
                chunks = [c for c in names if not c.startswith(".")]
                pending = chunks[:: max(1, len(chunks) // PENDING)][:PENDING]
                for _ in range(min(PER_MOUNT, kills - len(served[side]))):
                    rewrite(m.mnt, pending)
                    s, v = kill_once(m.pid, m.mnt)
                    started[side].append(s)
                    served[side].append(v)
                    b.log(f"restart ({side}): worker killed with {len(pending)} chunks pending, successor started "
                          f"{s * 1e3:.0f} ms, first request served {v * 1e3:.0f} ms")
                    time.sleep(0.5)
        n += 1
    b.raw["restart"] = {"started": started, "served": served, "mount": mounting}

    def row(label: str, values: list[float], q: float, target: float | None, base: list[float] | None = None) -> Row:
        v = float(np.percentile(values, q))
        what = "mounts" if values is mounting["shardfs"] else f"kills, {PER_MOUNT} per mount, {PENDING} chunks pending"
        note = f"{len(values)} {what}; max {max(values):.3f} s"
        r = Row(label, "s", v, note=note)
        if base:
            r = replace(b.ratio_row(label, "s", v, float(np.percentile(base, q)), None), note=note + " (vs --baseline)")
        return b.abs_check(r, target, "<", f"< {target:g} s") if target is not None else r

    base = served.get("shardfs-base")
    rows = [row(LABELS[0], started["shardfs"], 50, 1.0), row(LABELS[1], started["shardfs"], 99, 1.0),
            row(LABELS[2], served["shardfs"], 50, None, base), row(LABELS[3], served["shardfs"], 99, None, base),
            row(LABELS[4], mounting["shardfs"], 50, None, mounting.get("shardfs-base"))]
    return rows
