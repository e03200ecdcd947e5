"""Stopping a worker of a mount (SIGSTOP) to make another serve every request, outside the
critical sections of what the workers share: a worker stopped while it holds the lock of the
shared ledger or page table (memfds locked with ``flock``: ``shardfs.tree.ledger``,
``shardfs.kernel.pagetable``) would stop every other worker's requests that take it, and the
test would wait for ever. Resume with SIGCONT, in a ``finally``."""

from __future__ import annotations

import contextlib
import os
import signal
import time


def stopped(pid: int, seconds: float = 30) -> None:
    """SIGSTOP worker ``pid``, once it holds none of the shared tables' locks."""
    deadline = time.monotonic() + seconds
    while True:
        os.kill(pid, signal.SIGSTOP)
        while state(pid) not in "TtZX":
            time.sleep(0.001)
        if not holds_shared_lock(pid):
            return
        os.kill(pid, signal.SIGCONT)
        assert time.monotonic() < deadline, f"worker {pid} held a shared table's lock for {seconds} s"
        time.sleep(0.01)


def state(pid: int) -> str:
    """The state letter of process ``pid`` (``T``: stopped; ``X``: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "X"


def holds_shared_lock(pid: int) -> bool:
    """True if ``pid`` holds a lock on one of its shardfs memfds (``/proc/locks``)."""
    inodes = set()
    with contextlib.suppress(FileNotFoundError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:shardfs"):
                    inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if "->" not in fields and len(fields) > 5 and fields[4] == str(pid) \
                    and int(fields[5].rsplit(":", 1)[1]) in inodes:
                return True
    return False
