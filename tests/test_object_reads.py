"""The view over an object store (``ObjectStorage`` + ``ObjectReads``) against a real SeaweedFS.

The read matrix (tests/sources.py: every index location, codec chain, key encoding, writer) is
uploaded to the session's SeaweedFS; the tree (``compose_tree``) over that prefix is walked through the same
calls fuse_ops makes (listdir, open, read, release) and must show exactly what the tree over
the local directory shows, which zarr 3 reads (v2 mode) as zarr 3 reads the source natively.
Then what only an object store has: a shard replaced between its index read and a chunk open
(412, the index read again), and a server gone (EIO for that request, one log line, served
again once it is back).
"""

from __future__ import annotations

import errno
import logging
import stat
import uuid
from pathlib import Path

import numpy as np
import pytest
import trio

from conftest import assert_same_array, case_params, read_native, read_zarr3_v2
from s3server import SeaweedS3
from testkit.delayproxy import DelayProxy
from sources import CASES, LE, ZSTD, nested_codecs, random_data, sharding, write_group, write_v3
from shardfs.storage.local import LocalStorage
from shardfs.storage.objects import ObjectStorage
from shardfs.storage.requests import Retry
from shardfs.tree.nodetable import ROOT_INODE
from shardfs.app.compose import Tree, compose_tree


def upload(root: Path, st: ObjectStorage) -> None:
    """Every file below ``root`` as an object of the same key."""
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st.replace(p.relative_to(root).as_posix(), [p.read_bytes()])


async def walk(view: Tree, ino: int = ROOT_INODE, path: str = "") -> dict[str, bytes]:
    """``{path: content}`` of every file the view shows (directories as ``path/``), read like
    a client: listdir, open, one read past the end, release."""
    out: dict[str, bytes] = {}
    for name, attr in await view.listing.listdir(ino):
        sub = f"{path}/{name}" if path else name
        if stat.S_ISDIR(attr.mode):
            out[sub + "/"] = b""
            out.update(await walk(view, attr.ino, sub))
            continue
        handle = await view.opens.open(attr.ino)
        try:
            out[sub] = bytes(await view.opens.read(handle, 0, attr.size + 1))
        finally:
            view.opens.release(handle)
        assert len(out[sub]) == attr.size, sub
    return out


@pytest.fixture(scope="module")
def objects_env(s3):
    with pytest.MonkeyPatch.context() as mp:
        for name, value in s3.env.items():
            mp.setenv(name, value)
        yield s3


@pytest.fixture(scope="module")
def matrix_url(matrix, objects_env) -> str:
    url = f"s3://{objects_env.bucket}/matrix-{uuid.uuid4().hex[:8]}"
    st = ObjectStorage(url)
    try:
        upload(matrix.root, st)
    finally:
        st.close()
    return url


@pytest.fixture(scope="module")
def object_files(matrix_url) -> dict[str, bytes]:
    st = ObjectStorage(matrix_url)
    try:
        return trio.run(walk, compose_tree(st))
    finally:
        st.close()


def test_the_view_of_objects_is_the_view_of_the_same_files_in_a_directory(matrix, object_files):
    local = trio.run(walk, compose_tree(LocalStorage(str(matrix.root))))
    assert sorted(object_files) == sorted(local)
    assert [k for k in local if object_files[k] != local[k]] == []
    assert sum(1 for k in local if "/c" in k or k[-1:].isdigit()) > 100  # chunk files were compared


@pytest.mark.parametrize("case", case_params(CASES))
def test_zarr3_reads_the_objects_view_as_the_source_natively(case, matrix, object_files, tmp_path):
    for key, data in object_files.items():
        if key.startswith(case.relpath + "/") and not key.endswith("/"):
            (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / key).write_bytes(data)
    assert_same_array(read_zarr3_v2(tmp_path / case.relpath), read_native(matrix.root / case.relpath))


def two_versions(tmp_path: Path) -> tuple[Path, Path]:
    """The same sharded array (2 shards of 2x2 chunks, zstd: chunk files are transcoded) written
    twice with different values, under ``v1/a`` and ``v2/a``."""
    roots = []
    for seed in (1, 2):
        root = tmp_path / f"v{seed}"
        write_group(root)
        write_v3(root / "a", random_data((8, 4), "int32", seed), (8, 4),
                 [sharding((4, 2), [LE, ZSTD])])
        roots.append(root)
    return roots[0], roots[1]


async def chunk_bytes(view: Tree, name: str, replace=None, array: str = "a") -> bytes:
    """Chunk file ``array/name`` as a client reads it; ``replace()`` runs between its lookup and open."""
    arr = await view.names.lookup(ROOT_INODE, array)
    attr = await view.names.lookup(arr.ino, name)
    if replace is not None:
        replace()
    handle = await view.opens.open(attr.ino)
    try:
        return bytes(await view.opens.read(handle, 0, 1 << 20))
    finally:
        view.opens.release(handle)


def test_a_shard_replaced_after_its_index_was_read_is_read_again_at_its_new_version(objects_env, tmp_path):
    v1, v2 = two_versions(tmp_path)
    st = ObjectStorage(f"s3://{objects_env.bucket}/replaced-{uuid.uuid4().hex[:8]}")
    other = ObjectStorage(st.url)  # another host: ``st`` still remembers the version it saw
    try:
        upload(v1, st)
        new = (v2 / "a/c/0/0").read_bytes()
        got = trio.run(chunk_bytes, compose_tree(st), "1.0", lambda: other.replace("a/c/0/0", [new]))
    finally:
        st.close()
        other.close()
    want = trio.run(chunk_bytes, compose_tree(LocalStorage(str(v2))), "1.0")
    old = trio.run(chunk_bytes, compose_tree(LocalStorage(str(v1))), "1.0")
    assert got == want and got != old


def test_a_server_gone_fails_that_read_alone_with_eio_and_one_log_line(tmp_path, caplog, monkeypatch):
    v1, _ = two_versions(tmp_path)
    server = SeaweedS3(tmp_path / "weed").start()
    try:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        st = ObjectStorage(f"s3://{server.bucket}/gone", stat_ttl=60,  # versions stay remembered
                           retry=Retry(max_retries=1, retry_timeout=2, request_timeout=2, connect_timeout=1))
        upload(v1, st)
        want = {name: trio.run(chunk_bytes, compose_tree(LocalStorage(str(v1))), name) for name in ("0.0", "1.0")}
        view = compose_tree(st)

        async def scenario() -> None:
            # the shard's index cached by a listing (so the open reads no index ahead in the
            # background), then a chunk other than its first (that would fetch it whole)
            await view.listing.listdir((await view.names.lookup(ROOT_INODE, "a")).ino)
            assert await chunk_bytes(view, "1.0") == want["1.0"]
            server.kill()
            caplog.clear()
            with caplog.at_level(logging.ERROR, logger="shardfs"):
                with pytest.raises(OSError) as failed:
                    await chunk_bytes(view, "0.0")
            assert failed.value.errno == errno.EIO
            lines = [r.getMessage() for r in caplog.records]
            assert len(lines) == 1 and lines[0].startswith(f"s3://{server.bucket}/gone/a/c/0/0: "), lines
            assert await chunk_bytes(view, "1.0") == want["1.0"]  # what is in memory is still served
            server.start()
            assert await chunk_bytes(view, "0.0") == want["0.0"]

        trio.run(scenario)
        st.close()
    finally:
        server.stop()


# ------------------------------------------------------------------ requests per chunk and per shard

CPS = 4  # chunks per shard along each axis: shards of 16 chunks


@pytest.fixture
def counted(objects_env, tmp_path):
    """``(view, proxy, requests, want, root)``: a 2x2-shard array (shards of 4x4 chunks of 32x32 int32;
    the second array ``n`` with nested sharding: inner shards of 2x2 chunks) uploaded, a tree
    reaching SeaweedFS through a counting proxy, ``requests(key)`` listing ``(method, range,
    if-match)`` of the requests for one key, ``want(array, name)`` the chunk file as a tree
    of the local directory shows it. Versions stay remembered (``stat_ttl`` 60 s): the counts
    do not depend on the test's speed."""
    root = tmp_path / "src"
    write_group(root)
    write_v3(root / "a", random_data((256, 256), "int32", 3), (128, 128), [sharding((32, 32), [LE])])
    write_v3(root / "n", random_data((256, 256), "int32", 4), (128, 128), nested_codecs((64, 64), (32, 32), [LE]))
    prefix = f"counted-{uuid.uuid4().hex[:8]}"
    st = ObjectStorage(f"s3://{objects_env.bucket}/{prefix}")
    upload(root, st)
    st.close()
    local = compose_tree(LocalStorage(str(root)))
    with DelayProxy(("127.0.0.1", objects_env.ports["s3.port"]), delay=0, record=True) as proxy:
        st = ObjectStorage(f"s3://{objects_env.bucket}/{prefix}", endpoint=f"http://127.0.0.1:{proxy.port}",
                           stat_ttl=60)

        def requests(key: str) -> list[tuple[str, str | None, bool]]:
            return [(r.method, r.headers.get("range"), "if-match" in r.headers) for r in proxy.log
                    if r.path == f"/{objects_env.bucket}/{prefix}/{key}"]

        def want(array: str, name: str) -> bytes:
            return trio.run(chunk_bytes, local, name, None, array)

        yield compose_tree(st), proxy, requests, want, root
        st.close()


def names(shard: tuple[int, int]) -> list[str]:
    """The chunk files of ``shard`` in the order zarr 2.18 reads them (C order)."""
    return [f"{shard[0] * CPS + i}.{shard[1] * CPS + j}" for i in range(CPS) for j in range(CPS)]


def test_a_chunk_costs_one_ranged_get_if_match_after_one_suffix_get_of_its_index(counted):
    view, proxy, requests, want, src = counted
    assert trio.run(chunk_bytes, view, "5.6", None, "a") == want("a", "5.6")
    index = 16 * CPS * CPS + 4
    shard = (src / "a/c/1/1").read_bytes()
    offset, nbytes = np.frombuffer(shard[-index:-4], "<u8").reshape(CPS, CPS, 2)[1, 2].tolist()
    assert requests("a/c/1/1") == [("GET", f"bytes=-{index}", False),
                                   ("GET", f"bytes={offset}-{offset + nbytes - 1}", True)]
    for other in ("a/c/0/0", "a/c/0/1", "a/c/1/0"):  # their indexes, read ahead in the background
        assert requests(other) in ([], [("GET", f"bytes=-{index}", False)]), (other, requests(other))


def test_a_scattered_read_reads_every_index_of_its_array_ahead_once_then_a_chunk_costs_one_get(counted):
    """A cold chunk that is not its shard's first (no sweep starts there): after its index and
    its bytes, the indexes of the array's other shards are read in the background (one listing,
    one GET each, none twice); a chunk of another shard then costs one GET."""
    view, proxy, requests, want, src = counted
    index = ("GET", f"bytes=-{16 * CPS * CPS + 4}", False)
    shards = [f"a/c/{i}/{j}" for i in range(2) for j in range(2)]

    async def scattered() -> tuple[bytes, bytes, list]:
        first = await chunk_bytes(view, "5.6", None, "a")
        with trio.fail_after(5):
            while any(view.indexes.index_cache.latest(key) is None for key in shards):
                await trio.sleep(0.01)
        before = len(proxy.log)
        second = await chunk_bytes(view, "1.5", None, "a")
        return first, second, proxy.log[before:]

    first, second, after = trio.run(scattered)
    assert (first, second) == (want("a", "5.6"), want("a", "1.5"))
    assert [(r.method, r.path.rpartition("/")[2], "if-match" in r.headers) for r in after] == [("GET", "1", True)]
    assert requests("a/c/0/1") == [index, ("GET", after[0].headers["range"], True)]
    assert requests("a/c/1/1")[0] == index and len(requests("a/c/1/1")) == 2
    assert requests("a/c/0/0") == requests("a/c/1/0") == [index]
    assert [r.method for r in proxy.log].count("LIST") == 1
    assert not [r for r in proxy.log if "/n/" in r.path], "another array's shards were read"


def test_a_shard_read_whole_costs_at_most_two_gets_and_reading_it_again_none(counted):
    view, proxy, requests, want, src = counted

    async def sweep(shards) -> dict[str, bytes]:
        return {name: await chunk_bytes(view, name, None, "a") for shard in shards for name in names(shard)}

    shards = [(0, 0), (0, 1), (1, 0), (1, 1)]
    got = trio.run(sweep, shards)
    assert got == {name: want("a", name) for shard in shards for name in names(shard)}
    per_shard = [requests(f"a/c/{i}/{j}") for i, j in shards]
    # the first shard, opened at its first chunk: its index, then all of it; the next, walked on
    # to from it in C order (``_walk_on``): all of it in one GET that also tells its index, with
    # the shards after it, fetched ahead the same way
    index = ("GET", f"bytes=-{16 * CPS * CPS + 4}", False)
    size = (src / "a/c/0/0").stat().st_size
    assert per_shard[0] == [index, ("GET", f"bytes=0-{size - 1}", True)], per_shard
    assert all(r == [("GET", None, False)] for r in per_shard[1:]), per_shard
    before = len(proxy.log)
    assert trio.run(sweep, shards) == got
    assert proxy.log[before:] == []


def test_no_index_is_read_ahead_when_the_arrays_indexes_would_not_fit_a_quarter_of_the_index_cache(counted):
    """With an index cache of 12 tables, a quarter holds 3: the array's 4 shards are listed
    (one LIST) and no other index is read."""
    view, proxy, requests, want, _ = counted
    view.indexes.index_cache.max_bytes = 12 * 16 * CPS * CPS  # 16 bytes per chunk in a table

    async def scattered() -> bytes:
        data = await chunk_bytes(view, "5.6", None, "a")
        with trio.fail_after(5):
            while "LIST" not in [r.method for r in proxy.log]:
                await trio.sleep(0.01)
        await trio.sleep(0.5)  # what the listing would start
        return data

    assert trio.run(scattered) == want("a", "5.6")
    assert [r.method for r in proxy.log].count("LIST") == 1
    assert [len(requests(f"a/c/{i}/{j}")) for i in range(2) for j in range(2)] == [0, 0, 0, 2]


def test_a_sweep_starting_inside_a_shard_fetches_the_rest_at_the_next_chunk_stored(counted):
    """A chunk, then the one stored right after it (zarr 3 stores a shard's chunks in Morton
    order): the second open fetches the shard whole (its index, the first chunk, all of it); the
    rest of the shard costs nothing more."""
    view, proxy, requests, want, src = counted
    index = 16 * CPS * CPS + 4
    size = (src / "a/c/0/1").stat().st_size
    table = np.frombuffer((src / "a/c/0/1").read_bytes()[-index:-4], "<u8").reshape(CPS * CPS, 2)
    offset, nbytes = table[5].tolist()
    [after] = np.flatnonzero(table[:, 0] == offset + nbytes)
    sweep = [names((0, 1))[5], names((0, 1))[after]] + [n for i, n in enumerate(names((0, 1))) if i not in (5, after)]

    async def read() -> dict[str, bytes]:
        return {name: await chunk_bytes(view, name, None, "a") for name in sweep}

    assert trio.run(read) == {name: want("a", name) for name in sweep}
    assert requests("a/c/0/1") == [("GET", f"bytes=-{index}", False),
                                   ("GET", f"bytes={offset}-{offset + nbytes - 1}", True),
                                   ("GET", f"bytes=0-{size - 1}", True)]


def test_nested_indexes_cost_one_request_per_level(counted):
    view, proxy, requests, want, _ = counted
    assert trio.run(chunk_bytes, view, "0.0", None, "n") == want("n", "0.0")
    got = requests("n/c/0/0")  # the outer index, the 4 inner indexes in one GET, the chunk
    assert [(m, c) for m, _, c in got] == [("GET", False), ("GET", True), ("GET", True)], got
    assert got[0][1] == f"bytes=-{16 * 2 * 2 + 4}"


def test_concurrent_opens_of_a_shard_share_its_index_read_and_its_whole_fetch(counted):
    view, proxy, requests, want, src = counted
    got: dict[str, bytes] = {}

    # every other chunk in the order they are stored: not the first chunk (a sweep would start
    # there), none stored right after another (a sweep from inside the shard): in whatever
    # order they run, they are scattered reads
    table = np.frombuffer((src / "a/c/1/0").read_bytes()[-(16 * CPS * CPS + 4):-4], "<u8").reshape(CPS * CPS, 2)
    stored = np.argsort(table[:, 0]).tolist()
    assert stored[0] == 0
    opened = [names((1, 0))[pos] for pos in stored[1::2]]

    async def all_at_once() -> None:
        async def one(name: str) -> None:
            got[name] = await chunk_bytes(view, name, None, "a")

        async with trio.open_nursery() as nursery:
            for name in opened:
                nursery.start_soon(one, name)

    trio.run(all_at_once)
    assert got == {name: want("a", name) for name in opened}
    # one index GET, the chunks of the first two opens, then all of it (the third open): the
    # other opens wait for those
    assert [(m, c) for m, _, c in requests("a/c/1/0")] == [("GET", False)] + [("GET", True)] * 3


def test_listing_an_array_costs_its_listing_and_one_index_get_per_shard(counted):
    view, proxy, requests, want, root = counted

    async def listing() -> list[str]:
        arr = await view.names.lookup(ROOT_INODE, "a")
        return [name for name, _ in await view.listing.listdir(arr.ino)]

    shown = trio.run(listing)
    assert sorted(shown) == sorted([".zarray", ".zattrs"]
                                   + [n for i in range(2) for j in range(2) for n in names((i, j))])
    index = f"bytes=-{16 * CPS * CPS + 4}"
    for i in range(2):
        for j in range(2):
            assert requests(f"a/c/{i}/{j}") == [("GET", index, False)]
    assert {r.method for r in proxy.log} <= {"GET", "LIST"}
    assert [r.method for r in proxy.log].count("GET") == 4 + 2  # the indexes, and zarr.json of the root and of a


def test_a_sweep_crossing_shards_row_by_row_looks_at_the_shards_after_one_once(counted):
    """zarr 2.18's order: rows of chunks, each crossing both shards of a row of shards, so each
    shard is visited 4 times. The shards after one are looked at (``_prefetch_after``) once per
    shard the sweep walks on to, not at every visit: after shard 0 when the sweep walks on to
    shard 1 (``Prefetch.walk_on``: shards 1 to 3 fetched ahead), after 1, after 2 and after 3 (nothing
    left after them)."""
    view, proxy, requests, want, src = counted
    looked: list[int] = []
    prefetch_after = view.prefetch._prefetch_after

    def recording(arr, at: int, size: int) -> bool:
        looked.append(at)
        return prefetch_after(arr, at, size)

    view.prefetch._prefetch_after = recording
    rows = [f"{i}.{j}" for i in range(2 * CPS) for j in range(2 * CPS)]

    async def read() -> dict[str, bytes]:
        return {name: await chunk_bytes(view, name, None, "a") for name in rows}

    assert trio.run(read) == {name: want("a", name) for name in rows}
    assert looked == [0, 1, 2, 3]
    assert requests("a/c/1/0") == requests("a/c/1/1") == [("GET", None, False)]


def test_a_sweep_in_c_order_has_the_next_layer_of_shards_fetched_in_turn_before_it_comes_to_it(objects_env, tmp_path):
    """A 3x3x3-shard array (shards of 2x2x4 chunks) swept in zarr 2.18's order, C order of the
    chunk grid: each plane of chunks crosses the 9 shards of a layer (more than
    ``PREFETCH_SHARDS``), and the sweep reads a layer in 2 planes, then enters the next. Once
    it has read the first layer (and the fetches it started are done), the whole second layer
    has been fetched (the shards after each one walked on to, as many as a plane crosses), each
    shard whole in one GET, and nothing of the third. The fetches start in C order, the order
    the sweep needs them, ``PREFETCH_AT_ONCE`` at once (never more). In all, the
    first shard costs its index and one GET If-Match, every other shard one GET."""
    from shardfs.reads import prefetch

    root = tmp_path / "src"
    write_group(root)
    write_v3(root / "v", random_data((12, 12, 24), "uint8", 5), (4, 4, 8), [sharding((2, 2, 2), [LE])])
    prefix = f"layers-{uuid.uuid4().hex[:8]}"
    st = ObjectStorage(f"s3://{objects_env.bucket}/{prefix}")
    upload(root, st)
    st.close()
    local = compose_tree(LocalStorage(str(root)))
    grid = (3, 3, 3)
    keys = [f"v/c/{i}/{j}/{k}" for i, j, k in np.ndindex(*grid)]  # C order
    chunks = [f"{i}.{j}.{k}" for i, j, k in np.ndindex(6, 6, 12)]
    first_layer = [name for name in chunks if int(name.split(".")[0]) < 2]
    with DelayProxy(("127.0.0.1", objects_env.ports["s3.port"]), delay=0, record=True) as proxy:
        st = ObjectStorage(f"s3://{objects_env.bucket}/{prefix}", endpoint=f"http://127.0.0.1:{proxy.port}",
                           stat_ttl=60)
        view = compose_tree(st)
        started: list[str] = []
        running = [0, 0]  # now, most
        fetch_whole = view.reads.fetch_whole

        async def counting(key: str):
            started.append(key)
            running[0] += 1
            running[1] = max(running)
            try:
                return await fetch_whole(key)
            finally:
                running[0] -= 1

        view.reads.fetch_whole = counting

        def requests() -> list[list[tuple[str, str | None, bool]]]:
            return [[(r.method, r.headers.get("range"), "if-match" in r.headers) for r in proxy.log
                     if r.path == f"/{objects_env.bucket}/{prefix}/{key}"] for key in keys]

        async def sweep(names: list[str]) -> dict[str, bytes]:
            got = {name: await chunk_bytes(view, name, None, "v") for name in names}
            with trio.fail_after(10):
                while view.indexes._index_reads:
                    await trio.sleep(0.01)
            return got

        got = trio.run(sweep, first_layer)
        after_first = requests()
        got.update(trio.run(sweep, chunks[len(first_layer):]))
        st.close()
    assert got == {name: trio.run(chunk_bytes, local, name, None, "v") for name in chunks}
    size = (root / keys[0]).stat().st_size
    whole = [("GET", None, False)]
    assert after_first == [[("GET", f"bytes=-{16 * 16 + 4}", False), ("GET", f"bytes=0-{size - 1}", True)]] + \
        [whole] * 17 + [[]] * 9, after_first
    assert requests() == after_first[:18] + [whole] * 9
    assert sorted(started) == keys[1:]  # each once
    at_once = prefetch.PREFETCH_AT_ONCE
    # in turn: trio starts tasks spawned together in any order, so each fetch starts among the
    # PREFETCH_AT_ONCE next in C order
    assert all(abs(started.index(key) - i) < at_once for i, key in enumerate(keys[1:])), started
    assert running[1] == at_once


@pytest.mark.parametrize("count, slot", [(1, 0), (2, 0), (2, 1)])
def test_a_walk_fetches_at_most_prefetch_max_shards_ahead_however_wide_a_plane(objects_env, tmp_path, count, slot):
    """A 2x40-shard array (shards of 1x4 chunks): a plane of chunks crosses 40 shards, more
    than ``PREFETCH_MAX``. A sweep of shard 0's chunks, then the first chunk of the next shard
    homed at the worker (a walk: ``_walk_on``), fetches that shard and the shards after it,
    up to the ``PREFETCH_MAX``-th after shard 0, each whole in one GET, and no other: a sweep
    of a small region fetches no more for nothing. Of ``count`` workers (``Prefetch.share``),
    worker ``slot`` fetches those homed at it among them (every ``count``-th), so the workers
    together fetch ahead what one worker would, not ``count`` times as many; worker 1 walks on
    from a sweep of shard 0, homed at worker 0 (served where every worker finds it)."""
    from shardfs.reads import prefetch

    root = tmp_path / "src"
    write_group(root)
    write_v3(root / "w", random_data((2, 160), "uint8", 6), (1, 4), [sharding((1, 1), [LE])])
    prefix = f"wide-{uuid.uuid4().hex[:8]}"
    st = ObjectStorage(f"s3://{objects_env.bucket}/{prefix}")
    upload(root, st)
    st.close()
    keys = [f"w/c/{i}/{j}" for i in range(2) for j in range(40)]
    names = [f"0.{j}" for j in range(4)] + [f"0.{4 * (count if slot == 0 else slot)}"]
    with DelayProxy(("127.0.0.1", objects_env.ports["s3.port"]), delay=0, record=True) as proxy:
        st = ObjectStorage(f"s3://{objects_env.bucket}/{prefix}", endpoint=f"http://127.0.0.1:{proxy.port}",
                           stat_ttl=60)
        view = compose_tree(st)
        view.prefetch.share(slot, count)

        async def sweep() -> list[bytes]:
            got = [await chunk_bytes(view, name, None, "w") for name in names]
            with trio.fail_after(10):
                while view.indexes._index_reads:
                    await trio.sleep(0.01)
            return got

        got = trio.run(sweep)
        st.close()
    local = compose_tree(LocalStorage(str(root)))
    assert got == [trio.run(chunk_bytes, local, name, None, "w") for name in names]
    fetched = [key for key in keys if any(r.path == f"/{objects_env.bucket}/{prefix}/{key}" for r in proxy.log)]
    assert fetched == keys[:1] + keys[slot or count:1 + prefetch.PREFETCH_MAX:count]
    for key in fetched[1:]:
        assert [(r.method, r.headers.get("range")) for r in proxy.log
                if r.path == f"/{objects_env.bucket}/{prefix}/{key}"] == [("GET", None)], key
