"""Listings of an object store (and a local directory) are remembered for the entry timeout.

Seen on the wire through a recording proxy (``testkit.delayproxy.DelayProxy``, no delay)
in front of SeaweedFS: a listing repeated within ``-o entry_timeout`` sends no LIST; a change
made through the mount (a fold creating a shard, a new array, ``rm -r``) shows in the next
listing at once; a change made in the bucket behind the mount's back shows once the entry
timeout has passed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from urllib.parse import quote

import obstore
import pytest

from testkit.delayproxy import DelayProxy
from conftest import wait_for
from shardfs.app import state
from shardfs.writes.journal import segments_under
from inproc import InProcess
from sources import Spec, build
from test_s3_mount import write_chunk

W = Spec("w", (16, 20), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
         index_location="end", index_crc=True, initial=((slice(0, 8), slice(0, 10)),),
         write=(slice(0, 16), slice(0, 20)))  # 2 x 2 shards of 2 x 2 chunks; shard (0, 0) stored


@pytest.fixture
def proxied(tmp_path, s3, s3_upload, mount):
    """``(S3Source, proxy, mount point, expected, journal directory)``: ``W`` in a fresh
    prefix, mounted through a recording proxy, the mount's own requests forgotten."""
    exp = build(tmp_path / "src", [W])["w"]
    up = s3_upload(tmp_path / "src")
    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0, record=True) as proxy:
        endpoint = f"http://127.0.0.1:{proxy.port}"
        mnt = mount(up.url, "-o", f"endpoint={endpoint}", env=up.env)
        proxy.log.clear()
        yield up, proxy, mnt, exp, Path(state.journal_dir(up.url, endpoint=endpoint))


def listed(dirs) -> list[list[str]]:
    return [sorted(os.listdir(d)) for d in dirs]


def lists(proxy, prefix: str | None = None) -> int:
    """LIST requests seen (of ``prefix`` below the mounted one, when given)."""
    return sum(r.method == "LIST" and (prefix is None or f"prefix={quote(prefix, safe='')}&" in r.query + "&")
               for r in proxy.log)


def test_a_listing_repeated_within_the_entry_timeout_costs_no_list(proxied):
    """Listing the root, the array and its shard directories costs 7 LISTs (a listing stops
    at each sub-prefix and lists again after it; the array's listing lists its shards); the
    same listings again within the 10 s entry timeout cost none, getattr of the shard
    directories included (answered from the parent's listing)."""
    up, proxy, mnt, exp, _ = proxied
    dirs = [mnt, mnt / "w", mnt / "w" / "c", mnt / "w" / "c" / "0"]
    first = listed(dirs)
    assert first == [[".zattrs", ".zgroup", ".zmetadata", "w"], [".zarray", ".zattrs", "0.0", "0.1", "1.0", "1.1"],
                     ["0"], ["0"]]
    assert lists(proxy) == 7, [(r.method, r.query) for r in proxy.log]
    proxy.log.clear()
    assert listed(dirs) == first
    assert [os.path.isdir(d) for d in dirs] == [True] * 4
    assert lists(proxy) == 0, [(r.method, r.query) for r in proxy.log]


def test_changes_made_through_the_mount_show_in_the_next_listing_at_once(proxied):
    """Each listing cached first, then changed through the mount: a fold creating shard
    (1, 1), a new array (``.zarray``), ``rm -r`` of an array: the next listing shows the change
    and asks the store again for the listings the change touched."""
    up, proxy, mnt, exp, journal = proxied
    prefix = up.prefix
    dirs = [mnt, mnt / "w", mnt / "w" / "c"]
    assert listed(dirs) == [[".zattrs", ".zgroup", ".zmetadata", "w"],
                            [".zarray", ".zattrs", "0.0", "0.1", "1.0", "1.1"], ["0"]]
    write_chunk(mnt, W, (3, 3), 5, exp)  # shard (1, 1): new
    wait_for(lambda: segments_under(str(journal)) == [], 30, "the fold of shard (1, 1)")
    assert [k for k in up.keys() if "/c/" in k] == ["w/c/0/0", "w/c/1/1"]
    proxy.log.clear()
    assert listed(dirs[1:]) == [[".zarray", ".zattrs", "0.0", "0.1", "1.0", "1.1", "3.3"],
                                ["0", "1"]]
    assert sorted(os.listdir(mnt / "w" / "c" / "1")) == ["1"]
    assert lists(proxy, f"{prefix}/w/c/") >= 1
    (mnt / "made").mkdir()
    (mnt / "made" / ".zarray").write_text(json.dumps(
        {"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<i2", "compressor": None,
         "fill_value": 0, "order": "C", "filters": None}))
    assert "made/zarr.json" in up.keys()
    proxy.log.clear()
    assert sorted(os.listdir(mnt)) == [".zattrs", ".zgroup", ".zmetadata", "made", "w"]
    assert lists(proxy, f"{prefix}/") >= 1
    shutil.rmtree(mnt / "w")
    assert [k for k in up.keys() if k.startswith("w/")] == []
    assert sorted(os.listdir(mnt)) == [".zattrs", ".zgroup", ".zmetadata", "made"]


def test_a_change_behind_the_mounts_back_shows_after_the_entry_timeout(tmp_path, s3_upload, mount):
    """``-o entry_timeout=2``: a group and a shard added to the bucket by another client are
    not listed while the listings made just before are fresh, and are listed within the
    timeout (plus polling slack) after that."""
    build(tmp_path / "src", [W])
    up = s3_upload(tmp_path / "src")
    mnt = mount(up.url, "-o", "entry_timeout=2", env=up.env)
    assert sorted(os.listdir(mnt)) == [".zattrs", ".zgroup", ".zmetadata", "w"]
    assert sorted(os.listdir(mnt / "w" / "c")) == ["0"]
    store = up.store()
    obstore.put(store, "g/zarr.json", json.dumps({"zarr_format": 3, "node_type": "group"}).encode())
    obstore.put(store, "w/c/1/1", bytes(obstore.get(store, "w/c/0/0").bytes()))
    assert sorted(os.listdir(mnt)) == [".zattrs", ".zgroup", ".zmetadata", "w"]  # remembered: well within 2 s
    assert sorted(os.listdir(mnt / "w" / "c")) == ["0"]
    wait_for(lambda: sorted(os.listdir(mnt)) == [".zattrs", ".zgroup", ".zmetadata", "g", "w"], 4,
             "the new group listed")
    wait_for(lambda: sorted(os.listdir(mnt / "w" / "c")) == ["0", "1"], 4, "the new shard listed")


def test_a_change_behind_a_local_mounts_back_shows_after_the_entry_timeout(tmp_path):
    """The same for a local directory: its listings are remembered as well, for
    ``-o entry_timeout=2``. In-process (``tests/inproc.py``: the listings are the view's)."""
    src = tmp_path / "src"
    build(src, [W])
    with InProcess(src, list_ttl=2) as fs:
        mnt = fs / ""
        assert sorted(mnt.iterdir()) == [".zattrs", ".zgroup", ".zmetadata", "w"]
        assert sorted((mnt / "w" / "c").iterdir()) == ["0"]
        (src / "g").mkdir()
        (src / "g" / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
        (src / "w" / "c" / "1").mkdir()
        shutil.copy(src / "w" / "c" / "0" / "0", src / "w" / "c" / "1" / "1")
        assert sorted(mnt.iterdir()) == [".zattrs", ".zgroup", ".zmetadata", "w"]  # remembered: well within 2 s
        wait_for(lambda: sorted(mnt.iterdir()) == [".zattrs", ".zgroup", ".zmetadata", "g", "w"], 4,
                 "the new group listed")
        wait_for(lambda: sorted((mnt / "w" / "c").iterdir()) == ["0", "1"], 4, "the new shard listed")


def test_groups_whose_names_extend_one_another_are_all_listed(tmp_path, s3_upload, mount):
    """Groups ``foo``, ``foo-`` and ``foo_`` in the bucket are all listed (zarr 2.18's
    ``test_double_counting_group_v3`` through a mount): SeaweedFS lists ``foo`` before ``foo-``
    (not in the bytes' order, ``-`` < ``/``), and the listing's skip past ``foo/`` dropped ``foo-``."""
    build(tmp_path / "src", [])
    up = s3_upload(tmp_path / "src")
    store = up.store()
    for name in ("foo", "foo-", "foo_"):
        obstore.put(store, f"g/{name}/zarr.json", json.dumps({"zarr_format": 3, "node_type": "group"}).encode())
        obstore.put(store, f"g/{name}/bar/zarr.json", json.dumps({"zarr_format": 3, "node_type": "group"}).encode())
    obstore.put(store, "g/zarr.json", json.dumps({"zarr_format": 3, "node_type": "group"}).encode())
    mnt = mount(up.url, env=up.env)
    assert sorted(os.listdir(mnt / "g")) == [".zattrs", ".zgroup", ".zmetadata", "foo", "foo-", "foo_"]
