"""``base.cores``: the CPUs this process may use, for ``-o workers=auto`` (doc/SEMANTICS.md,
"Workers"): its affinity, fewer if its cgroup's CPU quota allows fewer. In process, against
cgroup trees written in a temporary directory (v2's ``cpu.max``, v1's ``cpu.cfs_quota_us``)."""

from __future__ import annotations

import os
from pathlib import Path

from shardfs.base import cores
from shardfs.config import default_workers


def tree(tmp_path: Path, cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    """A cgroup root under ``tmp_path`` holding ``files`` (path -> content), and a
    ``/proc/self/cgroup`` saying ``cgroup``: (root, that file)."""
    root = tmp_path / "cgroup"
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    me = tmp_path / "self"
    me.write_text(cgroup)
    return str(root), str(me)


def test_a_v2_quota_of_the_process_cgroup_or_an_ancestor_is_the_lowest(tmp_path):
    root, me = tree(tmp_path, "0::/pod/app\n", {"pod/cpu.max": "150000 100000\n", "pod/app/cpu.max": "max 100000\n",
                                                "cpu.max": "max 100000\n"})
    assert cores.quota_cpus(root, me) == 1.5
    affinity = len(os.sched_getaffinity(0))
    assert cores.available(root, me) == min(affinity, 2)


def test_no_quota_is_the_affinity(tmp_path):
    root, me = tree(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"})
    assert cores.quota_cpus(root, me) is None
    assert cores.available(root, me) == len(os.sched_getaffinity(0))
    assert cores.quota_cpus(root, str(tmp_path / "none")) is None  # (no /proc/self/cgroup: no quota)


def test_a_v1_cpu_quota(tmp_path):
    root, me = tree(tmp_path, "4:memory:/x\n2:cpu,cpuacct:/docker/abc\n0::/\n",
                    {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
                     "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
                     "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert cores.quota_cpus(root, me) == 0.5
    assert cores.available(root, me) == 1


def test_auto_is_half_the_cores_at_least_one_at_most_eight():
    assert [default_workers(n) for n in (1, 2, 3, 4, 7, 16, 64)] == [1, 1, 1, 2, 3, 8, 8]
