"""The workers figure of ``scripts/bench`` (``--only workers``): one mount of ``vol`` served by
``-o workers=N`` worker processes (doc/ARCHITECTURE.md, "Workers"), read-only and writable.

For N = 1, 2, 4 (and 8 where the machine has 8 cores), alternated over the repetitions, each
in a fresh mount with page caches dropped: 4 concurrent zarr 2.18 processes read disjoint slabs
of the array (every chunk once, ``readers.zarr_readers``). Reported: chunk files a second, CPU per
chunk summed over the workers (utime + stime of each worker, ``/proc/PID/stat``), each worker's
share of that CPU, the requests one worker sent another (a READ or RELEASE of a handle the
other opened: ``forwarded``, per chunk), the voluntary and involuntary context switches a chunk
of the workers' request threads (``switches``: with N workers on few cores, a worker preempted
while busy), and the mount's memory after the read: the workers' RSS
summed (``rss``: what the bench reported before; it counts the pages a worker forked from the
zygote still shares with it and the other workers once per worker), and the PSS of the
supervisor, the zygote and the workers summed (``pss``, from ``/proc/PID/smaps_rollup``: each
shared page divided among the processes that map it, so the sum is the mount's real resident
memory; the memory target is judged on it). The
same on a writable mount (nothing written: its reads are served as a read-only mount's, but
by workers built with the owner's journal and marks). Targets (issue 37, for a 2-core machine
already saturated by one daemon and its readers): with 2 workers each worker does at least
30% of the work, CPU per chunk at most 1.25x one worker's, not slower; the memory (PSS) of
a mount with 4 workers at most 2x one's. Where the machine has more cores (at least 2N), a scaling table reads with 2N
readers for N up to 8 (read-only): the target there is at least 0.7 x N one worker's rate.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench_lib.harness import (CLIENTS, PY2, BenchError, MiB, Row, median, process_tree, pss, rotate,
                               status_of)
from bench_lib.readers import cpu_seconds, zarr_readers

COUNTS = (1, 2, 4)
READERS = 4


def worker_pids(mnt: Path) -> list[int]:
    """The pids of the workers serving ``mnt``, by slot (``shardfs status --json``)."""
    doc = status_of(mnt)
    if doc.get("workers"):
        return [w["pid"] for w in sorted(doc["workers"], key=lambda w: w["index"])]
    return [doc["worker"]["pid"]]


def forwarded(mnt: Path) -> int:
    """Requests the workers of ``mnt`` sent one another so far (every worker's, up to 1 s old)."""
    return sum(status_of(mnt).get("forwarded", {}).values())


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def switches(pid: int) -> tuple[int, int]:
    """The voluntary and involuntary context switches of ``pid``'s main thread (the one serving
    the requests), (0, 0) if it is gone: a worker preempted while busy counts involuntary ones."""
    try:
        with open(f"/proc/{pid}/status") as f:
            counts = {k: int(v) for k, v in (line.split(":", 1) for line in f) if k.endswith("ctxt_switches")}
    except OSError:
        return 0, 0
    return counts["voluntary_ctxt_switches"], counts["nonvoluntary_ctxt_switches"]


def measure(bench: Any, n: int, readers: int, ro: bool = True, src: Any = None, options: str = "",
            name: str = "", auto: bool = False) -> dict[str, Any]:
    """One fresh mount (read-only, or writable) of ``src`` (the bench's local ``big``, or an
    ``s3://`` URL with its ``options``) with ``n`` workers read by ``readers`` zarr 2.18 processes;
    with ``auto``, ``-o workers=auto`` counting 2n cores (``SHARDFS_TEST_CORES``): the workers past
    the first parked while the queue is calm."""
    workers = "workers=auto" if auto else f"workers={n}"
    with bench.mounted(src or bench.big, f"workers{n}{name}{'' if ro else 'rw'}{'auto' * auto}", ro=ro,
                       options=",".join([workers, *[options] * bool(options)]),
                       env={"SHARDFS_TEST_CORES": str(2 * n)} if auto else None) as m:
        pids = worker_pids(m.mnt)
        supervisor = int(status_of(m.mnt)["pid"])
        if len(pids) != n:
            raise BenchError(f"-o workers={n}: {len(pids)} workers serve")
        bench.drop_caches()
        cpu0 = [cpu_seconds(p) for p in pids]
        switched0 = [switches(p) for p in pids]
        sent0 = forwarded(m.mnt)
        wall, _ = zarr_readers(bench, PY2, CLIENTS, m.mnt / "vol", readers, None)
        cpu = [cpu_seconds(p) - c for p, c in zip(pids, cpu0)]
        switched = [(v - v0, i - i0) for (v, i), (v0, i0) in zip(map(switches, pids), switched0)]
        mem = sum(rss(p) for p in pids)
        real = sum(pss(p) for p in process_tree(supervisor))
        time.sleep(1.2 if n > 1 else 0)  # (each worker's counts reach the others every second)
        sent = forwarded(m.mnt) - sent0
    chunks = len(bench.vol_names)
    total = sum(cpu)
    return {"wall": wall, "rate": chunks / wall, "cpu_us": total / chunks * 1e6,
            "shares": [c / total if total else 0.0 for c in cpu], "rss": mem, "pss": real, "forwarded": sent / chunks,
            "voluntary": sum(v for v, _ in switched) / chunks, "involuntary": sum(i for _, i in switched) / chunks}


KINDS = (("read-only", True), ("writable", False), ("S3 read-only", True))
S3_BUCKET = "bench-workers"


def figure(bench: Any) -> list[Row]:
    """Every row (module docstring); SeaweedFS, for the S3 kind, is stopped by PID whatever happens."""
    from testkit.seaweed import REGION, S3Source, SeaweedS3, aws_env, put_all, upload

    server = SeaweedS3(bench.work / "seaweed-workers", bucket=S3_BUCKET)
    with aws_env():
        server.start()
        try:
            put_all(S3Source(server, "big").store(), [("zarr.json", bench.big / "zarr.json")])
            upload(server, bench.big / "vol", "big/vol")
            s3 = (f"s3://{S3_BUCKET}/big", f"endpoint={server.endpoint},region={REGION}")
            return _figure(bench, s3)
        finally:
            server.stop()


def _figure(bench: Any, s3: tuple[str, str]) -> list[Row]:
    counts = [*COUNTS, *([8] if (os.cpu_count() or 1) >= 8 else [])]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {(k, n): [] for k, _ in KINDS for n in counts}
    for rep in bench.repeat():
        for kind, ro in KINDS:
            for n in rotate(counts, rep):
                if kind.startswith("S3"):
                    runs[kind, n].append(measure(bench, n, READERS, ro, s3[0], s3[1], "s3"))
                else:
                    runs[kind, n].append(measure(bench, n, READERS, ro))
                r = runs[kind, n][-1]
                bench.log(f"workers rep {rep + 1}: {kind} workers={n} {r['rate']:.0f} chunks/s, "
                          f"{r['cpu_us']:.0f} µs CPU/chunk, shares {', '.join(f'{s:.0%}' for s in r['shares'])}, "
                          f"forwarded {r['forwarded']:.2f}/chunk, context switches {r['voluntary']:.2f} voluntary "
                          f"{r['involuntary']:.2f} involuntary/chunk, RSS of the workers {r['rss'] / MiB:.0f} MiB, "
                          f"PSS of the mount {r['pss'] / MiB:.0f} MiB, load {os.getloadavg()[0]:.1f}")
    bench.raw["workers"] = {f"{k} {n}": rs for (k, n), rs in runs.items()}
    med = {key: {k: median([r[k] for r in rs]) for k in ("rate", "cpu_us", "rss", "pss", "wall", "forwarded")}
           for key, rs in runs.items()}
    share = {key: [median([r["shares"][i] for r in rs]) for i in range(key[1])] for key, rs in runs.items()}
    rows: list[Row] = []
    for kind, _ro in KINDS:
        one = med[kind, 1]
        for n in counts:
            m = med[kind, n]
            row = bench.ratio_row(f"workers={n}: 4 zarr 2.18 readers, {kind} mount, time vs workers=1", "s",
                                  m["wall"], one["wall"], 1.1 if n == 2 else None)
            row.note = (f"{m['rate']:.0f} chunk files/s; worker shares {', '.join(f'{s:.0%}' for s in share[kind, n])}"
                        + (f"; {m['forwarded']:.2f} requests forwarded per chunk" if n > 1 else ""))
            if n == 2 and min(share[kind, 2]) < 0.3:
                row.status, row.note = "FAIL", row.note + " (a worker below 30%)"
            rows.append(row)
            row = bench.ratio_row(f"  CPU per chunk, summed over the workers, {kind}, workers={n} vs 1", "µs",
                                  m["cpu_us"], one["cpu_us"], 1.25 if n == 2 else None)
            if n > 1:  # (each repetition's N ran side by side with its workers=1, at the same load)
                paired = [r["cpu_us"] / o["cpu_us"] for r, o in zip(runs[kind, n], runs[kind, 1])]
                row.note = f"per repetition {', '.join(f'{x:.2f}x' for x in paired)}"
            # (a worker preempted while busy: the CPU/chunk of N workers on few cores grows with it)
            row.note = (row.note + "; " if row.note else "") + (
                f"involuntary context switches {median([r['involuntary'] for r in runs[kind, n]]):.2f}/chunk, "
                f"voluntary {median([r['voluntary'] for r in runs[kind, n]]):.2f}")
            rows.append(row)
    top = max(counts)
    for kind, _ro in KINDS:
        # judged on PSS (the mount's real memory); the RSS sum counts each shared page once per worker
        rows.append(bench.ratio_row(f"  memory of the mount (PSS: supervisor, zygote, workers), {kind}, "
                                    f"workers={top} vs 1", "MiB",
                                    med[kind, top]["pss"] / MiB, med[kind, 1]["pss"] / MiB, 2.0))
        rows.append(bench.ratio_row(f"  RSS of the workers summed (shared pages counted per worker), {kind}, "
                                    f"workers={top} vs 1", "MiB",
                                    med[kind, top]["rss"] / MiB, med[kind, 1]["rss"] / MiB, None))
    cores = os.cpu_count() or 1
    if cores >= 4:  # the scaling table: 2N readers, N up to 8 and cores / 2
        base = None
        for n in [k for k in (1, 2, 4, 8) if 2 * k <= cores]:
            rate = median([measure(bench, n, 2 * n)["rate"] for _ in bench.repeat()])
            base = base or rate
            row = bench.ratio_row(f"scaling: workers={n}, {2 * n} readers, chunk files/s vs workers=1", "/s",
                                  rate, base, None)
            row.target, row.status = f">= {0.7 * n:.1f}x", "PASS" if rate >= 0.7 * n * base else "FAIL"
            rows.append(row)
    return rows


def elastic(bench: Any) -> list[Row]:
    """The elastic figure (``--only elastic``): ``-o workers=auto`` with 2 workers (the second
    parked while the queue is calm: ``shardfs.kernel.elastic``) beside 2 workers always reading
    and one, read by one zarr 2.18 reader (serial: auto should cost what one worker does) and by
    4 (auto as 2 workers)."""
    sides = (("workers=1", 1, False), ("workers=2", 2, False), ("workers=auto (2)", 2, True))
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {(r, label): [] for r in (1, READERS) for label, _, _ in sides}
    for rep in bench.repeat():
        for readers in (1, READERS):
            for label, n, auto in rotate(list(sides), rep):
                r = measure(bench, n, readers, auto=auto)
                runs[readers, label].append(r)
                bench.log(f"workers rep {rep + 1}: {label}, {readers} reader(s): {r['rate']:.0f} chunks/s, "
                          f"{r['cpu_us']:.0f} µs CPU/chunk, shares {', '.join(f'{s:.0%}' for s in r['shares'])}, "
                          f"load {os.getloadavg()[0]:.1f}")
    rows: list[Row] = []
    for readers in (1, READERS):
        one = runs[readers, "workers=1"]
        for label in ("workers=2", "workers=auto (2)"):
            rs = runs[readers, label]
            share = [median([r["shares"][i] for r in rs]) for i in range(2)]
            row = bench.ratio_row(f"{label}: {readers} zarr 2.18 reader{'s' * (readers > 1)}, read-only, time vs "
                                  "workers=1", "s", median([r["wall"] for r in rs]), median([r["wall"] for r in one]),
                                  1.1 if readers == 1 and "auto" in label else None)
            row.note = f"worker shares {', '.join(f'{s:.0%}' for s in share)}"
            rows.append(row)
            row = bench.ratio_row(f"  CPU per chunk, summed over the workers, {label} vs 1, {readers} reader"
                                  f"{'s' * (readers > 1)}", "µs", median([r["cpu_us"] for r in rs]),
                                  median([r["cpu_us"] for r in one]), None)
            row.note = "per repetition " + ", ".join(f"{r['cpu_us'] / o['cpu_us']:.2f}x" for r, o in zip(rs, one))
            rows.append(row)
    return rows
