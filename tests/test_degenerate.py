"""Scalars (0-d arrays) and zero-length dimensions through the mount, and no bug ending it.

xarray writes a 0-d array for every scalar coordinate (rioxarray's ``spatial_ref``, CF grid
mappings); zarr 2.18 writes arrays of shape ``(0,)`` and resizes to zero and back. Each is
created, written, listed, folded and read through the mount like any other array, and read
natively with zarr-python 3 (and tensorstore) after ``shardfs umount``.

A bug in a request handler answers that request with EIO and is logged once with its
traceback; a bug in a background task (the fold callback) is logged with its traceback, shown
by ``shardfs status``, and the mount keeps serving; whatever ends the daemon leaves its reason
and traceback in the log file. Bugs are planted in the real daemon by a ``sitecustomize``
module put first on its ``PYTHONPATH`` (``planted``).
"""

from __future__ import annotations

import errno
import json
import os
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import budget, run_shardfs, status, wait_for, zarr2
from inproc import InProcess
from shardfs.app.peers import PUBLISH_S
from sources import build
from writers import umount


def errors(mount, mnt) -> list[str]:
    return [line for line in mount.info(mnt).log_text().splitlines() if " ERROR " in line]


SCALAR_COORD = """
import os
import xarray as xr
ds = xr.Dataset({"t": (("y", "x"), np.arange(12.0).reshape(3, 4))},
                coords={"x": np.arange(4), "y": [10, 20, 30],
                        "spatial_ref": ((), np.int64(4326), {"crs_wkt": "GEOGCS[WGS 84]"})})
ds["t"].attrs["grid_mapping"] = "spatial_ref"
ds.to_zarr(root + "/ds", mode="w", consolidated=False)
back = xr.open_zarr(root + "/ds", consolidated=False).load()
result = {"spatial_ref": back["spatial_ref"].values, "t": back["t"].values,
          "listed": sorted(os.listdir(root + "/ds/spatial_ref")),
          "zarray": json.load(open(root + "/ds/spatial_ref/.zarray"))}
"""


def test_scalar_coordinate_through_xarray_to_zarr_reads_back_natively_after_umount(tmp_path, mount, source):
    """The scalar coordinate's value (not its fill value) reaches its shard: zarr 3 and
    tensorstore read it natively after ``shardfs umount``, which exits 0 (before: the fold
    failed forever, the value stayed in the journal, the listing was EIO)."""
    build(tmp_path / "src", [])
    src = source(tmp_path / "src")
    mnt = src.mount(mount)
    got = zarr2(SCALAR_COORD, root=str(mnt))
    assert got["spatial_ref"].shape == () and int(got["spatial_ref"]) == 4326
    np.testing.assert_array_equal(got["t"], np.arange(12.0).reshape(3, 4))
    assert got["listed"] == [".zarray", ".zattrs", "0"]
    assert (got["zarray"]["shape"], got["zarray"]["chunks"]) == ([], [])
    assert errors(mount, mnt) == []
    umount(mount, mnt)
    src.assert_equals("ds/spatial_ref", np.array(4326, dtype="<i8"))
    src.assert_equals("ds/t", np.arange(12.0).reshape(3, 4))
    assert src.leftovers() == []


DEGENERATE = """
import os
out = {}
s = zarr.open_array(root + "/scalar", mode="w", shape=(), dtype="<f4", fill_value=-1)
out["scalar:before"] = s[...]
s[...] = 2.5
out["scalar"] = s[...]
out["scalar:listed"] = sorted(os.listdir(root + "/scalar"))
e = zarr.open_array(root + "/empty", mode="w", shape=(0,), chunks=(5,), dtype="<i2")
out["empty"] = e[...]
out["empty:listed"] = sorted(os.listdir(root + "/empty"))
z = zarr.open_array(root + "/wide", mode="w", shape=(0, 10), chunks=(2, 5), dtype="<i4", fill_value=7)
out["wide:0"] = z[...]
z.resize(4, 10)
z[...] = np.arange(40).reshape(4, 10)
out["wide:4"] = z[...]
out["wide:4:listed"] = sorted(os.listdir(root + "/wide"))
z.resize(0, 10)
out["wide:again0"] = z[...]
out["wide:again0:listed"] = sorted(os.listdir(root + "/wide"))
z.resize(3, 10)
out["wide:3"] = z[...]
z[2, :] = 5
out["wide"] = zarr.open_array(root + "/wide", mode="r")[...]
result = out
"""


def test_zero_dimensional_and_zero_length_arrays_through_zarr2(tmp_path, mount, source):
    """zarr 2.18 creates, writes, lists and resizes 0-d arrays and arrays with a zero-length
    dimension (resized to zero and back: nothing of the old rows comes back); the shards hold
    what was written."""
    build(tmp_path / "src", [])
    src = source(tmp_path / "src")
    mnt = src.mount(mount)
    got = zarr2(DEGENERATE, root=str(mnt))
    assert got["scalar:before"].tolist() == -1.0 and got["scalar"].tolist() == 2.5
    assert got["scalar:listed"] == [".zarray", "0"]
    assert got["empty"].shape == (0,) and got["empty:listed"] == [".zarray"]
    assert got["wide:0"].shape == (0, 10)
    np.testing.assert_array_equal(got["wide:4"], np.arange(40).reshape(4, 10))
    assert got["wide:4:listed"] == [".zarray", "0.0", "0.1", "1.0", "1.1"]
    assert got["wide:again0"].shape == (0, 10) and got["wide:again0:listed"] == [".zarray"]
    np.testing.assert_array_equal(got["wide:3"], np.full((3, 10), 7))
    want = np.full((3, 10), 7, "<i4")
    want[2] = 5
    np.testing.assert_array_equal(got["wide"], want)
    assert errors(mount, mnt) == []
    umount(mount, mnt)
    src.assert_equals("scalar", np.array(2.5, "<f4"))
    src.assert_equals("empty", np.zeros((0,), "<i2"))
    src.assert_equals("wide", want)
    assert src.leftovers() == []


# --------------------------------------------------------------------------- property


@st.composite
def degenerate_arrays(draw):
    """v2 metadata of a 0-d array or one with a zero-length dimension, and what to write."""
    ndim = draw(st.integers(0, 3))
    shape = [draw(st.integers(0, 5)) for _ in range(ndim)]
    if ndim and 0 not in shape and draw(st.booleans()):
        shape[draw(st.integers(0, ndim - 1))] = 0
    chunks = [draw(st.integers(1, 3)) for _ in range(ndim)]
    dtype = draw(st.sampled_from(["<i2", ">f8", "|u1", "<u4"]))
    compressor = draw(st.sampled_from([None, {"id": "zstd", "level": 1}, {"id": "gzip", "level": 1}]))
    zarray = {"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype, "order": "C",
              "compressor": compressor, "filters": None, "fill_value": draw(st.sampled_from([0, 3])),
              "dimension_separator": draw(st.sampled_from([".", "/"]))}
    grow = [draw(st.integers(1, 4)) for _ in range(ndim)]  # a resize after the first write
    return zarray, grow


def _chunk_files(zarray: dict, data: np.ndarray) -> dict[str, bytes]:
    """The chunk files zarr 2.18 writes for ``data`` (every chunk, fill ones too): key -> bytes."""
    import itertools
    import numcodecs

    out = {}
    shape, chunks = zarray["shape"], zarray["chunks"]
    grid = [-(-s // c) for s, c in zip(shape, chunks)]
    for coords in itertools.product(*map(range, grid)):
        block = np.full(chunks, zarray["fill_value"], dtype=zarray["dtype"])
        region = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(coords, chunks, shape))
        block[tuple(slice(0, r.stop - r.start) for r in region)] = data[region]
        buf = np.ascontiguousarray(block).tobytes()
        if zarray["compressor"]:
            buf = bytes(numcodecs.get_codec(zarray["compressor"]).encode(buf))
        out[zarray["dimension_separator"].join(map(str, coords)) if coords else "0"] = buf
    return out


def _write(fs, name: str, files: dict[str, bytes]) -> None:
    for key, buf in files.items():
        path = fs / name
        for part in key.split("/")[:-1]:
            path = path / part
            if not path.exists():
                path.mkdir()
        (path / key.split("/")[-1]).write_bytes(buf)


@settings(max_examples=budget(25))
@given(case=degenerate_arrays(), seed=st.integers(0, 2**16))
def test_degenerate_shapes_are_written_folded_and_read_as_zarr3_reads_them(case, seed, tmp_path_factory):
    """Arrays of every degenerate shape (0-d, a zero-length dimension, grown from zero and
    resized back), created from a ``.zarray`` and written chunk file by chunk file in-process as
    zarr 2.18 writes them, then folded: the mount reads each chunk file back byte for byte, and
    zarr-python 3 reads the source as written (a zero-length array: no shard left)."""
    import zarr

    zarray, grow = case
    root = tmp_path_factory.mktemp("degenerate")
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 100, size=zarray["shape"]).astype(zarray["dtype"])
    with InProcess(root, read_only=False) as fs:
        (fs / "a").mkdir()
        (fs / "a" / ".zarray").write_text(json.dumps(zarray))
        files = _chunk_files(zarray, data)
        _write(fs, "a", files)
        for key, buf in files.items():
            assert (fs / "a" / key).read_bytes() == buf, key
        if zarray["shape"]:  # (a 0-d array has no shape to change)
            grown = dict(zarray, shape=[s + g for s, g in zip(zarray["shape"], grow)])  # from 0 to more
            (fs / "a" / ".zarray").write_text(json.dumps(grown))
            bigger = np.full(grown["shape"], zarray["fill_value"], zarray["dtype"])
            bigger[tuple(slice(0, s) for s in zarray["shape"])] = data
            bigger[tuple(slice(s, None) for s in zarray["shape"])] = 1
            _write(fs, "a", _chunk_files(grown, bigger))
            (fs / "a" / ".zarray").write_text(json.dumps(zarray))  # back to the first shape (zero: nothing)
        else:  # a 0-d array's one chunk is "0" whatever its separator: the other one changes nothing
            other = "." if zarray["dimension_separator"] == "/" else "/"
            (fs / "a" / ".zarray").write_text(json.dumps(dict(zarray, dimension_separator=other)))
            assert (fs / "a" / "0").read_bytes() == files["0"]
    native = zarr.open_array(str(root / "a"), mode="r")[...]
    assert native.shape == tuple(zarray["shape"])
    np.testing.assert_array_equal(native, data)
    if 0 in zarray["shape"]:
        assert sorted(p.name for p in (root / "a").iterdir()) == ["zarr.json"]


# --------------------------------------------------------------------------- no bug ends the mount


def planted(tmp_path: Path, code: str) -> dict[str, str]:
    """The environment of a daemon with ``code`` run at its start (a ``sitecustomize`` first on
    its ``PYTHONPATH``, before the package it imports): how a test plants a bug."""
    site = tmp_path / "planted"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(code))
    return {"PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}


FOLD_CALLBACK_BUG = """
from shardfs.tree import commits

async def folded(self, shard, positions, version):
    raise ZeroDivisionError("planted in the fold callback")

commits.Commits.folded = folded
"""


def test_a_bug_in_the_fold_callback_leaves_the_mount_serving(tmp_path, mount):
    """The fold callback raises after every fold: each shard is still folded, the mount keeps
    serving reads and writes, the bug is logged once with its traceback and shown by
    ``shardfs status``, and ``shardfs umount`` exits 0 (before: the exception left the trio
    nursery and the daemon unmounted)."""
    src = tmp_path / "src"
    build(src, [])
    mnt = mount(src, env=planted(tmp_path, FOLD_CALLBACK_BUG), allow_traceback=True)
    for n in range(3):
        zarr2("""
            z = zarr.open_array(root + '/a', mode='a', shape=(4,), chunks=(2,), dtype='i4', fill_value=0)
            z[:] = n + 1
            result = z[...]
            """, root=str(mnt), n=n)
        wait_for(lambda n=n: status(mnt)["folds"]["done"] >= n + 1, 30, f"fold {n + 1}")
    np.testing.assert_array_equal(zarr2("result = zarr.open_array(p, mode='r')[...]", p=str(mnt / "a")), [3] * 4)

    def shown() -> bool:
        doc = status(mnt)
        return [(b["where"], b["count"]) for b in doc["internal_errors"]["by_place"]] == \
            [("fold callback", doc["folds"]["done"])]

    # With 2 workers the owner's part of the status, as another worker answers it, is its last
    # published one: up to PUBLISH_S old, so it may predate every fold (they take 0.1 s here).
    wait_for(shown, 10, "the fold callback's error in the status")
    time.sleep(PUBLISH_S)
    doc = status(mnt)
    (bug,) = doc["internal_errors"]["by_place"]
    assert (bug["where"], bug["count"]) == ("fold callback", doc["folds"]["done"])
    assert bug["error"] == "ZeroDivisionError: planted in the fold callback"
    log = mount.info(mnt).log_text()
    assert log.count("Traceback") == 1 and log.count("internal error in fold callback") == 1, log
    text = run_shardfs("status", str(mnt)).stdout
    assert "internal error in fold callback" in text and "ZeroDivisionError" in text
    umount(mount, mnt)
    from conftest import read_native

    np.testing.assert_array_equal(read_native(src / "a"), [3] * 4)


HANDLER_BUG = """
from shardfs.tree import names

_lookup = names.Names.lookup

async def lookup(self, parent, name):
    if name == "planted":
        raise KeyError("planted in lookup")
    return await _lookup(self, parent, name)

names.Names.lookup = lookup
"""


def test_a_bug_in_a_request_handler_is_eio_logged_once_with_its_traceback(tmp_path, mount):
    """A lookup meets a bug: EIO each time, one traceback in the log (later ones counted),
    the rest of the mount unaffected."""
    src = tmp_path / "src"
    build(src, [])
    # (one worker: with N, each logs its own first traceback)
    mnt = mount(src, "-o", "workers=1", env=planted(tmp_path, HANDLER_BUG), allow_traceback=True)
    for _ in range(3):
        with pytest.raises(OSError) as e:
            os.stat(mnt / "planted")
        assert e.value.errno == errno.EIO
    assert json.loads((mnt / ".zgroup").read_text()) == {"zarr_format": 2}
    log = mount.info(mnt).log_text()
    assert log.count("Traceback") == 1 and "KeyError: 'planted in lookup'" in log, log
    (bug,) = status(mnt)["internal_errors"]["by_place"]
    assert (bug["where"], bug["count"]) == ("lookup", 3)
    umount(mount, mnt)


LOOP_BUG = """
import os
import trio
from shardfs.kernel import fuseloop

_main = fuseloop.main

async def main(gate=None, exclusive=True):
    async with trio.open_nursery() as nursery:
        async def serve():
            await _main(gate, exclusive)
            nursery.cancel_scope.cancel()  # unmounted: the worker ends as an unplanted one does

        nursery.start_soon(serve)
        while not os.path.exists(os.environ["PLANTED_TRIGGER"]):
            await trio.sleep(0.05)
        raise RuntimeError("planted in the request loop")

fuseloop.main = main
"""


def test_what_ends_the_daemon_is_in_its_log_file(tmp_path, mount):
    """An exception that ends the daemon's worker (planted beside its request loop, raised once a
    file appears) is in the log file with its traceback, not only on a stderr nobody reads."""
    src = tmp_path / "src"
    build(src, [])
    trigger = tmp_path / "trigger"
    mnt = mount(src, env={**planted(tmp_path, LOOP_BUG), "PLANTED_TRIGGER": str(trigger)}, allow_traceback=True)
    m = mount.info(mnt)
    trigger.touch()
    line = "CRITICAL the daemon stops: RuntimeError: planted in the request loop"
    wait_for(lambda: line in m.log_text(), 30, "the daemon's end in its log")
    trigger.unlink()  # the worker that replaces it (``shardfs.app.run``'s supervisor) keeps serving
    assert 'raise RuntimeError("planted in the request loop")' in m.log_text()  # the traceback
