"""Per-minute figures of a soak: the CSV, the PNG of the curves, and the flatness check.

``Sampler.sample(now)`` records each daemon's /proc figures (``Daemon.stats``), the bytes in
its journal directory and the faults injected so far. ``minutes(ops, samples, t0, faults)``
folds the operations (``checks.Op``) and samples into one row per minute: operations, errors by
errno, p50/p99 latency of reads and writes (ms), each daemon's memory (the PSS of its
processes, MiB: their RSS counts a page each worker shares with the zygote or maps of the
shards' ring once per process), fds (not sockets), sockets, threads, spill and journal bytes
(each the mean of the minute's samples; the lowest for the pools, sockets and threads:
``POOLS``), pending chunks and folds done/failed (``shardfs status``; the last sample of the
minute), whether the daemon was started afresh in it (its pid changed since the previous
sample: a kill fault), faults injected. ``write_csv``, ``write_samples`` and ``plot`` write them;
``flatness(rows)`` compares the last quarter's mean of each with the second quarter's, from
steady state on (within 10%, or within a small absolute slack for small values) and returns
the failures (each one line).
"""

from __future__ import annotations

import collections
import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from soak_lib.checks import Op
from soak_lib.daemons import Daemon

FLAT = {"pss_mib": 16.0, "fds": 8, "journal_bytes": 1 << 20, "spill_bytes": 1 << 20}
# Pools that follow the load and the faults: the object store client's connections (reqwest
# closes one idle for 90 s) and the worker threads (trio's, at most its default limiter's 40,
# which every blocking call of the daemon goes through; tokio's blocking pool; both end a
# thread idle for 10 s). Within a minute they swing (sockets 7-46, threads 36-52 in 20-s
# samples of an S3 run with faults: a server down holds all 40 trio threads in requests), so
# each minute's figure for them is its lowest sample: a pool shrinks back when the load dips,
# a leaked socket or thread never does and raises every sample.
POOLS = {"sockets": 8, "threads": 4}
SAMPLED = (*FLAT, *POOLS)
STATUS = ("pending_chunks", "folds_done", "folds_failed")  # from ``shardfs status --json`` (counters per daemon run)
TOLERANCE = 0.10


@dataclass
class Sample:
    t: float
    daemon: str
    values: dict[str, float]


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


class Sampler:
    """Samples the daemons (module docstring); ``journals[name]`` is each daemon's journal dir."""

    def __init__(self, daemons: list[Daemon], journals: dict[str, Path]):
        self.daemons, self.journals = daemons, journals
        self.samples: list[Sample] = []

    def sample(self, now: float) -> None:
        for d in self.daemons:
            values = d.stats()
            if values:
                values["journal_bytes"] = dir_bytes(self.journals[d.name])
                status = d.status()
                if "pending" in status:  # (not a mount's document: its daemon was killed, none answers yet)
                    values["pending_chunks"] = status["pending"]["chunks"]
                    values["folds_done"] = status["folds"]["done"]
                    values["folds_failed"] = status["folds"]["failed"]
                self.samples.append(Sample(now, d.name, values))


def _pct(xs: list[float], q: float) -> float | str:
    return round(float(np.percentile(xs, q)) * 1000, 1) if xs else ""


def minutes(ops: list[Op], samples: list[Sample], t0: float, fault_starts: list[float],
            daemons: list[str]) -> list[dict[str, Any]]:
    """One row per minute of the run (module docstring)."""
    n = int(max([o.end for o in ops] + [s.t for s in samples] + [t0]) - t0) // 60 + 1
    starts: dict[str, list[float]] = {}  # each daemon's samples whose pid is not the previous one's
    for d in daemons:
        mine_p = [s for s in samples if s.daemon == d and "pid" in s.values]
        starts[d] = [b.t for a, b in zip(mine_p, mine_p[1:]) if a.values["pid"] != b.values["pid"]]
    rows = []
    for m in range(n):
        lo, hi = t0 + 60 * m, t0 + 60 * (m + 1)
        mine = [o for o in ops if lo <= o.end < hi]
        errors = collections.Counter("other" if o.err.startswith("X:") else o.err for o in mine if o.err)
        row: dict[str, Any] = {"minute": m + 1, "ops": len(mine), "errors": sum(errors.values()),
                               "errors_by_errno": " ".join(f"{k}={v}" for k, v in sorted(errors.items()))}
        for kind in ("read", "write"):
            lat = [o.end - o.start for o in mine if o.kind == kind and not o.err]
            row[f"{kind}s"] = len([o for o in mine if o.kind == kind])
            row[f"{kind}_p50_ms"], row[f"{kind}_p99_ms"] = _pct(lat, 50), _pct(lat, 99)
        for d in daemons:
            mine_s = [s for s in samples if s.daemon == d and lo <= s.t < hi]
            row[f"{d}_started"] = int(any(lo <= t < hi for t in starts[d]))
            for key in SAMPLED:  # the minute's mean (lowest for a pool): one sample is one draw
                seen = [s.values[key] for s in mine_s if key in s.values]
                row[f"{d}_{key}"] = round(float(np.min(seen) if key in POOLS else np.mean(seen)), 1) if seen else ""
            for key in STATUS:
                row[f"{d}_{key}"] = round(mine_s[-1].values[key], 1) if mine_s and key in mine_s[-1].values else ""
        row["faults"] = len([t for t in fault_starts if lo <= t < hi])
        rows.append(row)
    return rows


def write_samples(samples: list[Sample], t0: float, path: Path) -> None:
    """Every sample, one JSON line each (``t`` in seconds from the start), for a closer look."""
    with open(path, "w") as f:
        for s in samples:
            f.write(json.dumps({"t": round(s.t - t0, 1), "daemon": s.daemon, **s.values}) + "\n")


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def plot(rows: list[dict[str, Any]], daemons: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["minute"] for r in rows]

    def series(key: str) -> list[float]:
        return [float(r[key]) if r[key] != "" else np.nan for r in rows]

    panels = [("operations / min", ["ops", "errors", "faults"]),
              ("latency p50 / p99 (ms)", ["read_p50_ms", "read_p99_ms", "write_p50_ms", "write_p99_ms"]),
              ("daemon PSS (MiB)", [f"{d}_pss_mib" for d in daemons]),
              ("fds / sockets / threads", [f"{d}_{k}" for d in daemons for k in ("fds", "sockets", "threads")]),
              ("journal / spill bytes", [f"{d}_{k}" for d in daemons for k in ("journal_bytes", "spill_bytes")]),
              ("pending chunks, folds", [f"{d}_{k}" for d in daemons for k in STATUS])]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.4 * len(panels)), sharex=True)
    for ax, (label, keys) in zip(axes, panels):
        for key in keys:
            ax.plot(x, series(key), marker=".", label=key)
        ax.set_ylabel(label, fontsize=8)
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("minute")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def flatness(rows: list[dict[str, Any]], daemons: list[str]) -> list[str]:
    """Failures of the flatness check (module docstring), from steady state on: after the first
    minute in which the clients reached half their median rate (they start in it: on a loaded
    machine importing zarr and tensorstore takes them most of a minute, the daemons idle
    meanwhile); none when fewer than 4 minutes are left."""
    median = float(np.median([r["ops"] for r in rows])) if rows else 0.0
    rows = rows[next((i for i, r in enumerate(rows) if r["ops"] >= median / 2), 0) + 1:]
    if len(rows) < 4:
        return []
    q = len(rows) // 4
    last = range(len(rows) - q, len(rows))
    out = []
    for d in daemons:
        # A daemon started afresh (a kill) refills its pools from none: its pools are compared
        # without that minute and the next, from the first q minutes of the second quarter on.
        fresh = {i + k for i, r in enumerate(rows) if r.get(f"{d}_started") for k in (0, 1)}
        kept = [i for i in range(q, len(rows) - q) if i not in fresh][:q]
        for key, slack in (*FLAT.items(), *POOLS.items()):
            second = kept if key in POOLS else range(q, 2 * q)
            a = [float(rows[i][f"{d}_{key}"]) for i in second if rows[i][f"{d}_{key}"] != ""]
            b = [float(rows[i][f"{d}_{key}"]) for i in last
                 if rows[i][f"{d}_{key}"] != "" and not (key in POOLS and i in fresh)]
            if not a or not b:
                continue
            ma, mb = float(np.mean(a)), float(np.mean(b))
            if mb > ma * (1 + TOLERANCE) and mb - ma > slack:
                out.append(f"{d} {key}{' (lowest per minute)' if key in POOLS else ''}: last quarter {mb:.1f}, "
                           f"second quarter {ma:.1f} (> +{TOLERANCE:.0%})")
    return out
