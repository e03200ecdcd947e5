"""What reads through an ``s3://`` mount cost in HTTP requests (issue 13, "Reads").

The daemon reaches SeaweedFS through a counting TCP proxy (``testkit.delayproxy.DelayProxy``
with ``record=True``, no delay), which sees every HTTP request; the counts below are those of
one shard's key, with their ``Range`` and ``If-Match``. Promises: a shard's index costs one GET
(a suffix GET when it is at the end, no HEAD before it); an inner chunk one ranged GET of its
bytes conditioned on the ETag the index was read at; a cold chunk other than its shard's first
(a scattered read) also has the indexes of the array's other shards read ahead, each once, so
a chunk of another shard then costs one GET; a whole shard read chunk by chunk 2 GETs (opened
at its first chunk, where a sweep in C order starts: its index, then all of it in one GET; the
shards after the first, in a walk of the array: all of it in one GET, fetched ahead);
reading again what the daemon has cached, no GET. Before a second read the kernel's page cache
of the files is dropped (``POSIX_FADV_DONTNEED``), and the daemon's ``wchar`` shows it served
the bytes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import obstore
import pytest

from testkit.delayproxy import DelayProxy, Request
from conftest import drop_caches, run_shardfs, serving_pids, zarr2
from source_kinds import BucketSource, unique_prefix
from sources import Spec, build

s = slice
CPS = (4, 4)  # chunks per shard: 16


def spec(index_location: str) -> Spec:
    """4 shards of 16 chunks of 32x32 int32 (about 4 KiB each: random values barely compress)."""
    return Spec("rq", (256, 256), (32, 32), (128, 128), "<i4", 0, ("zstd", 1), inner_crc=False,
                index_location=index_location, index_crc=True, initial=((s(0, 256), s(0, 256)),),
                write=(s(0, 1), s(0, 1)))


INDEX_BYTES = 16 * CPS[0] * CPS[1] + 4  # (offset, nbytes) uint64 pairs and a crc32c


@pytest.fixture
def counted(request, s3, tmp_path, mount):
    """``(source, proxy, mnt, spec, expected)``: the array uploaded to the session's SeaweedFS and
    mounted through a counting proxy; the requests of the mount itself already forgotten."""
    sp = spec(request.param)
    expected = build(tmp_path / "src", [sp])[sp.name]
    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0, record=True) as proxy:
        src = BucketSource(tmp_path / "src", s3, unique_prefix(request), endpoint=f"http://127.0.0.1:{proxy.port}")
        mnt = src.mount(mount)
        proxy.log.clear()
        yield src, proxy, mnt, sp, expected


def requests_for(src: BucketSource, proxy: DelayProxy, key: str) -> list[Request]:
    path = f"/{src.server.bucket}/{src.prefix}/{key}"
    assert proxy.log is not None  # a recording proxy
    return [r for r in proxy.log if r.path == path]


def etag(src: BucketSource, key: str) -> str:
    return obstore.head(src.objects.store(), key)["e_tag"].strip('"')


def index_range(sp: Spec) -> str:
    return f"bytes=-{INDEX_BYTES}" if sp.index_location == "end" else f"bytes=0-{INDEX_BYTES - 1}"


def describe(reqs: list[Request]) -> list[tuple[str, str | None, str | None]]:
    return [(r.method, r.headers.get("range"), r.headers.get("if-match")) for r in reqs]


def chunk_files(mnt: Path, sp: Spec, shard: tuple[int, int], where: str = "shard-dir"
                ) -> list[tuple[Path, tuple[int, int]]]:
    """Every chunk file of ``shard`` with its chunk index, in C order: in the view's shard
    directory (``rq/c/I/J/i.j``) or at the array's root (``rq/i.j``)."""
    base = mnt / sp.name / "c" / str(shard[0]) / str(shard[1]) if where == "shard-dir" else mnt / sp.name
    return [(base / sp.chunk_name(idx), idx) for idx in
            ((shard[0] * CPS[0] + i, shard[1] * CPS[1] + j) for i in range(CPS[0]) for j in range(CPS[1]))]


def chunk_range(src: BucketSource, sp: Spec, shard: tuple[int, int], idx: tuple[int, int]) -> str:
    """The HTTP Range of chunk ``idx``'s bytes in its shard, from the shard's stored index."""
    data = bytes(obstore.get(src.objects.store(), sp.shard_key(shard)).bytes())
    index = data[-INDEX_BYTES:] if sp.index_location == "end" else data[:INDEX_BYTES]
    pairs = np.frombuffer(index[:-4], dtype="<u8").reshape(-1, 2)
    offset, nbytes = (int(v) for v in pairs[(idx[0] % CPS[0]) * CPS[1] + idx[1] % CPS[1]])
    return f"bytes={offset}-{offset + nbytes - 1}"


def read_files(paths) -> list[bytes]:
    """Each file read whole, one after the other (open, read to the end, close)."""
    return [Path(p).read_bytes() for p in paths]


def drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def wchar(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def assert_chunk(sp: Spec, expected: np.ndarray, idx, data: bytes) -> None:
    np.testing.assert_array_equal(sp.decode(data), sp.padded_chunk(expected, idx), err_msg=f"chunk {idx}")


def assert_no_get(reqs: list[Request]) -> None:
    """Served from the daemon's cache: no request at all (versions are remembered for the
    mount's ``attr_timeout``, 10 s here: no HEAD revalidates them within that)."""
    assert not reqs, describe(reqs)


@pytest.mark.parametrize("where", ["root", "shard-dir"])
@pytest.mark.parametrize("counted", ["end", "start"], indirect=True)
def test_cold_chunk_read_costs_one_index_get_and_one_conditional_ranged_get(counted, where):
    src, proxy, mnt, sp, expected = counted
    shard = (1, 0)
    key = sp.shard_key(shard)
    path, idx = chunk_files(mnt, sp, shard, where)[5]
    [data] = read_files([path])
    assert_chunk(sp, expected, idx, data)
    reqs = requests_for(src, proxy, key)
    assert describe(reqs) == [("GET", index_range(sp), None),
                              ("GET", chunk_range(src, sp, shard, idx), f'"{etag(src, key)}"')], (
        "expected the index GET, then one GET of the chunk's bytes conditioned on the ETag the index was read at")
    others = [r for r in proxy.log if r.path.startswith(f"/{src.server.bucket}/{src.prefix}/{sp.name}/c/")
              and r not in reqs]  # their indexes, read ahead in the background: each at most once
    assert all(describe([r]) == [("GET", index_range(sp), None)] for r in others), describe(others)
    assert len({r.path for r in others}) == len(others), [r.path for r in others]

    # the same chunk again, past the kernel's page cache: served from the daemon's cache
    proxy.log.clear()
    drop_page_cache(path)
    assert read_files([path]) == [data]
    assert_no_get(requests_for(src, proxy, key))


@pytest.mark.parametrize("counted", ["end", "start"], indirect=True)
def test_whole_shard_read_chunk_by_chunk_costs_two_gets(counted):
    """Opened at its first chunk, a shard is fetched whole in one GET If-Match the ETag its
    index was read at; its other chunks cost nothing, and no other shard is asked anything."""
    src, proxy, mnt, sp, expected = counted
    key = sp.shard_key((1, 1))
    files = chunk_files(mnt, sp, (1, 1), "root")
    for (_, idx), data in zip(files, read_files([p for p, _ in files])):
        assert_chunk(sp, expected, idx, data)
    size = obstore.head(src.objects.store(), key)["size"]
    assert describe(requests_for(src, proxy, key)) == [
        ("GET", index_range(sp), None), ("GET", f"bytes=0-{size - 1}", f'"{etag(src, key)}"')]
    others = [r for r in proxy.log if r.path.startswith(f"/{src.server.bucket}/{src.prefix}/{sp.name}/c/")
              and r.path != f"/{src.server.bucket}/{src.prefix}/{key}"]
    assert not others, describe(others)


@pytest.mark.parametrize("counted", ["end"], indirect=True)
def test_scattered_reads_read_every_index_ahead_once_then_a_chunk_costs_one_get(counted):
    """A cold chunk other than its shard's first: its index, its bytes, and in the background
    one listing of the array and one index GET for each other shard (never a second one for
    the shard read); then a chunk of another shard costs exactly one GET, If-Match its ETag."""
    src, proxy, mnt, sp, expected = counted
    shards = list(np.ndindex(*sp.shard_grid))
    path, idx = chunk_files(mnt, sp, (1, 0), "root")[5]
    assert_chunk(sp, expected, idx, read_files([path])[0])
    deadline = time.monotonic() + 10
    while any(not requests_for(src, proxy, sp.shard_key(sh)) for sh in shards) and time.monotonic() < deadline:
        time.sleep(0.02)
    before = len(proxy.log)
    shard = (0, 1)
    path, idx = chunk_files(mnt, sp, shard, "root")[6]
    assert_chunk(sp, expected, idx, read_files([path])[0])
    key = sp.shard_key(shard)
    assert describe(proxy.log[before:]) == [("GET", chunk_range(src, sp, shard, idx), f'"{etag(src, key)}"')], (
        describe(proxy.log[before:]))
    assert [r.path for r in proxy.log[before:]] == [f"/{src.server.bucket}/{src.prefix}/{key}"]
    for sh in shards:
        reqs = describe(requests_for(src, proxy, sp.shard_key(sh)))
        assert reqs[:1] == [("GET", index_range(sp), None)], (sh, reqs)
        assert len(reqs) == (2 if sh in ((1, 0), shard) else 1), (sh, reqs)
    assert [r.method for r in proxy.log].count("LIST") == 1


@pytest.mark.parametrize("counted", ["end"], indirect=True)
def test_a_shard_read_again_costs_no_get(counted, mount):
    src, proxy, mnt, sp, expected = counted
    key = sp.shard_key((1, 1))
    files = [p for p, _ in chunk_files(mnt, sp, (1, 1))]
    first = read_files(files)
    assert requests_for(src, proxy, key), "the first read asked nothing"
    proxy.log.clear()
    pids = serving_pids(mnt)  # (whichever worker reads them: their writes to the kernel added up)
    for p in files:
        drop_page_cache(p)
    before = sum(map(wchar, pids))
    assert read_files(files) == first
    served = sum(map(wchar, pids)) - before
    assert served >= sum(map(len, first)), f"the daemon wrote {served} B: the kernel served the second read"
    assert_no_get(requests_for(src, proxy, key))


@pytest.mark.parametrize("counted", ["end"], indirect=True)
def test_zarr2_whole_array_read_fetches_the_shards_after_the_first_ahead_in_one_get_each(counted, mount):
    """zarr 2.18 reads the array row of chunks by row, so its first rows cross shards (0, 0) and
    (0, 1) in turn. It opens shard (0, 0) at its first chunk: its index, then all of it in one
    GET If-Match its ETag. Then it walks on to (0, 1), the next in C order of the shard grid:
    that is a walk of the array, so (0, 1) and the shards after it are fetched ahead, each whole
    in one unconditional GET that also gives its index and ETag; the lookups and opens of
    their chunks wait for it and ask nothing more. The ``--debug`` log names the shards each
    walk fetched ahead, the first walk's from past shard 0."""
    src, proxy, mnt, sp, expected = counted
    got = zarr2("result = zarr.open(path, mode='r')[...]", path=str(mnt / sp.name))
    np.testing.assert_array_equal(got, expected)
    per_shard = {sh: describe(requests_for(src, proxy, sp.shard_key(sh))) for sh in np.ndindex(*sp.shard_grid)}
    print(f"\nzarr 2.18 whole array, requests per shard: {per_shard}")
    first, *others = per_shard
    key = sp.shard_key(first)
    size = obstore.head(src.objects.store(), key)["size"]
    assert per_shard[first] == [("GET", index_range(sp), None),
                                ("GET", f"bytes=0-{size - 1}", f'"{etag(src, key)}"')], (
        first, per_shard[first])
    for sh in others:
        assert per_shard[sh] == [("GET", None, None)], (sh, per_shard[sh])
    walks = [line.split(" a sweep past shard ", 1)[1].removesuffix(" fetched ahead")
             for line in mount.info(mnt).log_text().splitlines() if " fetched ahead" in line]
    assert walks and walks[0].startswith(f"0 of its grid: {sp.shard_key(others[0])}"), walks
    assert sorted(key for walk in walks for key in walk.split(": ", 1)[1].split(", ")) == sorted(
        sp.shard_key(sh) for sh in others), walks


def test_a_second_sweep_of_an_array_larger_than_the_cache_fetches_each_shard_whole_again(s3, tmp_path, mount,
                                                                                          request):
    """With ``-o cache_size`` holding 3.5 of the array's 4 shards, a second zarr 2.18 whole-array
    read in the same mount (page caches dropped) finds shards evicted by the first, then by
    itself. It sweeps them as the first read did: (0, 0) opened at its first chunk is fetched
    whole in one GET If-Match its ETag, and the shards after it ahead in one unconditional GET
    each; never a GET per chunk (a shard's read-ahead is once per visit, not once per mount)."""
    sp = spec("end")
    expected = build(tmp_path / "src", [sp])[sp.name]
    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0, record=True) as proxy:
        src = BucketSource(tmp_path / "src", s3, unique_prefix(request), endpoint=f"http://127.0.0.1:{proxy.port}")
        shards = list(np.ndindex(*sp.shard_grid))
        sizes = {sh: obstore.head(src.objects.store(), sp.shard_key(sh))["size"] for sh in shards}
        mnt = src.mount(mount, "-o", f"cache_size={max(sizes.values()) * 7 // 2}")
        per_sweep = []
        for _ in range(2):
            drop_caches("3")  # (opening the files to drop theirs would read them)
            proxy.log.clear()
            got = zarr2("result = zarr.open(path, mode='r')[...]", path=str(mnt / sp.name))
            np.testing.assert_array_equal(got, expected)
            per_sweep.append({sh: describe(requests_for(src, proxy, sp.shard_key(sh))) for sh in shards})
    print(f"\nrequests per shard, first and second sweep: {per_sweep}")
    first, *others = shards
    assert per_sweep[1][first] == [("GET", f"bytes=0-{sizes[first] - 1}", f'"{etag(src, sp.shard_key(first))}"')], (
        per_sweep[1][first])
    for sh in others:
        assert per_sweep[1][sh] == [("GET", None, None)], (sh, per_sweep[1][sh])


def test_a_replaced_shard_shows_after_attr_timeout_and_is_never_mixed(s3, tmp_path, mount, request):
    """Versions are remembered for ``attr_timeout`` (3 s here): a chunk read again within it
    costs no request, not even a HEAD (also after the 1 s local sources keep stats); the shard
    replaced behind the mount's back shows after it, each chunk file wholly the new version's."""
    sp = spec("end")
    expected = build(tmp_path / "src", [sp])[sp.name]
    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0, record=True) as proxy:
        src = BucketSource(tmp_path / "src", s3, unique_prefix(request), endpoint=f"http://127.0.0.1:{proxy.port}")
        mnt = src.mount(mount, "-o", "attr_timeout=3")
        shard, moved_from = (1, 1), (0, 0)
        key = sp.shard_key(shard)
        picked = [chunk_files(mnt, sp, shard)[i] for i in (0, 5)]
        for (_, idx), data in zip(picked, read_files([p for p, _ in picked])):
            assert_chunk(sp, expected, idx, data)
        store = src.objects.store()
        obstore.put(store, key, bytes(obstore.get(store, sp.shard_key(moved_from)).bytes()))
        proxy.log.clear()
        time.sleep(1.5)
        for path, idx in picked:
            drop_page_cache(path)
            assert_chunk(sp, expected, idx, read_files([path])[0])
        assert_no_get(requests_for(src, proxy, key))
        time.sleep(2.5)  # 4 s after the replacement
        for path, idx in picked:
            drop_page_cache(path)
            before = (idx[0] - 4 * (shard[0] - moved_from[0]), idx[1] - 4 * (shard[1] - moved_from[1]))
            assert_chunk(sp, expected, before, read_files([path])[0])
        assert [r.method for r in requests_for(src, proxy, key)].count("GET") >= 1


def connections_to(pid: int, port: int) -> int:
    """The TCP connections process ``pid`` holds to 127.0.0.1:``port`` (from /proc: its socket
    inodes matched with the established entries of /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open(f"/proc/{pid}/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return sum(1 for r in rows if r[2] == f"0100007F:{port:04X}" and r[3] == "01" and r[9] in inodes)


def sixteen_shards(tmp_path: Path) -> Spec:
    """4x4 shards of 2x2 chunks of 32x32 int32, all stored, built under ``tmp_path/src``."""
    sp = Spec("sixteen", (64 * 4, 64 * 4), (32, 32), (64, 64), "<i4", 0, ("zstd", 1), inner_crc=False,
              index_location="end", index_crc=True, initial=((s(0, 256), s(0, 256)),), write=(s(0, 1), s(0, 1)))
    build(tmp_path / "src", [sp])
    return sp


def test_cold_opens_at_an_array_root_look_names_up_at_once(s3, tmp_path, mount, request):
    """16 threads each open the first chunk of another shard at the array's root, the store
    0.4 s a round trip away: each lookup reads its shard's index (one round trip), and the kernel
    sends them at once (``enable_parallel_dirops``, which libfuse 3.14 alone never passes on):
    the proxy sees at least 8 requests awaiting their answers together (one after the other, a
    lookup's index read and the reads of chunks already looked up overlap: at most 3)."""
    from concurrent.futures import ThreadPoolExecutor

    sp = sixteen_shards(tmp_path)
    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0.2) as proxy:
        src = BucketSource(tmp_path / "src", s3, unique_prefix(request), endpoint=f"http://127.0.0.1:{proxy.port}")
        mnt = src.mount(mount)
        files = [mnt / sp.name / sp.chunk_name((2 * i, 2 * j)) for i in range(4) for j in range(4)]
        proxy.reset_peak()
        with ThreadPoolExecutor(len(files)) as pool:
            datas = list(pool.map(lambda p: Path(p).read_bytes(), files))
        peak = proxy.peak_in_flight
    assert [len(d) > 0 for d in datas] == [True] * 16
    print(f"\n{peak} requests in flight at once")
    assert peak >= 8, peak


def test_idle_connections_to_the_store_are_closed(s3, tmp_path, mount, request):
    """A burst of concurrent reads (16 shards, one chunk of each, the store 0.4 s a round trip
    away) opens many connections to the store; one left idle is closed after ``POOL_IDLE``
    seconds (10), by the pool's sweep every ``POOL_IDLE`` seconds (a generous time-out, not a latency)."""
    from concurrent.futures import ThreadPoolExecutor

    from shardfs.storage.requests import POOL_IDLE

    sp = sixteen_shards(tmp_path)
    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0.2) as proxy:
        src = BucketSource(tmp_path / "src", s3, unique_prefix(request), endpoint=f"http://127.0.0.1:{proxy.port}")
        mnt = src.mount(mount)
        pids = serving_pids(mnt)

        def connections() -> int:  # (every worker's)
            return sum(connections_to(pid, proxy.port) for pid in pids)

        files = [mnt / sp.name / sp.chunk_name((2 * i, 2 * j)) for i in range(4) for j in range(4)]
        with ThreadPoolExecutor(len(files)) as pool:
            list(pool.map(lambda p: Path(p).read_bytes(), files))
        assert connections() > 4
        # The read-ahead may use a connection after the reads returned: it is idle from then on.
        deadline = time.monotonic() + 3 * POOL_IDLE + 10
        while connections() and time.monotonic() < deadline:
            time.sleep(1)
        assert connections() == 0


def test_a_shard_replaced_twice_within_a_second_never_shows_the_first_replacement_s_pages(s3, tmp_path, mount,
                                                                                         request):
    """S3 keeps a Last-Modified of whole seconds: two versions of a shard replaced behind the
    mount's back within one second have the same time, and here a chunk file of the same size
    (the second has other bytes in it). That chunk file read at the first version, then at the
    second, shows the second's bytes (the kernel's pages of the first are dropped)."""
    sp = spec("end")
    build(tmp_path / "src", [sp])
    src = BucketSource(tmp_path / "src", s3, unique_prefix(request))
    mnt = src.mount(mount, "-o", "attr_timeout=0,entry_timeout=0")
    store = src.objects.store()
    key = sp.shard_key((1, 1))
    original = bytes(obstore.get(store, key).bytes())
    table = np.frombuffer(original[-INDEX_BYTES:-4], dtype="<u8").reshape(-1, 2)
    path, _ = chunk_files(mnt, sp, (1, 1))[5]
    start, nbytes = (int(v) for v in table[5])
    chunk = original[start:start + nbytes]
    other = original[:start + 100] + bytes(b ^ 0xFF for b in chunk[100:104]) + original[start + 104:]
    for _ in range(20):  # until both replacements fall within one second
        obstore.put(store, key, other)
        first = obstore.head(store, key)["last_modified"]
        assert path.read_bytes() == other[start:start + nbytes]  # the kernel keeps these pages
        obstore.put(store, key, original)
        if obstore.head(store, key)["last_modified"] == first:
            break
    else:
        pytest.fail("no two replacements within one second in 20 tries")
    assert path.read_bytes() == chunk


def test_umount_does_not_wait_for_indexes_read_ahead_from_a_store_that_does_not_answer(s3, tmp_path, mount,
                                                                                        request):
    """A scattered read has the other shards' indexes read ahead in the background; the store
    never answers those (held in the proxy), and each request may take ``-o timeout`` (120 s
    here). ``shardfs umount`` ends the mount at once all the same (0, the daemon gone within
    20 s), with no error logged about the reads it dropped: nobody needs them any more."""
    sp = spec("end")
    expected = build(tmp_path / "src", [sp])[sp.name]
    others = {sp.shard_key(sh) for sh in np.ndindex(*sp.shard_grid)} - {sp.shard_key((1, 0))}
    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0, record=True) as proxy:
        src = BucketSource(tmp_path / "src", s3, unique_prefix(request), endpoint=f"http://127.0.0.1:{proxy.port}")
        mnt = src.mount(mount, "-o", "timeout=120")
        proxy.hold(lambda r: r.path.removeprefix(f"/{src.server.bucket}/{src.prefix}/") in others)
        path, idx = chunk_files(mnt, sp, (1, 0), "root")[5]
        assert_chunk(sp, expected, idx, read_files([path])[0])
        deadline = time.monotonic() + 10
        while len(proxy.held) < len(others) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(r.path.rsplit("/c/", 1)[1] for r in proxy.held) == ["0/0", "0/1", "1/1"]
        daemon = mount.info(mnt)
        started = time.monotonic()
        r = run_shardfs("umount", str(mnt))
        assert r.returncode == 0, r.stderr
        daemon.proc.wait(timeout=20)
        assert time.monotonic() - started < 20
        assert not os.path.ismount(mnt)
        proxy.release()
    assert [line for line in daemon.log_text().splitlines() if " ERROR " in line] == []
