"""Per-minute figures of a soak: the CSV, the PNG of the curves, and the flatness check.

``Sampler.sample(now)`` records each daemon's /proc figures (``Daemon.stats``), the bytes in
its journal directory and the faults injected so far. ``minutes(ops, samples, t0, faults)``
folds the operations (``checks.Op``) and samples into one row per minute: operations, errors by
errno, p50/p99 latency of reads and writes (ms), each daemon's RSS (MiB), fds (not sockets),
sockets, threads, spill and journal bytes (each the mean of the minute's samples), pending
chunks and folds done/failed (``shardfs status``; the last sample of the minute), faults
injected. ``write_csv`` and ``plot`` write them; ``flatness(rows)`` compares the mean of the
last quarter with the second quarter for RSS, fds and journal/spill bytes, and with the second
quarter's highest minute for the pools (sockets, threads: ``POOLS``), within 10% or a small
absolute slack for small values, and returns the failures (each one line).
"""

from __future__ import annotations

import collections
import csv
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from checks import Op
from daemons import Daemon

FLAT = {"rss_mib": 16.0, "fds": 8, "journal_bytes": 1 << 20, "spill_bytes": 1 << 20}
# Pools that follow the load: the object store client's connections (idle ones kept 90 s by
# reqwest, then closed) and the worker threads (trio's, at most its 40-token default limiter
# plus the fold and listing limiters, idle ones kept 10 s; tokio's, idle ones kept 10 s). Under
# the same load they go up and down (sockets 7-38 within a minute of a 5-min S3 run): flat
# means the last quarter stays within what they reached at steady state, the second quarter.
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
                if status:
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
            for key in SAMPLED:  # the minute's mean: one sample is one draw of a quantity that follows the load
                seen = [s.values[key] for s in mine_s if key in s.values]
                row[f"{d}_{key}"] = round(float(np.mean(seen)), 1) if seen else ""
            for key in STATUS:
                row[f"{d}_{key}"] = round(mine_s[-1].values[key], 1) if mine_s and key in mine_s[-1].values else ""
        row["faults"] = len([t for t in fault_starts if lo <= t < hi])
        rows.append(row)
    return rows


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
              ("daemon RSS (MiB)", [f"{d}_rss_mib" for d in daemons]),
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
    """Failures of the flatness check (module docstring); none when the run is under 4 minutes.
    ``FLAT`` quantities: the last quarter's mean against the second quarter's mean; ``POOLS``:
    against the second quarter's highest minute (see ``POOLS``)."""
    if len(rows) < 4:
        return []
    q = len(rows) // 4
    second, last = rows[q: 2 * q], rows[len(rows) - q:]
    out = []
    for d in daemons:
        for key, slack in (*FLAT.items(), *POOLS.items()):
            a = [float(r[f"{d}_{key}"]) for r in second if r[f"{d}_{key}"] != ""]
            b = [float(r[f"{d}_{key}"]) for r in last if r[f"{d}_{key}"] != ""]
            if not a or not b:
                continue
            ma, mb = float(np.max(a) if key in POOLS else np.mean(a)), float(np.mean(b))
            if mb > ma * (1 + TOLERANCE) and mb - ma > slack:
                what = "highest minute" if key in POOLS else "mean"
                out.append(f"{d} {key}: last quarter {mb:.1f}, second quarter {what} {ma:.1f} (> +{TOLERANCE:.0%})")
    return out
