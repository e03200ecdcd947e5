"""The decoded-chunk cache: a transcoded (or crc32c-stripped) chunk is decoded once per shard
version, and never served stale after a write. Observed through the debug log (one line per
decode and per cache hit): in-process (``tests/inproc.py``), and the ``-o chunk_cache`` option
through a mount."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_same_array, read_native, run_shardfs
from inproc import InProcess
from sources import CRC, GZIP, LE, ZSTD, journal_entries, sharding, write_v3
from writers import cache_stats as stats

SHAPE, CHUNK, SHARD = (8, 12), (4, 6), (8, 12)


@pytest.fixture
def src(tmp_path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    data = np.arange(96, dtype="<i4").reshape(SHAPE) + 1
    write_v3(root / "tr", data, SHARD, [sharding(CHUNK, [LE, GZIP, ZSTD])])  # two compressors: transcoded
    write_v3(root / "crc", data, SHARD, [sharding(CHUNK, [LE, CRC])])  # crc32c stripped on read
    return root


def chunk_bytes(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a[:4, :6], dtype="<i4").tobytes()


def test_transcoded_chunk_is_decoded_once_and_fresh_after_a_write(src, caplog):
    """In-process (``tests/inproc.py``): the view's own decodes, counted from its debug log; the
    write is the chunk file zarr 2.18 writes (its region rewritten whole)."""
    caplog.set_level(logging.DEBUG, logger="shardfs")

    def counted() -> dict:
        return {"decodes": caplog.text.count(" decoded (chunk cache: "),
                "hits": caplog.text.count(" served from the chunk cache")}

    with InProcess(src, read_only=False) as fs:
        mnt = fs / ""
        native = read_native(src / "tr")
        before = counted()
        assert (mnt / "tr" / "0.0").read_bytes() == chunk_bytes(native)
        assert (mnt / "tr" / "0.0").read_bytes() == chunk_bytes(native)
        after = counted()
        assert (after["decodes"] - before["decodes"], after["hits"] - before["hits"]) == (1, 1), after
        for _ in range(2):
            assert (mnt / "crc" / "0.0").read_bytes() == chunk_bytes(read_native(src / "crc"))
        crc = counted()
        assert (crc["decodes"] - after["decodes"], crc["hits"] - after["hits"]) == (1, 1), crc

        native[0:2, 0:3] = -7
        (mnt / "tr" / "0.0").write_bytes(chunk_bytes(native))  # the v2 chunk: raw, no compressor
        assert (mnt / "tr" / "0.0").read_bytes() == chunk_bytes(native), "pending write not visible"
        shard = src / "tr" / "c" / "0" / "0"
        old = shard.stat().st_ino
        deadline = time.monotonic() + 20
        # the idle fold replaces the shard, then drops the pending chunk and its journal entry
        while shard.stat().st_ino == old or journal_entries(src):
            assert time.monotonic() < deadline, "the pending chunk was never folded"
            time.sleep(0.1)
        folded = counted()
        assert (mnt / "tr" / "0.0").read_bytes() == chunk_bytes(native), "stale chunk after the fold"
        assert counted()["decodes"] == folded["decodes"] + 1, "the new shard version must be decoded"
    assert_same_array(read_native(src / "tr"), native, "native read after the tree is closed")


def test_chunk_cache_budget_option(src, mount):
    # smaller than one 96-byte chunk: nothing is kept (one worker: each of N keeps 1/N of it, which
    # tests/test_workers.py::test_the_caches_limits_are_the_mounts_each_worker_keeps_its_share checks)
    mnt = mount(src, "-o", "chunk_cache=64,workers=1")
    for _ in range(2):
        (mnt / "tr" / "0.0").read_bytes()
    s = stats(mount, mnt)
    assert (s["decodes"], s["hits"]) == (2, 0), s
    assert "0 entries, 0 of 64 bytes" in mount.info(mnt).log_text()
    bad = run_shardfs("mount", str(src), str(src.parent / "m2"), "-o", "chunk_cache=lots")
    assert bad.returncode == 1, bad
    assert bad.stderr.strip() == "shardfs: error: -o chunk_cache=lots: not a size (e.g. 64M)", bad
