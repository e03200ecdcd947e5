"""The ``Storage`` contract (shardfs/storage/__init__.py), checked on every implementation.

``LocalStorage`` runs on a temporary directory; ``ObjectStorage`` against a real SeaweedFS
(tests/s3server.py) for ``s3://`` and a real Azurite (tests/azserver.py, skipped when not
installed) for ``az://``, each test below its own prefix. The object-store-only part at the end
covers what only a remote store has: ``check()`` at mount (bad credentials, missing bucket or
prefix, unreachable endpoint), a server killed mid-read and restarted, a short outage retried,
the delay proxy, and the trio bridge of its coroutines.
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest

from azserver import CONTAINER
from s3server import ACCESS_KEY, SECRET_KEY, SeaweedS3
from shardfs.storage import ABSENT, Entry, Range, Version, VersionMismatch
from shardfs.storage.local import LocalStorage
from shardfs.storage.objects import PAGE, ObjectStorage
from shardfs.storage.requests import Retry, StorageUnavailable
from testkit.delayproxy import DelayProxy

KINDS = ["local", "objects", "azure"]


@pytest.fixture
def aws_env(monkeypatch, s3):
    """Credentials and endpoint of the session's SeaweedFS in the standard AWS variables."""
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    return s3


def _objects(s3, prefix: str | None = None, **kw) -> ObjectStorage:
    return ObjectStorage(f"s3://{s3.bucket}/{prefix or 't-' + uuid.uuid4().hex[:12]}", **kw)


@pytest.fixture(params=KINDS)
def storage(request, tmp_path):
    if request.param == "objects":
        request.getfixturevalue("aws_env")
        st = _objects(request.getfixturevalue("s3"))
        yield st
        st.close()
    elif request.param == "azure":
        az = request.getfixturevalue("azure")
        monkeypatch = request.getfixturevalue("monkeypatch")
        for name, value in az.env.items():
            monkeypatch.setenv(name, value)
        st = ObjectStorage(f"az://{CONTAINER}/t-{uuid.uuid4().hex[:12]}", endpoint=az.endpoint)
        yield st
        st.close()
    else:
        root = tmp_path / "src"
        root.mkdir()
        yield LocalStorage(str(root))


def test_version_changes_on_replace(storage):
    assert storage.version("a/k") is None
    v1 = storage.replace("a/k", [b"abc"], if_version=ABSENT)
    assert storage.version("a/k") == v1
    assert v1.size == 3
    v2 = storage.replace("a/k", [b"abcd", memoryview(b"ef")])
    assert v2 != v1 and v2.size == 6
    assert storage.version("a/k") == v2
    v3 = storage.replace("a/k", [b"abcdeX"], if_version=v2)  # same size, other content
    assert v3.tag != v2.tag and v3.size == 6
    assert storage.read_all("a/k") == (b"abcdeX", v3)


def test_ranged_and_suffix_reads(storage):
    data = bytes(range(256)) * (3 * 4096 + 7)  # 3 MiB + 1792 B: ranges > 1 MiB apart
    size = len(data)
    v = storage.replace("s/shard", [data])
    ranges = [Range(0, 10), Range(100, 50), Range(size - 5, 100), Range(size + 10, 10),
              Range(2_600_000, 4096), Range(-16, 16), Range(-16, 8), Range(7, 0)]
    want = [data[0:10], data[100:150], data[size - 5:], b"", data[2_600_000:2_604_096],
            data[-16:], data[-16:-8], b""]
    assert storage.read("s/shard", ranges) == want
    assert storage.read("s/shard", ranges, if_version=v) == want
    assert storage.read("s/shard", [Range(-4096, 4096)], if_version=v) == [data[-4096:]]
    storage.replace("s/shard", [b"new"])
    with pytest.raises(VersionMismatch):
        storage.read("s/shard", [Range(0, 10)], if_version=v)
    with pytest.raises(FileNotFoundError):
        storage.read("s/missing", [Range(0, 10)])
    with pytest.raises(FileNotFoundError):
        storage.read_all("s/missing")


def test_conditional_replace_race_has_one_winner(storage):
    base = storage.replace("race/k", [b"base"])
    barrier = threading.Barrier(8)

    def write(i: int) -> Version | str:
        barrier.wait()
        try:
            return storage.replace("race/k", [b"writer %d" % i], if_version=base)
        except VersionMismatch:
            return "lost"

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(write, range(8)))
    winners = [(i, o) for i, o in enumerate(outcomes) if o != "lost"]
    assert len(winners) == 1, outcomes
    i, version = winners[0]
    assert storage.read_all("race/k") == (b"writer %d" % i, version)


def test_create_only_if_absent(storage):
    v = storage.replace("c/k", [b"first"], if_version=ABSENT)
    with pytest.raises(VersionMismatch):
        storage.replace("c/k", [b"second"], if_version=ABSENT)
    assert storage.read_all("c/k") == (b"first", v)
    storage.delete("c/k")
    with pytest.raises(VersionMismatch):  # If-Match on a vanished key
        storage.replace("c/k", [b"third"], if_version=v)
    assert storage.version("c/k") is None


def test_delete(storage):
    storage.delete("d/missing")  # unconditional: missing is fine
    storage.delete("d/missing", if_version=ABSENT)
    old = storage.replace("d/k", [b"one"])
    new = storage.replace("d/k", [b"two"])
    with pytest.raises(VersionMismatch):
        storage.delete("d/k", if_version=old)
    with pytest.raises(VersionMismatch):
        storage.delete("d/k", if_version=ABSENT)
    assert storage.read_all("d/k") == (b"two", new)
    storage.delete("d/k", if_version=new)
    assert storage.version("d/k") is None
    with pytest.raises(VersionMismatch):
        storage.delete("d/k", if_version=new)


def test_listing_pages_over_many_keys(storage):
    files = [f"f{i:04d}" for i in range(PAGE + 150)]
    deep = [f"a_sub/x{i:04d}" for i in range(50)]  # listed as one entry, never walked
    keys = files + deep + ["m_sub/k", "z_sub/deeper/k"]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: storage.replace(f"many/{k}", [b"x"]), keys))
    pages = list(storage.list("many"))
    assert len(pages) >= 2 and all(0 < len(p) <= PAGE for p in pages), [len(p) for p in pages]
    entries = [e for p in pages for e in p]
    assert sorted(entries) == sorted([Entry(f, False) for f in files] +
                                     [Entry(d, True) for d in ("a_sub", "m_sub", "z_sub")])
    sub = [e for p in storage.list("many/a_sub/") for e in p]
    assert sorted(sub) == sorted(Entry(k.split("/")[1], False) for k in deep)
    assert [e for p in storage.list("many/z_sub") for e in p] == [Entry("deeper", True)]
    assert list(storage.list("nothing/here")) == []


# --------------------------------------------------------------------------- object store only


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_check_accepts_a_good_source_and_names_each_bad_one(aws_env, monkeypatch):
    s3 = aws_env
    good = _objects(s3, "checked")
    good.replace("zarr.json", [b"{}"])
    good.check()
    ObjectStorage(f"s3://{s3.bucket}").check()

    missing_prefix = f"s3://{s3.bucket}/no-such-prefix"
    with pytest.raises(StorageUnavailable) as e:
        ObjectStorage(missing_prefix).check()
    assert str(e.value) == f"{missing_prefix}: no such prefix (no object below it)"

    with pytest.raises(StorageUnavailable) as e:
        ObjectStorage("s3://no-such-bucket/checked").check()
    assert str(e.value) == "s3://no-such-bucket/checked: no such bucket"

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-" + SECRET_KEY)
    with pytest.raises(StorageUnavailable) as e:
        ObjectStorage(f"s3://{s3.bucket}/checked").check()
    assert str(e.value) == (f"s3://{s3.bucket}/checked: access denied "
                            "(check the credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; "
                            "a public bucket: -o anonymous)")
    with pytest.raises(PermissionError) as pe:
        ObjectStorage(f"s3://{s3.bucket}/checked").read_all("zarr.json")
    assert pe.value.errno == errno.EACCES

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailable) as e:
        ObjectStorage(f"s3://{s3.bucket}/checked", endpoint=f"http://127.0.0.1:{_free_port()}").check()
    assert time.monotonic() - t0 < 30  # a hang
    assert str(e.value).startswith(f"s3://{s3.bucket}/checked: endpoint unreachable (")
    assert "\n" not in str(e.value)


def test_anonymous_requests_are_unsigned(aws_env):
    signed = _objects(aws_env, "anon")
    signed.replace("k", [b"private"])
    with pytest.raises(PermissionError):  # the bucket is not public: unsigned reads are refused
        ObjectStorage(f"s3://{aws_env.bucket}/anon", anonymous=True).read_all("k")


def test_server_killed_mid_read_gives_eio_then_recovers(tmp_path, monkeypatch):
    server = SeaweedS3(tmp_path / "own").start()
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        data = bytes(range(256)) * 4096
        direct = ObjectStorage(f"s3://{server.bucket}/r", endpoint=server.endpoint)
        direct.replace("shard", [data])
        direct.close()
        retry = Retry(max_retries=3, retry_timeout=4, init_backoff=0.1, max_backoff=0.5,
                      request_timeout=4, connect_timeout=2)
        with DelayProxy(("127.0.0.1", server.ports["s3.port"]), delay=0.3) as proxy:
            st = ObjectStorage(f"s3://{server.bucket}/r", endpoint=f"http://127.0.0.1:{proxy.port}", retry=retry)
            outcome: list = []

            def read() -> None:
                t0 = time.monotonic()
                try:
                    outcome.append(st.read("shard", [Range(0, len(data))]))
                except OSError as e:
                    outcome.append(e)
                outcome.append(time.monotonic() - t0)

            reader = threading.Thread(target=read)
            reader.start()
            time.sleep(0.15)  # the GET is in the proxy, on its way to the server
            server.kill()
            reader.join(timeout=30)
            err, elapsed = outcome
            assert isinstance(err, OSError) and err.errno == errno.EIO, err
            assert elapsed < 30, elapsed  # a hang
            server.start()
            assert st.read("shard", [Range(5, 10)]) == [data[5:15]]
            st.close()
    finally:
        server.stop()


def test_read_during_a_short_outage_is_retried_and_succeeds(tmp_path, monkeypatch):
    server = SeaweedS3(tmp_path / "own").start()
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        retry = Retry(max_retries=30, retry_timeout=25, init_backoff=0.1, max_backoff=0.5)
        st = ObjectStorage(f"s3://{server.bucket}/o", endpoint=server.endpoint, retry=retry)
        v = st.replace("k", [b"survives"])
        server.kill()
        outcome: list = []
        reader = threading.Thread(target=lambda: outcome.append(st.read("k", [Range(0, 100)], if_version=v)))
        reader.start()
        time.sleep(0.5)  # connection refused, retried with backoff meanwhile
        assert reader.is_alive()
        server.start()
        reader.join(timeout=30)
        assert outcome == [[b"survives"]]
        st.close()
    finally:
        server.stop()


@contextlib.contextmanager
def _answering(handler: type, monkeypatch) -> Iterator[str]:
    """An HTTP server on loopback answering every request with ``handler`` (a server that
    misbehaves in a way SeaweedFS cannot be made to), with credentials in the environment;
    yields its endpoint URL and stops it at the end."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_5xx_is_retried_a_bounded_number_of_times_then_eio(monkeypatch):
    """A server answering 503 to everything: exactly 1 + max_retries requests, then EIO."""
    hits: list[str] = []

    class Unavailable(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.command)
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

        def log_message(self, *args) -> None:
            pass

    with _answering(Unavailable, monkeypatch) as endpoint:
        st = ObjectStorage("s3://b/p", endpoint=endpoint,
                           retry=Retry(max_retries=3, retry_timeout=10, init_backoff=0.05, max_backoff=0.2))
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            st.read("k", [Range(0, 10)])
        assert e.value.errno == errno.EIO and time.monotonic() - t0 < 30  # a hang
        assert hits == ["GET"] * 4
        hits.clear()
        with pytest.raises(OSError) as e:
            st.version("k")
        assert e.value.errno == errno.EIO and hits == ["HEAD"] * 4
        st.close()


def test_a_404_to_an_if_match_put_is_a_version_mismatch(monkeypatch):
    """Some servers answer 404, not 412, to ``If-Match`` on a key that vanished: it is a
    ``VersionMismatch`` (the fold reads again), never ``FileNotFoundError``. One PUT, no retry."""
    hits: list[tuple[str, str | None]] = []

    class Vanished(http.server.BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            hits.append((self.command, self.headers.get("If-Match")))
            body = b"<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>"
            self.send_response(404)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    with _answering(Vanished, monkeypatch) as endpoint:
        st = ObjectStorage("s3://b/p", endpoint=endpoint)
        with pytest.raises(VersionMismatch):
            st.replace("k", [b"new"], if_version=Version('"e1"', 3, 0))
        assert hits == [("PUT", '"e1"')]
        st.close()


def test_delay_proxy_adds_its_delay_each_way(aws_env):
    st = _objects(aws_env)
    v = st.replace("k", [b"through the proxy"])
    with DelayProxy(("127.0.0.1", aws_env.ports["s3.port"]), delay=0.2) as proxy:
        slow = ObjectStorage(st.url, endpoint=f"http://127.0.0.1:{proxy.port}")
        slow.version("k")  # connection set up
        proxy.reset_peak()
        t0 = time.monotonic()
        assert slow.read("k", [Range(0, 7), Range(-5, 5)], if_version=v) == [b"through", b"proxy"]
        elapsed = time.monotonic() - t0
        slow.close()
    # 0.2 s each way: at least one round trip; both GETs in flight at once (the proxy saw them
    # together; an upper bound on the time would flake on a loaded machine)
    assert elapsed >= 0.4 and proxy.peak_in_flight == 2, (elapsed, proxy.peak_in_flight)
    st.close()


def test_trio_tasks_await_reads_on_the_loop_thread(aws_env):
    import trio

    st = _objects(aws_env)
    blobs = {f"k{i}": bytes([i]) * (1000 + i) for i in range(50)}
    for k, b in blobs.items():
        st.replace(k, [b])
    got: dict[str, bytes] = {}

    async def main() -> None:
        async def one(k: str) -> None:
            [got[k]] = await st.loop.trio_run(st.requests.aread(k, [Range(0, 4096)]))

        async with trio.open_nursery() as nursery:
            for k in blobs:
                nursery.start_soon(one, k)
        with trio.move_on_after(0.001):  # a cancelled await abandons its request
            await st.loop.trio_run(st.requests.aread("k1", [Range(0, 10)]))
        assert await st.loop.trio_run(st.requests.aversion("missing")) is None

    trio.run(main)
    assert got == blobs
    st.close()


def test_a_nested_shard_replaced_between_its_index_and_its_inner_indexes_is_read_again(storage, tmp_path):
    """``shard.read_index_sync`` reads a nested shard's own index (``read_versioned``), then its
    inner shards' indexes with ``read(key, ranges, if_version)``. A shard replaced in between
    (another writer) must fail that second read (``VersionMismatch``), so the index is read
    again: without the check, the inner indexes come from the new shard at the old one's
    offsets and the table mixes two versions (issue 27 item 7)."""
    import json as json_mod
    import warnings

    import numcodecs
    import numpy as np

    from shardfs.shards import shard as shard_mod
    from shardfs.tree.metadata import parse
    from shardfs.format.v2 import describe_array
    from sources import LE, ZSTD, nested_codecs, write_v3

    def shard_bytes(name: str, data: np.ndarray) -> tuple[bytes, dict]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_v3(tmp_path / name, data, (8, 8), nested_codecs((4, 4), (2, 2), [LE, ZSTD]))
        return ((tmp_path / name / "c" / "0" / "0").read_bytes(),
                json_mod.loads((tmp_path / name / "zarr.json").read_text()))

    old, doc = shard_bytes("old", np.arange(64, dtype="int32").reshape(8, 8) + 1)
    new_data = np.random.default_rng(7).integers(1, 1 << 30, size=(8, 8)).astype("int32")
    new, _ = shard_bytes("new", new_data)  # random values compress worse: other offsets
    fmt = describe_array(parse(json_mod.dumps(doc).encode())).layout.index
    key = "a/c/0/0"
    storage.replace(key, [old])
    real = storage.read_versioned
    replaced = []

    def read_versioned(k, rng):
        out = real(k, rng)
        if not replaced:  # another writer replaces the shard right after its index was read
            replaced.append(storage.replace(key, [new]))
        return out

    storage.read_versioned = read_versioned
    version, table = shard_mod.read_index_sync(storage, key, fmt)
    assert version == replaced[0]
    values = []
    for pos in range(table.shape[0]):  # every chunk decodes from the shard version it was located in
        ext = shard_mod.extent(key, version, table, pos)
        stored = storage.read(key, [Range(ext.offset, ext.nbytes)], if_version=version)[0]
        values += np.frombuffer(numcodecs.Zstd().decode(stored), dtype="<i4").tolist()
    assert sorted(values) == sorted(new_data.ravel().tolist())
