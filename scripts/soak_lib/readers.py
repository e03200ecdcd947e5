"""The reader role: read random regions and whole shards through a mount, log what each chunk held.

``run_reader(worker)`` loops until the deadline: picks an array and a region (``grid.pick_region``),
reads it with the worker's ``lib`` (``zarr2``: zarr-python 2.18; ``zarr3``: zarr-python 3 with
``zarr_format=2``; ``tensorstore``: its ``zarr`` driver with a fresh context, no cache) opening the
array afresh for each read, and logs ``{"k": "r", "a", "m", "lib", "t0", "t1", "r"}`` (``r``: the
region, ``[start, stop]`` per axis, logged for a failed read too: the judge excuses a failure
only for a write of a chunk inside it) plus either
``c`` (``grid.tokens_by_chunk``: the distinct values in each chunk's part) or ``err``.
The config gives ``mount`` (this reader's mountpoint), ``m`` (its index) and ``arrays``
(name -> {"zarray": the v2 metadata, "shard": the shard shape in elements}).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from soak_lib.grid import Grid, Region, pick_region, tokens_by_chunk


def _zarr2(path: str, region: Region) -> np.ndarray:
    """Into zeros: zarr 2.18 decodes a chunk file read empty (an in-place write's ``O_TRUNC`` in
    flight) with gzip to nothing, without an error, leaving its part of the output as it was, and
    ``np.empty`` may hand out the memory of the previous read (another chunk's values)."""
    import zarr

    z = zarr.open_array(path, mode="r")
    shape = tuple(len(range(*r.indices(n))) for r, n in zip(region, z.shape))
    out = np.zeros(shape, dtype=z.dtype)
    z.get_basic_selection(region, out=out)  # type: ignore[arg-type]  # zarr 2.18's API (.venv-zarr2)
    return out


def _zarr3(path: str, region: Region) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(path, mode="r", zarr_format=2)[region])


def _tensorstore(path: str, region: Region) -> np.ndarray:
    import tensorstore as ts

    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": path}}
    return ts.open(spec, read=True, context=ts.Context()).result()[region].read().result()


READERS: dict[str, Callable[[str, Region], np.ndarray]] = {
    "zarr2": _zarr2, "zarr3": _zarr3, "tensorstore": _tensorstore}


def run_reader(worker: Any) -> None:
    cfg = worker.config
    read = READERS[cfg["lib"]]
    arrays = {name: (Grid(a["zarray"]), tuple(a["shard"])) for name, a in cfg["arrays"].items()}
    # tensorstore's zarr driver has no v2 vlen-utf8 (|O): it reads the other arrays only
    names = sorted(n for n in arrays if not (cfg["lib"] == "tensorstore" and arrays[n][0].strings))
    while worker.running():
        name = worker.rng.choice(names)
        grid, shard = arrays[name]
        region = pick_region(worker.rng, grid, shard)
        path = f"{cfg['mount']}/{name}"
        t0, t1, values, err = worker.timed(lambda: read(path, region))
        rec: dict[str, Any] = {"k": "r", "a": name, "m": cfg["m"], "lib": cfg["lib"], "t0": t0, "t1": t1,
                               "r": [[r.start, r.stop] for r in region]}
        if err is None:
            rec["c"] = tokens_by_chunk(grid, region, np.asarray(values))
        else:
            rec["err"], rec["msg"] = err, worker.detail
        worker.log(rec)
