"""``shardfs mount s3://BUCKET[/PREFIX] MNT`` against a real S3 server (SeaweedFS, tests/s3server.py).

Mount-time checks: bad credentials, a missing bucket or prefix, an unreachable endpoint and
options meant for the other kind of source fail with one line on stderr, a non-zero status
and nothing mounted, in the background form and with ``-f``. The state directory of a URL
is keyed on the normalized URL and the endpoint it is reached through.
"""

from __future__ import annotations

import os
import socket
import threading

import numpy as np
import pytest
import zarr

from conftest import daemon_pids, run_shardfs
from shardfs import state
from shardfs.shard import rewrite_sync
from shardfs.storage import ABSENT
from shardfs.storage.objects import ObjectStorage
from sources import Spec, build

S = Spec("s", (8, 10), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
         index_location="end", index_crc=True, initial=((slice(0, 8), slice(0, 5)),),
         write=(slice(0, 4), slice(0, 5)))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def uploaded(tmp_path, s3_upload):
    build(tmp_path / "src", [S])
    return s3_upload(tmp_path / "src")


def mount_fails(src: str, mnt, env: dict[str, str], *opts: str) -> list[str]:
    """Run both forms (daemonizing, and ``-f``); each must fail with status 1, nothing mounted
    and no daemon left. Returns the stderr of each."""
    said = []
    for argv in (["mount", src, str(mnt)], ["mount", src, str(mnt), "-f"]):
        r = run_shardfs(*argv, *opts, env={**os.environ, **env}, timeout=60)
        assert r.returncode == 1, (r.returncode, r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr
        assert not os.path.ismount(mnt) and daemon_pids(mnt) == []
        said.append(r.stderr)
    return said


def test_wrong_secret_is_one_line(uploaded, mnt_dir):
    env = {**uploaded.env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    want = (f"shardfs: error: {uploaded.url}: access denied (check the credentials: "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)\n")
    assert mount_fails(uploaded.url, mnt_dir, env) == [want, want]


def test_missing_bucket_is_one_line(uploaded, mnt_dir):
    want = "shardfs: error: s3://no-such-bucket/p: no such bucket\n"
    assert mount_fails("s3://no-such-bucket/p", mnt_dir, uploaded.env) == [want, want]


def test_missing_prefix_is_one_line(uploaded, mnt_dir):
    url = f"s3://{uploaded.server.bucket}/no-such-prefix"
    want = f"shardfs: error: {url}: no such prefix (no object below it)\n"
    assert mount_fails(url + "/", mnt_dir, uploaded.env) == [want, want]


def test_prefix_without_zarr_json_is_one_line(uploaded, mnt_dir):
    url = f"{uploaded.url}/s/c"  # shards, no zarr.json
    want = f"shardfs: error: {url}: not a Zarr v3 group or array (no zarr.json)\n"
    assert mount_fails(url, mnt_dir, uploaded.env) == [want, want]


@pytest.mark.parametrize("how", ["option", "env"])
def test_unreachable_endpoint_is_one_line(uploaded, mnt_dir, how):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    env = {**uploaded.env, "AWS_ENDPOINT_URL": endpoint} if how == "env" else uploaded.env
    opts = ("-o", f"endpoint={endpoint}") if how == "option" else ()
    for said in mount_fails(uploaded.url, mnt_dir, env, *opts):
        assert said.startswith(f"shardfs: error: {uploaded.url}: endpoint unreachable ("), said


def test_anonymous_requests_are_refused_by_a_private_bucket(uploaded, mnt_dir):
    want = (f"shardfs: error: {uploaded.url}: access denied (check the credentials: "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)\n")
    assert mount_fails(uploaded.url, mnt_dir, uploaded.env, "-o", "ro,anonymous") == [want, want]


@pytest.mark.parametrize("src,opt,message", [
    ("url", "follow_symlinks", "-o follow_symlinks: applies to a local directory, not to an object-store URL"),
    ("url", "endpoint=127.0.0.1:9000", "-o endpoint=127.0.0.1:9000: not an http:// or https:// URL"),
    ("gs://bucket/p", "region=eu-west-1", "-o region: applies to s3:// URLs only"),
    ("local", "endpoint=http://127.0.0.1:9000",
     "-o endpoint: applies to an object-store URL (s3://...), not to a local directory"),
    ("local", "region=us-east-1", "-o region: applies to an object-store URL (s3://...), not to a local directory"),
    ("local", "anonymous", "-o anonymous: applies to an object-store URL (s3://...), not to a local directory"),
    ("local", "cache_size=1G", "-o cache_size: applies to an object-store URL (s3://...), not to a local directory"),
    ("local", "cache_dir=/tmp/c",
     "-o cache_dir: applies to an object-store URL (s3://...), not to a local directory"),
    ("url", "cache_size=lots", "-o cache_size=lots: not a size (e.g. 64M)"),
])
def test_option_for_the_other_kind_of_source_is_one_line(tmp_path, uploaded, mnt_dir, src, opt, message):
    src = {"url": uploaded.url, "local": str(tmp_path / "src")}.get(src, src)
    want = f"shardfs: error: {message}\n"
    assert mount_fails(src, mnt_dir, uploaded.env, "-o", opt) == [want, want]


def test_state_dir_is_keyed_on_the_normalized_url_and_endpoint(monkeypatch):
    url = "s3://bucket/pre/fix"
    same = [state.source_id(u) for u in (url, "s3://bucket/pre/fix/", "s3://bucket//pre//fix", "S3://bucket/pre/fix")]
    assert same == [same[0]] * 4 and same[0].startswith("fix-"), same
    a, b = state.source_id(url, "http://127.0.0.1:1"), state.source_id(url, "http://127.0.0.1:2")
    assert len({same[0], a, b}) == 3, "the endpoint is not part of the key"
    assert state.source_id(url, "http://127.0.0.1:1/") == a
    assert state.source_id("s3://bucket/pre/fiX") != same[0], "keys are case-sensitive"
    assert state.journal_dir(url, endpoint="http://127.0.0.1:1") == os.path.join(state.state_home(), a, "journal")

    from shardfs.source import Source

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert Source.parse(url + "/", {}).endpoint == "http://127.0.0.1:1"
    assert Source.parse(url, {"endpoint": "http://127.0.0.1:2"}).endpoint == "http://127.0.0.1:2"
    assert Source.parse("gs://bucket/p", {}).endpoint is None, "AWS_ENDPOINT_URL is for s3:// only"


# --------------------------------------------------------------------------- folds over objects


class Hooked(ObjectStorage):
    """An ``ObjectStorage`` that runs ``after_read`` once, right after its next ``read_all``:
    another writer acting between a fold's read and its conditional PUT. Counts its calls."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.after_read = None
        self.calls: list[tuple[str, object]] = []

    def read_all(self, key):
        out = super().read_all(key)
        self.calls.append(("read_all", out[1]))
        hook, self.after_read = self.after_read, None
        if hook is not None:
            hook()
        return out

    def replace(self, key, data, if_version=None):
        self.calls.append(("replace", if_version))
        return super().replace(key, data, if_version)


def shard_of_s(storage) -> tuple[str, object]:
    """The key and index format of ``s``'s only shard."""
    from shardfs.metadata import parse
    from shardfs.v2 import describe_array
    from shardfs.writes import shard_target

    target = shard_target("s", describe_array(parse(storage.read_all("s/zarr.json")[0])).layout, (0, 0))
    if isinstance(storage, Hooked):
        storage.calls.clear()
    return target.key, target.fmt


def chunk_values(seed: int) -> np.ndarray:
    return S.values(S.chunk, seed)


@pytest.fixture
def storages(uploaded, monkeypatch):
    for name, value in uploaded.env.items():
        monkeypatch.setenv(name, value)
    mine, other = Hooked(uploaded.url), ObjectStorage(uploaded.url)
    yield mine, other
    mine.close()
    other.close()


def test_a_fold_that_loses_the_race_reads_again_and_applies_its_chunks_on_top(uploaded, storages):
    """The other writer replaces the shard between the fold's read and its PUT: the PUT
    (If-Match the ETag read) is refused with 412, and the fold reads the shard again and
    replaces it with both writers' chunks (one conditional PUT per attempt)."""
    mine, other = storages
    key, fmt = shard_of_s(mine)
    exp = zarr.open_array(uploaded.zarr_store(), path="s", mode="r")[...]
    theirs, ours = chunk_values(71), chunk_values(72)
    mine.after_read = lambda: rewrite_sync(other, key, fmt, {1: S.encode(theirs)})  # chunk (0, 1)
    version = rewrite_sync(mine, key, fmt, {2: S.encode(ours)})  # chunk (1, 0)
    exp[S.chunk_region((0, 1))], exp[S.chunk_region((1, 0))] = theirs, ours
    [first, second] = [v for op, v in mine.calls if op == "read_all"]
    assert [c[0] for c in mine.calls] == ["read_all", "replace", "read_all", "replace"], mine.calls
    assert [c[1] for c in mine.calls if c[0] == "replace"] == [first, second] and first != second
    assert mine.version(key) == version
    np.testing.assert_array_equal(zarr.open_array(uploaded.zarr_store(), path="s", mode="r")[...], exp)


def test_a_fold_of_a_shard_deleted_meanwhile_creates_it_if_none_match(uploaded, storages):
    """The shard vanishes between the fold's read and its PUT (If-Match on a missing key: 412,
    or 404 from some servers): the fold reads again, finds nothing and creates the shard with
    If-None-Match: * holding only its own chunk."""
    mine, other = storages
    key, fmt = shard_of_s(mine)
    ours = chunk_values(73)
    mine.after_read = lambda: other.delete(key)
    rewrite_sync(mine, key, fmt, {3: S.encode(ours)})  # chunk (1, 1)
    assert [c[0] for c in mine.calls] == ["read_all", "replace", "replace"], mine.calls
    assert mine.calls[2][1] is ABSENT
    exp = np.zeros(S.shape, S.dtype)
    exp[S.chunk_region((1, 1))] = ours
    np.testing.assert_array_equal(zarr.open_array(uploaded.zarr_store(), path="s", mode="r")[...], exp)


def test_two_writers_folding_disjoint_chunks_of_one_shard_at_once_lose_nothing(uploaded, storages):
    """Two storages (two hosts) fold their own chunks of the same shard round after round,
    started together: every round, the shard ends up with both writers' latest chunks."""
    mine, other = storages
    key, fmt = shard_of_s(mine)
    barrier = threading.Barrier(2)
    exp = zarr.open_array(uploaded.zarr_store(), path="s", mode="r")[...]

    def writer(storage, positions, seed):
        for round_ in range(8):
            barrier.wait(timeout=30)
            rewrite_sync(storage, key, fmt, {p: S.encode(chunk_values(seed + 10 * round_ + p)) for p in positions})

    threads = [threading.Thread(target=writer, args=(mine, (0, 3), 100)),
               threading.Thread(target=writer, args=(other, (1, 2), 500))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for idx, p, seed in (((0, 0), 0, 100), ((1, 1), 3, 100), ((0, 1), 1, 500), ((1, 0), 2, 500)):
        exp[S.chunk_region(idx)] = chunk_values(seed + 70 + p)
    np.testing.assert_array_equal(zarr.open_array(uploaded.zarr_store(), path="s", mode="r")[...], exp)
