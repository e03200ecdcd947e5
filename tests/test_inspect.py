"""`shardfs inspect` on shards, shard directories in a mount, and arrays."""

from __future__ import annotations

import json
import os

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

from conftest import run_shardfs


def _make(src):
    arr = zarr.create_array(str(src / "raw"), shape=(40, 50), chunks=(10, 10), shards=(20, 20),
                            dtype="int32", compressors=[ZstdCodec(level=1)], fill_value=0)
    data = np.zeros((40, 50), dtype="int32")
    data[0:10, 0:10] = 1  # one inner chunk of shard (0, 0)
    data[20:40, 40:50] = 2  # edge shard (1, 2): two inner chunks, two past the edge
    arr[:] = data
    zarr.open_group(str(src), mode="a")
    return arr


def test_inspect_shard_dir_in_mount_matches_listing(tmp_path, mount):
    src = tmp_path / "src"
    _make(src)
    mnt = mount(src)
    out = run_shardfs("inspect", "--json", str(mnt / "raw" / "c" / "1" / "2"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    shard = report["shard"]
    assert shard["key"] == "c/1/2"
    assert shard["index_status"].startswith("ok")
    stored = {row["chunk"] for row in shard["index"] if not row["empty"]}
    assert stored == set(os.listdir(mnt / "raw" / "c" / "1" / "2")) == {"2.4", "3.4"}
    past_edge = [row for row in shard["index"] if row["chunk"] is None]
    assert len(past_edge) == 2 and all(row["empty"] for row in past_edge)
    sizes = {row["chunk"]: row["nbytes"] for row in shard["index"] if not row["empty"]}
    assert sizes["2.4"] == os.stat(mnt / "raw" / "2.4").st_size
    assert shard["unused_bytes"] == 0
    assert report["v2_compressor"] == {"id": "zstd", "level": 1}


def test_inspect_text_and_corrupt_shard(tmp_path):
    src = tmp_path / "src"
    _make(src)
    shard_file = src / "raw" / "c" / "0" / "0"
    text = run_shardfs("inspect", str(shard_file))
    assert text.returncode == 0 and "checksum verified" in text.stdout and "0.0" in text.stdout
    raw = bytearray(shard_file.read_bytes())
    raw[-1] ^= 0xFF
    shard_file.write_bytes(bytes(raw))
    report = json.loads(run_shardfs("inspect", "--json", str(shard_file)).stdout)
    assert report["shard"]["index_status"].startswith("corrupt: index checksum mismatch")


def test_inspect_unpresentable_array_and_bad_path(tmp_path):
    src = tmp_path / "src"
    _make(src)
    meta = json.loads((src / "raw" / "zarr.json").read_text())
    meta["codecs"][0]["configuration"]["chunk_shape"] = [3, 10]  # does not divide the shard
    (src / "raw" / "zarr.json").write_text(json.dumps(meta))
    report = json.loads(run_shardfs("inspect", "--json", str(src / "raw")).stdout)
    assert report["presentable"] is False and report["reason"]
    bad = run_shardfs("inspect", str(tmp_path))
    assert bad.returncode == 1 and "not inside a Zarr v3 array" in bad.stderr
