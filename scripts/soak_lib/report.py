"""The soak's summary: a table per source, the failures with what replays them, the last line.

``Result`` holds one source's figures; ``table(results)`` is the summary table (markdown, also
written to ``summary.md``); ``failures(result, seed)`` prints each failure with the seed and the
op log of the chunk concerned; ``last_line(results, seed)`` is
``soak: N operations, F faults, lost L, forbidden R, wedged W (seed S)``; ``evidence(...)``, printed
with the failures, what a failed run (CI's, whose files are gone) needs to be understood.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Result:
    source: str
    minutes: float
    operations: int = 0
    reads: int = 0
    writes: int = 0
    acknowledged: int = 0
    structure: int = 0
    chunks_checked: int = 0
    faults: collections.Counter = field(default_factory=collections.Counter)
    errors: collections.Counter = field(default_factory=collections.Counter)
    masked: collections.Counter = field(default_factory=collections.Counter)
    raced: collections.Counter = field(default_factory=collections.Counter)
    cross_mount: collections.Counter = field(default_factory=collections.Counter)
    excused: collections.Counter = field(default_factory=collections.Counter)  # by rule (checks.py)
    worker_kill: collections.Counter = field(default_factory=collections.Counter)  # seen during worker kills
    lost: list[str] = field(default_factory=list)
    forbidden: list[str] = field(default_factory=list)
    unclean: list[str] = field(default_factory=list)
    wedged: list[str] = field(default_factory=list)
    flat: list[str] = field(default_factory=list)
    umount_seconds: list[float] = field(default_factory=list)
    hazard_mount: float | None = None  # share of values lost through the mount (zarr 2.18)
    hazard_native: float | None = None  # natively with zarr-python 3
    notes: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)  # of a failed run (``evidence``)

    @property
    def forbidden_count(self) -> int:
        return len(self.forbidden) + len(self.unclean)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def table(results: list[Result]) -> str:
    rows = [
        ("minutes", lambda r: f"{r.minutes:g}"),
        ("operations", lambda r: f"{r.operations:,}"),
        ("reads / chunk values checked", lambda r: f"{r.reads:,} / {r.chunks_checked:,}"),
        ("writes (acknowledged)", lambda r: f"{r.writes:,} ({r.acknowledged:,})"),
        ("structure changes", lambda r: f"{r.structure:,}"),
        ("faults", lambda r: f"{sum(r.faults.values())}: "
         + ", ".join(f"{k} {v}" for k, v in sorted(r.faults.items()))),
        ("client errors", lambda r: ", ".join(f"{k} {v}" for k, v in r.errors.most_common()) or "none"),
        ("fill read during a fault (client masked an error)",
         lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r.masked.items())) or "0"),
        ("read failed beside an in-place write, cp or rm (POSIX race)",
         lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r.raced.items())) or "0"),
        ("read failed on one mount after the other mount's write (stale size) or rm (stale name)",
         lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r.cross_mount.items())) or "0"),
        ("failures excused, by rule", lambda r: "; ".join(f"{k}: {v}" for k, v in r.excused.most_common()) or "0"),
        ("during worker kills: fill reads, failed reads (other failures)",
         lambda r: f"{r.worker_kill['fill reads']}, {r.worker_kill['failed reads']}"
         + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(r.worker_kill.items())
                             if k not in ("fill reads", "failed reads")) + ")"
            if set(r.worker_kill) - {"fill reads", "failed reads"} else "")),
        ("lost", lambda r: str(len(r.lost))),
        ("forbidden (of which unclean errors)", lambda r: f"{r.forbidden_count} ({len(r.unclean)})"),
        ("wedged", lambda r: str(len(r.wedged))),
        ("umount (s)", lambda r: ", ".join(f"{s:.1f}" for s in r.umount_seconds)),
        ("flat (PSS, fds, sockets, threads, journal, spill)", lambda r: "yes" if not r.flat else "; ".join(r.flat)),
        ("#3682: values lost, dask lock=False through the mount (zarr 2.18)", lambda r: _pct(r.hazard_mount)),
        ("#3682: values lost, same write natively (zarr-python 3)", lambda r: _pct(r.hazard_native)),
    ]
    head = "| | " + " | ".join(r.source for r in results) + " |"
    sep = "|---|" + "---|" * len(results)
    body = [f"| {name} | " + " | ".join(fn(r) for r in results) + " |" for name, fn in rows]
    return "\n".join([head, sep, *body])


def failures(result: Result, seed: int, limit: int = 8) -> str:
    out = []
    for what, items in (("LOST", result.lost), ("FORBIDDEN", result.forbidden), ("UNCLEAN ERROR", result.unclean),
                        ("WEDGED", result.wedged)):
        for item in items[:limit]:
            out.append(f"soak [{result.source}, seed {seed}] {what}: {item}")
        if len(items) > limit:
            out.append(f"soak [{result.source}, seed {seed}] ... {len(items) - limit} more {what} (see the op logs)")
    return "\n".join(out)


_STAMP = re.compile(r"^(\S+ \S+) shardfs\[\d+\] ")
_KEYS = re.compile(r"\S+://\S+|/\S+|\d+")


def evidence(windows: list[tuple[str, float, float]], t0: float, logs: list[Path], lines: int = 30) -> list[str]:
    """The fault windows (``kind start..end``: the clock of the op logs, and seconds after ``t0``)
    and each daemon log's non-DEBUG messages, alike ones (keys, paths and numbers aside) counted
    once with their first and last times, in order of first appearance (at most ``lines``)."""
    out = ["fault windows: " + ", ".join(f"{k} {s:.1f}..{e:.1f} (t+{s - t0:.1f})" for k, s, e in windows)]
    for log in logs:
        try:
            text = log.read_text(errors="replace").splitlines()
        except OSError as e:
            out.append(f"{log.name}: {e}")
            continue
        seen: dict[str, list] = {}  # message shape -> [count, first, last, an example]
        for line in text:
            stamp = _STAMP.match(line)
            if stamp is None or " DEBUG " in line:
                continue
            message = line[stamp.end():]
            entry = seen.setdefault(_KEYS.sub("#", message), [0, stamp[1], "", message[:200]])
            entry[0] += 1
            entry[2] = stamp[1]
        out.append(f"{log.name}: {len(seen)} kinds of message (count, first, last, an example):")
        shown = list(seen.values())[:lines]
        out += [f"  {n:>4} {first[11:]} {last[11:]} {example}" for n, first, last, example in shown]
    return out


def last_line(results: list[Result], seed: int) -> str:
    n = sum(r.operations for r in results)
    f = sum(sum(r.faults.values()) for r in results)
    lost = sum(len(r.lost) for r in results)
    forbidden = sum(r.forbidden_count for r in results)
    wedged = sum(len(r.wedged) for r in results)
    return f"soak: {n} operations, {f} faults, lost {lost}, forbidden {forbidden}, wedged {wedged} (seed {seed})"
