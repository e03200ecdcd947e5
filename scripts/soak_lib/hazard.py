"""The zarr-python #3682 pattern: dask ``da.store(..., lock=False)`` of an array whose dask chunks
are inner chunks smaller than its shards, from several processes with 8 threads each.

As a script (``python hazard.py PATH LIB PART PARTS THREADS``, under zarr 2.18's venv for
``zarr2`` through a mount, or the main venv for ``zarr3`` on a v3 array natively): process
``PART`` of ``PARTS`` stores the dask blocks ``(i, j)`` with ``(i + j) % PARTS == PART`` of
``expected(shape)`` into the array at PATH, on the threaded scheduler with ``THREADS`` workers,
``lock=False``; blocks of one shard go to different processes and threads at once.

In the controller, ``store_everywhere(path, python, lib, ...)`` runs the processes at once and
``lost_fraction(values)`` is the share of values that differ from ``expected`` afterwards.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np


def expected(shape: tuple[int, ...]) -> np.ndarray:
    """Distinct non-zero values (exact in float32)."""
    return (np.arange(int(np.prod(shape)), dtype="float64") % 1_000_003 + 1).reshape(shape).astype("float32")


def lost_fraction(values: np.ndarray) -> float:
    want = expected(values.shape)
    return float(np.mean(values != want))


def store_everywhere(path: str, python: str, lib: str, parts: int, threads: int, env: dict[str, str],
                     timeout: float) -> list[str]:
    """Run the ``parts`` processes at once; the error output of those that failed."""
    procs = [subprocess.Popen([python, __file__, path, lib, str(p), str(parts), str(threads)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for p in range(parts)]
    errors = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            errors.append(f"hazard writer {p.pid} killed after {timeout:g} s")
            continue
        if p.returncode:
            errors.append(out[-2000:])
    return errors


def _main() -> None:
    import dask
    import dask.array as da
    import zarr

    path, lib, part, parts, threads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    z = zarr.open_array(path, mode="r+") if lib == "zarr2" else zarr.open_array(path, mode="r+", zarr_format=3)
    chunks = z.chunks  # zarr 3: the inner chunks of a sharded array
    data = da.from_array(expected(z.shape), chunks=chunks)
    sources, regions = [], []
    for idx in np.ndindex(*data.numblocks):
        if sum(idx) % parts == part:
            sources.append(data.blocks[idx])
            regions.append(tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, chunks, z.shape)))
    with dask.config.set(scheduler="threads", num_workers=threads):
        da.store(sources, [z] * len(sources), regions=regions, lock=False)  # type: ignore[list-item]  # a zarr array is a dask store target


if __name__ == "__main__":
    _main()
