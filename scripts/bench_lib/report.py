"""The bench's outputs: the printed table and the PNG chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {"PASS": "#2e7d32", "FAIL": "#c62828", "report": "#5c7ea8", "ERROR": "#9e9e9e"}
FLOOR_COLOR = "#9575cd"  # rows whose baseline is the pyfuse3 passthrough (``Row.floor_ratio`` set)


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "entries/s":
        return f"{x / 1000:.1f}k/s"
    if unit == "GB/s":
        return f"{x:.2f} GB/s"
    if unit == "ms":
        return f"{x:.2f} ms"
    if unit == "µs":
        return f"{x:.0f} µs" if x >= 10 else f"{x:.1f} µs"
    if unit == "s":
        return f"{x:.2f} s" if x < 100 else f"{x:.0f} s"
    if unit == "MiB":
        return f"{x:.0f} MiB" if x >= 10 else f"{x:.1f} MiB"
    return f"{x:.3g} {unit}".strip()


def table(rows: list[Any], smoke: bool = False) -> str:
    head = ("figure", "through mount", "baseline", "ratio", "target", "status")
    body = []
    for r in rows:
        status = r.status
        if smoke and status == "FAIL":
            status = "miss"  # smoke datasets are too small for the targets to mean anything
        body.append((r.figure, _fmt(r.mount, r.unit), _fmt(r.baseline, r.unit),
                     "-" if r.ratio is None else f"{r.ratio:.2f}x", r.target,
                     status + (f"  {r.note}" if r.note else "")))
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(5)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row[:5], widths)))
             + "  " + row[5] for row in [head, *body]]
    lines.insert(1, "-" * len(lines[0]))
    lines.append("ratio = time through the mount / time of the baseline (>1: the mount is slower); "
                 "for bytes and RSS rows, value / baseline.")
    if any(r.floor_ratio is not None for r in rows):
        lines.append("floor rows: the baseline is the same operation through floorfs, the thinnest pyfuse3 "
                     "passthrough of the real copy (one round trip per FUSE request and nothing else); "
                     "their note gives floorfs / the figure's baseline, the part of the gap no pyfuse3 "
                     "filesystem can close.")
    return "\n".join(lines)


def chart(rows: list[Any], path: Path, title: str) -> None:
    """Left: every ratio (log scale) with its target; right: absolute figures against their targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(rows)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 0.42 * n + 1.8), sharey=True,
                                   gridspec_kw={"width_ratios": [3, 2]})
    ys = list(range(n))[::-1]
    labels = [r.figure.strip() for r in rows]
    for y, r in zip(ys, rows):
        floor = r.floor_ratio
        color = FLOOR_COLOR if floor is not None and r.status == "report" else COLORS.get(r.status, "#5c7ea8")
        if r.status == "ERROR":
            ax1.text(1.0, y, f"  ERROR {r.note[:60]}", va="center", fontsize=8, color="#616161")
            continue
        if r.ratio is not None:
            ax1.barh(y, r.ratio, color=color, height=0.6)
            ax1.text(r.ratio, y, f" {r.ratio:.2f}x", va="center", fontsize=8)
        else:
            ax1.text(1.0, y, "  (absolute target only)", va="center", fontsize=8, color="#616161")
        if floor is not None:  # where the passthrough itself stands against the copy
            ax1.plot([floor], [y], marker="D", color="black", mfc="white", ms=5)
            ax1.text(floor, y + 0.3, f"passthrough/baseline {floor:.2f}x", ha="center", fontsize=6)
        if r.ratio_max is not None:
            ax1.plot([r.ratio_max, r.ratio_max], [y - 0.4, y + 0.4], color="black", lw=2)
        if r.abs_target is not None and r.mount is not None:
            # shortfall against the absolute target, <= 1 meets it
            f = r.mount / r.abs_target if r.abs_dir == "<" else r.abs_target / max(r.mount, 1e-12)
            ax2.barh(y, f, color=color, height=0.6)
            ax2.text(f, y, f" {_fmt(r.mount, r.unit)} (target {r.target})", va="center", fontsize=8)
    ax1.set_xscale("log")
    ax1.axvline(1.0, color="#424242", lw=0.8, ls="--")
    ax1.set_yticks(ys)
    ax1.set_yticklabels(labels, fontsize=8)
    ax1.set_xlabel("through the mount / baseline (log; black tick = target, lower is better)\n"
                   "purple: baseline = a pyfuse3 passthrough (floorfs); "
                   "diamond: that passthrough / the row above's baseline",
                   fontsize=9)
    ax2.axvline(1.0, color="black", lw=1.5)
    ax2.set_xscale("log")
    ax2.set_xlabel("absolute targets: value vs target (<= 1 meets it)")
    lo1, hi1 = ax1.get_xlim()
    ax1.set_xlim(min(lo1, 0.3), max(hi1, 3) * 2.5)
    lo2, hi2 = ax2.get_xlim()
    ax2.set_xlim(min(lo2, 0.1), max(hi2, 2) * 8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
