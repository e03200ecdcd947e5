"""shardfs.reads.rangecache: ranges of object versions in memory and in a disk cache directory.

Real temporary directories throughout; the disk-failure tests mount a small or read-only
tmpfs (root only, as the FUSE tests are run here). Through a mount: ``-o cache_dir`` over
SeaweedFS, with the daemon's requests seen by a recording proxy (``testkit.delayproxy``).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import obstore
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.delayproxy import DelayProxy, Request
from conftest import budget, read_zarr2, run_shardfs
from source_kinds import BucketSource, unique_prefix
from sources import Spec, assert_read_equals, build
from shardfs.reads.rangecache import BLOCK, TAG_NAME, RangeCache
from shardfs.storage import Version

WHERE = "s3://bucket/prefix/raw/c/0/0"
V1 = Version('"etag-1"', 1 << 20, 1)
V2 = Version('"etag-2"', 1 << 20, 2)
CONTENT = {V1: random.Random(1).randbytes(V1.size), V2: random.Random(2).randbytes(V2.size)}


def put_on_disk(root: Path, where: str, offset: int, data: bytes) -> None:
    cache = RangeCache(0, str(root))
    cache.put(where, V1, offset, data)
    cache.flush()


def cache_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*/*") if not p.name.startswith(".tmp."))


def disk_bytes(root: Path) -> int:
    """The bytes of the cache's files (one the background trim removes while they are summed: 0)."""
    def size(p: Path) -> int:
        try:
            return p.stat().st_size
        except FileNotFoundError:
            return 0

    return sum(map(size, cache_files(root)))


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter importing the shardfs this test does (-P: not the
    working directory's: ``scripts/mutants`` plants its bugs in a copy on PYTHONPATH)."""
    return subprocess.run([sys.executable, "-P", "-c", code], check=True, capture_output=True,
                          text=True, timeout=60).stdout


@pytest.fixture
def tmpfs(tmp_path):
    """``make(options)``: a tmpfs mounted on a new directory (root only), unmounted at the end."""
    mounted = []

    def make(options: str) -> Path:
        point = tmp_path / f"tmpfs{len(mounted)}"
        point.mkdir()
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], check=True)
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=True)


# --------------------------------------------------------------------------- memory


def test_sub_ranges_are_served_and_uncovered_ranges_miss():
    cache = RangeCache(4 << 20)
    data = CONTENT[V1]
    cache.put(WHERE, V1, 1000, data[1000:5000])
    assert cache.get(WHERE, V1, 1000, 4000) == data[1000:5000]
    assert cache.get(WHERE, V1, 1234, 100) == data[1234:1334]
    assert cache.get(WHERE, V1, 4999, 1) == data[4999:5000]
    assert cache.get(WHERE, V1, 999, 10) is None  # starts before
    assert cache.get(WHERE, V1, 4990, 11) is None  # ends after
    assert cache.get(WHERE, V1, 6000, 10) is None
    assert cache.get("s3://bucket/prefix/raw/c/0/1", V1, 1234, 100) is None
    cache.put(WHERE, V1, 5000, data[5000:6000])  # adjacent ranges are not stitched together
    assert cache.get(WHERE, V1, 4990, 20) is None
    assert cache.get(WHERE, V1, 5500, 20) == data[5500:5520]


def test_the_end_of_an_object_and_suffix_ranges():
    cache = RangeCache(4 << 20)
    data = CONTENT[V1]
    cache.put(WHERE, V1, -100, data[-100:])  # a suffix range (an index at the end)
    assert cache.get(WHERE, V1, V1.size - 100, 100) == data[-100:]
    assert cache.get(WHERE, V1, -40, 40) == data[-40:]
    assert cache.get(WHERE, V1, V1.size - 10, 1000) == data[-10:]  # shorter past the end
    assert cache.get(WHERE, V1, V1.size + 5, 10) == b""
    assert cache.get(WHERE, V1, V1.size - 101, 10) is None


def test_a_new_etag_invalidates_the_old_one():
    cache = RangeCache(4 << 20)
    cache.put(WHERE, V1, 0, CONTENT[V1][:1000])
    cache.put(WHERE, V1, 5000, CONTENT[V1][5000:6000])
    cache.put(WHERE, V2, 0, CONTENT[V2][:500])
    assert cache.get(WHERE, V1, 0, 100) is None
    assert cache.get(WHERE, V1, 5000, 100) is None
    assert cache.get(WHERE, V2, 0, 100) == CONTENT[V2][:100]
    assert cache.used == 500  # the old version's ranges are gone


def test_an_object_without_etag_is_never_cached():
    cache = RangeCache(4 << 20)
    unknown = Version("", 100, 0)
    cache.put(WHERE, unknown, 0, b"x" * 100)
    assert cache.get(WHERE, unknown, 0, 10) is None
    assert cache.used == 0


def test_memory_hits_share_the_put_buffer_without_a_copy():
    """A range is kept as put (obstore's body, not a copy) and a part of it is served as a
    ``memoryview`` of it: a shard fetched whole costs no copy per chunk served from it."""
    cache = RangeCache(4 << 20)
    body = obstore.Bytes(CONTENT[V1][:300_000])  # what a GET with copy=False gives
    cache.put(WHERE, V1, 0, body)
    assert cache.get(WHERE, V1, 0, 300_000) is body
    part = cache.get(WHERE, V1, 1000, 4000)
    assert isinstance(part, memoryview) and part.obj is body and part.readonly
    assert part == CONTENT[V1][1000:5000]
    assert cache.used == 300_000
    cache.put(WHERE, V1, V1.size - 100, b"x" * 200)  # longer than the object: cut to its end
    assert cache.get(WHERE, V1, V1.size - 100, 200) == b"x" * 100


def test_memory_is_bounded_and_least_recently_used_goes_first():
    cache = RangeCache(3000)
    data = CONTENT[V1]
    for i in range(3):
        cache.put(f"s3://b/{i}", V1, 0, data[:1000])
    assert cache.get("s3://b/0", V1, 0, 10) == data[:10]  # 0 is now more recent than 1
    cache.put("s3://b/3", V1, 0, data[:1000])
    assert cache.used == 3000
    assert cache.get("s3://b/1", V1, 0, 10) is None
    assert [cache.get(f"s3://b/{i}", V1, 0, 10) for i in (0, 2, 3)] == [data[:10]] * 3
    cache.put("s3://b/4", V1, 0, data[:3001])  # larger than the whole budget: not kept, nothing evicted
    assert cache.get("s3://b/4", V1, 0, 10) is None
    assert cache.used == 3000
    assert RangeCache(0).get(WHERE, V1, 0, 1) is None


def test_a_range_inside_a_cached_one_is_not_kept_twice():
    cache = RangeCache(1 << 20)
    data = CONTENT[V1]
    cache.put(WHERE, V1, 100, data[100:200])
    cache.put(WHERE, V1, 300, data[300:400])
    cache.put(WHERE, V1, 900, data[900:1000])
    cache.put(WHERE, V1, 0, data[:1000])  # the read-ahead of the rest: replaces all three
    assert cache.used == 1000
    cache.put(WHERE, V1, 500, data[500:600])
    assert cache.used == 1000
    assert cache.get(WHERE, V1, 150, 300) == data[150:450]


# --------------------------------------------------------------------------- the oracle

SIZES = {("s3://b/x", '"a"'): 300_000, ("s3://b/x", '"b"'): 2_000, ("s3://b/y", '"a"'): 600_000}
CONTENTS = {key: random.Random(str(key)).randbytes(size) for key, size in SIZES.items()}
_key = st.sampled_from(sorted(SIZES))
_op = st.one_of(
    st.tuples(st.just("put"), _key, st.integers(-700_000, 700_000), st.integers(1, 700_000)),
    st.tuples(st.just("get"), _key, st.integers(-700_000, 700_000), st.integers(0, 700_000)),
)
MODES = {  # memory bytes, disk bound (None: no disk cache)
    "memory": (1 << 30, None),
    "small-memory": (400_000, None),
    "disk-only": (0, 1 << 30),
    "memory-and-disk": (200_000, 1 << 30),
}


def _span(size: int, offset: int, nbytes: int) -> tuple[int, int]:
    start = max(0, size + offset) if offset < 0 else offset
    return start, min(start + nbytes, size)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(60))
@given(ops=st.lists(_op, max_size=25))
def test_served_ranges_match_an_oracle(mode, ops, tmp_path):
    """Every get returns the exact bytes or None; with room for everything, None exactly when
    no single range put since the object's last version change covers it."""
    memory, disk = MODES[mode]
    with tempfile.TemporaryDirectory(dir=tmp_path) as root:
        cache = RangeCache(memory, root if disk else None, disk)
        current: dict[str, tuple[str, list[tuple[int, int]]]] = {}  # where -> (tag, ranges)
        for kind, (where, tag), offset, nbytes in ops:
            version = Version(tag, SIZES[where, tag], 0)
            start, stop = _span(version.size, offset, nbytes)
            content = CONTENTS[where, tag]
            if kind == "put":
                if start < stop:
                    cache.put(where, version, offset, content[start:stop])
                    ranges = current[where][1] if current.get(where, ("",))[0] == tag else []
                    current[where] = (tag, ranges + [(start, stop)])
                continue
            cache.flush()
            got = cache.get(where, version, offset, nbytes)
            assert got is None or got == content[start:stop]
            covered = start >= stop or (current.get(where, ("",))[0] == tag
                                        and any(s <= start and stop <= e for s, e in current[where][1]))
            if mode != "small-memory":
                assert (got is not None) == covered
            assert cache.used <= memory
            assert cache.used == sum(len(d) for obj in cache._objects.values() for d in obj.data.values())
        cache.flush()  # before the directory goes


# --------------------------------------------------------------------------- disk


def test_ranges_persist_across_caches_and_processes(tmp_path):
    root = tmp_path / "cache"
    data = CONTENT[V1]
    first = RangeCache(1 << 20, str(root))
    first.put(WHERE, V1, 1000, data[1000:900_000])  # several crc32c blocks
    first.flush()
    assert (root / TAG_NAME).read_bytes().startswith(b"Signature: 8a477f597d28d172789f06886806bc55")
    assert len(cache_files(root)) == 1
    second = RangeCache(0, str(root))  # no memory: every hit is read from disk
    assert second.get(WHERE, V1, 1000, 10) == data[1000:1010]
    assert second.get(WHERE, V1, 3 * BLOCK - 5, 10) == data[3 * BLOCK - 5: 3 * BLOCK + 5]
    assert second.get(WHERE, V1, 899_990, 10) == data[899_990:900_000]
    assert second.get(WHERE, V1, 899_990, 11) is None
    assert second.get(WHERE, V2, 2000, 10) is None
    out = run_python(f"""
from shardfs.reads.rangecache import RangeCache
from shardfs.storage import Version
cache = RangeCache(0, {str(root)!r})
print(cache.get({WHERE!r}, Version(*{tuple(V1)!r}), 500_000, 16).hex())
print(cache.get({WHERE!r}, Version(*{tuple(V1)!r}), 0, 16))
cache.put("s3://other/key", Version('"x"', 5, 0), 0, b"hello")
cache.flush()
""")
    assert out.split() == [data[500_000:500_016].hex(), "None"]
    assert RangeCache(0, str(root)).get("s3://other/key", Version('"x"', 5, 0), 1, 3) == b"ell"


def test_the_trio_thread_can_ask_memory_alone(tmp_path):
    root = tmp_path / "cache"
    put_on_disk(root, WHERE, 0, CONTENT[V1][:5000])
    cache = RangeCache(1 << 20, str(root))
    assert cache.get(WHERE, V1, 100, 10, disk=False) is None
    assert cache.get(WHERE, V1, 100, 10) == CONTENT[V1][100:110]
    assert cache.get(WHERE, V1, 4000, 10, disk=False) == CONTENT[V1][4000:4010]  # the file's block is in memory


def test_a_new_etag_removes_the_old_files(tmp_path):
    root = tmp_path / "cache"
    cache = RangeCache(0, str(root))
    cache.put(WHERE, V1, 0, CONTENT[V1][:1000])
    cache.put(WHERE, V1, 5000, CONTENT[V1][5000:6000])
    cache.put("s3://bucket/other", V1, 0, CONTENT[V1][:10])
    cache.put(WHERE, V2, 0, CONTENT[V2][:500])
    cache.flush()
    assert len(cache_files(root)) == 2
    assert RangeCache(0, str(root)).get(WHERE, V1, 0, 10) is None
    assert RangeCache(0, str(root)).get(WHERE, V2, 0, 10) == CONTENT[V2][:10]


def test_files_inside_a_new_range_are_removed(tmp_path):
    root = tmp_path / "cache"
    cache = RangeCache(0, str(root))
    cache.put(WHERE, V1, 100, CONTENT[V1][100:200])
    cache.put(WHERE, V1, 300, CONTENT[V1][300:400])
    cache.put(WHERE, V1, 0, CONTENT[V1][:1000])
    cache.put(WHERE, V1, 500, CONTENT[V1][500:600])  # inside: not written
    cache.flush()
    assert [p.name.rsplit(".", 2)[1:] for p in cache_files(root)] == [["0", "1000"]]


def _corrupt(path: Path, how: str) -> None:
    raw = bytearray(path.read_bytes())
    if how == "truncated":
        raw = raw[:-7]
    elif how == "payload-bit":
        raw[-100] ^= 0x01
    elif how == "foreign-key":  # a file of another key under this name (or a damaged header)
        raw[20] ^= 0x01
    elif how == "garbage":
        raw = bytearray(b"not a cache file")
    path.write_bytes(raw)


@pytest.mark.parametrize("how", ["truncated", "payload-bit", "foreign-key", "garbage"])
def test_a_damaged_file_is_ignored_and_removed_with_one_log_line(tmp_path, caplog, how):
    root = tmp_path / "cache"
    put_on_disk(root, WHERE, 0, CONTENT[V1][:5000])
    [path] = cache_files(root)
    _corrupt(path, how)
    cache = RangeCache(0, str(root))
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        assert cache.get(WHERE, V1, 4000, 1000) is None
        assert cache.get(WHERE, V1, 4000, 1000) is None
    assert not path.exists()
    assert len(warnings(caplog)) == 1
    assert str(path) in warnings(caplog)[0] and "ignored and removed" in warnings(caplog)[0]
    cache.put(WHERE, V1, 0, CONTENT[V1][:5000])  # and it is cached again
    cache.flush()
    assert RangeCache(0, str(root)).get(WHERE, V1, 4000, 1000) == CONTENT[V1][4000:5000]


def test_only_the_blocks_read_are_checked(tmp_path, caplog):
    root = tmp_path / "cache"
    put_on_disk(root, WHERE, 0, CONTENT[V1][:3 * BLOCK])
    [path] = cache_files(root)
    raw = bytearray(path.read_bytes())
    raw[len(raw) - BLOCK // 2] ^= 0x80  # in the last block
    path.write_bytes(raw)
    cache = RangeCache(0, str(root))
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        assert cache.get(WHERE, V1, 10, 100) == CONTENT[V1][10:110]
        assert warnings(caplog) == []
        assert cache.get(WHERE, V1, 2 * BLOCK + 10, 100) is None
    assert len(warnings(caplog)) == 1 and not path.exists()


def _file_bytes(where: str, nbytes: int) -> int:
    root = Path(tempfile.mkdtemp())
    try:
        put_on_disk(root, where, 0, CONTENT[V1][:nbytes])
        return cache_files(root)[0].stat().st_size
    finally:
        shutil.rmtree(root)


def test_the_disk_bound_evicts_the_least_recently_used_files(tmp_path):
    root = tmp_path / "cache"
    file_size = _file_bytes("s3://b/0", 10_000)
    bound = file_size * 7 // 2  # room for 3 files (and 3 are below 7/8 of it), not 4
    cache = RangeCache(0, str(root), bound)
    for i in range(3):
        cache.put(f"s3://b/{i}", V1, 0, CONTENT[V1][:10_000])
        cache.flush()
        time.sleep(0.02)  # distinct mtimes
    assert cache.trim_disk() == 3 * file_size
    assert cache.get("s3://b/0", V1, 0, 10) == CONTENT[V1][:10]  # a hit: 0 is now the most recent
    time.sleep(0.02)
    cache.put("s3://b/3", V1, 0, CONTENT[V1][:10_000])
    cache.flush()
    assert cache.trim_disk() == 3 * file_size
    assert [cache.get(f"s3://b/{i}", V1, 0, 10) is not None for i in range(4)] == [True, False, True, True]


def test_the_disk_bound_is_kept_in_the_background(tmp_path):
    root = tmp_path / "cache"
    bound = 200_000
    cache = RangeCache(0, str(root), bound)
    for i in range(40):
        cache.put(f"s3://b/{i}", V1, 0, CONTENT[V1][:20_000])  # 4x the bound in all
    cache.flush()
    deadline = time.monotonic() + 10
    while disk_bytes(root) > bound and time.monotonic() < deadline:
        time.sleep(0.05)
    assert disk_bytes(root) <= bound
    assert cache.get("s3://b/39", V1, 0, 10) == CONTENT[V1][:10]


def test_a_cache_dir_that_cannot_be_created_fails_at_once(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"^cache_dir .*/file/cache: cannot create it: Not a directory$"):
        RangeCache(0, str(tmp_path / "file" / "cache"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"^cache_dir .*/mine: not empty and not a cache directory"):
        RangeCache(0, str(tmp_path / "mine"))
    assert (tmp_path / "mine" / "notes.txt").read_text() == "x"


def test_a_read_only_cache_dir_degrades_to_memory(tmpfs, caplog):
    root = tmpfs("ro,size=1m,mode=0700")
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        cache = RangeCache(1 << 20, str(root))
        cache.put(WHERE, V1, 0, CONTENT[V1][:1000])
        cache.put(WHERE, V1, 2000, CONTENT[V1][2000:3000])
        assert cache.get(WHERE, V1, 100, 100) == CONTENT[V1][100:200]
        assert cache.get(WHERE, V1, 5000, 100) is None
    assert warnings(caplog) == [f"cache_dir {root}: Read-only file system: caching in memory only from now on"]


def test_a_full_cache_dir_degrades_to_memory(tmpfs, caplog):
    root = tmpfs("size=64k,mode=0700")
    cache = RangeCache(1 << 20, str(root), 1 << 30)
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        cache.put(WHERE, V1, 0, CONTENT[V1][:10_000])
        cache.put(WHERE, V1, 10_000, CONTENT[V1][10_000:200_000])  # more than the filesystem holds
        cache.put(WHERE, V1, 300_000, CONTENT[V1][300_000:400_000])
        cache.flush()
        assert cache.get(WHERE, V1, 100_000, 100) == CONTENT[V1][100_000:100_100]
        assert cache.get(WHERE, V1, 600_000, 100) is None
    assert warnings(caplog) == [f"cache_dir {root}: No space left on device: caching in memory only from now on"]
    assert [p.name.rsplit(".", 2)[1:] for p in cache_files(root)] == [["0", "10000"]]  # no temporary left


def test_two_processes_share_a_cache_dir(tmp_path):
    """Two writers and readers of the same keys at once, with evictions running: every hit is
    exact and no file is ever seen damaged."""
    root = tmp_path / "cache"
    RangeCache(0, str(root))
    code = f"""
import logging, random, sys
from shardfs.reads.rangecache import RangeCache
from shardfs.storage import Version
logging.basicConfig(level=logging.WARNING)
cache = RangeCache(0, {str(root)!r}, 3_000_000)
rng = random.Random(int(sys.argv[1]))
hits = 0
for _ in range(400):
    i = rng.randrange(8)
    version = Version(f'"e{{rng.randrange(2)}}"', 400_000, 0)
    content = random.Random(f"{{i}}{{version.tag}}").randbytes(version.size)
    start = rng.randrange(400_000)
    stop = min(400_000, start + rng.randrange(1, 300_000))
    if rng.random() < 0.5:
        cache.put(f"s3://b/{{i}}", version, start, content[start:stop])
    else:
        got = cache.get(f"s3://b/{{i}}", version, start, stop - start)
        assert got is None or got == content[start:stop], (i, version, start, stop)
        hits += got is not None
cache.flush()
print(hits)
"""
    procs = [subprocess.Popen([sys.executable, "-P", "-c", code, str(seed)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert all(int(out) > 0 for out, _ in results)
    assert [err for _, err in results] == ["", ""]


def test_threads_share_one_cache(tmp_path):
    cache = RangeCache(300_000, str(tmp_path / "cache"), 2_000_000)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(300):
                where = f"s3://b/{rng.randrange(4)}"
                version = rng.choice((V1, V2))
                start = rng.randrange(200_000)
                stop = start + rng.randrange(1, 100_000)
                if rng.random() < 0.4:
                    cache.put(where, version, start, CONTENT[version][start:stop])
                else:
                    got = cache.get(where, version, start, stop - start)
                    assert got is None or got == CONTENT[version][start:stop]
                assert cache.used <= 300_000
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# --------------------------------------------------------------------------- through a mount

E2E = Spec("cached", (128, 128), (32, 32), (64, 64), "<i4", 0, ("zstd", 1), inner_crc=False,
           index_location="end", index_crc=True, initial=((slice(0, 128), slice(0, 128)),),
           write=(slice(0, 1), slice(0, 1)))  # 4 shards of 4 chunks


@pytest.mark.parametrize("workers", ["workers=1", "workers=2"])
def test_cache_dir_serves_a_remount_without_chunk_gets_and_never_an_old_etag(request, s3, tmp_path, mount, workers):
    """Mount with ``-o cache_dir``, read the array, unmount; mount again: the same bytes and no
    GET of chunk data (only the shard indexes, read to learn each shard's ETag). A shard changed
    behind the mount (a new ETag) is served new, the others still from the disk cache. With two
    workers, a shard fetched whole is kept for both (``shardfs.storage.sharedshards``) and
    written to the disk cache too."""
    expected = build(tmp_path / "src", [E2E])[E2E.name]
    cache_dir = tmp_path / "cache"
    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0, record=True) as proxy:
        src = BucketSource(tmp_path / "src", s3, unique_prefix(request), endpoint=f"http://127.0.0.1:{proxy.port}")
        shards = [f"/{s3.bucket}/{src.prefix}/{E2E.shard_key((i, j))}" for i in range(2) for j in range(2)]

        def read_through_a_mount(*extra: str) -> tuple[np.ndarray, list[Request], Path]:
            mnt = src.mount(mount, "-o", f"ro,{workers},cache_dir={cache_dir}", *extra)
            proxy.log.clear()
            got = read_zarr2(mnt / E2E.name)
            return got, [r for r in proxy.log if r.path in shards], mnt

        def unmount(mnt: Path) -> None:
            r = run_shardfs("umount", str(mnt), timeout=60)
            assert r.returncode == 0, r.stderr
            assert mount.info(mnt).proc.wait(timeout=30) == 0

        def chunk_gets(reqs: list[Request]) -> list[str]:
            """The shards whose chunk data was fetched (GETs conditioned on an ETag)."""
            return sorted(r.path for r in reqs if r.method == "GET" and "if-match" in r.headers)

        got, reqs, mnt = read_through_a_mount()
        assert_read_equals(got, expected, "first mount")
        assert sorted(set(chunk_gets(reqs))) == shards  # a cold read fetches every shard's chunks
        unmount(mnt)
        assert len(cache_files(cache_dir)) >= 4

        got, reqs, mnt = read_through_a_mount()
        assert_read_equals(got, expected, "second mount")
        assert chunk_gets(reqs) == []
        indexes = sorted(r.path for r in reqs if r.method == "GET")  # the indexes alone: each
        assert sorted(set(indexes)) == shards and len(indexes) <= len(shards) * int(workers[-1])  # worker's own
        unmount(mnt)

        # a shard replaced behind the mount, while one is live: a new ETag, the same size (two
        # chunks swapped), so only the ETag tells the versions apart
        got, reqs, mnt = read_through_a_mount("-o", "entry_timeout=0,attr_timeout=0")
        assert chunk_gets(reqs) == []
        before = obstore.head(src.objects.store(), E2E.shard_key((0, 1)))
        expected[0:32, 64:128] = np.concatenate([expected[0:32, 96:128], expected[0:32, 64:96]], axis=1)
        zarr.open_array(src.objects.zarr_store(read_only=False), path=E2E.name, mode="r+")[0:32, 64:128] = \
            expected[0:32, 64:128]
        after = obstore.head(src.objects.store(), E2E.shard_key((0, 1)))
        assert after["size"] == before["size"] and after["e_tag"] != before["e_tag"]
        time.sleep(1.5)  # the daemon remembers a version for 1 s
        proxy.log.clear()
        assert_read_equals(read_zarr2(mnt / E2E.name), expected, "changed shard, same mount")
        changed = f"/{s3.bucket}/{src.prefix}/{E2E.shard_key((0, 1))}"
        assert set(chunk_gets([r for r in proxy.log if r.path in shards])) == {changed}
        unmount(mnt)

        got, reqs, mnt = read_through_a_mount()  # and the next mount serves it from disk
        assert_read_equals(got, expected, "after the change, remounted")
        assert chunk_gets(reqs) == []
        unmount(mnt)


def test_a_cache_dir_that_cannot_be_created_fails_the_mount_in_one_line(tmp_path, s3_upload, mnt_dir):
    build(tmp_path / "src", [E2E])
    uploaded = s3_upload(tmp_path / "src")
    (tmp_path / "file").write_text("x")
    bad = tmp_path / "file" / "cache"
    for form in ((), ("-f",)):
        r = run_shardfs("mount", uploaded.url, str(mnt_dir), *form, "-o", f"cache_dir={bad}",
                        env={**os.environ, **uploaded.env}, timeout=60)
        assert (r.returncode, r.stderr) == (
            1, f"shardfs: error: -o cache_dir {bad}: cannot create it: Not a directory\n")
        assert not os.path.ismount(mnt_dir)
