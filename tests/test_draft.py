"""The 2022 sharding storage-transformer draft: reads and writes through the mount.

No library writes the draft: sources are built by ``sources.write_draft``
(inner chunks encoded by zarr-python 3, packed by hand), and the oracle after
writes is ``sources.read_draft``, a reference decoder over zarr's codecs. An array the view
cannot show is checked in-process (``tests/inproc.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import assert_same_array, budget, read_tensorstore, read_zarr2_many, read_zarr3_v2, run_shardfs
from inproc import InProcess, copy_chunk_file
from sources import CRC, GZIP, LE, ZSTD, copy_array, digest_name, random_data, read_draft, write_draft
from writers import WRITERS, umount

V2_DOT = {"name": "v2", "configuration": {"separator": "."}}


# name -> (data, chunk shape, chunks per shard, codecs, key encoding, transformer name key, v2 compressor)
ARRAYS = {
    "d2": (random_data((11, 13), "int32", 1, [np.s_[0:3, 0:4]]), (3, 4), (2, 2), [LE, ZSTD], None,
           "storage_transformer", {"id": "zstd", "level": 1}),
    "d3": (random_data((5, 6, 7), "float64", 2, [np.s_[4:5]]), (2, 3, 3), (2, 1, 2), [LE, GZIP, CRC], V2_DOT,
           "storage_transformer", {"id": "gzip", "level": 3}),
    "dtr": (random_data((9, 10), "uint16", 3), (4, 3), (1, 3), [LE, GZIP, ZSTD], None,
            "storage_transformer", None),
    # zarr-python 2.13's experimental spelling of the transformer's name
    "dext": (random_data((17,), "int16", 4, [np.s_[6:9]]), (3,), (3,), [LE], None, "extension", None),
}


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("draft") / "src"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    for name, (data, chunk, cps, codecs, keys, spelling, _comp) in ARRAYS.items():
        write_draft(root / name, data, chunk, cps, codecs, key_encoding=keys, spec_name=spelling)
    return root


def test_reference_decoder_reads_what_was_written(src):
    for name, (data, *_rest) in ARRAYS.items():
        assert_same_array(read_draft(src / name), data, f"reference decode of {name}")


def test_draft_arrays_read_with_every_v2_client(mnt):
    via_zarr2 = read_zarr2_many([mnt / n for n in ARRAYS])
    for name, (data, *_rest) in ARRAYS.items():
        assert_same_array(via_zarr2[str(mnt / name)], data, f"zarr 2.18 read of {name}")
        assert_same_array(read_zarr3_v2(mnt / name), data, f"zarr 3 v2 read of {name}")
        assert_same_array(read_tensorstore(mnt / name), data, f"tensorstore read of {name}")


@pytest.mark.parametrize("name", list(ARRAYS))
def test_zarray_and_shard_dirs(tree, name):
    """In-process."""
    mnt = tree
    data, chunk, cps, _codecs, keys, _spelling, compressor = ARRAYS[name]
    zarray = json.loads((mnt / name / ".zarray").read_text())
    assert zarray["chunks"] == list(chunk) and zarray["shape"] == list(data.shape)
    assert zarray["compressor"] == compressor
    if keys is None:  # default keys: shard directory c/0/0 holds the chunks of shard (0, 0)
        shard_dir = mnt / name / "c" / "0" / ("0" if data.ndim > 1 else "")
        expected = set()
        for idx in np.ndindex(*cps):
            region = tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunk))
            if np.any(data[region]):
                expected.add(".".join(map(str, idx)))
        assert set(shard_dir.iterdir()) == expected


@pytest.mark.parametrize("name,writer", [("d2", "zarr2"), ("d3", "zarr3"), ("dtr", "zarr2"), ("dext", "zarr3")])
def test_writes_fold_into_the_draft_layout(name, writer, src, tmp_path, mount):
    own = copy_array(src / name, tmp_path / "src")
    before = (own / name / "zarr.json").read_text()
    expected = ARRAYS[name][0].copy()
    region = tuple(slice(1, s - 1) for s in expected.shape)
    values = (np.arange(math.prod(expected[region].shape)) % 200 + 5).reshape(expected[region].shape)
    expected[region] = values.astype(expected.dtype)
    mnt = mount(own)
    WRITERS[writer](mnt / name, region, values.astype(expected.dtype), tmp_path)
    assert_same_array(read_zarr3_v2(mnt / name), expected, "read-back through the mount")
    umount(mount, mnt)
    assert (own / name / "zarr.json").read_text() == before, "the metadata must not change"
    assert_same_array(read_draft(own / name), expected, f"reference decode of {name} after the writes")


@pytest.mark.parametrize("name", ["d2", "d3", "dtr", "dext"])
def test_a_chunk_file_rewritten_folds_into_the_draft_layout_in_process(name, src, tmp_path):
    """The daemon's part of ``writes_fold_into_the_draft_layout``, in-process (``tests/inproc.py``):
    a chunk file written with another chunk's bytes reads back as written and folds into the
    2022 draft's layout, the metadata unchanged (the mounted test writes with zarr 2.18 and 3)."""
    own = copy_array(src / name, tmp_path / "src")
    before = (own / name / "zarr.json").read_text()
    expected = ARRAYS[name][0].copy()
    with InProcess(own, read_only=False) as fs:
        copy_chunk_file(fs / name, expected)
    assert (own / name / "zarr.json").read_text() == before, "the metadata must not change"
    assert_same_array(read_draft(own / name), expected, f"reference decode of {name} after the write")


def test_inspect_draft_shard(mnt, src):
    out = run_shardfs("inspect", "--json", str(mnt / "d2" / "c" / "1" / "1"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["storage_transformer"].startswith("sharding storage-transformer draft")
    assert report["index"] == {"location": "end", "endian": "little", "crc32c": False, "nbytes": 64}
    assert report["chunk_shape"] == [3, 4] and report["shard_shape"] == [6, 8]
    shard = report["shard"]
    assert shard["index_status"] == "ok (no checksum)"
    assert shard["unused_bytes"] == shard["stored_chunks"], "write_draft leaves one byte after each chunk"
    text = run_shardfs("inspect", str(src / "d2"))
    assert "storage-transformer draft" in text.stdout, text.stdout


def test_unknown_storage_transformer_is_explained(tmp_path):
    """In-process (``tests/inproc.py``); ``inspect`` of the source."""
    root = tmp_path / "src"
    write_draft(root / "a", random_data((4,), "int32", 5), (2,), (2,), [LE])
    doc = json.loads((root / "a" / "zarr.json").read_text())
    doc["storage_transformers"][0]["storage_transformer"] = "https://example.org/other"
    (root / "a" / "zarr.json").write_text(json.dumps(doc))
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    with InProcess(root) as fs:
        assert (fs / "a").iterdir() == []
    out = run_shardfs("inspect", str(root / "a"))
    assert "unsupported storage transformer" in out.stdout, out.stdout


@st.composite
def draft_arrays(draw):
    ndim = draw(st.integers(1, 3))
    chunk = [draw(st.integers(1, 4)) for _ in range(ndim)]
    cps = [draw(st.integers(1, 3)) for _ in range(ndim)]
    shape = [draw(st.integers(1, 2 * c * n + 1)) for c, n in zip(chunk, cps)]
    codecs = draw(st.sampled_from([[LE], [LE, ZSTD], [LE, GZIP, CRC], [LE, GZIP, ZSTD]]))
    keys = draw(st.sampled_from([None, V2_DOT, {"name": "default", "configuration": {"separator": "."}}]))
    data = np.random.default_rng(draw(st.integers(0, 2**16))).integers(0, 3, size=shape).astype("uint8")
    return data, chunk, cps, codecs, keys


@settings(max_examples=budget(100))
@given(case=draft_arrays())
def test_property_draft_reads_match_the_reference(case, tree, src):
    """In-process (``tests/inproc.py``); zarr 3 (v2 mode) reads a copy of the files shown."""
    data, chunk, cps, codecs, keys = case
    name = digest_name(data.shape, chunk, cps, codecs, keys, data.tobytes().hex())
    if not (src / name).exists():
        write_draft(src / name, data, chunk, cps, codecs, key_encoding=keys, order="C")
    assert_same_array(read_draft(src / name), data, "reference decoder")
    shown = (tree / name).copy_to(src.parent / "shown" / name)
    assert_same_array(read_zarr3_v2(shown), data, f"zarr 3 v2 read of {chunk} x {cps} {codecs}")
