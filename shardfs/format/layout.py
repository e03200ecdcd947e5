"""Geometry of one array: its chunk grids, shard grid and storage keys.

``ArrayLayout`` answers "which shard holds inner chunk (i, j, k), and at which
position of its index", and the inverse; ``KeyScheme`` turns shard coordinates
into source keys and back, and chunk coordinates into the view's file names and
back (``ArrayLayout.names``); ``parse_coord`` is the one parser of a coordinate
in a name. Nothing here does I/O.

A ``transpose`` codec before the sharding codec puts the shard's index (and its
``chunk_shape``) in the transposed space: dimension ``k`` of the index grid is
dimension ``order[k]`` of the array (numpy's ``transpose(order)``).
``permuted``/``unpermuted`` convert shapes, and ``ArrayLayout.order`` makes
``locate``/``chunk_at`` map array-space chunk coordinates to index positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from shardfs.format.shardfile import NestedFormat, ShardFormat

MAX_CHUNKS = 1 << 40  # inner chunks in an array's grid; bounds the inode space


class Unpresentable(ValueError):
    """The array cannot be shown as a v2 array (the message says why)."""


def parse_coord(text: str) -> int | None:
    """A coordinate spelled as keys and names spell it (ASCII decimal digits without sign or
    leading zeros), else None."""
    if text.isascii() and text.isdigit() and (text[0] != "0" or text == "0"):
        return int(text)
    return None


def permuted(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` (array space) in the space of ``transpose(order)``: entry k is ``shape[order[k]]``."""
    return tuple(shape[o] for o in order)


def unpermuted(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """Inverse of ``permuted``: a transposed-space ``shape`` back in array space."""
    out = [0] * len(order)
    for k, o in enumerate(order):
        out[o] = shape[k]
    return tuple(out)


def composed(first: tuple[int, ...], then: tuple[int, ...]) -> tuple[int, ...]:
    """The single order equal to ``transpose(first)`` followed by ``transpose(then)``."""
    return permuted(first, then)


@dataclass(frozen=True)
class KeyScheme:
    """A ``chunk_key_encoding`` (``default`` or ``v2``) for arrays of ``ndim`` dimensions."""

    kind: str  # "default" or "v2"
    separator: str  # "/" or "."
    ndim: int
    nested: bool = False  # the view prefers "/" keys (arrays of OME-Zarr images and labels)

    def key(self, coords: tuple[int, ...]) -> str:
        """The storage key of the chunk (shard) at ``coords``."""
        if self.kind == "default":
            return self.separator.join(["c", *map(str, coords)])
        return self.separator.join(map(str, coords)) if coords else "0"

    def keys(self, coords: np.ndarray) -> list[str]:
        """``key`` of every row of an ``(n, ndim)`` coordinate array."""
        rows = coords.astype(str).tolist()
        if self.kind == "default":
            return [self.separator.join(["c", *row]) for row in rows]
        return [self.separator.join(row) for row in rows] if self.ndim else ["0"] * len(rows)

    def parse(self, key: str) -> tuple[int, ...] | None:
        """Coordinates for a storage key (the inverse of ``key``), or None if ``key`` is not one."""
        parts = key.split(self.separator)
        if self.kind == "default":
            if parts[0] != "c":
                return None
            parts = parts[1:]
        elif self.ndim == 0:
            return () if key == "0" else None
        coords = [parse_coord(p) for p in parts]
        found = tuple(c for c in coords if c is not None)
        return found if len(found) == len(coords) == self.ndim else None

    @cached_property
    def view_separator(self) -> str:
        """The v2 view's ``dimension_separator``, chosen so that no chunk key collides with a
        shard's name: "/" when the source's shard keys are v2 "."-joined ones (``0.1`` at the
        array root), "." when they are v2 "/"-joined ones (the source's ``0/`` directories
        hold shards), otherwise "/" if ``nested`` (the ``c`` prefix never looks like a chunk
        key) and "." if not. 0-D arrays have the single key ``0`` either way (".")."""
        if self.ndim == 0:
            return "."
        if self.kind == "v2":
            return "/" if self.separator == "." else "."
        return "/" if self.nested else "."

    def is_prefix(self, key: str) -> bool:
        """True if ``key`` names a directory that can hold keys (e.g. ``c/0``)."""
        if self.separator != "/":
            return False
        parts = key.split("/")
        if self.kind == "default":
            if parts[0] != "c":
                return False
            parts = parts[1:]
        return len(parts) < self.ndim and all(parse_coord(p) is not None for p in parts)


@dataclass(frozen=True)
class ArrayLayout:
    """Shape, inner chunk shape and shard shape of an array (unsharded: index is None).

    With nested sharding ``chunk_shape`` is the innermost chunk shape and
    ``index`` a ``NestedFormat``; positions in a shard are always C-order
    positions in its grid of innermost chunks. Shapes are in array space;
    ``order`` (a transpose before the sharding codec, a permutation of the
    dimensions; None if there is none) says how the index's grid is permuted: positions are C-order in
    ``permuted(chunks_per_shard, order)``.
    """

    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    shard_shape: tuple[int, ...]
    index: ShardFormat | None
    keys: KeyScheme
    order: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if any(c <= 0 for c in self.chunk_shape) or any(
            s % c for s, c in zip(self.shard_shape, self.chunk_shape)
        ):
            raise Unpresentable(
                f"inner chunk shape {self.chunk_shape} does not divide shard shape {self.shard_shape}"
            )
        n = int(np.prod([max(g, 1) for g in self.chunk_grid], dtype=object))
        if n > MAX_CHUNKS:
            raise Unpresentable(f"{n} inner chunks exceed the supported {MAX_CHUNKS}")

    @cached_property
    def ndim(self) -> int:
        return len(self.shape)

    @cached_property
    def names(self) -> KeyScheme:
        """The view's names of chunk files and inner shard directories: coordinates joined
        with "." ("0" for 0-D). Used in shard directories, and at the array root unless
        ``keys.view_separator`` is "/" (then the root holds one directory level per coordinate)."""
        return KeyScheme("v2", ".", self.ndim)

    @cached_property
    def chunks_per_shard(self) -> tuple[int, ...]:
        return tuple(s // c for s, c in zip(self.shard_shape, self.chunk_shape))

    @cached_property
    def chunk_grid(self) -> tuple[int, ...]:
        """Number of inner chunks along each dimension (the v2 chunk grid)."""
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunk_shape))

    @cached_property
    def shard_grid(self) -> tuple[int, ...]:
        return tuple(-(-s // c) for s, c in zip(self.shape, self.shard_shape))

    @cached_property
    def spans(self) -> tuple[tuple[int, ...], ...]:
        """Inner chunks per shard, then per nested inner shard of each level, outermost first."""
        out = [self.chunks_per_shard]
        fmt = self.index
        while isinstance(fmt, NestedFormat):
            fmt = fmt.inner
            out.append(self._array_space(fmt.chunks_per_shard))
        return tuple(out)

    @cached_property
    def index_grid(self) -> tuple[int, ...]:
        """The grid of inner chunks that a shard's index covers, in the index's (transposed) space."""
        return self._index_space(self.chunks_per_shard)

    def _index_space(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape if self.order is None else permuted(shape, self.order)

    def _array_space(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape if self.order is None else unpermuted(shape, self.order)

    @property
    def depth(self) -> int:
        """Levels of nested inner shards (0 without nested sharding)."""
        return len(self.spans) - 1

    def box(self, coords: tuple[int, ...], level: int) -> tuple[int, ...]:
        """Coordinates of the shard (level 0) or nested inner shard (level >= 1) holding
        inner chunk ``coords``, in that level's grid over the whole array."""
        return tuple(c // n for c, n in zip(coords, self.spans[level]))

    def box_origin(self, box: tuple[int, ...], level: int) -> tuple[int, ...]:
        """The first inner chunk of shard (level 0) or nested inner shard ``box``."""
        return tuple(b * n for b, n in zip(box, self.spans[level]))

    def in_grid(self, coords: tuple[int, ...]) -> bool:
        if len(coords) != self.ndim:
            return False
        for c, g in zip(coords, self.chunk_grid):  # a loop: every lookup asks, a generator costs more
            if not 0 <= c < g:
                return False
        return True

    def shard_in_grid(self, coords: tuple[int, ...]) -> bool:
        return len(coords) == self.ndim and all(0 <= c < g for c, g in zip(coords, self.shard_grid))

    def linear(self, coords: tuple[int, ...]) -> int:
        """Position of an inner chunk in the C-order chunk grid (its inode offset)."""
        return c_linear(coords, self.chunk_grid)

    def coords(self, linear: int) -> tuple[int, ...]:
        """Inverse of ``linear``."""
        return c_coords(linear, self.chunk_grid)

    def locate(self, coords: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        """``(shard coords, position in the shard's index)`` of an inner chunk."""
        shard, local = [], []
        for c, n in zip(coords, self.chunks_per_shard):  # every lookup and open asks: plain loops
            q, r = divmod(c, n)
            shard.append(q)
            local.append(r)
        pos = 0
        for c, n in zip(local if self.order is None else permuted(tuple(local), self.order), self.index_grid):
            pos = pos * n + c
        return tuple(shard), pos

    def chunks_at(self, shard: tuple[int, ...] | np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Inverse of ``locate`` for many index positions of one shard (or of many: ``shard``
        an ``(n, ndim)`` array, the shard of each position).

        Returns the global coordinates, an ``(n, ndim)`` int64 array, and a boolean
        mask of the rows that lie inside the array (edge shards hold chunks past it).
        """
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        if self.ndim:
            local = np.stack(np.unravel_index(positions, self.index_grid), axis=-1).astype(np.int64)
        else:  # a 0-d array: its one chunk, at position 0, has no coordinates
            local = np.zeros((len(positions), 0), dtype=np.int64)
        if self.order is not None:
            local = local[:, np.argsort(self.order)]
        origin = np.array(shard, dtype=np.int64) * np.array(self.chunks_per_shard, dtype=np.int64)
        coords = local + origin
        return coords, np.all(coords < np.array(self.chunk_grid, dtype=np.int64), axis=1)

    def chunk_at(self, shard: tuple[int, ...], pos: int) -> tuple[int, ...] | None:
        """Inverse of ``locate``; None when that inner chunk lies past the array edge."""
        coords, inside = self.chunks_at(shard, np.array([pos]))
        return tuple(coords[0].tolist()) if inside[0] else None

    def inner_shard_at(self, shard: tuple[int, ...], pos: int) -> tuple[int, ...]:
        """The first-level nested inner shard at ``pos`` of a shard's index over its inner
        shards, in that level's grid over the whole array (as ``box(..., 1)``)."""
        per = tuple(a // b for a, b in zip(self.spans[0], self.spans[1]))
        return tuple(s * n + c for s, n, c in zip(shard, per, self._local(pos, per)))

    def _local(self, pos: int, grid: tuple[int, ...]) -> tuple[int, ...]:
        """Array-space coordinates of C-order position ``pos`` in the index-space form of ``grid``."""
        local = []
        for n in reversed(self._index_space(grid)):
            pos, c = divmod(pos, n)
            local.append(c)
        return self._array_space(tuple(reversed(local)))


def c_linear(coords: tuple[int, ...], grid: tuple[int, ...]) -> int:
    """Position of ``coords`` in ``grid`` in C order (plain loops: lookups and opens ask,
    and numpy's per-call cost is larger than the work)."""
    n = 0
    for c, g in zip(coords, grid):
        n = n * g + c
    return n


def c_coords(linear: int, grid: tuple[int, ...]) -> tuple[int, ...]:
    """Inverse of ``c_linear``."""
    out = []
    for g in reversed(grid):
        linear, c = divmod(linear, g)
        out.append(c)
    return tuple(reversed(out))
