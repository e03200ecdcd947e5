"""Chunk arithmetic and v2 chunk bytes, for the worker processes (numpy + numcodecs only).

``Grid(meta)`` is built from an array's v2 ``.zarray`` (as a dict): ``chunks_of(region)`` lists
the inner chunks a region touches with the part of the region each covers, ``key(chunk)`` is
the chunk's v2 key (with the array's ``dimension_separator``; ``chunk_named`` reads it back out of
an error message), ``encode(token)`` is the bytes a
v2 writer would store for a chunk filled with ``token`` (filters, then compressor, in the
array's memory order; a string array's values are ``value(token)``, read back by ``token_of``;
a blosc array's odd tokens stored uncompressed, ``uncompressed``),
``chunk_region(chunk)`` is the chunk's box clipped to the array.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Iterator

import numcodecs
import numpy as np

Region = tuple[slice, ...]
STRING_MARK = "ß"  # a string chunk's value is this and its token (Grid.value)


class Grid:
    """The v2 chunk grid of one array (see the module docstring)."""

    def __init__(self, meta: dict[str, Any]):
        self.shape = tuple(meta["shape"])
        self.chunks = tuple(meta["chunks"])
        self.dtype = np.dtype(meta["dtype"])
        self.order = meta.get("order", "C")
        self.sep = meta.get("dimension_separator") or "."
        self.filters = [numcodecs.get_codec(f) for f in meta.get("filters") or []]
        self.compressor = numcodecs.get_codec(meta["compressor"]) if meta.get("compressor") else None
        # A blosc array's odd tokens are stored as they are (``clevel`` 0: a frame every reader
        # decodes, of another size). A chunk filled with one value compresses to one size whatever
        # the value, so without it a chunk's versions would all have one size, and readers of a
        # chunk renamed onto meanwhile would never meet two (a file read with direct I/O gave the
        # new version's size to ``fstat`` and read the old one's bytes: not seen by this soak).
        blosc = meta.get("compressor") or {}
        self.uncompressed = numcodecs.get_codec({**blosc, "clevel": 0}) if blosc.get("id") == "blosc" else None

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunks))

    def all_chunks(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*(range(n) for n in self.grid)))

    def key(self, chunk: tuple[int, ...]) -> str:
        return self.sep.join(map(str, chunk))

    def chunk_named(self, text: str, array: str) -> tuple[int, ...] | None:
        """The chunk whose file ``.../ARRAY/KEY`` an error message names, if it names one."""
        m = re.search(rf"/{re.escape(array)}/([0-9]+(?:{re.escape(self.sep)}[0-9]+)*)(?![0-9.])", text)
        if m is None:
            return None
        chunk = tuple(int(i) for i in m.group(1).split(self.sep))
        return chunk if len(chunk) == len(self.shape) else None

    def chunk_region(self, chunk: tuple[int, ...]) -> Region:
        return tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(chunk, self.chunks, self.shape))

    def chunks_of(self, region: Region) -> Iterator[tuple[tuple[int, ...], Region]]:
        """Each chunk touched by ``region`` with its part, relative to the region's origin."""
        ranges = [range(r.start // c, -(-r.stop // c)) for r, c in zip(region, self.chunks)]
        for chunk in itertools.product(*ranges):
            box = self.chunk_region(chunk)
            yield chunk, tuple(slice(max(b.start, r.start) - r.start, min(b.stop, r.stop) - r.start)
                               for b, r in zip(box, region))

    @property
    def strings(self) -> bool:
        """A string array (``|O`` with the ``vlen-utf8`` filter): its values are ``value(token)``."""
        return self.dtype == object

    def value(self, token: int) -> Any:
        """What a chunk filled with ``token`` holds: the token, or for strings ``"ß<token>"``
        (non-ASCII, a length that varies; the fill, token 0, is ``""``)."""
        if not self.strings:
            return token
        return f"{STRING_MARK}{token}" if token else ""

    def encode(self, token: int) -> bytes:
        data = np.full(self.chunks, self.value(token), dtype=self.dtype)
        buf: Any = np.ascontiguousarray(data) if self.order == "C" else np.asfortranarray(data)
        if not self.strings:  # an object array goes to its vlen filter as it is
            buf = buf.tobytes(order=self.order)
        for f in self.filters:
            buf = f.encode(buf)
        if self.compressor is not None:
            buf = (self.uncompressed if token % 2 and self.uncompressed else self.compressor).encode(buf)
        return bytes(buf)


def tokens_by_chunk(grid: Grid, region: Region, values: np.ndarray) -> list[list[Any]]:
    """``[[*chunk, *sorted distinct values]]`` for every chunk ``values`` (read at ``region``) touches
    (strings as their tokens: ``token_of``)."""
    out = []
    for chunk, part in grid.chunks_of(region):
        if grid.strings:
            distinct = sorted({token_of(v) for v in values[part].ravel().tolist()}, key=repr)
        else:
            distinct = [v.item() for v in np.unique(values[part])]
        out.append([*chunk, *distinct])
    return out


def token_of(value: Any) -> int | str:
    """The token a string value stands for (``Grid.value``'s inverse; ``""`` and None, a v2
    reader's fill, are 0, and so is the 0 of the zeros zarr 2.18 reads into, where it left a
    chunk's part as it was: ``readers._zarr2``); anything else is returned as a string, which no
    check allows."""
    if value is None or value == "" or (type(value) is int and value == 0):
        return 0
    m = re.fullmatch(rf"{STRING_MARK}([0-9]+)", value) if isinstance(value, str) else None
    return int(m.group(1)) if m else f"not a token: {value!r}"[:80]


def owner(array: str, chunk: tuple[int, ...], mounts: int) -> int:
    """Which mount's writers write ``chunk`` of ``array`` (the others' readers only check it loosely)."""
    return (sum(chunk) + sum(map(ord, array))) % mounts


def pick_region(rng: Any, grid: Grid, shard: tuple[int, ...]) -> Region:
    """A region to read: a whole shard (30%), one inner chunk (20%) or a random box (50%)."""
    roll = rng.random()
    if roll < 0.3:
        idx = [rng.randrange(-(-s // h)) for s, h in zip(grid.shape, shard)]
        return tuple(slice(i * h, min((i + 1) * h, s)) for i, h, s in zip(idx, shard, grid.shape))
    if roll < 0.5:
        return grid.chunk_region(rng.choice(grid.all_chunks()))
    box = []
    for s in grid.shape:
        a = rng.randrange(s)
        box.append(slice(a, rng.randrange(a + 1, s + 1)))
    return tuple(box)
