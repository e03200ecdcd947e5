"""The view over an object store (``ObjectStorage`` + ``ObjectReads``) against a real SeaweedFS.

The read matrix (tests/sources.py: every index location, codec chain, key encoding, writer) is
uploaded to the session's SeaweedFS; a ``View`` over that prefix is walked through the same
calls fuse_ops makes (listdir, open, read, release) and must show exactly what a ``View`` over
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

import pytest
import trio

from conftest import assert_same_array, case_params, read_native, read_zarr3_v2
from s3server import SeaweedS3
from sources import CASES, LE, ZSTD, random_data, sharding, write_group, write_v3
from shardfs.storage.local import LocalStorage
from shardfs.storage.objects import ObjectStorage, Retry
from shardfs.view import ROOT_INODE, View


def upload(root: Path, st: ObjectStorage) -> None:
    """Every file below ``root`` as an object of the same key."""
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st.replace(p.relative_to(root).as_posix(), [p.read_bytes()])


async def walk(view: View, ino: int = ROOT_INODE, path: str = "") -> dict[str, bytes]:
    """``{path: content}`` of every file the view shows (directories as ``path/``), read like
    a client: listdir, open, one read past the end, release."""
    out: dict[str, bytes] = {}
    for name, attr in await view.listdir(ino):
        sub = f"{path}/{name}" if path else name
        if stat.S_ISDIR(attr.mode):
            out[sub + "/"] = b""
            out.update(await walk(view, attr.ino, sub))
            continue
        handle = await view.open(attr.ino)
        try:
            out[sub] = bytes(await view.read(handle, 0, attr.size + 1))
        finally:
            view.release(handle)
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
        return trio.run(walk, View(st))
    finally:
        st.close()


def test_the_view_of_objects_is_the_view_of_the_same_files_in_a_directory(matrix, object_files):
    local = trio.run(walk, View(LocalStorage(str(matrix.root))))
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


async def chunk_bytes(view: View, name: str, replace=None) -> bytes:
    """Chunk file ``a/name`` as a client reads it; ``replace()`` runs between its lookup and open."""
    arr = await view.lookup(ROOT_INODE, "a")
    attr = await view.lookup(arr.ino, name)
    if replace is not None:
        replace()
    handle = await view.open(attr.ino)
    try:
        return bytes(await view.read(handle, 0, 1 << 20))
    finally:
        view.release(handle)


def test_a_shard_replaced_after_its_index_was_read_is_read_again_at_its_new_version(objects_env, tmp_path):
    v1, v2 = two_versions(tmp_path)
    st = ObjectStorage(f"s3://{objects_env.bucket}/replaced-{uuid.uuid4().hex[:8]}")
    try:
        upload(v1, st)
        new = (v2 / "a/c/0/0").read_bytes()
        got = trio.run(chunk_bytes, View(st), "1.0", lambda: st.replace("a/c/0/0", [new]))
    finally:
        st.close()
    want = trio.run(chunk_bytes, View(LocalStorage(str(v2))), "1.0")
    old = trio.run(chunk_bytes, View(LocalStorage(str(v1))), "1.0")
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
        want = {name: trio.run(chunk_bytes, View(LocalStorage(str(v1))), name) for name in ("0.0", "1.0")}
        view = View(st)

        async def scenario() -> None:
            assert await chunk_bytes(view, "0.0") == want["0.0"]  # the shard's index is cached now
            server.kill()
            caplog.clear()
            with caplog.at_level(logging.ERROR, logger="shardfs"):
                with pytest.raises(OSError) as failed:
                    await chunk_bytes(view, "1.0")
            assert failed.value.errno == errno.EIO
            lines = [r.getMessage() for r in caplog.records]
            assert len(lines) == 1 and lines[0].startswith(f"s3://{server.bucket}/gone/a/c/0/0: "), lines
            assert await chunk_bytes(view, "0.0") == want["0.0"]  # what is in memory is still served
            server.start()
            assert await chunk_bytes(view, "1.0") == want["1.0"]

        trio.run(scenario)
        st.close()
    finally:
        server.stop()
