"""Legacy writers change the hierarchy through the mount (DESIGN.md "What real tools need").

Creating arrays and groups (zarr 2.18, zarr 3 in v2 mode, xarray when installed),
resizing, consolidating, deleting (``mode="w"``, ``rm -r``), and shell tools
copying arrays in (``rsync -a``, ``cp -a``, ``cp -r``) and out (each chunk once).
Every test compares with zarr-python 3 reading the v3 source natively after
``shardfs umount`` (or, in-process with ``tests/inproc.py``, after the tree is closed).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import read_native, zarr2
from inproc import InPath, InProcess
from writers import umount
from sources import Spec, build, leftovers

s = slice
# A sharded array with data in two of its four shards, default key encoding.
RAW = Spec("raw", (20, 27), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
           index_location="end", index_crc=True,
           initial=((s(0, 8), s(0, 10)), (s(8, 20), s(10, 27))), write=(s(0, 1), s(0, 1)))


def run(*cmd, ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, timeout=120)
    if ok:
        assert r.returncode == 0, f"{cmd} -> {r.returncode}: {r.stderr.decode(errors='replace')}"
    return r


def zjson(path: Path) -> dict:
    return json.loads((Path(path) / "zarr.json").read_text())


def sharding(doc: dict) -> dict:
    (codec,) = doc["codecs"]
    assert codec["name"] == "sharding_indexed"
    return codec["configuration"]


def errors(mount, mnt) -> list[str]:
    return [line for line in mount.info(mnt).log_text().splitlines() if " ERROR " in line]


def assert_clean(src: Path) -> None:
    assert leftovers(src) == [], f"temporaries or journal left in the source: {leftovers(src)}"


def v2_copy(tmp: Path, name: str, data: np.ndarray, chunks, compressor: dict) -> Path:
    """A real zarr 2.18 DirectoryStore array at ``tmp/v2/name`` holding ``data``."""
    np.save(tmp / f"{name}.npy", data)
    zarr2("""
        import numcodecs
        data = np.load(vpath)
        z = zarr.open_array(path, mode='w', shape=data.shape, chunks=chunks, dtype=data.dtype,
                            compressor=numcodecs.get_codec(compressor))
        z[...] = data
        z.attrs.update({'_ARRAY_DIMENSIONS': ['y', 'x'], 'units': 'K'})
        result = np.zeros(0)
        """, path=str(tmp / "v2" / name), vpath=str(tmp / f"{name}.npy"), chunks=list(chunks),
          compressor=compressor)
    return tmp / "v2" / name


# --------------------------------------------------------------------------- creating


def test_zarr2_create_dataset_in_mounted_group(tmp_path, mount):
    src = tmp_path / "src"
    exp = build(src, [RAW])
    mnt = mount(src, "-o", "shard_size=512")
    data = np.arange(9 * 7, dtype="<f8").reshape(9, 7) / 4
    res = zarr2("""
        g = zarr.open_group(mnt, mode='a')
        d = g.create_dataset('new', shape=(9, 7), chunks=(2, 3), dtype='<f8',
                             compressor=zarr.Zstd(level=3), fill_value=-1.0)
        d[...] = np.array(data)
        d.attrs['_ARRAY_DIMENSIONS'] = ['y', 'x']
        d.attrs['units'] = 'm'
        sub = g.create_group('grp')
        sub.attrs['k'] = 1
        f = sub.create_dataset('big', shape=(5, 6), chunks=(5, 6), dtype='>u2', order='F',
                               compressor=zarr.GZip(level=2), fill_value=7)
        f[1:3, 2:5] = 1234
        result = {'new': zarr.open(mnt + '/new', mode='r')[...], 'big': zarr.open(mnt + '/grp/big', mode='r')[...],
                  'keys': sorted(zarr.open_group(mnt, mode='r').array_keys())}
        """, mnt=str(mnt), data=data.tolist())
    np.testing.assert_array_equal(res["new"], data)
    assert res["keys"] == ["new", "raw"]
    big = np.full((5, 6), 7, ">u2")
    big[1:3, 2:5] = 1234
    np.testing.assert_array_equal(res["big"], big)
    zarray = json.loads((mnt / "new" / ".zarray").read_text())
    assert (zarray["chunks"], zarray["dtype"], zarray["compressor"]["id"]) == ([2, 3], "<f8", "zstd")
    assert json.loads((mnt / "grp" / "big" / ".zarray").read_text())["order"] == "F"
    assert errors(mount, mnt) == []
    umount(mount, mnt)

    new = zjson(src / "new")
    cfg = sharding(new)
    # shard rule: each dimension doubles in turn (last first, capped at the 5 x 3 chunk grid)
    # while the shard's chunks of 2*3*8 bytes fit in 512 bytes: (1,2) (2,2) (2,3); (4,3) is too big.
    assert new["chunk_grid"]["configuration"]["chunk_shape"] == [4, 9]
    assert cfg["chunk_shape"] == [2, 3]
    assert [c["name"] for c in cfg["codecs"]] == ["bytes", "zstd"]
    assert cfg["codecs"][0]["configuration"]["endian"] == "little"
    assert new["dimension_names"] == ["y", "x"]
    # the v2 fill_value is xarray's mask: kept as xarray spells it on v3 data (base64 float64)
    assert new["attributes"] == {"units": "m", "_FillValue": "AAAAAAAA8L8="}
    assert new["fill_value"] == -1.0
    np.testing.assert_array_equal(read_native(src / "new"), data)
    big_doc = zjson(src / "grp" / "big")
    assert [c["name"] for c in sharding(big_doc)["codecs"]] == ["transpose", "bytes", "gzip"]
    assert sharding(big_doc)["codecs"][1]["configuration"]["endian"] == "big"
    np.testing.assert_array_equal(read_native(src / "grp" / "big"), big)
    assert zjson(src / "grp") == {"zarr_format": 3, "node_type": "group", "attributes": {"k": 1}}
    np.testing.assert_array_equal(read_native(src / "raw"), exp["raw"])
    assert_clean(src)


def test_filters_and_numcodecs_compressors_become_v3_codecs(tmp_path, mount):
    src = tmp_path / "src"
    build(src, [])
    mnt = mount(src)
    ints = np.arange(10 * 12, dtype="<i4").reshape(10, 12) * 3
    floats = np.round(np.linspace(-5, 5, 30), 1)
    got = zarr2("""
        import numcodecs
        g = zarr.open_group(mnt, mode='a')
        a = g.create_dataset('delta', shape=(10, 12), chunks=(4, 5), dtype='<i4',
                             filters=[numcodecs.Delta('<i4')], compressor=numcodecs.Zlib(1))
        a[...] = np.array(ints, dtype='<i4')
        b = g.create_dataset('scaled', shape=(30,), chunks=(7,), dtype='<f8', fill_value=None,
                             filters=[numcodecs.FixedScaleOffset(0, 10, '<f8', astype='<i4')],
                             compressor=numcodecs.LZ4())
        b[...] = np.array(floats)
        result = {'delta': zarr.open(mnt + '/delta', mode='r')[...],
                  'scaled': zarr.open(mnt + '/scaled', mode='r')[...],
                  'filters': json.loads(open(mnt + '/delta/.zarray').read())['filters']}
        """, mnt=str(mnt), ints=ints.tolist(), floats=floats.tolist())
    np.testing.assert_array_equal(got["delta"], ints)
    np.testing.assert_array_equal(got["scaled"], floats)
    assert got["filters"] == [{"id": "delta", "dtype": "<i4", "astype": "<i4"}]
    assert errors(mount, mnt) == []
    umount(mount, mnt)
    assert [c["name"] for c in sharding(zjson(src / "delta"))["codecs"]] == [
        "numcodecs.delta", "bytes", "numcodecs.zlib"]
    assert [c["name"] for c in sharding(zjson(src / "scaled"))["codecs"]] == \
        ["numcodecs.fixedscaleoffset", "bytes", "numcodecs.lz4"]
    np.testing.assert_array_equal(read_native(src / "delta"), ints)
    np.testing.assert_array_equal(read_native(src / "scaled"), floats)
    assert_clean(src)


def test_a_zarray_with_filters_and_a_numcodecs_compressor_becomes_v3_codecs_in_process(tmp_path):
    """The daemon's part of ``filters_and_numcodecs_compressors_become_v3_codecs``, in-process
    (``tests/inproc.py``): an array made from a ``.zarray`` with a Delta filter and a Zlib
    compressor, its chunk files encoded by numcodecs (edge chunks padded, as zarr 2.18 writes
    them), is stored with those codecs as v3 ``numcodecs.*`` codecs and reads back natively (the
    mounted test makes it with zarr 2.18)."""
    import numcodecs

    src = tmp_path / "src"
    build(src, [])
    ints = np.arange(10 * 12, dtype="<i4").reshape(10, 12) * 3
    delta, zlib = numcodecs.Delta("<i4"), numcodecs.Zlib(1)
    with InProcess(src, read_only=False) as fs:
        (fs / "delta").mkdir()
        (fs / "delta" / ".zarray").write_text(json.dumps({
            "zarr_format": 2, "shape": [10, 12], "chunks": [4, 5], "dtype": "<i4", "order": "C", "fill_value": 0,
            "filters": [delta.get_config()], "compressor": zlib.get_config()}))
        for i in range(3):
            for j in range(3):
                block = np.zeros((4, 5), "<i4")
                part = ints[4 * i:4 * i + 4, 5 * j:5 * j + 5]
                block[:part.shape[0], :part.shape[1]] = part
                (fs / "delta" / f"{i}.{j}").write_bytes(zlib.encode(delta.encode(block)))
        assert json.loads((fs / "delta" / ".zarray").read_text())["filters"] == [
            {"id": "delta", "dtype": "<i4", "astype": "<i4"}]
    assert [c["name"] for c in sharding(zjson(src / "delta"))["codecs"]] == [
        "numcodecs.delta", "bytes", "numcodecs.zlib"]
    np.testing.assert_array_equal(read_native(src / "delta"), ints)
    assert_clean(src)


def test_zarr3_v2_mode_open_array_w_creates_and_recreates(tmp_path, mount):
    import zarr

    src = tmp_path / "src"
    build(src, [RAW])
    mnt = mount(src)
    a = zarr.open_array(str(mnt / "made"), mode="w", zarr_format=2, shape=(6, 10), chunks=(3, 4), dtype="i2",
                        fill_value=0)
    a[...] = np.arange(60, dtype="i2").reshape(6, 10)
    # mode="w" again with the same metadata, then over an existing array with other metadata
    b = zarr.open_array(str(mnt / "made"), mode="w", zarr_format=2, shape=(6, 10), chunks=(3, 4), dtype="i2",
                        fill_value=0)
    b[0, :] = 5
    c = zarr.open_array(str(mnt / "raw"), mode="w", zarr_format=2, shape=(3, 3), chunks=(2, 2), dtype="f4",
                        fill_value=0)
    c[...] = 1.5
    assert errors(mount, mnt) == []
    umount(mount, mnt)
    made = np.zeros((6, 10), "i2")
    made[0, :] = 5
    np.testing.assert_array_equal(read_native(src / "made"), made)
    np.testing.assert_array_equal(read_native(src / "raw"), np.full((3, 3), 1.5, "f4"))
    assert sharding(zjson(src / "raw"))["chunk_shape"] == [2, 2]
    assert {p.name for p in src.iterdir()} - {".shardfs"} == {"made", "raw", "zarr.json"}
    assert_clean(src)


def test_zarr2_open_array_w_over_an_existing_array(tmp_path, mount):
    src = tmp_path / "src"
    build(src, [RAW])
    mnt = mount(src)
    got = zarr2("""
        z = zarr.open_array(p, mode='w', shape=(5, 3), chunks=(2, 2), dtype='<u1', fill_value=1)
        z[0] = [7, 8, 9]
        same = zarr.open_array(p, mode='w', shape=(5, 3), chunks=(2, 2), dtype='<u1', fill_value=1)
        same[4] = 3
        result = zarr.open(p, mode='r')[...]
        """, p=str(mnt / "raw"))
    want = np.ones((5, 3), "u1")
    want[4] = 3
    np.testing.assert_array_equal(got, want)
    assert errors(mount, mnt) == []
    umount(mount, mnt)
    np.testing.assert_array_equal(read_native(src / "raw"), want)
    assert sharding(zjson(src / "raw"))["chunk_shape"] == [2, 2]
    assert sorted(str(p.relative_to(src / "raw")) for p in (src / "raw").rglob("*") if p.is_file()) == \
        ["c/0/0", "zarr.json"]  # the old shards are gone; one shard holds the new chunks
    assert_clean(src)


def test_zattrs_before_zarray_and_nested_separator(tmp_path):
    """In-process (``tests/inproc.py``); zarr 2.18 reads a copy of the files shown."""
    src = tmp_path / "src"
    build(src, [])
    with InProcess(src, read_only=False) as mnt:
        (mnt / "nest").mkdir()
        (mnt / "nest" / ".zattrs").write_text(json.dumps({"_ARRAY_DIMENSIONS": ["t"], "a": [1, 2]}))
        (mnt / "nest" / ".zarray").write_text(json.dumps({
            "zarr_format": 2, "shape": [10], "chunks": [4], "dtype": "<i8", "compressor": None,
            "fill_value": 3, "order": "C", "filters": None, "dimension_separator": "/"}))
        assert json.loads((mnt / "nest" / ".zattrs").read_text()) == {"_ARRAY_DIMENSIONS": ["t"], "a": [1, 2]}
        assert json.loads((mnt / "nest" / ".zarray").read_text())["dimension_separator"] == "/"
        (mnt / "nest" / "1").write_bytes(np.arange(4, 8, dtype="<i8").tobytes())
        shown = (mnt / "nest").copy_to(tmp_path / "shown" / "nest")
    got = zarr2("result = zarr.open(p, mode='r')[...]", p=str(shown))
    assert got.tolist() == [3, 3, 3, 3, 4, 5, 6, 7, 3, 3]
    doc = zjson(src / "nest")
    assert doc["dimension_names"] == ["t"] and doc["attributes"] == {"a": [1, 2], "_FillValue": 3}
    assert read_native(src / "nest").tolist() == [3, 3, 3, 3, 4, 5, 6, 7, 3, 3]


XR_SNIPPET = """
import xarray as xr
ds = xr.Dataset({"t": (("y", "x"), np.arange(12.0).reshape(3, 4))},
                coords={"x": np.arange(4), "y": [10, 20, 30]})
ds["t"][0, 0] = np.nan
ds.to_zarr(root + "/ds", mode="w", **kw)
more = xr.Dataset({"t": (("y", "x"), np.full((2, 4), 5.0))}, coords={"x": np.arange(4), "y": [40, 50]})
more.to_zarr(root + "/ds", mode="a", append_dim="y", **kw)
xr.Dataset({"flag": (("y",), np.array([True, False, True, False, False]))}).to_zarr(
    root + "/ds", mode="a", **kw)
ds.to_zarr(root + "/again", mode="w", **kw)
ds.isel(y=[0]).to_zarr(root + "/again", mode="w", **kw)  # over an existing store: delete, then create
out = {}
for name in ("ds", "again"):
    back = xr.open_zarr(root + "/" + name, **kw).load()
    for var in ("t", "x", "y", "flag"):
        if var in back:
            out[name + "/" + var] = back[var].values
            out[name + "/" + var + ":dtype"] = back[var].dtype.str
"""


def _xarray_expected() -> dict:
    t = np.arange(12.0).reshape(3, 4)
    t[0, 0] = np.nan
    return {"ds/t": np.concatenate([t, np.full((2, 4), 5.0)]), "ds/x": np.arange(4), "ds/y": [10, 20, 30, 40, 50],
            "ds/flag": [True, False, True, False, False], "again/t": t[:1], "again/x": np.arange(4), "again/y": [10]}


def _xarray_native(src: Path) -> dict:
    import xarray as xr

    out = {}
    for name in ("ds", "again"):
        back = xr.open_zarr(str(src / name), consolidated=False).load()
        for var in back.variables:
            out[f"{name}/{var}"] = back[var].values
            out[f"{name}/{var}:dtype"] = back[var].dtype.str
    return out


@pytest.mark.parametrize("client", ["xarray2025-zarr2", "xarray-zarr3"])
def test_xarray_to_zarr_w_and_a_through_the_mount(client, tmp_path, mount):
    src = tmp_path / "src"
    build(src, [])
    mnt = mount(src)
    if client == "xarray2025-zarr2":
        got = zarr2(XR_SNIPPET + "\nresult = out\n", root=str(mnt), kw={})
    else:
        scope: dict = {"np": np, "root": str(mnt), "kw": {"zarr_format": 2, "consolidated": False}}
        exec(XR_SNIPPET, scope)
        got = scope["out"]
    assert errors(mount, mnt) == []
    umount(mount, mnt)
    native = _xarray_native(src)
    for key, want in _xarray_expected().items():
        if want is not None:
            np.testing.assert_array_equal(got[key], want, err_msg=key)
        np.testing.assert_array_equal(native[key], got[key], err_msg=f"{key}: native v3 read differs")
        assert native[key + ":dtype"] == got[key + ":dtype"], key
    assert got["ds/flag:dtype"] == "|b1"
    assert_clean(src)


def copy_in(path: Path, dest: InPath) -> None:
    """``cp -r PATH DEST`` in-process: DEST made, then each entry as ``readdir`` lists it."""
    dest.mkdir()
    for entry in os.scandir(path):
        if entry.is_dir():
            copy_in(Path(entry.path), dest / entry.name)
        else:
            (dest / entry.name).write_bytes(Path(entry.path).read_bytes())


def test_nested_array_copied_chunks_first(tmp_path, caplog):
    """A "/" array copied into the mount with its key directories and chunks before its
    .zarray (an order cp -r may take): they become the new array's keys. In-process
    (``tests/inproc.py``); zarr 2.18 reads a copy of the files shown."""
    src = tmp_path / "src"
    build(src, [])
    data = np.arange(9 * 8, dtype="<u2").reshape(9, 8)
    np.save(tmp_path / "d.npy", data)
    zarr2("""
        z = zarr.open_array(path, mode='w', shape=(9, 8), chunks=(4, 3), dtype='<u2', dimension_separator='/',
                            compressor=None)
        z[...] = np.load(vpath)
        result = np.zeros(0)
        """, path=str(tmp_path / "v2" / "n"), vpath=str(tmp_path / "d.npy"))
    copy = tmp_path / "v2" / "n"
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(src, read_only=False) as mnt:
        (mnt / "n").mkdir()
        for row in sorted(p.name for p in copy.iterdir() if p.is_dir()):
            (mnt / "n" / row).mkdir()
            for col in sorted(os.listdir(copy / row)):
                (mnt / "n" / row / col).write_bytes((copy / row / col).read_bytes())
        (mnt / "n" / ".zarray").write_bytes((copy / ".zarray").read_bytes())
        assert sorted((mnt / "n" / "0").iterdir()) == ["0", "1", "2"]
        copy_in(copy, mnt / "m")
        shown = {name: (mnt / name).copy_to(tmp_path / "shown" / name) for name in ("n", "m")}
    got = zarr2("result = {'n': zarr.open(a, mode='r')[...], 'm': zarr.open(b, mode='r')[...]}",
                a=str(shown["n"]), b=str(shown["m"]))
    np.testing.assert_array_equal(got["n"], data)
    np.testing.assert_array_equal(got["m"], data)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    np.testing.assert_array_equal(read_native(src / "n"), data)
    np.testing.assert_array_equal(read_native(src / "m"), data)
    assert zjson(src / "n")["chunk_key_encoding"] == {"name": "v2", "configuration": {"separator": "."}}
    assert_clean(src)


# --------------------------------------------------------------------------- changing


def test_resize_drops_chunks_past_the_edge_including_pending(tmp_path, mount):
    src = tmp_path / "src"
    exp = build(src, [RAW])["raw"]
    mnt = mount(src)
    res = zarr2("""
        z = zarr.open(p, mode='r+')
        z[16:20, 20:27] = 9          # pending chunks, then cut off
        z.resize(12, 13)             # shrink: shards c/1/2 gone, chunks past row 3 / col 2 emptied
        z.resize(20, 27)             # grow back: the dropped region reads as fill
        z.append(np.ones((4, 27), dtype='i4'), axis=0)
        result = {'data': z[...], 'shape': list(zarr.open(p, mode='r').shape)}
        """, p=str(mnt / "raw"))
    want = np.zeros((24, 27), "<i4")
    want[:12, :15] = exp[:12, :15]  # whole chunks inside the (12, 13) edge are kept, as zarr does
    want[20:24] = 1
    assert res["shape"] == [24, 27]
    np.testing.assert_array_equal(res["data"], want)
    zarray = json.loads((mnt / "raw" / ".zarray").read_text())
    zarray_bytes = (mnt / "raw" / ".zarray").read_bytes()
    (mnt / "raw" / ".zarray").write_bytes(zarray_bytes)  # identical rewrite: accepted
    for change in ({"dtype": "<i8"}, {"chunks": [2, 5]}, {"compressor": {"id": "gzip", "level": 1}}):
        with pytest.raises(OSError) as e:
            (mnt / "raw" / ".zarray").write_text(json.dumps({**zarray, **change}))
        assert e.value.errno == errno.EPERM, change
    assert len(errors(mount, mnt)) == 3, errors(mount, mnt)
    umount(mount, mnt)
    np.testing.assert_array_equal(read_native(src / "raw"), want)
    assert zjson(src / "raw")["shape"] == [24, 27]
    assert_clean(src)


def test_a_zarray_rewrite_resizes_and_drops_chunks_past_the_edge_in_process(tmp_path):
    """The daemon's part of ``resize_drops_chunks_past_the_edge_including_pending``, in-process
    (``tests/inproc.py``): a ``.zarray`` rewritten with a smaller shape (how zarr 2.18 resizes)
    drops the chunks past the new edge, pending ones too, and keeps the whole chunks inside
    it; grown back, the dropped region is empty; an identical rewrite is accepted and one that
    changes the dtype, chunks or compressor is EPERM (the mounted test keeps zarr 2.18)."""
    src = tmp_path / "src"
    exp = build(src, [RAW])["raw"]
    with InProcess(src, read_only=False) as fs:
        arr = fs / "raw"
        for rel in ("4.4", "4.5"):  # rows 16-20, cols 20-27: pending, then cut off
            (arr / rel).write_bytes(RAW.encode(np.full(RAW.chunk, 9, "<i4")))
        zarray = json.loads((arr / ".zarray").read_text())
        (arr / ".zarray").write_text(json.dumps({**zarray, "shape": [12, 13]}))
        chunks = [tuple(map(int, n.split("."))) for n in arr.iterdir() if not n.startswith(".") and "." in n]
        assert chunks and all(i < 3 and j < 3 for i, j in chunks), chunks
        (arr / ".zarray").write_text(json.dumps({**zarray, "shape": [20, 27]}))
        assert not (arr / "4.4").exists() and not (arr / "3.0").exists()
        (arr / ".zarray").write_bytes((arr / ".zarray").read_bytes())  # identical rewrite: accepted
        for change in ({"dtype": "<i8"}, {"chunks": [2, 5]}, {"compressor": {"id": "gzip", "level": 1}}):
            with pytest.raises(OSError) as e:
                (arr / ".zarray").write_text(json.dumps({**zarray, **change}))
            assert e.value.errno == errno.EPERM, change
    want = np.zeros((20, 27), "<i4")
    want[:12, :15] = exp[:12, :15]  # whole chunks inside the (12, 13) edge are kept, as zarr does
    np.testing.assert_array_equal(read_native(src / "raw"), want)
    assert zjson(src / "raw")["shape"] == [20, 27]
    assert_clean(src)


@pytest.mark.parametrize("workers", [1, 2], ids=["one_worker", "two_workers"])
def test_resize_after_resize_drops_the_kernels_chunk_entries_of_every_layout(tmp_path, mount, source, workers):
    """The kernel keeps a chunk file's dentry and attributes (the entry and attribute timeouts)
    across resizes, each of which gives the array a new layout (and chunk inodes): a shrink
    that empties the chunk must drop those of the older layouts too, else zarr 2.18's resize,
    which removes every chunk it still sees outside the new shape, fails with ENOENT (the
    soak's scratch arrays did), and ``stat`` shows a file that ``open`` says is not there.
    Four arrays: on the old code at least one failed in each of 4 runs (timing: the fold). With
    2 workers the layouts' slots are given under the shared ledger's lock (``Hierarchy``)."""
    build(tmp_path / "src", [RAW])
    src = source(tmp_path / "src")
    mnt = src.mount(mount, "-o", f"workers={workers}")
    res = zarr2("""
        import itertools, os

        def looked_at(p):  # stat and open every chunk name (as zarr 2.18 reads): the kernel keeps them
            out = {}
            for i, j in itertools.product(range(6), range(6)):
                name = '%d.%d' % (i, j)
                try:
                    with open(p + '/' + name, 'rb') as f:
                        opened = len(f.read()) > 0
                except FileNotFoundError:
                    opened = False
                out[name] = [os.path.isfile(p + '/' + name), opened]
            return out

        data = np.arange(40 * 30, dtype='i4').reshape(40, 30) + 1
        failed, seen = [], {}
        for n in range(4):
            p = root + '/s%d' % n
            z = zarr.open_array(p, mode='w', shape=(40, 30), chunks=(10, 10), dtype='i4', fill_value=0)
            z[...] = data
            looked_at(p)
            z.resize(50, 30)             # grow: a new layout, nothing emptied
            looked_at(p)
            try:
                z.resize(10, 30)         # shrink: rows 1..3 emptied, then removed by zarr 2.18
            except OSError as e:
                failed.append('s%d: %r' % (n, e))
            seen['s%d' % n] = {k: v for k, v in looked_at(p).items() if v != [False, False]}
        result = {'failed': failed, 'seen': seen, 'data': zarr.open_array(root + '/s3', mode='r')[...]}
        """, root=str(mnt))
    assert res["failed"] == []
    assert res["seen"] == {f"s{n}": {"0.0": [True, True], "0.1": [True, True], "0.2": [True, True]} for n in range(4)}
    want = np.arange(40 * 30, dtype="<i4").reshape(40, 30)[:10] + 1
    np.testing.assert_array_equal(res["data"], want)
    assert errors(mount, mnt) == []
    umount(mount, mnt)
    for n in range(4):
        src.assert_equals(f"s{n}", want)


def test_unlinked_zarray_rewritten_with_other_metadata_makes_a_new_array(tmp_path, caplog):
    """In-process (``tests/inproc.py``); zarr 2.18 reads a copy of the files shown."""
    src = tmp_path / "src"
    build(src, [RAW])
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(src, read_only=False) as fs:
        zarray = json.loads((fs / "raw" / ".zarray").read_text())
        (fs / "raw" / ".zarray").unlink()
        assert not (fs / "raw" / ".zarray").exists()
        (fs / "raw" / ".zarray").write_text(json.dumps({**zarray, "shape": [3], "chunks": [2], "dtype": "<i2",
                                                        "compressor": None, "fill_value": 4}))
        assert (fs / "raw").iterdir() == [".zarray"]  # the old chunks are gone with the old array
        (fs / "raw" / "1").write_bytes(np.array([7, 8], "<i2").tobytes())
        shown = (fs / "raw").copy_to(tmp_path / "shown")
    assert zarr2("result = zarr.open(p, mode='r')[...]", p=str(shown)).tolist() == [4, 4, 7]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert read_native(src / "raw").tolist() == [4, 4, 7]
    assert_clean(src)


def test_consolidate_metadata_and_open_consolidated(tmp_path, mount):
    src = tmp_path / "src"
    exp = build(src, [RAW])["raw"]
    mnt = mount(src)
    res = zarr2("""
        zarr.consolidate_metadata(mnt)
        g = zarr.open_consolidated(mnt, mode='r')
        result = {'raw': g['raw'][...], 'keys': sorted(json.loads(open(mnt + '/.zmetadata').read())['metadata'])}
        """, mnt=str(mnt))
    np.testing.assert_array_equal(res["raw"], exp)
    assert res["keys"] == [".zattrs", ".zgroup", "raw/.zarray", "raw/.zattrs"]
    umount(mount, mnt)
    assert sorted(p.name for p in src.iterdir() if p.name != ".shardfs") == ["raw", "zarr.json"]


def test_a_zmetadata_written_is_accepted_and_served_computed_in_process(tmp_path):
    """The daemon's part of ``consolidate_metadata_and_open_consolidated``, in-process
    (``tests/inproc.py``): a ``.zmetadata`` written (as ``zarr.consolidate_metadata`` does) is
    accepted and not stored; the one served is computed from the source (the mounted test
    consolidates and opens with zarr 2.18)."""
    src = tmp_path / "src"
    build(src, [RAW])
    with InProcess(src, read_only=False) as fs:
        (fs / ".zmetadata").write_text(json.dumps({"zarr_consolidated_format": 1, "metadata": {"x/.zarray": {}}}))
        doc = json.loads((fs / ".zmetadata").read_text())
        assert sorted(doc["metadata"]) == [".zattrs", ".zgroup", "raw/.zarray", "raw/.zattrs"]
        assert doc["metadata"]["raw/.zarray"] == json.loads((fs / "raw" / ".zarray").read_text())
    assert sorted(p.name for p in src.iterdir() if p.name != ".shardfs") == ["raw", "zarr.json"]
    assert_clean(src)


def rm_r(path: InPath) -> None:
    """``rm -r`` in-process: what is listed is removed, files first, then the directory."""
    for name, st in path.entries():
        if stat.S_ISDIR(st.st_mode):
            rm_r(path / name)
        else:
            (path / name).unlink()
    path.rmdir()


def test_rm_r_deletes_arrays_and_groups_in_the_source(tmp_path, caplog):
    """In-process (``tests/inproc.py``): ``rm -r`` as its calls (list, unlink, rmdir)."""
    src = tmp_path / "src"
    build(src, [RAW])
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(src, read_only=False) as fs:
        (fs / "grp").mkdir()
        (fs / "grp" / ".zgroup").write_text('{"zarr_format": 2}')
        (fs / "grp" / "z").mkdir()
        (fs / "grp" / "z" / ".zarray").write_text(json.dumps(
            {"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<f8", "compressor": None, "fill_value": 0.0,
             "filters": None, "order": "C"}))
        (fs / "grp" / "z" / "0").write_bytes(np.ones(2).tobytes())
        rm_r(fs / "raw")
        rm_r(fs / "grp")
        assert sorted((fs / "").iterdir()) == [".zattrs", ".zgroup", ".zmetadata"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert sorted(p.name for p in src.iterdir() if p.name != ".shardfs") == ["zarr.json"]
    assert_clean(src)


def test_an_array_made_in_plain_new_directories_makes_them_groups(tmp_path, caplog):
    """In-process: ``mkdir -p a/b`` then an array in ``a/b`` (zarr 2.18's ``open_array(MNT/a/b/z,
    mode="w")`` writes no ``.zgroup`` above it): ``a`` and ``a/b`` become groups, as zarr-python 3
    builds a new node's parents, so the array is listed, read natively, found by the next mount
    and removed by ``rm -r``; a directory made and left empty stays no node."""
    import zarr

    src = tmp_path / "src"
    build(src, [RAW])
    caplog.set_level(logging.INFO, logger="shardfs")
    zarray = {"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<i4", "compressor": None, "fill_value": 0,
              "filters": None, "order": "C"}
    with InProcess(src, read_only=False) as fs:
        (fs / "a").mkdir()
        (fs / "a" / "b").mkdir()
        (fs / "a" / "b" / "z").mkdir()
        (fs / "a" / "b" / "empty").mkdir()
        (fs / "a" / "b" / "z" / ".zarray").write_text(json.dumps(zarray))
        (fs / "a" / "b" / "z" / "1").write_bytes(np.array([7, 8], "<i4").tobytes())
        assert sorted((fs / "a").iterdir()) == [".zattrs", ".zgroup", ".zmetadata", "b"]
        assert sorted((fs / "a" / "b").iterdir()) == [".zattrs", ".zgroup", ".zmetadata", "empty", "z"]
    assert zjson(src / "a") == zjson(src / "a" / "b") == {"zarr_format": 3, "node_type": "group", "attributes": {}}
    assert not (src / "a" / "b" / "empty").exists()
    np.testing.assert_array_equal(zarr.open_array(str(src / "a" / "b" / "z"), mode="r")[...], [0, 0, 7, 8])
    assert [m for m in caplog.messages if "parent of" in m] == [
        f"{src}/a: created a v3 group (a parent of a/b/z)", f"{src}/a/b: created a v3 group (a parent of a/b/z)"]
    with InProcess(src, read_only=False) as fs:  # the next mount finds them
        assert sorted((fs / "a" / "b").iterdir()) == [".zattrs", ".zgroup", ".zmetadata", "z"]
        assert (fs / "a" / "b" / "z" / "1").read_bytes() == np.array([7, 8], "<i4").tobytes()
        rm_r(fs / "a")
    assert sorted(p.name for p in src.iterdir() if p.name != ".shardfs") == ["raw", "zarr.json"]


def test_a_group_removed_while_held_open_and_made_again_is_a_new_directory(tmp_path, mount):
    """``rm -r`` of a group while a process holds its directory open, then the same name made
    again (what ``to_zarr(mode="w")`` does over an existing store, with zarr 3's threads still
    holding the old one): files are created in the new directory (not ENOENT from the
    removed one), the new group is made, and the old descriptor gives EIO, as on a removed
    directory's dead inode."""
    src = tmp_path / "src"
    build(src, [])
    mnt = mount(src)
    again = mnt / "again"
    again.mkdir()
    (again / ".zgroup").write_text('{"zarr_format": 2}')
    held = os.open(again, os.O_RDONLY | os.O_DIRECTORY)
    try:
        run("rm", "-r", again)
        again.mkdir()
        (again / ".zgroup.1.partial").write_text('{"zarr_format": 2}')
        os.rename(again / ".zgroup.1.partial", again / ".zgroup")
        assert os.listdir(again) == [".zgroup"]
        with pytest.raises(OSError) as e:
            os.listdir(held)
        assert e.value.errno == errno.EIO
    finally:
        os.close(held)
    assert errors(mount, mnt) == []
    umount(mount, mnt)
    assert zjson(src / "again")["node_type"] == "group"
    assert_clean(src)


def test_read_only_mount_refuses_structure_changes(tmp_path):
    """In-process (``tests/inproc.py``), read-only as ``-o ro``."""
    src = tmp_path / "src"
    build(src, [RAW])
    with InProcess(src) as mnt:
        for op in (lambda: (mnt / "x").mkdir(), lambda: rm_r(mnt / "raw"),
                   lambda: (mnt / "raw" / ".zarray").write_text("{}")):
            with pytest.raises(OSError) as e:
                op()
            assert e.value.errno == errno.EROFS
    assert (src / "raw" / "zarr.json").is_file()


# --------------------------------------------------------------------------- shell tools in


@pytest.mark.parametrize("tool", ["rsync", "cp-a", "cp-r"])
def test_shell_tools_copy_arrays_in(tool, tmp_path, mount):
    src = tmp_path / "src"
    build(src, [RAW])
    data = (np.arange(20 * 27, dtype="<i4").reshape(20, 27) * 7) - 100
    copy = v2_copy(tmp_path, "arr", data, (4, 5), {"id": "zstd", "level": 3})
    mnt = mount(src)
    cmd = {"rsync": ["rsync", "-a"], "cp-a": ["cp", "-a"], "cp-r": ["cp", "-r"]}[tool]
    run(*cmd, f"{copy}/" if tool == "rsync" else copy, mnt / "new")  # a new array
    if tool == "rsync":
        run(*cmd, f"{copy}/", mnt / "raw")  # over an existing array with identical .zarray
    else:
        run(*cmd, f"{copy}/.", mnt / "raw")
    assert errors(mount, mnt) == []
    got = zarr2("result = {'new': zarr.open(a, mode='r')[...], 'raw': zarr.open(b, mode='r')[...]}",
                a=str(mnt / "new"), b=str(mnt / "raw"))
    np.testing.assert_array_equal(got["new"], data)
    np.testing.assert_array_equal(got["raw"], data)
    umount(mount, mnt)
    np.testing.assert_array_equal(read_native(src / "new"), data)
    np.testing.assert_array_equal(read_native(src / "raw"), data)
    assert zjson(src / "new")["dimension_names"] == ["y", "x"]
    assert zjson(src / "new")["attributes"] == {"units": "K", "_FillValue": 0}  # zarr 2's fill: xarray's mask
    assert_clean(src)


@pytest.mark.parametrize("tool", ["cp-a", "tar"])
def test_copies_over_an_array_once_its_empty_chunks_are_served(tool, tmp_path, mount):
    """``cp -a`` copies in the order of the source's inode numbers, which reused ones can put
    ``.zattrs`` first: its dimension names make the array serve its empty chunks (xarray's
    null fill), and cp unlinks each chunk file (``st_nlink`` 2: the shard directory lists it
    too) before its exclusive create; ``tar -x`` unlinks a file its exclusive create found. The
    names unlinked are free for them (before: EEXIST for every chunk, 1 run in 60 of the test
    above)."""
    src = tmp_path / "src"
    build(src, [RAW])
    data = (np.arange(20 * 27, dtype="<i4").reshape(20, 27) * 3) + 1
    copy = v2_copy(tmp_path, "arr", data, (4, 5), {"id": "zstd", "level": 3})
    mnt = mount(src)
    run("cp", "-a", copy / ".zattrs", mnt / "raw")
    assert zjson(src / "raw")["dimension_names"] == ["y", "x"]
    assert json.loads((mnt / "raw" / ".zarray").read_text())["fill_value"] is None
    assert len([n for n in os.listdir(mnt / "raw") if not n.startswith(".")]) == 30  # every chunk served
    if tool == "tar":
        run("tar", "-C", copy, "-cf", tmp_path / "arr.tar", ".")
        run("tar", "-C", mnt / "raw", "-xf", tmp_path / "arr.tar")
    else:
        run("cp", "-a", f"{copy}/.", mnt / "raw")
    assert errors(mount, mnt) == []
    np.testing.assert_array_equal(zarr2("result = zarr.open(a, mode='r')[...]", a=str(mnt / "raw")), data)
    umount(mount, mnt)
    np.testing.assert_array_equal(read_native(src / "raw"), data)
    assert_clean(src)


def test_chunk_names_unlinked_are_kept_unshown_up_to_a_bound(tmp_path, monkeypatch):
    """In-process (``tests/inproc.py``): the last ``UNFILLED_KEPT`` chunk files removed from an
    array that serves its empty chunks stay unshown; an older one is the fill chunk again (an
    ``rm -r`` of a huge array does not grow the daemon); writing one shows it at once."""
    from shardfs.tree import made

    monkeypatch.setattr(made, "UNFILLED_KEPT", 2)
    src = tmp_path / "src"
    build(src, [RAW])
    with InProcess(src, read_only=False) as fs:
        arr = fs / "raw"
        (arr / ".zattrs").write_text(json.dumps({"_ARRAY_DIMENSIONS": ["y", "x"]}))
        fill = (arr / "0.3").read_bytes()  # an empty chunk, served
        for name in ("0.3", "0.4", "1.1"):  # fill, fill, stored
            (arr / name).unlink()
        assert [(arr / n).exists() for n in ("0.3", "0.4", "1.1")] == [True, False, False]
        assert (arr / "0.3").read_bytes() == fill and "0.4" not in arr.iterdir() and "0.3" in arr.iterdir()
        (arr / "0.4").write_bytes(fill)
        assert (arr / "0.4").exists() and not (arr / "1.1").exists()


def test_mkdir_of_key_directories_in_an_array(tmp_path, caplog):
    """In-process (``tests/inproc.py``): writers make key directories before writing chunks into
    them (``mkdir -p c/0/2``: c and c/0 exist, c/0/2 is made)."""
    src = tmp_path / "src"
    exp = build(src, [RAW])["raw"]
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(src, read_only=False) as fs:
        arr = fs / "raw"
        with pytest.raises(FileExistsError):
            (arr / "c").mkdir()
        (arr / "c" / "0" / "2").mkdir()  # a shard that does not exist yet (c/0 does)
        assert (arr / "c" / "0" / "2").iterdir() == []
        block = np.full((4, 5), 77, "<i4")
        (arr / "c" / "0" / "2" / "1.4").write_bytes(RAW.encode(block))
        for bad in ("newdir", "c/x"):
            with pytest.raises(PermissionError):
                (arr / bad).mkdir()
        assert (arr / "c" / "0" / "2").iterdir() == ["1.4"]
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 2
    exp[4:8, 20:25] = 77
    np.testing.assert_array_equal(read_native(src / "raw"), exp)
    assert_clean(src)


# --------------------------------------------------------------------------- copies out


@pytest.mark.parametrize("tool", ["cp-r", "rsync", "copy_store"])
def test_copies_out_hold_each_chunk_once(tool, tmp_path, mount):
    src = tmp_path / "src"
    exp = build(src, [RAW])["raw"]
    mnt = mount(src, "-o", "ro")
    out = tmp_path / "out"
    if tool == "cp-r":
        run("cp", "-r", mnt / "raw", out)
    elif tool == "rsync":
        run("rsync", "-a", f"{mnt / 'raw'}/", out)
    else:
        zarr2("zarr.copy_store(zarr.DirectoryStore(a), zarr.DirectoryStore(b)); result = np.zeros(0)",
              a=str(mnt / "raw"), b=str(out))
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    stored = sorted(os.listdir(mnt / "raw"))
    assert files == stored, f"copy holds {files}"
    assert len([f for f in files if not f.startswith(".")]) == 4 + 12  # stored inner chunks
    assert "c" not in os.listdir(mnt / "raw") and sorted(os.listdir(mnt / "raw" / "c" / "0" / "0")) == \
        ["0.0", "0.1", "1.0", "1.1"]
    got = zarr2("result = zarr.open(p, mode='r')[...]", p=str(out))
    np.testing.assert_array_equal(got, read_native(src / "raw"))
    np.testing.assert_array_equal(got, exp)
