"""Pictures of which shards of an array hold chunks: a character map and a PNG heat map.

Both show a 2-D slice of the shard grid (a 1-D array: one row): ``--slice`` names, per array
dimension, either ``:`` (shown; one or two of them, the last two by default) or an array index
(the shards holding it). Each shard is shaded by the fraction of its inner chunks inside the array
that are stored (``inspect``'s ``stored.shards`` rows); a corrupt shard is marked. Both are made
in memory: ``shardfs inspect --map`` writes the PNG's bytes.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

RAMP = "░▒▓█"  # (0, 1/4], (1/4, 1/2], (1/2, 3/4], (3/4, 1] of a shard's chunks stored
NONE, CORRUPT = "·", "X"
MAX_ROWS, MAX_COLS = 32, 64  # a larger slice is shown in blocks of shards
SIZE, DPI = (800, 600), 100  # the PNG's pixels
AXES = (0.1, 0.1, 0.7, 0.8)  # where the plot is in the PNG: left, bottom, width, height (fractions)
COLOUR_BAR = (0.84, 0.1, 0.03, 0.8)
CORRUPT_COLOUR = "red"


@dataclass
class Slice:
    """A 2-D slice of the shard grid: the dimensions shown (rows, columns; rows None for a 1-D
    array) and the shard index along every other one."""

    rows: int | None
    cols: int
    fixed: dict[int, int]
    label: str


def parse_slice(spec: str | None, shape: list[int], shard_shape: list[int]) -> Slice:
    """The slice ``--slice`` names (None: the last two dimensions, index 0 of the others);
    ``ValueError`` (one line) if it does not fit the array."""
    ndim = len(shape)
    parts = spec.split(",") if spec else ["0"] * max(0, ndim - 2) + [":"] * min(ndim, 2)
    if len(parts) != ndim:
        raise ValueError(f"--slice {spec}: {len(parts)} entries for {ndim} dimensions")
    shown = [d for d, p in enumerate(parts) if p.strip() == ":"]
    if not 1 <= len(shown) <= 2:
        raise ValueError(f"--slice {spec}: needs one or two ':' entries (the dimensions shown)")
    fixed = {}
    for d, p in enumerate(parts):
        if d in shown:
            continue
        try:
            index = int(p)
        except ValueError:
            raise ValueError(f"--slice {spec}: {p!r} is neither ':' nor an array index") from None
        if not 0 <= index < shape[d]:
            raise ValueError(f"--slice {spec}: index {index} is outside dimension {d} (size {shape[d]})")
        fixed[d] = index // shard_shape[d]
    label = ",".join(":" if d in shown else p.strip() for d, p in enumerate(parts))
    return Slice(shown[0] if len(shown) == 2 else None, shown[-1], fixed, label)


def fractions(stored: dict[str, Any], where: Slice) -> np.ndarray:
    """The slice as a 2-D array: per shard the fraction of its chunks stored (0 if none), -1 if
    corrupt."""
    grid = stored["shard_grid"]
    out = np.zeros((grid[where.rows] if where.rows is not None else 1, grid[where.cols]))
    for row in stored["shards"]:
        at = _cell(row["coords"], where)
        if at is not None:
            out[at] = row["chunks"] / max(1, row["chunks_in_bounds"])
    for row in stored["corrupt"]:
        at = _cell(row["coords"], where)
        if at is not None:
            out[at] = -1
    return out


def char_map(report: dict[str, Any], where: Slice) -> list[str]:
    """The character map of ``report``'s slice ``where``, with its legend."""
    grid = fractions(report["stored"], where)
    step_r, step_c = math.ceil(grid.shape[0] / MAX_ROWS), math.ceil(grid.shape[1] / MAX_COLS)
    shard = report["shard_shape"]
    rows_dim = "-" if where.rows is None else f"dimension {where.rows}"
    lines = [f"map        [{where.label}]: rows {rows_dim}, columns dimension {where.cols}; one character per "
             f"{step_r}x{step_c} shards" if step_r * step_c > 1 else
             f"map        [{where.label}]: rows {rows_dim}, columns dimension {where.cols}; one character per shard",
             f"           {NONE} none stored  {RAMP[0]} to {RAMP[-1]}: up to 1/4 .. all of the chunks stored  "
             f"{CORRUPT} corrupt"]
    row_size = shard[where.rows] if where.rows is not None else 0
    for r in range(0, grid.shape[0], step_r):
        chars = []
        for c in range(0, grid.shape[1], step_c):
            block = grid[r:r + step_r, c:c + step_c]
            chars.append(CORRUPT if (block < 0).any() else _shade(float(block.clip(0).mean())))
        lines.append(f"{r * row_size:>10} {''.join(chars)}")
    return lines


def _shade(fraction: float) -> str:
    if fraction <= 0:
        return NONE
    return RAMP[min(len(RAMP) - 1, math.ceil(fraction * len(RAMP)) - 1)]


def png(report: dict[str, Any], where: Slice) -> bytes:
    """A heat map of the slice, axes in array coordinates, with a colour bar: the bytes of a PNG
    of ``SIZE`` pixels (the caller writes them: this room does no I/O). Each shard is coloured by
    what the character map shades it by (``fractions``: of its inner chunks inside the array, the
    fraction stored; a shard past the edge is "all stored" when every chunk inside is), a corrupt
    shard in ``CORRUPT_COLOUR``. The plot fills ``AXES`` of the figure. ``ImportError`` without
    matplotlib (the ``map`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = fractions(report["stored"], where)
    shape, shard = report["shape"], report["shard_shape"]
    height = shape[where.rows] if where.rows is not None else shard[where.cols]
    fig = plt.figure(figsize=(SIZE[0] / DPI, SIZE[1] / DPI), dpi=DPI)
    ax = fig.add_axes(AXES)
    extent = (0, shown.shape[1] * shard[where.cols],
              shown.shape[0] * (shard[where.rows] if where.rows is not None else shard[where.cols]), 0)
    colours = matplotlib.colormaps["viridis"].with_extremes(under=CORRUPT_COLOUR)
    image = ax.imshow(shown, cmap=colours, vmin=0, vmax=1, extent=extent, interpolation="nearest", aspect="auto")
    ax.set_xlim(0, shape[where.cols])
    ax.set_ylim(height, 0)
    ax.set_xlabel(f"dimension {where.cols} (array index)")
    ax.set_ylabel(f"dimension {where.rows} (array index)" if where.rows is not None else "")
    ax.set_title(f"{report['array']} [{where.label}]", fontsize="small")
    fig.colorbar(image, cax=fig.add_axes(COLOUR_BAR),
                 label="fraction of the shard's inner chunks stored (red: corrupt)")
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI)
    plt.close(fig)
    return out.getvalue()


def _cell(coords: list[int], where: Slice) -> tuple[int, int] | None:
    """Where shard ``coords`` is in the slice's 2-D array; None if it is not in the slice."""
    if any(coords[d] != i for d, i in where.fixed.items()):
        return None
    return (coords[where.rows] if where.rows is not None else 0), coords[where.cols]
