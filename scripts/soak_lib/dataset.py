"""The soak's source: a v3 group of sharded arrays (several dtypes, codecs, shard shapes, nested
sharding, edge shards, strings), built with zarr-python 3 through testkit/v3.py's builders.

``build(root, rng, model)`` writes ``root`` (the group, ``scratch/`` for structure changes,
every array of ``ARRAYS`` with about half its inner chunks set to an initial token, recorded in
``model``, and the empty ``HAZARD`` array of the #3682 pattern) and returns the arrays by name.
Tokens 1..99999 are the initial ones (worker index 0; writers use ``index * 100000 + seq``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soak_lib.grid import Grid
from soak_lib.model import Model
from testkit import v3 as S  # codec JSON and v3 writers


@dataclass(frozen=True)
class ArraySpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    shard: tuple[int, ...]  # the shard shape (elements)
    chunk: tuple[int, ...]  # the innermost chunk shape: the v2 view's chunks
    codecs: tuple[dict[str, Any], ...]

    def doc(self) -> dict[str, Any]:
        return S.array_doc(self.shape, self.dtype, self.shard, list(self.codecs),
                           fill="" if self.dtype == "string" else 0)

    def grid(self) -> Grid:
        """Its v2 chunk grid (a ``string`` array is ``|O`` with the ``vlen-utf8`` filter in v2)."""
        strings = self.dtype == "string"
        return Grid({"shape": list(self.shape), "chunks": list(self.chunk), "dtype": "|O" if strings else self.dtype,
                     "filters": [{"id": "vlen-utf8"}] if strings else None})


ARRAYS = (
    # gzip, index at the end with crc32c, edge shards (40 = 2.5 shards)
    ArraySpec("i32gz", (48, 40), "int32", (16, 16), (8, 8), (S.sharding((8, 8), [S.LE, S.GZIP]),)),
    # 3-D zstd, index at the start
    ArraySpec("f64zs", (20, 20, 12), "float64", (10, 10, 6), (5, 5, 3),
              (S.sharding((5, 5, 3), [S.LE, S.ZSTD], index_location="start"),)),
    # raw big-endian chunks with a crc32c each, edge shards both ways
    ArraySpec("u32be", (33, 41), "uint32", (22, 16), (11, 8), (S.sharding((11, 8), [S.BE, S.CRC]),)),
    # nested sharding: inner shards of 8x8 holding 4x4 zstd chunks
    ArraySpec("f32nest", (32, 32), "float32", (16, 16), (4, 4), tuple(S.nested_codecs((8, 8), (4, 4), [S.LE, S.ZSTD]))),
    # transpose (v2 order F) + blosc
    ArraySpec("i64bl", (24, 24), "int64", (12, 12), (6, 6),
              (S.sharding((6, 6), [S.transpose((1, 0)), S.LE, S.blosc("lz4", 5, "shuffle", 8)]),)),
    # strings (v2: |O with the vlen-utf8 filter), chunk files of varying sizes, edge shards
    ArraySpec("strvl", (22, 20), "string", (8, 10), (4, 5), (S.sharding((4, 5), [{"name": "vlen-utf8"}, S.ZSTD]),)),
)
# The zarr-python #3682 pattern: dask chunks = inner chunks (16x16) of 128x128 shards.
HAZARD = ArraySpec("hazard", (256, 256), "float32", (128, 128), (16, 16), (S.sharding((16, 16), [S.LE, S.ZSTD]),))


def build(root: Path, rng: random.Random, model: Model) -> dict[str, ArraySpec]:
    """Write the source under ``root`` (see the module docstring)."""
    S.write_group(root)
    S.write_group(root / "scratch")
    token = 0
    for spec in ARRAYS:
        grid = spec.grid()
        regions = []
        for chunk in grid.all_chunks():
            if rng.random() < 0.5:
                token += 1
                regions.append((grid.chunk_region(chunk), grid.value(token)))
                model.initial(spec.name, chunk, token)
            else:
                model.initial(spec.name, chunk, 0)
        S.write_zarr3(root / spec.name, spec.doc(), regions)
    write_empty(root, HAZARD)
    return {spec.name: spec for spec in ARRAYS}


def write_empty(root: Path, spec: ArraySpec) -> None:
    """An array with no chunks stored."""
    S.write_zarr3(root / spec.name, spec.doc())
