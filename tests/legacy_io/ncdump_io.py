"""Debian's netCDF-C 4.9 (``ncdump`` from ``netcdf-bin``) reading Zarr v2 through NCZarr.

``argv[1]``: a JSON list of ``{"op": "read", "group": DIR, "array": NAME}`` jobs; prints a JSON
list of results: ``shape``, ``dtype`` (numpy ``str``), ``nodata`` (the ``_FillValue`` attribute
ncdump shows, None without one) and ``data`` (C-order bytes, base64), or ``{"error": ...}``.
ncdump prints an element equal to the fill value as ``_``: it is read back as that value.
Runs under the test venv's Python; only ``ncdump`` itself is Debian's.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys

import numpy as np

TYPES = {"byte": "|i1", "ubyte": "|u1", "short": "<i2", "ushort": "<u2", "int": "<i4", "uint": "<u4",
         "int64": "<i8", "uint64": "<u8", "float": "<f4", "double": "<f8"}
_NUMBER_SUFFIX = re.compile(r"(?<=[0-9.])(b|ub|s|us|u|ll|ull|f)$", re.IGNORECASE)


def _value(word: str) -> float | int:
    word = _NUMBER_SUFFIX.sub("", word.strip())
    if word in ("NaN", "NaNf", "nan"):
        return float("nan")
    return float(word) if any(c in word for c in ".eE") or "inf" in word.lower() else int(word)


def _read(job: dict) -> dict:
    url = f"file://{job['group']}#mode=zarr,file"
    r = subprocess.run(["ncdump", "-v", job["array"], "-p", "9,17", url], capture_output=True, text=True,
                       timeout=120, check=False)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"ncdump {r.returncode}")
    text = r.stdout
    dims = {n: int(v) for n, v in re.findall(r"^\s+(\S+) = (\d+) ;", text.split("variables:")[0], re.MULTILINE)}
    decl = re.search(rf"^\s+(\w+) {re.escape(job['array'])}\(([^)]*)\) ;", text, re.MULTILINE)
    if decl is None or decl.group(1) not in TYPES:
        raise RuntimeError(f"no numeric variable {job['array']} in ncdump's header")
    dtype = np.dtype(TYPES[decl.group(1)])
    shape = [dims[d.strip()] for d in decl.group(2).split(",")]
    fill = re.search(rf"^\s+{re.escape(job['array'])}:_FillValue = ([^;]+) ;", text, re.MULTILINE)
    nodata = _value(fill.group(1)) if fill else None
    body = text.split("data:", 1)[1]
    body = body[body.index(f" {job['array']} =") + len(job["array"]) + 3:body.rindex(";")]
    words = [w for w in re.split(r"[,\s]+", body) if w]
    values = np.array([nodata if w == "_" else _value(w) for w in words], dtype=dtype).reshape(shape)
    return {"shape": shape, "dtype": dtype.str, "nodata": nodata,
            "data": base64.b64encode(values.tobytes()).decode()}


def main() -> None:
    results = []
    for job in json.loads(sys.argv[1]):
        try:
            results.append(_read(job))
        except Exception as e:  # noqa: BLE001 - report what ncdump refused, job by job
            results.append({"error": f"{type(e).__name__}: {e}"})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
