"""The faults of a soak: a schedule drawn from the seed, and the injector that applies it.

``schedule(rng, seconds, kinds, every)`` draws one event about every ``every`` seconds (uniformly
jittered), never in the first or last 10% of the run, each ``Fault(at, kind, seconds, target)``.
Kinds: ``kill`` (SIGKILL of daemon ``target``, the supervisor and its worker, lazy unmount,
remount: the journal's replay), ``worker-kill`` (SIGKILL of daemon ``target``'s worker alone:
its supervisor starts another on the same connection, and no client may notice: a window of
this kind excuses nothing, ``EXCUSING``),
``s3-restart`` (the S3 server stops, stays down ``seconds``, restarts: stopped by SIGTERM, as
SeaweedFS loses the last writes it acknowledged to a SIGKILL, which a real S3 never does), ``503`` / ``500`` /
``reset`` / ``stall`` (a burst of ``seconds`` from the ``FaultProxy``), ``journal-full`` (the tmpfs
holding daemon A's journal is filled to the last byte for ``seconds``, then freed).

``Injector.run(events, t0, stop)`` applies the events in order on its own thread (each at
``t0 + at``) and appends each one's ``Window(kind, target, start, end)`` (monotonic times,
``end`` once the system is back: a restarted daemon live again, the server answering) to
``windows``; an injector failure (a daemon that does not come back) is kept in ``errors``.
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soak_lib.daemons import Daemon, Wedged

LOCAL_KINDS = ("kill", "worker-kill", "journal-full")
S3_KINDS = ("kill", "worker-kill", "journal-full", "s3-restart", "503", "500", "reset", "stall")
WORKER_KILL = "worker-kill"  # a fault no client may notice: its window excuses no failure
SETTLE = 2.0  # seconds after a fault ends during which its effects still count as the fault's
# SeaweedFS answers 404 for objects whose volume has not reported to its master again for a few
# seconds after a restart (a real S3 never does): the mount then rightly says ENOENT.
SETTLE_AFTER = {"s3-restart": 10.0}


@dataclass
class Fault:
    at: float
    kind: str
    seconds: float
    target: int  # which daemon (kill)


@dataclass
class Window:
    kind: str
    target: int
    start: float
    end: float


def schedule(rng: random.Random, seconds: float, kinds: tuple[str, ...], every: float, daemons: int) -> list[Fault]:
    """The seeded fault schedule (module docstring)."""
    events, t = [], seconds * 0.1 + rng.uniform(0, every / 2)
    while t < seconds * 0.9:
        kind = rng.choice(kinds)
        length = {"kill": 0.0, WORKER_KILL: 0.0, "stall": rng.uniform(8, 15)}.get(kind, rng.uniform(3, 10))
        events.append(Fault(round(t, 1), kind, round(length, 1), rng.randrange(daemons)))
        t += rng.uniform(every * 0.5, every * 1.5)
    return events


class JournalDisk:
    """A small tmpfs for a journal (``-o journal_dir``), mounted and unmounted by the soak."""

    def __init__(self, path: Path, size: str = "16m"):
        self.path = Path(path)
        self.size = size
        self.filler = self.path.parent / f"{self.path.name}-filler"

    def mount(self) -> None:
        import subprocess

        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0700", "tmpfs", str(self.path)],
                       check=True, capture_output=True)

    def fill(self) -> int:
        """Fill the tmpfs to the last byte (a file beside the journal); the bytes written."""
        n = 0
        fd = os.open(self.path / ".soak-filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for size in (1 << 16, 4096, 512, 1):
                block = b"\0" * size
                try:
                    while True:
                        n += os.write(fd, block)
                except OSError:  # ENOSPC: on to smaller blocks
                    pass
        finally:
            os.close(fd)
        return n

    def free(self) -> None:
        try:
            os.unlink(self.path / ".soak-filler")
        except FileNotFoundError:
            pass

    def unmount(self) -> None:
        import subprocess

        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


class Injector:
    """Applies a schedule (module docstring); ``proxy`` and ``server`` only for an S3 source."""

    def __init__(self, daemons: list[Daemon], disk: JournalDisk | None, proxy: Any = None, server: Any = None):
        self.daemons, self.disk, self.proxy, self.server = daemons, disk, proxy, server
        self.windows: list[Window] = []
        self.errors: list[str] = []
        self.current: Window | None = None  # the fault being applied (its end not known yet)
        self._thread: threading.Thread | None = None

    def start(self, events: list[Fault], t0: float, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self.run, args=(events, t0, stop), name="faults", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def run(self, events: list[Fault], t0: float, stop: threading.Event) -> None:
        for ev in events:
            if stop.wait(max(0.0, t0 + ev.at - time.monotonic())):
                return
            start = time.monotonic()
            self.current = Window(ev.kind, ev.target, start, math.inf)
            try:
                self.apply(ev, stop)
            except (Wedged, RuntimeError, OSError) as e:
                self.errors.append(f"{ev.kind} at {ev.at} s: {e}")
            finally:
                self.windows.append(Window(ev.kind, ev.target, start,
                                           time.monotonic() + SETTLE_AFTER.get(ev.kind, SETTLE)))
                self.current = None

    def apply(self, ev: Fault, stop: threading.Event) -> None:
        if ev.kind == "kill":
            d = self.daemons[ev.target % len(self.daemons)]
            d.kill()
            d.start()
        elif ev.kind == WORKER_KILL:
            self.daemons[ev.target % len(self.daemons)].kill_worker()
        elif ev.kind == "s3-restart":
            self.server.terminate()  # (not a SIGKILL: SeaweedFS would lose writes it acknowledged)
            stop.wait(ev.seconds)
            self.server.start()
        elif ev.kind == "journal-full":
            assert self.disk is not None
            try:
                self.disk.fill()
                stop.wait(ev.seconds)
            finally:
                self.disk.free()
        else:
            self.proxy.set_fault(ev.kind)
            try:
                stop.wait(ev.seconds)
            finally:
                self.proxy.set_fault(None)

    def overlapping(self, t0: float, t1: float, excusing: bool = True) -> list[Window]:
        """The fault windows that overlap [t0, t1]: with ``excusing``, only those whose fault
        may make a client fail (not ``worker-kill``: its failures are the judge's to count)."""
        current = self.current
        return [w for w in [*self.windows, *([current] if current else [])]
                if w.start < t1 and t0 < w.end and not (excusing and w.kind == WORKER_KILL)]

    def worker_kill(self, t0: float, t1: float) -> bool:
        """[t0, t1] overlaps a worker kill's window and no fault that excuses a failure."""
        windows = self.overlapping(t0, t1, excusing=False)
        return bool(windows) and all(w.kind == WORKER_KILL for w in windows)
