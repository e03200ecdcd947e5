"""How many CPUs this process may use: the cores it may run on (``sched_getaffinity``: a cpuset,
``taskset``), fewer if its cgroup's CPU quota allows fewer (a container's ``--cpus``, a
Kubernetes CPU limit: the quota is not in the affinity, and a pod limited to 2 CPUs on a
64-core node would otherwise count 64)."""

from __future__ import annotations

import math
import os

CGROUP_ROOT = "/sys/fs/cgroup"
SELF = "/proc/self/cgroup"


def available(root: str = CGROUP_ROOT, cgroup: str = SELF) -> int:
    """The cores this process may run on, at most its cgroup's quota rounded up; at least 1."""
    cores = len(os.sched_getaffinity(0))
    quota = quota_cpus(root, cgroup)
    return max(1, min(cores, math.ceil(quota)) if quota is not None else cores)


def quota_cpus(root: str = CGROUP_ROOT, cgroup: str = SELF) -> float | None:
    """The CPUs the CPU quota of this process's cgroup and of its ancestors allow (the lowest):
    cgroup v2's ``cpu.max`` (``QUOTA PERIOD``, ``max``: none), v1's ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us`` (-1: none); None if no quota (or nothing readable) says any."""
    try:
        with open(cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            for d in _ancestors(root, path):
                found += _v2(d)
        elif "cpu" in controllers.split(","):
            for d in _ancestors(os.path.join(root, controllers), path):
                found += _v1(d)
    return min(found) if found else None


def _ancestors(top: str, path: str) -> list[str]:
    """``top`` joined with ``path`` and with each of its parents, ``top`` itself last."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    return [os.path.join(top, *parts[:n]) for n in range(len(parts), -1, -1)]


def _v2(d: str) -> list[float]:
    try:
        with open(os.path.join(d, "cpu.max")) as f:
            quota, period = f.read().split()[:2]
        return [] if quota == "max" else [int(quota) / int(period)]
    except (OSError, ValueError):
        return []


def _v1(d: str) -> list[float]:
    try:
        with open(os.path.join(d, "cpu.cfs_quota_us")) as f:
            quota = int(f.read())
        with open(os.path.join(d, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        return [quota / period] if quota > 0 and period > 0 else []
    except (OSError, ValueError):
        return []
