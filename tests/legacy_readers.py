"""The Zarr v2 clients outside Python's zarr, as the tests drive them (tests/test_legacy_readers.py).

- GDAL 3.6 (Debian ``gdal-bin python3-gdal``): ``legacy_io/gdal_io.py`` under the system
  ``/usr/bin/python3``, and the ``gdal_translate`` CLI;
- libnetcdf 4.10 (PyPI ``netCDF4`` wheel in ``.venv``): ``legacy_io/netcdf_io.py`` in a process
  of its own; Debian's netCDF-C 4.9 (``ncdump``, ``netcdf-bin``): ``legacy_io/ncdump_io.py``;
- zarr.js 0.6 (npm ``zarr``, installed in ``tests/js`` by scripts/install): ``js/zarrjs.mjs``.

Each runs a list of jobs in one process and answers one dict per job (``{"error": ...}`` for
what the client refused); ``decode`` turns a read into a numpy array. ``outcome`` classifies a
read against the oracle (zarr-python 3 reading the v3 source): ``ok``, ``wrong`` (read
without complaint, other values) or ``error``.
"""

from __future__ import annotations

import base64
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's python3-gdal installs osgeo for it alone
JS_DIR = HERE / "js"
CLIENTS = ("gdal", "netcdf", "ncdump", "zarrjs")


def missing(client: str) -> str | None:
    """Why ``client`` cannot run here (scripts/install installs all three), None if it can."""
    if client == "gdal":
        probe = subprocess.run([SYSTEM_PYTHON, "-c", "from osgeo import gdal"], capture_output=True, check=False)
        return None if probe.returncode == 0 and shutil.which("gdal_translate") else \
            "GDAL (Debian gdal-bin python3-gdal) is not installed"
    if client == "netcdf":
        try:
            import netCDF4  # noqa: F401
        except ImportError:
            return "netCDF4 (PyPI) is not installed in this venv"
        return None
    if client == "ncdump":
        return None if shutil.which("ncdump") else "ncdump (Debian netcdf-bin) is not installed"
    if shutil.which("node") is None or not (JS_DIR / "node_modules" / "zarr").is_dir():
        return "zarr.js (npm zarr in tests/js: scripts/install) is not installed"
    return None


def require(client: str) -> None:
    reason = missing(client)
    if reason:
        pytest.skip(reason)


def run(client: str, jobs: list[dict], zstd: bool = False, timeout: float = 300) -> list[dict]:
    """Run ``jobs`` with ``client``; one result dict per job. ``zstd``: zarr.js registers
    numcodecs.js's zstd codec first."""
    if not jobs:
        return []
    arg = json.dumps(jobs)
    if client == "gdal":
        cmd = [SYSTEM_PYTHON, str(HERE / "legacy_io" / "gdal_io.py"), arg]
    elif client in ("netcdf", "ncdump"):
        cmd = [sys.executable, str(HERE / "legacy_io" / f"{client}_io.py"), arg]
    else:
        cmd = ["node", str(JS_DIR / "zarrjs.mjs"), *(["--zstd"] if zstd else []), arg]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False,
                       cwd=JS_DIR if client == "zarrjs" else None)
    assert r.returncode == 0, f"{client} died ({r.returncode}): {r.stderr[-2000:]}"
    results = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(results) == len(jobs), (client, r.stdout[-2000:])
    return results


def read_jobs(client: str, group: Path, array: str) -> dict:
    """The read job of ``client`` for array ``array`` of the v2 group at ``group``."""
    if client == "zarrjs":
        return {"op": "read", "array": str(group / array)}
    return {"op": "read", "group": str(group), "array": array}


def create_job(client: str, group: Path, array: str, data: np.ndarray, chunks, nodata=None) -> dict:
    """The job of ``client`` creating array ``array`` in ``group`` and writing ``data``."""
    job = {"op": "create", "dtype": data.dtype.str, "shape": list(data.shape), "chunks": list(chunks),
           "data": base64.b64encode(np.ascontiguousarray(data).tobytes()).decode(), "nodata": nodata}
    if client == "zarrjs":
        return {**job, "array": str(group / array)}
    return {**job, "group": str(group), "array": array}


def decode(result: dict, key: str = "data") -> np.ndarray:
    """The values a successful read returned, as numpy."""
    if "strings" in result:
        return np.array(result["strings"], dtype=object).reshape(result["shape"])
    dtype = np.dtype(result.get("native") or result["dtype"])
    return np.frombuffer(base64.b64decode(result[key]), dtype=dtype).reshape(result["shape"])


def same_values(got: np.ndarray, expected: np.ndarray) -> bool:
    """Equal shape and values (compared as values across dtypes; NaN equals NaN)."""
    if got.shape != expected.shape:
        return False
    if got.dtype.kind in "fc" and expected.dtype.kind in "fc":
        return bool(np.array_equal(got, expected, equal_nan=True))
    if got.dtype.kind in "OUS" or expected.dtype.kind in "OUS":  # strings: GDAL gives str for bytes too
        def text(values: np.ndarray) -> list:
            return [v.decode() if isinstance(v, bytes) else v for v in values.ravel().tolist()]
        return text(got) == text(expected)
    if expected.dtype.kind in "mM":
        expected = expected.view("i8")
        got = got.view("i8") if got.dtype.kind in "mM" else got
    return bool(np.array_equal(got, expected))


def outcome(result: dict, expected: np.ndarray) -> str:
    """``error`` (the client refused), ``ok`` (the oracle's values) or ``wrong``."""
    if "error" in result:
        return "error"
    return "ok" if same_values(decode(result), expected) else "wrong"


def same_fill(a: Any, b: Any) -> bool:
    """Two fill values / nodata values are the same (NaN equals NaN; "NaN" spells NaN)."""
    if a is None or b is None:
        return a is b
    a, b = (float("nan") if v == "NaN" else v for v in (a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return complex(a) == complex(b)
    except (TypeError, ValueError):
        return a == b
