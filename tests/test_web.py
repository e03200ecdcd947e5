"""Plain web servers as sources (doc: OBJECT-STORAGE "Web servers"): ``shardfs mount
http://host/path/data.zarr MNT`` through nginx on loopback (Range, ETag, no listing).

zarr-python 3 reading the same files locally is the oracle; zarr 2.18 reads the mount.
Listings are made up from the metadata: consolidated metadata and OME-Zarr attributes
name a group's children, an array's shards are found by the GETs of their indexes; any
other child is found by name. The mount is read-only (EROFS).
"""

from __future__ import annotations

import errno
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import read_zarr2_many, run_shardfs
from inproc import InProcess


def _source(root: Path) -> dict[str, np.ndarray]:
    """``root/data.zarr``: a consolidated group with a sharded array and a group, an OME image
    (levels named by ``multiscales``), and ``extra`` (a group no metadata names); returns the
    arrays written, by path."""
    import zarr

    rng = np.random.default_rng(5)
    written = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = zarr.open_group(str(root / "data.zarr"), mode="w", zarr_format=3)
        raw = g.create_array("raw", shape=(10, 12), chunks=(2, 3), shards=(4, 6), dtype="u2")
        raw[:7] = written["raw"] = rng.integers(1, 1000, (7, 12)).astype("u2")  # rows 8-9: no shard
        sub = g.create_group("sub")
        x = sub.create_array("x", shape=(5,), chunks=(2,), shards=(4,), dtype="f4", compressors=None)
        x[:] = written["sub/x"] = rng.random(5).astype("f4")
        img = g.create_group("img", attributes={"ome": {"version": "0.5", "multiscales": [
            {"name": "img", "axes": [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}],
             "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1, 1]}]}]}]}})
        level = img.create_array("0", shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="u1")
        level[:] = written["img/0"] = rng.integers(0, 255, (8, 8)).astype("u1")
        zarr.consolidate_metadata(str(root / "data.zarr"))
        extra = g.create_group("extra")  # after consolidating: named by nothing
        e = extra.create_array("e", shape=(3,), chunks=(3,), dtype="i8")
        e[:] = written["extra/e"] = np.array([7, -1, 3])
    for name in written:  # completed by zarr 3 reading the files (fill of absent chunks)
        written[name] = np.asarray(zarr.open_array(str(root / "data.zarr" / name), mode="r")[...])
    return written


def test_a_web_source_reads_as_native(tmp_path, web_server, mount):
    root = tmp_path / "www"
    written = _source(root)
    server = web_server(root)
    mnt = mount(f"{server.url}/data.zarr")
    assert sorted(os.listdir(mnt)) == [".zattrs", ".zgroup", ".zmetadata", "img", "raw", "sub"]
    assert [n for n in sorted(os.listdir(mnt / "img")) if not n.startswith(".")] == ["0"]
    assert [n for n in os.listdir(mnt / "extra") if not n.startswith(".")] == []  # found by name; "e" not named
    raw_chunks = {f"{i}.{j}" for i in range(4) for j in range(4)}
    assert {n for n in os.listdir(mnt / "raw") if not n.startswith(".")} == raw_chunks
    assert sorted(os.listdir(mnt / "raw" / "c" / "1" / "1")) == ["2.2", "2.3", "3.2", "3.3"]
    assert os.listdir(mnt / "raw" / "c" / "2") == []  # a grid position without shards: a 404 each
    got = read_zarr2_many([mnt / p for p in written])
    for path, want in written.items():
        np.testing.assert_array_equal(got[str(mnt / path)], want, err_msg=path)
    heads = [r for r in server.requests() if r.startswith("HEAD ")]
    assert not [r for r in heads if "/raw/" in r or "/img/" in r], heads  # shards: found by their index GETs


def test_a_web_source_lists_what_its_metadata_and_index_gets_say_in_process(tmp_path, web_server):
    """The listings of ``a_web_source_reads_as_native``, in-process (``tests/inproc.py`` over an
    ``http://`` source): a web server lists nothing, so the tree lists the groups and arrays the
    consolidated metadata names, an array's chunks from its shards' index GETs (a grid position
    without a shard: a 404, an empty shard directory), and never asks a HEAD of a shard; every
    chunk file's bytes are the stored chunk's (the mounted test reads them with zarr 2.18)."""
    root = tmp_path / "www"
    _source(root)
    server = web_server(root)
    with InProcess(f"{server.url}/data.zarr") as fs:
        assert sorted((fs / ".").iterdir()) == [".zattrs", ".zgroup", ".zmetadata", "img", "raw", "sub"]
        assert [n for n in sorted((fs / "img").iterdir()) if not n.startswith(".")] == ["0"]
        assert [n for n in (fs / "extra").iterdir() if not n.startswith(".")] == []  # found by name; "e" not named
        raw_chunks = {f"{i}.{j}" for i in range(4) for j in range(4)}
        assert {n for n in (fs / "raw").iterdir() if not n.startswith(".")} == raw_chunks
        assert sorted((fs / "raw" / "c" / "1" / "1").iterdir()) == ["2.2", "2.3", "3.2", "3.3"]
        assert (fs / "raw" / "c" / "2").iterdir() == []  # a grid position without shards: a 404 each
        assert (fs / "raw" / "c" / "1" / "1" / "2.2").read_bytes() == (fs / "raw" / "2.2").read_bytes()
    heads = [r for r in server.requests() if r.startswith("HEAD ")]
    assert not [r for r in heads if "/raw/" in r or "/img/" in r], heads  # shards: found by their index GETs


def test_a_web_source_is_read_only(tmp_path, web_server, mount):
    root = tmp_path / "www"
    _source(root)
    server = web_server(root)
    mnt = mount(f"{server.url}/data.zarr")
    for attempt in (lambda: (mnt / "raw" / "new").write_bytes(b"x"), lambda: os.mkdir(mnt / "newdir"),
                    lambda: os.unlink(mnt / "raw" / "0.0")):
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno == errno.EROFS
    assert (root / "data.zarr" / "raw" / "c" / "0" / "0").exists()


def test_web_source_mistakes_are_one_line(tmp_path, web_server, mnt_dir):
    root = tmp_path / "www"
    _source(root)
    server = web_server(root)
    r = run_shardfs("mount", f"{server.url}/nothing.zarr", str(mnt_dir))
    assert (r.returncode, r.stderr.strip().splitlines()) == (
        1, [f"shardfs: error: {server.url}/nothing.zarr: not a Zarr v3 group or array (no zarr.json)"])
    r = run_shardfs("mount", f"{server.url}/data.zarr", str(mnt_dir), "-o", "endpoint=http://x")
    assert (r.returncode, r.stderr.strip()) == (
        2 if "usage" in r.stderr else 1, r.stderr.strip())
    assert r.stderr.strip().splitlines()[-1].endswith(
        "-o endpoint: applies to an object store (s3://...), not to a web server")
    server.stop()
    r = run_shardfs("mount", f"{server.url}/data.zarr", str(mnt_dir))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "server unreachable" in r.stderr
    assert not os.path.ismount(mnt_dir)


def test_a_shard_changed_on_the_server_is_seen(tmp_path, web_server, mount):
    import zarr

    root = tmp_path / "www"
    _source(root)
    server = web_server(root)
    mnt = mount(f"{server.url}/data.zarr", "-o", "attr_timeout=0.5,entry_timeout=0.5")
    before = json.loads((mnt / "sub" / "x" / ".zarray").read_text())
    assert before["shape"] == [5]
    first = (mnt / "sub" / "x" / "0").read_bytes()
    time.sleep(1.1)  # nginx's ETag is the mtime in seconds and the size (the same here)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.open_array(str(root / "data.zarr" / "sub" / "x"), mode="r+")[:2] = [42.0, 43.0]
    time.sleep(1.5)
    after = (mnt / "sub" / "x" / "0").read_bytes()
    assert np.frombuffer(after, "<f4").tolist() == [42.0, 43.0] and after != first
