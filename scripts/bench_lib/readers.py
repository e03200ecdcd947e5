"""zarr 2.18 reader processes against a mount (or a directory), and the CPU the processes serving
it spend meanwhile: how the peers, S3 and workers figures of ``scripts/bench`` read an array.
Imports only ``harness`` (no figure's module)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench_lib.harness import BenchError, process_tree

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` and its descendants (a supervised mount's worker:
    ``harness.process_tree``), all their threads (those that ended too), in seconds."""
    total = 0
    for p in process_tree(pid):
        with open(f"/proc/{p}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def zarr_readers(bench: Any, py2: str, clients: str, vol: Path, n: int, pid: int | None
                 ) -> tuple[float, float | None]:
    """``n`` concurrent zarr 2.18 processes (``py2`` running ``clients``) reading disjoint slabs of
    ``vol`` (all of it together), started together once each has imported zarr (so the daemon CPU
    measured is the read's alone, not what the daemon does at its start meanwhile, such as
    importing zarr-python itself): (wall seconds from the first start to the last end, daemon CPU seconds
    over the read or None without a daemon). The slabs' sums must add up to the array's."""
    procs = [subprocess.Popen([py2, clients, "zarr_read_part", str(vol), str(k), str(n)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(n)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdin is not None
            if p.stdout.readline().strip() != "ready":
                raise BenchError(f"reader did not start: {p.communicate(timeout=10)[1].strip()[-300:]}")
        cpu0 = cpu_seconds(pid) if pid else None
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        deadline = time.monotonic() + bench.op_timeout()
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode:
                raise BenchError(f"reader exit {p.returncode}: {err.strip()[-300:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        cpu = cpu_seconds(pid) - cpu0 if pid and cpu0 is not None else None
    except subprocess.TimeoutExpired:
        raise BenchError(f"{n} zarr readers did not finish in time") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # our own child, by its Popen
                p.wait()
    total = sum(o["sum"] for o in outs)
    if total != bench.vol_sum:
        raise BenchError(f"{n} readers read wrong data (sum {total} != {bench.vol_sum})")
    return max(o["end"] for o in outs) - min(o["start"] for o in outs), cpu
