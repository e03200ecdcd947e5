"""Benchmark clients: each measured operation runs here, in its own process.

Run as ``PYTHON clients.py COMMAND ARGS...``, with ``.venv/bin/python`` (zarr 3,
tensorstore, dask) or ``.venv-zarr2/bin/python`` (zarr-python 2.18). Every
command prints one JSON object on stdout. Times are measured inside the
process around the operation alone (after imports and input loading), so
interpreter start-up does not dilute the comparison.

Only numpy and the library under test are imported, and only by the command
that needs it, so this file works in both environments.

Object storage: where a command takes an ``ENDPOINT`` after its path, a path
``s3://BUCKET/PREFIX`` names the array stored at PREFIX, read at ENDPOINT (plain
HTTP) with the credentials and region in ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_REGION``: zarr 3 through its ``ObjectStore``
over obstore's ``S3Store``, zarr 2.18 through ``FSStore`` (fsspec's s3fs).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable


def _checksum(a) -> int:
    import numpy as np

    return int(np.asarray(a).sum(dtype=np.uint64))


def _open_array(path: str, endpoint: str | None):
    """``zarr.open_array(path, mode="r")``, or the array at ``s3://BUCKET/PREFIX`` on ``endpoint``."""
    import zarr

    if not path.startswith("s3://"):
        return zarr.open_array(path, mode="r")
    env = os.environ
    if zarr.__version__.startswith("2."):
        store = zarr.storage.FSStore(path, mode="r", key=env["AWS_ACCESS_KEY_ID"],  # type: ignore[attr-defined]  # zarr 2.18 (.venv-zarr2)
                                     secret=env["AWS_SECRET_ACCESS_KEY"],
                                     client_kwargs={"endpoint_url": endpoint, "region_name": env["AWS_REGION"]})
        return zarr.open_array(store, mode="r")
    from obstore.store import S3Store
    from zarr.storage import ObjectStore

    bucket, _, prefix = path[len("s3://"):].partition("/")
    s3 = S3Store(bucket, prefix=prefix or None, client_options={"allow_http": True},
                 config={"endpoint": endpoint, "region": env["AWS_REGION"],
                         "access_key_id": env["AWS_ACCESS_KEY_ID"], "secret_access_key": env["AWS_SECRET_ACCESS_KEY"]})
    return zarr.open_array(ObjectStore(s3, read_only=True), mode="r")


def zarr_read(path: str, endpoint: str | None = None) -> dict:
    """Read a whole array with whichever zarr-python this interpreter has (v2 or v3 metadata)."""
    import zarr

    t0 = time.perf_counter()
    arr = _open_array(path, endpoint)
    data = arr[...]
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "sum": _checksum(data), "shape": list(data.shape),
            "zarr": zarr.__version__}


def zarr_read_part(path: str, part: str, parts: str) -> dict:
    """One of ``parts`` concurrent readers: after imports it prints ``ready`` and waits for a line on
    stdin (so all readers start together), then opens the array and reads slab ``part`` of ``parts``
    along axis 0, split on chunk boundaries (``parts`` = 1: the whole array). Times are wall-clock
    (``time.time``) so the caller can span all readers."""
    import zarr

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    t0 = time.time()
    arr = zarr.open_array(path, mode="r")
    rows = -(-arr.shape[0] // arr.chunks[0])
    k, n = int(part), int(parts)
    lo, hi = k * rows // n * arr.chunks[0], (k + 1) * rows // n * arr.chunks[0]
    data = arr[lo:hi]
    t1 = time.time()
    return {"start": t0, "end": t1, "seconds": t1 - t0, "sum": _checksum(data)}


def ts_read(path: str, driver: str) -> dict:
    """Read a whole array with tensorstore (``zarr`` = v2 driver, ``zarr3`` = native)."""
    import tensorstore as ts

    t0 = time.perf_counter()
    store = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": path},
                     "context": {"cache_pool": {"total_bytes_limit": 0}}}, read=True).result()
    data = store.read().result()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "sum": _checksum(data), "shape": list(data.shape)}


def zarr_chunks(path: str, listfile: str, endpoint: str | None = None) -> dict:
    """Open an array once, then read the chunks listed (one chunk's grid coordinates a line,
    space-separated) one at a time, each as its own ``arr[region]``; per-chunk latencies in seconds."""
    import numpy as np

    with open(listfile) as f:
        coords = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    t_all = time.perf_counter()
    arr = _open_array(path, endpoint)
    lat, total = [], 0
    for c in coords:
        region = tuple(slice(i * n, (i + 1) * n) for i, n in zip(c, arr.chunks))
        t0 = time.perf_counter()
        total += int(np.asarray(arr[region]).sum(dtype=np.uint64))
        lat.append(time.perf_counter() - t0)
    return {"seconds": time.perf_counter() - t_all, "latencies": lat, "sum": total}


def zarr_write(path: str, npy: str) -> dict:
    """Write a whole array (already created, empty) from an .npy file."""
    import numpy as np
    import zarr

    data = np.load(npy)
    t0 = time.perf_counter()
    arr = zarr.open_array(path, mode="r+")
    arr[...] = data
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "zarr": zarr.__version__}


def dask_read(path: str, threads: str, block: str) -> dict:
    """Sum the first half (along axis 0) of a v2 array with dask's threaded scheduler,
    ``block`` chunk files per task along each axis. zarr's own async concurrency is set to 1,
    so each dask thread is one reader reading one chunk file at a time: ``threads`` is the
    number of concurrent readers."""
    import dask
    import dask.array as da
    import zarr

    zarr.config.set({"async.concurrency": 1})
    t0 = time.perf_counter()
    arr = zarr.open_array(path, mode="r")
    x = da.from_array(arr, chunks=tuple(c * int(block) for c in arr.chunks), asarray=True, lock=False)
    x = x[: -(-arr.shape[0] // 2)]  # the first half: enough to see scaling, half the time
    with dask.config.set(scheduler="threads", num_workers=int(threads)):
        total = int(x.sum(dtype="uint64").compute())
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "sum": total, "tasks": int(x.npartitions)}


def _read_file(path: str) -> int:
    """open + read to EOF (1 MiB reads) + close; the number of bytes read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        got = 0
        while b := os.read(fd, 1 << 20):
            got += len(b)
        return got
    finally:
        os.close(fd)


def random_reads(directory: str, listfile: str) -> dict:
    """open + read to EOF + close each listed file once; per-file latencies in seconds."""
    with open(listfile) as f:
        names = [line.rstrip("\n") for line in f if line.strip()]
    lat = []
    nbytes = 0
    t_all = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        nbytes += _read_file(os.path.join(directory, name))
        lat.append(time.perf_counter() - t0)
    return {"seconds": time.perf_counter() - t_all, "latencies": lat, "bytes": nbytes}


def reopen(path: str, calls: str) -> dict:
    """open + read to EOF + close one file ``calls`` times in a row (after one untimed call)."""
    n = int(calls)
    nbytes = _read_file(path)
    t0 = time.perf_counter()
    for _ in range(n):
        _read_file(path)
    return {"seconds": time.perf_counter() - t0, "calls": n, "bytes": nbytes}


COMMANDS: dict[str, Callable[..., dict[str, Any]]] = {
    "zarr_read": zarr_read, "zarr_read_part": zarr_read_part, "zarr_chunks": zarr_chunks, "ts_read": ts_read,
    "zarr_write": zarr_write, "dask_read": dask_read, "random_reads": random_reads, "reopen": reopen}


def main() -> None:
    cmd, *args = sys.argv[1:]
    result = COMMANDS[cmd](*args)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
