"""GDAL 3.6 (Debian ``python3-gdal``, the Zarr driver) reading and writing Zarr v2 arrays.

Run by tests/legacy_readers.py with the system ``/usr/bin/python3`` (where Debian puts
``osgeo``), never inside the test venv. ``argv[1]``: a JSON list of jobs; prints a JSON list
of results, one per job, ``{"error": "..."}`` for a job GDAL refused:

- ``{"op": "read", "group": DIR, "array": NAME}``: the multidimensional API
  (``OF_MULTIDIM_RASTER``, ``OpenMDArray``, ``ReadAsArray``) gives ``shape``, ``dtype`` (numpy
  ``str``), ``nodata`` (``GetNoDataValueAsDouble``; None when unset) and ``data`` (C-order
  bytes, base64; string arrays: ``strings``, a list); a 2-D array also through the classic
  raster API (``ZARR:"DIR":/NAME``, what ``gdalinfo`` prints as ``NoData Value``):
  ``band_nodata`` and ``band_data``;
- ``{"op": "create", "group": DIR, "array": NAME, "dtype": STR, "shape": [...],
  "chunks": [...], "data": BASE64, "nodata": X | null}``: ``CreateMDArray`` in the root group of
  ``DIR`` (opened in update mode; created first if it does not exist) and ``Write``.
"""

from __future__ import annotations

import base64
import os

import numpy as np
from osgeo import gdal, gdal_array
from jobs import run  # tests/legacy_io/jobs.py, beside this script

gdal.UseExceptions()


def _read(job: dict) -> dict:
    ds = gdal.OpenEx(job["group"], gdal.OF_MULTIDIM_RASTER)
    group = ds.GetRootGroup()
    arr = group.OpenMDArray(job["array"])
    if arr is None:
        raise RuntimeError(f"no array {job['array']}")
    out: dict = {"shape": [d.GetSize() for d in arr.GetDimensions()]}
    if arr.GetDataType().GetClass() == gdal.GEDTC_STRING:
        out["dtype"] = "str"
        out["strings"] = list(arr.Read())
    else:
        values = arr.ReadAsArray()
        out["dtype"] = values.dtype.str
        out["data"] = base64.b64encode(np.ascontiguousarray(values).tobytes()).decode()
    out["nodata"] = arr.GetNoDataValueAsDouble()
    del arr, group, ds  # children before their dataset: GDAL's bindings crash otherwise
    if len(out["shape"]) == 2 and "data" in out:
        raster = gdal.Open(f'ZARR:"{job["group"]}":/{job["array"]}')
        band = raster.GetRasterBand(1)
        out["band_nodata"] = band.GetNoDataValue()
        out["band_data"] = base64.b64encode(np.ascontiguousarray(band.ReadAsArray()).tobytes()).decode()
        del band, raster
    return out


def _create(job: dict) -> dict:
    if os.path.exists(job["group"]):
        ds = gdal.OpenEx(job["group"], gdal.OF_MULTIDIM_RASTER | gdal.OF_UPDATE)
    else:
        ds = gdal.GetDriverByName("Zarr").CreateMultiDimensional(job["group"])
    group = ds.GetRootGroup()
    dims = [group.CreateDimension(f"{job['array']}_d{i}", None, None, n) for i, n in enumerate(job["shape"])]
    dtype = np.dtype(job["dtype"])
    if dtype.kind in "SU":
        gdt = gdal.ExtendedDataType.CreateString(dtype.itemsize // (4 if dtype.kind == "U" else 1))
    else:
        gdt = gdal.ExtendedDataType.Create(gdal_array.NumericTypeCodeToGDALTypeCode(dtype))
    options = [f"BLOCKSIZE={','.join(map(str, job['chunks']))}"]
    arr = group.CreateMDArray(job["array"], dims, gdt, options)
    if job.get("nodata") is not None:
        arr.SetNoDataValueDouble(float(job["nodata"]))
    values = np.frombuffer(base64.b64decode(job["data"]), dtype=dtype).reshape(job["shape"])
    if arr.Write(values) != gdal.CE_None:
        raise RuntimeError("Write failed")
    del arr, group, ds  # closing the dataset flushes the chunks and the metadata
    return {"ok": True}


if __name__ == "__main__":
    run({"read": _read, "create": _create})
