"""Zarr v2 clients outside Python read and write through the mount what they read and write on a
real v2 copy (issue 23, items 5 and 7).

Clients (tests/legacy_readers.py): GDAL 3.6 (Zarr driver, multidimensional and classic raster
APIs, ``gdal_translate``), libnetcdf 4.10 (NCZarr, ``file://DIR#mode=zarr,file``), zarr.js 0.6
(and zarr.js with numcodecs.js's zstd registered, ``zarrjs+zstd``).

Reads: every case (a data type, a codec chain, a fill value, with or without dimension names)
is a v3 group holding one sharded array ``a``, written by zarr-python 3. Its v2 copy is written
by zarr-python 2.18 with the ``.zarray`` the mount shows. Each client reads the mount, the
copy and a ``-o c_order`` mount; the copy is the control for what the client itself cannot do
(``EXPECTED``: ``error`` = refuses, ``wrong`` = reads other values without complaint, as
netCDF-C does with ``"order": "F"``), the oracle is zarr-python 3 reading the source.
On the mount every client must do exactly what it does on the copy, with the same dtype, shape
and nodata, and nodata must be the source's fill value.

Writes: tests/test_legacy_writers.py. ``EXPECTED`` here and there is the client x data type x
(read, write) table of doc/SEMANTICS.md#legacy-readers.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass
from typing import Any

import legacy_readers as lr
import numpy as np
import pytest
from conftest import read_native, zarr2
from sources import (
    BE,
    GZIP,
    LE,
    ZSTD,
    array_doc,
    blosc,
    sharding,
    transpose,
    write_group,
    write_zarr3,
)

SHAPE, SHARD, INNER = (7, 10), (4, 8), (2, 4)  # edge shards and edge chunks in both dimensions
EMPTY = (slice(0, 2), slice(4, 8))  # one inner chunk left empty (all fill): absent in the shard


@dataclass(frozen=True)
class Case:
    """One array: numpy ``dtype``, v3 ``data_type`` JSON, inner codecs, fill, dimension names."""

    name: str
    dtype: str
    codecs: tuple[dict, ...] = (LE,)
    fill: Any = 0
    dims: bool = False
    data_type: Any = None

    def doc(self) -> dict:
        doc = array_doc(SHAPE, self.data_type or np.dtype(self.dtype).name, SHARD,
                        [sharding(INNER, list(self.codecs))], self.fill)
        if self.dims:
            doc["dimension_names"] = ["y", "x"]
        return doc

    @property
    def is_bytes(self) -> bool:
        """A bytes type (null_terminated_bytes, variable_length_bytes): its fill "" is base64."""
        return np.dtype(self.dtype).kind == "S" or self.data_type == "variable_length_bytes"

    def fill_scalar(self) -> Any:
        """The fill value as a numpy scalar of the case's dtype."""
        dt = np.dtype(self.dtype)
        if dt.kind in "USO":
            return b"" if self.is_bytes else ""
        if dt.kind == "M":
            return np.array(self.fill, dtype="i8").view(dt)[()]
        if dt.kind == "c":
            return dt.type(complex(*self.fill))
        return dt.type(float("nan") if self.fill == "NaN" else self.fill)

    def data(self) -> np.ndarray:
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        dt = np.dtype(self.dtype)
        if dt.kind == "b":
            d = rng.integers(0, 2, SHAPE).astype(bool)
            d[0, 0] = True
        elif dt.kind in "iu":
            d = rng.integers(1, 100, SHAPE).astype(dt)
        elif dt.kind == "M":
            d = (rng.integers(1, 10**9, SHAPE)).astype("i8").view(dt)
        elif dt.kind == "c":
            d = (rng.random(SHAPE) * 100 + 1j * rng.random(SHAPE)).astype(dt)
        elif dt.kind in "USO":  # names, as in string coordinates; the empty string among them
            most = dt.itemsize // 4 if dt.kind == "U" else dt.itemsize
            names = NAMES if dt.kind == "O" else [n for n in NAMES if len(n) <= most and n.isascii()]
            d = np.array([names[i] for i in rng.integers(0, len(names), math.prod(SHAPE))], dtype=object)
            d = d.reshape(SHAPE)
            if self.is_bytes:
                d = np.array([n.encode() for n in d.ravel()], dtype=object).reshape(SHAPE)
            if dt.kind != "O":
                d = d.astype(dt)
        else:
            d = (rng.random(SHAPE) * 100).astype(dt)
        d[EMPTY] = self.fill_scalar()
        return d


F32_BLOSC = blosc("lz4", 5, "shuffle", 4)
NAMES = ["Rome", "Oslo", "Lima", "Kyiv", "", "Ōsaka", "北京", "a𝄞b", "São Paulo"]
CASES = [
    Case("bool", "bool", fill=False),
    Case("int8", "int8", fill=7),
    Case("uint8", "uint8", fill=7),
    Case("int16", "int16", (LE, GZIP), fill=7),
    Case("int16_dims", "int16", (LE, blosc("zstd", 3, "bitshuffle", 2)), fill=7, dims=True),  # view: fill null
    Case("uint16", "uint16", fill=7),
    Case("int32", "int32", (LE, ZSTD), fill=7),
    Case("int32_be", "int32", (BE,), fill=7),
    Case("uint32", "uint32", fill=7),
    Case("int64", "int64", (LE, blosc("lz4", 5, "shuffle", 8)), fill=7),
    Case("uint64", "uint64", fill=7),
    Case("float16", "float16", fill=0),
    Case("float32", "float32", (LE, F32_BLOSC), fill=-9999.0),
    Case("float32_F", "float32", (transpose((1, 0)), LE), fill=-9999.0),  # "order": "F"
    Case("int32_F", "int32", (transpose((1, 0)), LE, ZSTD), fill=7),
    Case("float64", "float64", (LE, ZSTD), fill="NaN"),
    Case("float64_dims", "float64", (LE,), fill="NaN", dims=True),
    Case("complex64", "complex64", fill=[0.0, 0.0]),
    Case("datetime64", "datetime64[s]", fill=0,
         data_type={"name": "numpy.datetime64", "configuration": {"unit": "s", "scale_factor": 1}}),
    Case("utf32", "<U6", fill="", data_type={"name": "fixed_length_utf32", "configuration": {"length_bytes": 24}}),
    Case("bytes6", "|S6", ({"name": "bytes"},), fill="",
         data_type={"name": "null_terminated_bytes", "configuration": {"length_bytes": 6}}),
    Case("string", "O", ({"name": "vlen-utf8"}, ZSTD), fill="", data_type="string"),
    Case("vlen_bytes", "O", ({"name": "vlen-bytes"},), fill="", data_type="variable_length_bytes"),
]
READERS = ("gdal", "netcdf", "ncdump", "zarrjs", "zarrjs+zstd")

# What each client does with each case on a real v2 copy (zarr 2.18 wrote it): its own limits,
# established on the copy, then required of the mount. Anything not listed: "ok".
_NO_ZSTD = ("int32", "int32_F", "float64")  # zarr.js has no zstd codec unless one is registered
EXPECTED: dict[tuple[str, str], str] = {
    # GDAL 3.6: no complex fill value ([re, im]), no datetime64, no variable-length strings or bytes
    **{("gdal", n): "error" for n in ("complex64", "datetime64", "string", "vlen_bytes")},
    # libnetcdf 4.10: no bool, float16, complex, datetime64, "<U n" or variable-length type
    # ("|S n" is its string type); no "gzip" codec (only "zlib");
    # "order": "F" ignored (each chunk comes back transposed); the fill value of an absent chunk
    # of a big-endian array is byte-swapped
    **{("netcdf", n): "error" for n in ("bool", "float16", "complex64", "datetime64", "int16", "utf32",
                                         "string", "vlen_bytes")},
    ("netcdf", "float32_F"): "wrong", ("netcdf", "int32_F"): "wrong", ("netcdf", "int32_be"): "wrong",
    # Debian's netCDF-C 4.9 (ncdump): no compressor at all (it returns the compressed bytes as
    # values, silently), "order": "F" ignored, a big-endian array misread; crashes (SIGSEGV) on
    # bool, float16, complex, datetime64 and every string type
    **{("ncdump", n): "error" for n in ("bool", "float16", "complex64", "datetime64", "utf32", "bytes6",
                                         "string", "vlen_bytes")},
    **{("ncdump", n): "wrong" for n in ("int16", "int16_dims", "int32", "int32_be", "int64", "float32",
                                         "float32_F", "int32_F", "float64")},
    # zarr.js 0.6: no 64-bit integers, float16 (no Float16Array in node 20), complex, datetime64 or
    # string/bytes type; an absent chunk of a bool array fails (it cannot fill a chunk with false)
    **{(r, n): "error" for r in ("zarrjs", "zarrjs+zstd")
       for n in ("bool", "int64", "uint64", "float16", "complex64", "datetime64", "utf32", "bytes6", "string",
                 "vlen_bytes")},
    **{("zarrjs", n): "error" for n in _NO_ZSTD},
}
# On a -o c_order mount the transposed arrays are served raw in C order: netCDF-C reads them
# right, and zarr.js no longer needs zstd for them.
C_ORDER_FIXED = {("netcdf", "float32_F"), ("netcdf", "int32_F"), ("zarrjs", "int32_F"), ("ncdump", "float32_F"),
                 ("ncdump", "int32_F")}
# libnetcdf reports the fill value of a big-endian array byte-swapped (7 -> 117440512), on the copy
# too; ncdump 4.9 shows no _FillValue for NCZarr variables at all
NODATA_NOT_THE_FILL = {("netcdf", "int32_be"), *(("ncdump", c.name) for c in CASES)}


def _client(reader: str) -> str:
    return reader.split("+")[0]


# ------------------------------------------------------------------ the read fixture


def _copy_fill(case: Case) -> Any:
    """The case's fill value as zarr 2.18 takes it (``fill_value=``), through JSON."""
    if case.dtype == "complex64":
        return {"complex": case.fill}
    if case.dtype == "O":  # zarr 2 gives object arrays no fill (its JSON has none for bytes)
        return None
    return {"bytes": case.fill} if case.is_bytes else case.fill


@pytest.fixture(scope="module")
def reads(tmp_path_factory, module_mount):
    """``{(reader, where): [result per case]}`` for ``where`` in mount, copy, c_order; plus
    the oracle's arrays and fill values."""
    import zarr

    root = tmp_path_factory.mktemp("legacy")
    src, copy = root / "src", root / "v2"
    write_group(src)
    oracle, fills = {}, {}
    for case in CASES:
        write_group(src / case.name)
        write_zarr3(src / case.name / "a", case.doc(), [((...), case.data())])
        oracle[case.name] = read_native(src / case.name / "a")
        fills[case.name] = zarr.open_array(str(src / case.name / "a"), mode="r").fill_value
        if oracle[case.name].dtype.kind in "OT":  # zarr 3 reads variable-length strings as StringDType
            oracle[case.name] = np.array(oracle[case.name].tolist(), dtype=object)
        np.save(root / f"{case.name}.npy", oracle[case.name], allow_pickle=True)
    mnt = module_mount(src)
    c_mnt = module_mount(src, "-o", "c_order")
    # The control: the same data as zarr 2.18 writes it itself, with the codecs, chunks and order
    # the mount shows, the source's fill value, no empty chunk stored, consolidated.
    specs = [{"name": c.name, "zarray": json.loads((mnt / c.name / "a" / ".zarray").read_text()),
              "fill": _copy_fill(c), "dims": c.dims} for c in CASES]
    zarr2("""
        import numcodecs
        for spec in specs:
            z, fill, group = spec["zarray"], spec["fill"], f"{copy}/{spec['name']}"
            if isinstance(fill, dict):
                fill = complex(*fill["complex"]) if "complex" in fill else fill["bytes"].encode()
            elif fill == "NaN":
                fill = float("nan")
            zarr.open_group(group, mode="w")
            filters = [numcodecs.get_codec(f) for f in z["filters"] or ()]
            vlen = [f for f in filters if f.codec_id in ("vlen-utf8", "vlen-bytes")]  # zarr 2's object_codec
            a = zarr.open_array(f"{group}/a", mode="w", shape=z["shape"], chunks=z["chunks"], dtype=z["dtype"],
                                compressor=numcodecs.get_codec(z["compressor"]) if z["compressor"] else None,
                                filters=[f for f in filters if f not in vlen] or None,
                                object_codec=vlen[0] if vlen else None,
                                fill_value=fill, order=z["order"], dimension_separator=z["dimension_separator"],
                                write_empty_chunks=False)
            if spec["dims"]:
                a.attrs["_ARRAY_DIMENSIONS"] = ["y", "x"]
            a[...] = np.load(f"{root}/{spec['name']}.npy", allow_pickle=True)
            zarr.consolidate_metadata(group)
        result = {}
        """, specs=specs, copy=str(copy), root=str(root))
    out: dict = {"oracle": oracle, "fills": fills, "mnt": mnt, "c_mnt": c_mnt, "src": src, "copy": copy}
    for reader in READERS:
        if lr.missing(_client(reader)):
            continue
        for where, base in (("mount", mnt), ("copy", copy), ("c_order", c_mnt)):
            jobs = [lr.read_jobs(_client(reader), base / c.name, "a") for c in CASES]
            out[reader, where] = lr.run(_client(reader), jobs, zstd=reader.endswith("+zstd"))
    return out


def _result(reads, reader: str, where: str, case: Case) -> dict:
    return reads[reader, where][CASES.index(case)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("reader", READERS)
def test_read(reads, reader, case):
    """The client reads the mount (and a ``-o c_order`` mount) exactly as it reads the v2 copy:
    the same outcome, dtype, shape and nodata; where it can, the oracle's values, and the
    source's fill value as nodata. Only the view's fill rule differs from the copy: an int fill
    with dimension names is shown as null (no nodata), so that xarray masks nothing."""
    lr.require(_client(reader))
    expected = reads["oracle"][case.name]
    copy = _result(reads, reader, "copy", case)
    want = EXPECTED.get((reader, case.name), "ok")
    assert lr.outcome(copy, expected) == want, f"control (v2 copy): {copy.get('error', '')}"
    for where in ("mount", "c_order"):
        got = _result(reads, reader, where, case)
        fixed = where == "c_order" and (reader, case.name) in C_ORDER_FIXED
        assert lr.outcome(got, expected) == ("ok" if fixed else want), f"{where}: {got.get('error', '')}"
        if "error" in got:
            continue
        assert got["shape"] == list(SHAPE)
        if case.dims and np.dtype(case.dtype).kind in "biu":
            assert got["nodata"] is None, where  # fill_value null: xarray masks nothing
        elif (reader, case.name) not in NODATA_NOT_THE_FILL and np.dtype(case.dtype).kind not in "USO":
            assert lr.same_fill(got["nodata"], _native_fill(reads["fills"][case.name])), where
        if "error" in copy:  # a C_ORDER_FIXED case: the copy has nothing to compare with
            continue
        assert got["dtype"] == copy["dtype"], where
        if not (case.dims and np.dtype(case.dtype).kind in "biu"):
            assert lr.same_fill(got["nodata"], copy["nodata"]), (where, got["nodata"], copy["nodata"])
            if "band_nodata" in got:  # GDAL's classic API: what gdalinfo prints as NoData Value
                assert lr.same_fill(got["band_nodata"], copy["band_nodata"]), where


def _native_fill(value: Any) -> Any:
    value = np.asarray(value)
    if value.dtype.kind == "M":
        return int(value.view("i8"))
    if value.dtype.kind == "b":
        return float(value)
    return value.item()
