"""Zarr v2 clients outside Python write through the mount what they write into a directory
(issue 23, item 7): GDAL 3.6 (multidimensional ``CreateMDArray`` + ``Write``; ``gdal_translate
-of Zarr``), libnetcdf 4.10 (NCZarr ``mode=zarr,file``) and zarr.js 0.6 each create an array of
every numeric data type through the mount; after ``shardfs umount`` zarr-python 3 reads the v3
source. The control is the same write into a plain directory, read back by zarr 2.18: where a
client cannot write a type there either, it must fail the same way through the mount.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import legacy_readers as lr
import numpy as np
import pytest
from conftest import read_native, run_shardfs, zarr2
from sources import write_group

SHAPE, CHUNKS = (7, 10), (2, 4)
DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float32", "float64", "complex64", "S1", "U6")
WRITERS = ("gdal", "netcdf", "zarrjs")
# What each client cannot write into a plain directory (zarr 2.18 reading it back): anything not
# listed is "ok". Required of the mount too.
EXPECTED: dict[tuple[str, str], str] = {
    ("gdal", "bool"): "error",  # GDAL 3.6 has no bool data type
    # GDAL 3.6's Python MDArray.Write takes no strings (numpy strings are cast to float64)
    ("gdal", "S1"): "error", ("gdal", "U6"): "error",
    # netCDF4: no bool type; complex only with auto_complex=True (written then as a compound
    # type, which NCZarr cannot store)
    ("netcdf", "bool"): "error", ("netcdf", "complex64"): "error",
    # zarr.js 0.6: no 64-bit integers, no complex, no strings
    **{("zarrjs", d): "error" for d in ("int64", "uint64", "complex64", "S1", "U6")},
}


def _data(dtype: str) -> np.ndarray:
    rng = np.random.default_rng(len(dtype))
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, SHAPE).astype(bool)
    if dt.kind == "c":
        return (rng.random(SHAPE) * 100 + 1j * rng.random(SHAPE)).astype(dt)
    if dt.kind in "SU":  # netCDF's char type (S1) and names
        return np.array([["Rome", "Oslo", "x", "Kyiv", "Lima"][i] for i in rng.integers(0, 5, SHAPE).ravel()],
                        dtype=dt).reshape(SHAPE)
    return (rng.random(SHAPE) * 100).astype(dt) if dt.kind == "f" else rng.integers(1, 100, SHAPE).astype(dt)


def _where(client: str, base: Path, dtype: str) -> tuple[Path, str]:
    """(group, array) that ``client`` writes the ``dtype`` array to under ``base``."""
    if client == "netcdf":  # one NCZarr dataset (a v2 group) per variable
        return base / f"netcdf_{dtype}", "a"
    return base / client, f"a_{dtype}"


def _write_all(base: Path) -> dict:
    """Every client writes every dtype under ``base`` (a mount or a directory); its results."""
    out = {}
    for client in WRITERS:
        if lr.missing(client):
            continue
        if client == "zarrjs":  # zarr.js creates arrays, not the group around them
            (base / client).mkdir()
            (base / client / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
        jobs = [lr.create_job(client, *_where(client, base, d), _data(d), CHUNKS) for d in DTYPES]
        out[client] = lr.run(client, jobs)
    return out


@pytest.fixture(scope="module")
def writes(tmp_path_factory, module_mount):
    root = tmp_path_factory.mktemp("legacy-writes")
    src, plain = root / "src", root / "plain"
    write_group(src)
    plain.mkdir()
    (plain / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    mnt = module_mount(src)
    on_mount, on_plain = _write_all(mnt), _write_all(plain)
    r = run_shardfs("umount", str(mnt))
    assert r.returncode == 0, r.stderr
    back: dict = {}
    for client in on_mount:
        for d in DTYPES:
            group, name = _where(client, src, d)
            try:
                back[client, d, "mount"] = read_native(group / name)
            except Exception as e:  # noqa: BLE001 - what zarr 3 says about a write that did not land
                back[client, d, "mount"] = f"error: {type(e).__name__}: {e}"
    paths = {(c, d): str(Path(*_where(c, plain, d))) for c in on_plain for d in DTYPES}
    read = zarr2("""
        result = {}
        for p in paths:
            try:
                result[p] = zarr.open_array(p, mode="r")[...]
            except Exception as e:
                result[p] = "error: %s: %s" % (type(e).__name__, e)
        """, paths=list(paths.values()))
    for key, p in paths.items():
        back[(*key, "plain")] = read[p]
    return {"mount": on_mount, "plain": on_plain, "back": back}


def _outcome(job: dict, back, expected: np.ndarray) -> str:
    if "error" in job:
        return "error"
    if isinstance(back, str):
        return "lost"  # the client said it wrote; nothing readable is there
    return "ok" if lr.same_values(np.asarray(back), expected) else "wrong"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("client", WRITERS)
def test_write(writes, client, dtype):
    """The client writes through the mount exactly what it writes into a directory: zarr 3
    reads the source (after umount) with the values and dtype zarr 2.18 reads from the directory."""
    lr.require(client)
    i = DTYPES.index(dtype)
    expected = _data(dtype)
    want = EXPECTED.get((client, dtype), "ok")
    plain = writes["back"][client, dtype, "plain"]
    assert _outcome(writes["plain"][client][i], plain, expected) == want, \
        f"control: {writes['plain'][client][i]} {plain if isinstance(plain, str) else ''}"
    got = writes["back"][client, dtype, "mount"]
    assert _outcome(writes["mount"][client][i], got, expected) == want, \
        f"mount: {writes['mount'][client][i]} {got if isinstance(got, str) else ''}"
    if want == "ok":
        assert np.asarray(got).dtype == np.asarray(plain).dtype


# ------------------------------------------------------------------ gdal_translate


@pytest.fixture
def geotiff(tmp_path):
    """An Int16 GeoTIFF (7 x 10) with real zeros in it, written by GDAL; its values."""
    lr.require("gdal")
    values = np.random.default_rng(3).integers(-50, 50, SHAPE).astype("<i2")
    values[0, :] = 0
    np.save(tmp_path / "v.npy", values)
    subprocess.run([lr.SYSTEM_PYTHON, "-c", f"""
import numpy as np
from osgeo import gdal
gdal.UseExceptions()
v = np.load("{tmp_path}/v.npy")
ds = gdal.GetDriverByName("GTiff").Create("{tmp_path}/in.tif", {SHAPE[1]}, {SHAPE[0]}, 1, gdal.GDT_Int16)
ds.GetRasterBand(1).WriteArray(v)
ds = None
"""], check=True, capture_output=True, timeout=60)
    return tmp_path / "in.tif", values


def _translate(tif: Path, out: Path) -> None:
    r = subprocess.run(["gdal_translate", "-q", "-of", "Zarr", "-co", "BLOCKSIZE=2,4", str(tif), str(out)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr


def test_gdal_translate_into_the_mount(geotiff, tmp_path, mount):
    """``gdal_translate -of Zarr`` writes a v2 group through the mount (``.zgroup``, the array
    ``out``, ``.zmetadata``): GDAL reads back its values, and zarr 3 reads them from the source."""
    tif, values = geotiff
    src = tmp_path / "src"
    write_group(src)
    mnt = mount(src)
    _translate(tif, mnt / "out.zarr")
    shown = json.loads((mnt / "out.zarr" / "out" / ".zarray").read_text())
    assert (shown["dtype"], shown["chunks"], shown["shape"]) == ("<i2", [2, 4], list(SHAPE))
    (got,) = lr.run("gdal", [lr.read_jobs("gdal", mnt / "out.zarr", "out")])
    np.testing.assert_array_equal(lr.decode(got), values)
    assert run_shardfs("umount", str(mnt)).returncode == 0
    np.testing.assert_array_equal(read_native(src / "out.zarr" / "out"), values)


def test_gdal_fill_value_null_is_kept_and_survives_a_remount(geotiff, tmp_path, mount):
    """What GDAL wrote into ``.zarray`` (``"fill_value": null``) is what the mount shows, then and
    after a remount, so GDAL reports no nodata (as on the same translation into a directory) and
    masks none of the real zeros."""
    tif, values = geotiff
    src = tmp_path / "src"
    write_group(src)
    mnt = mount(src)
    _translate(tif, mnt / "out.zarr")
    _translate(tif, tmp_path / "out.zarr")
    assert json.loads((mnt / "out.zarr" / "out" / ".zarray").read_text())["fill_value"] is None
    on_mount, on_plain = lr.run("gdal", [lr.read_jobs("gdal", mnt / "out.zarr", "out"),
                                         lr.read_jobs("gdal", tmp_path / "out.zarr", "out")])
    assert on_mount == on_plain
    assert on_plain["nodata"] is None
    assert run_shardfs("umount", str(mnt)).returncode == 0
    again = mount(src)
    assert json.loads((again / "out.zarr" / "out" / ".zarray").read_text())["fill_value"] is None
    (got,) = lr.run("gdal", [lr.read_jobs("gdal", again / "out.zarr", "out")])
    assert got == on_plain
    np.testing.assert_array_equal(lr.decode(got), values)


def test_gdalinfo_nodata_nan_for_a_nan_filled_array_with_dimension_names(tmp_path, mount):
    """A float array with dimension names and fill NaN (no ``_FillValue``): ``gdalinfo`` prints
    ``NoData Value=nan`` through the mount, as on a v2 copy zarr 2.18 wrote."""
    lr.require("gdal")
    import zarr

    src = tmp_path / "src"
    root = zarr.open_group(str(src), mode="w", zarr_format=3)
    a = root.create_array("t", shape=SHAPE, chunks=CHUNKS, shards=(4, 8), dtype="float32",
                          fill_value=float("nan"), dimension_names=["y", "x"])
    a[:3] = 1.5
    mnt = mount(src)
    r = subprocess.run(["gdalinfo", f'ZARR:"{mnt}":/t'], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "NoData Value=nan" in r.stdout
