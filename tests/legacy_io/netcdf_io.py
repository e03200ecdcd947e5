"""libnetcdf 4.10 (the PyPI ``netCDF4`` wheel, with its filter plugins) reading and writing
Zarr v2 through NCZarr, in a process of its own (a crash in the C library fails one job list,
not the test session).

``argv[1]``: a JSON list of jobs; prints a JSON list of results, one per job,
``{"error": "..."}`` for a job libnetcdf refused:

- ``{"op": "read", "group": DIR, "array": NAME}``: ``Dataset("file://DIR#mode=zarr,file")``
  (pure Zarr, file storage: the URL form of libnetcdf 4.10's NCZarr documentation), the
  variable's ``shape``, ``dtype`` (numpy ``str``), ``nodata`` (its fill value, which NCZarr
  takes from ``.zarray``'s ``fill_value``: ``get_fill_value``, None without one) and ``data``
  (unmasked C-order bytes, base64; strings and bytes: ``strings``, a list, bytes decoded);
- ``{"op": "create", "group": DIR, "array": NAME, "dtype": STR, "shape": [...],
  "chunks": [...], "data": BASE64, "nodata": X | null}``: a new dataset at ``DIR``
  (``mode=zarr,file``, so plain Zarr v2 without NCZarr's extra attributes) with one variable.
"""

from __future__ import annotations

import base64

import netCDF4
import numpy as np
from jobs import run  # tests/legacy_io/jobs.py, beside this script


def url(directory: str) -> str:
    return f"file://{directory}#mode=zarr,file"


def _read(job: dict) -> dict:
    with netCDF4.Dataset(url(job["group"])) as ds:
        var = ds.variables[job["array"]]
        var.set_auto_maskandscale(False)
        values = np.asarray(var[...])
        nodata = var.get_fill_value()
        out = {"shape": list(var.shape), "dtype": values.dtype.str,
               "nodata": None if nodata is None else _json(np.asarray(nodata).item())}
        if values.dtype.kind in "OSU":
            out["strings"] = [_json(v) for v in values.ravel().tolist()]
        else:
            out["data"] = base64.b64encode(np.ascontiguousarray(values).tobytes()).decode()
        return out


def _json(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _create(job: dict) -> dict:
    dtype = np.dtype(job["dtype"])
    with netCDF4.Dataset(url(job["group"]), "w") as ds:
        names = [f"{job['array']}_d{i}" for i in range(len(job["shape"]))]
        for name, n in zip(names, job["shape"]):
            ds.createDimension(name, n)
        var = ds.createVariable(job["array"], dtype, names, chunksizes=job["chunks"],
                                fill_value=job.get("nodata") if job.get("nodata") is not None else False)
        var[...] = np.frombuffer(base64.b64decode(job["data"]), dtype=dtype).reshape(job["shape"])
    return {"ok": True}


if __name__ == "__main__":
    run({"read": _read, "create": _create})
