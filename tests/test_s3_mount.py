"""``shardfs mount s3://BUCKET[/PREFIX] MNT`` against a real S3 server (SeaweedFS, tests/s3server.py).

Mount-time checks: bad credentials, a missing bucket or prefix, an unreachable endpoint and
options meant for the other kind of source fail with one line on stderr, a non-zero status
and nothing mounted, in the background form and with ``-f``. The state directory of a URL
is keyed on the normalized URL and the endpoint it is reached through.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import obstore
import pytest
import zarr

from azserver import CONTAINER as AZ_CONTAINER
from testkit.delayproxy import DelayProxy
from testkit.seaweed import SeaweedS3, upload
from conftest import daemon_pids, lazy_unmount, read_zarr2, run_shardfs, wait_for, zarr2
from inproc import InProcess
from shardfs.app import state
from shardfs.writes.journal import segments_under
from shardfs.app.mounts import mounts
from shardfs.shards.shard import rewrite_sync
from shardfs.storage import ABSENT
from shardfs.storage.objects import ObjectStorage
from sources import Spec, build
from writers import umount, write_zarr2

pytestmark = pytest.mark.long(62)

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
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; a public bucket: -o anonymous)\n")
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
    obstore.put(uploaded.store(), "v2/.zgroup", b'{"zarr_format": 2}')
    want = f"shardfs: error: {uploaded.url}/v2: Zarr v2 data, not Zarr v3\n"
    assert mount_fails(f"{uploaded.url}/v2", mnt_dir, uploaded.env) == [want, want]


def test_a_failed_mount_exits_1_every_time(uploaded, mnt_dir):
    """The object store's client threads must not abort the process at exit (they did in
    about one run in five, with status 134, after printing the right line). The source is
    checked while the daemon starts: the daemon and its zygote end with the check's failure."""
    url = f"{uploaded.url}/s/c"
    codes = [run_shardfs("mount", url, str(mnt_dir), env={**os.environ, **uploaded.env}, timeout=60).returncode
             for _ in range(15)]
    assert codes == [1] * 15
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            if os.fsencode(mnt_dir) in f.read().split(b"\0"):
                left.append(pid)
    assert left == [] and not os.path.ismount(mnt_dir)


@pytest.mark.parametrize("how", ["option", "env"])
def test_unreachable_endpoint_is_one_line(uploaded, mnt_dir, how):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    env = {**uploaded.env, "AWS_ENDPOINT_URL": endpoint} if how == "env" else uploaded.env
    opts = ("-o", f"endpoint={endpoint}") if how == "option" else ()
    for said in mount_fails(uploaded.url, mnt_dir, env, *opts):
        assert said.startswith(f"shardfs: error: {uploaded.url}: endpoint unreachable ("), said


@pytest.mark.parametrize("how", ["option", "AWS_SKIP_SIGNATURE"])
def test_anonymous_requests_are_refused_by_a_private_bucket(uploaded, mnt_dir, how):
    want = (f"shardfs: error: {uploaded.url}: access denied to unsigned requests (-o anonymous): "
            "not a public bucket; give credentials\n")
    env = {**uploaded.env, "AWS_SKIP_SIGNATURE": "true"} if how != "option" else uploaded.env
    opts = ("-o", "ro,anonymous") if how == "option" else ("-o", "ro")
    assert mount_fails(uploaded.url, mnt_dir, env, *opts) == [want, want]


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
    ("local", "timeout=5", "-o timeout: applies to an object-store URL (s3://...), not to a local directory"),
    ("url", "timeout=x", "-o timeout=x: not a positive number of seconds"),
    ("url", "timeout=0", "-o timeout=0: not a positive number of seconds"),
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

    from shardfs.app import options

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert options.source(url + "/", options.parse([])).endpoint == "http://127.0.0.1:1"
    assert options.source(url, options.parse(["endpoint=http://127.0.0.1:2"])).endpoint == "http://127.0.0.1:2"
    assert options.source("gs://bucket/p", options.parse([])).endpoint is None, "AWS_ENDPOINT_URL is for s3:// only"


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
    from shardfs.tree.metadata import parse
    from shardfs.format.v2 import describe_array
    from shardfs.tree.commits import shard_target

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


# --------------------------------------------------------------------------- writes through an s3:// mount

W = Spec("w", (16, 20), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
         index_location="end", index_crc=True, initial=((slice(0, 8), slice(0, 10)),),
         write=(slice(0, 16), slice(0, 20)))  # 2 x 2 shards of 2 x 2 chunks; shard (0, 0) stored


@pytest.fixture
def bucket_w(tmp_path, s3_upload):
    """``W`` uploaded to a fresh prefix: ``(S3Source, expected array)``."""
    exp = build(tmp_path / "src", [W])["w"]
    return s3_upload(tmp_path / "src"), exp


def native(up, name: str) -> np.ndarray:
    """zarr-python 3 reading ``name`` from the bucket with its own ``ObjectStore``."""
    return np.asarray(zarr.open_array(up.zarr_store(), path=name, mode="r")[...])


def journal_of(up) -> Path:
    return Path(state.journal_dir(up.url, endpoint=up.server.endpoint))


def only_zarr_keys(up) -> None:
    """The prefix holds ``zarr.json`` files and shards, nothing else (no temporaries)."""
    keys = up.keys()
    bad = [k for k in keys if not (k.endswith("zarr.json") or re.fullmatch(r"\w+/c/\d+/\d+", k))]
    assert bad == [], bad


def write_chunk(mnt: Path, spec: Spec, idx, seed: int, exp: np.ndarray) -> None:
    block = spec.values(spec.chunk, seed)
    (mnt / spec.name / spec.chunk_name(idx)).write_bytes(spec.encode(block))
    exp[spec.chunk_region(idx)] = block


def test_zarr2_write_through_an_s3_mount_reaches_the_bucket(bucket_w, mount, tmp_path):
    """zarr 2.18 writes the whole array through the mount (shard (0, 0) rewritten, three new
    shards created); after ``shardfs umount`` zarr-python 3 reads it natively from the bucket."""
    up, exp = bucket_w
    mnt = mount(up.url, env=up.env)
    values = W.values(W.shape, 9)
    write_zarr2(mnt / "w", (slice(0, 16), slice(0, 20)), values, tmp_path)
    np.testing.assert_array_equal(read_zarr2(mnt / "w"), values)
    umount(mount, mnt)
    np.testing.assert_array_equal(native(up, "w"), values)
    assert [k for k in up.keys() if "/c/" in k] == [f"w/c/{i}/{j}" for i in range(2) for j in range(2)]
    only_zarr_keys(up)
    assert segments_under(str(journal_of(up))) == []


def test_umount_folds_pending_chunks_into_the_bucket(bucket_w, mount):
    """Chunks committed just before ``shardfs umount`` are still only in the journal; the
    umount folds them into the bucket before the daemon ends."""
    up, exp = bucket_w
    mnt = mount(up.url, env=up.env)
    before = up.store()
    shard = bytes(obstore.get(before, "w/c/0/0").bytes())
    write_chunk(mnt, W, (0, 0), 11, exp)
    write_chunk(mnt, W, (3, 3), 12, exp)  # a new shard (1, 1)
    assert segments_under(str(journal_of(up))) != [], "folded before the umount: nothing left to test"
    assert bytes(obstore.get(before, "w/c/0/0").bytes()) == shard
    umount(mount, mnt)
    np.testing.assert_array_equal(native(up, "w"), exp)
    assert segments_under(str(journal_of(up))) == []


def test_zattrs_and_a_new_array_write_zarr_json_in_the_bucket(bucket_w, mount, tmp_path):
    up, exp = bucket_w
    mnt = mount(up.url, env=up.env)
    (mnt / "w" / ".zattrs").write_text(json.dumps({"units": "mm"}))
    values = np.arange(60, dtype="<u2").reshape(6, 10)
    zarr2("""
        g = zarr.open_group(path, mode='r+')
        a = g.create_dataset('made', shape=(6, 10), chunks=(3, 5), dtype='<u2')
        a[...] = np.arange(60, dtype='<u2').reshape(6, 10)
        result = np.zeros(0)
        """, path=str(mnt))
    umount(mount, mnt)
    group = zarr.open_group(up.zarr_store(), mode="r")
    assert dict(group["w"].attrs) == {"units": "mm"}
    np.testing.assert_array_equal(group["made"][...], values)
    np.testing.assert_array_equal(group["w"][...], exp)


def test_a_tree_over_a_bucket_folds_its_chunk_writes_into_it_in_process(bucket_w, monkeypatch):
    """The daemon's part of ``umount_folds_pending_chunks_into_the_bucket``, in-process
    (``tests/inproc.py`` over the ``s3://`` URL): chunks written into a stored shard and into a
    new one read back at once and are in the bucket once the tree is closed (as an unmount
    folds), with nothing left in the journal."""
    up, exp = bucket_w
    for name, value in up.env.items():
        monkeypatch.setenv(name, value)
    with InProcess(up.url, read_only=False) as fs:
        write_chunk(fs, W, (0, 0), 11, exp)
        write_chunk(fs, W, (3, 3), 12, exp)  # a new shard (1, 1)
        assert (fs / "w" / W.chunk_name((3, 3))).read_bytes() == W.encode(W.values(W.chunk, 12))
    np.testing.assert_array_equal(native(up, "w"), exp)
    assert segments_under(str(journal_of(up))) == []


def test_attributes_and_a_new_array_written_in_a_tree_over_a_bucket_in_process(bucket_w, monkeypatch):
    """The daemon's part of ``zattrs_and_a_new_array_write_zarr_json_in_the_bucket``, in-process:
    a ``.zattrs`` written and a new array made from a ``.zarray`` and its chunk files become
    ``zarr.json`` documents and shards in the bucket (the mounted test makes them with zarr 2.18)."""
    up, exp = bucket_w
    for name, value in up.env.items():
        monkeypatch.setenv(name, value)
    values = np.arange(60, dtype="<u2").reshape(6, 10)
    with InProcess(up.url, read_only=False) as fs:
        (fs / "w" / ".zattrs").write_text(json.dumps({"units": "mm"}))
        (fs / "made").mkdir()
        (fs / "made" / ".zarray").write_text(json.dumps({
            "zarr_format": 2, "shape": [6, 10], "chunks": [3, 5], "dtype": "<u2", "compressor": None,
            "fill_value": 0, "order": "C", "filters": None}))
        for i in range(2):
            for j in range(2):
                (fs / "made" / f"{i}.{j}").write_bytes(values[3 * i:3 * i + 3, 5 * j:5 * j + 5].tobytes())
    group = zarr.open_group(up.zarr_store(), mode="r")
    assert dict(group["w"].attrs) == {"units": "mm"}
    np.testing.assert_array_equal(group["made"][...], values)
    np.testing.assert_array_equal(group["w"][...], exp)


def test_two_daemons_writing_disjoint_chunks_of_the_same_shards_lose_nothing(bucket_w, mount, tmp_path):
    """Two mounts of one URL (two hosts: separate journals) write interleaved chunks of every
    shard at once, three rounds, each folded concurrently; every chunk reaches the bucket."""
    up, exp = bucket_w
    mnts = [mount(up.url, "-o", f"journal_dir={tmp_path / f'j{k}'}", env=up.env) for k in range(2)]
    cells = [(i, j) for i in range(4) for j in range(4)]
    mine = [[c for c in cells if (c[0] + c[1]) % 2 == k] for k in range(2)]  # each shard: 2 chunks each
    for round_ in range(3):
        threads = [threading.Thread(target=lambda k=k, round_=round_: [
                       write_chunk(mnts[k], W, c, 100 * round_ + 10 * k + n, exp)
                                                        for n, c in enumerate(mine[k])]) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        wait_for(lambda: all(segments_under(str(tmp_path / f"j{k}")) == [] for k in range(2)), 60,
                 "both daemons folded their chunks")
    np.testing.assert_array_equal(native(up, "w"), exp)
    for mnt in mnts:
        umount(mount, mnt)
    np.testing.assert_array_equal(native(up, "w"), exp)


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.1, 0.3])
def test_sigkill_during_folds_then_a_remount_of_the_url_replays_everything(bucket_w, mount, delay):
    """Complete shards fold at once; the daemon is SIGKILLed ``delay`` seconds after the last
    commit (before, during or after those folds; shard (1, 1), left one chunk short, waits
    for the 1 s idle fold, so something is pending). The next mount of the same URL replays
    the journal: every acknowledged chunk is in the bucket."""
    up, exp = bucket_w
    mnt = mount(up.url, env=up.env)
    m = mount.info(mnt)
    for n, idx in enumerate((i, j) for i in range(4) for j in range(4) if (i, j) != (3, 3)):
        write_chunk(mnt, W, idx, 300 + n, exp)
    time.sleep(delay)
    os.kill(m.pid, signal.SIGKILL)
    m.proc.wait(timeout=10)
    lazy_unmount(mnt)
    again = mount(up.url + "/", env=up.env)  # the same URL, spelled differently
    if delay == 0.0:
        assert re.search(r"replayed [1-9]\d* journalled chunk changes", mount.info(again).log_text()), \
            "nothing was replayed"
    umount(mount, again)
    np.testing.assert_array_equal(native(up, "w"), exp)
    assert segments_under(str(journal_of(up))) == []
    only_zarr_keys(up)


def test_umount_names_the_changes_it_could_not_fold_into_the_bucket(bucket_w, mount):
    """A shard turned to garbage in the bucket after a commit cannot be folded: ``shardfs
    umount`` (which finds the daemon's journal from its URL and endpoint) says what is kept and
    exits 1; the bucket's garbage is left alone."""
    up, exp = bucket_w
    mnt = mount(up.url, env=up.env)
    write_chunk(mnt, W, (0, 0), 21, exp)
    obstore.put(up.store(), "w/c/0/0", b"garbage")
    r = run_shardfs("umount", str(mnt), env={**os.environ, **up.env}, timeout=120)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("shardfs: 1 change to w/c/0/0 kept in the journal: "), lines
    assert lines[1:] == [f"shardfs: they are folded by the next mount of {up.url}"], lines
    assert bytes(obstore.get(up.store(), "w/c/0/0").bytes()) == b"garbage"
    mount.info(mnt).proc.wait(timeout=30)


def test_a_fold_is_one_conditional_put_per_shard(bucket_w, mount):
    """Seen on the wire (a recording proxy in front of the server): the umount's folds are one
    PUT per shard, ``If-Match`` the ETag of the shard read for an existing shard and
    ``If-None-Match: *`` for a new one; a ``.zattrs`` write is one PUT of ``zarr.json``,
    ``If-Match`` its ETag, and a new array's ``zarr.json`` one PUT, ``If-None-Match: *``."""
    up, exp = bucket_w
    etags = {k: obstore.head(up.store(), k)["e_tag"] for k in ("w/c/0/0", "w/zarr.json")}
    with DelayProxy(("127.0.0.1", up.server.ports["s3.port"]), delay=0.0, record=True) as proxy:
        mnt = mount(up.url, "-o", f"endpoint=http://127.0.0.1:{proxy.port}", env=up.env)
        write_chunk(mnt, W, (1, 1), 31, exp)  # shard (0, 0), stored
        write_chunk(mnt, W, (2, 3), 32, exp)  # shard (1, 1), new
        (mnt / "w" / ".zattrs").write_text(json.dumps({"k": 1}))
        (mnt / "made").mkdir()
        (mnt / "made" / ".zarray").write_text(json.dumps(
            {"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<i2", "compressor": None,
             "fill_value": 0, "order": "C", "filters": None}))
        umount(mount, mnt)
        puts = [(r.path, r.headers.get("if-match"), r.headers.get("if-none-match"))
                for r in proxy.log if r.method == "PUT"]
    base = f"/{up.server.bucket}/{up.prefix}"
    assert sorted(puts) == [(f"{base}/made/zarr.json", None, "*"),
                            (f"{base}/w/c/0/0", etags["w/c/0/0"], None), (f"{base}/w/c/1/1", None, "*"),
                            (f"{base}/w/zarr.json", etags["w/zarr.json"], None)], puts
    assert zarr.open_array(up.zarr_store(), path="made", mode="r").shape == (4,)
    np.testing.assert_array_equal(native(up, "w"), exp)


def test_cache_dir_keeps_fetched_chunks_for_the_next_mount(bucket_w, mount, tmp_path, mnt_dir):
    """``-o cache_dir``: chunk bytes fetched by one mount are on disk; the next mount with the
    same directory reads every chunk without a ranged GET of chunk bytes (only shard indexes,
    suffix GETs, go to the server). A directory that is not a cache fails the mount in one line."""
    up, exp = bucket_w
    cache = tmp_path / "cache"
    mnt = mount(up.url, "-o", f"ro,cache_size=0,cache_dir={cache}", env=up.env)
    np.testing.assert_array_equal(read_zarr2(mnt / "w"), exp)
    umount(mount, mnt)
    assert (cache / "CACHEDIR.TAG").is_file() and len(list(cache.rglob("*.*.*.*"))) > 0
    with DelayProxy(("127.0.0.1", up.server.ports["s3.port"]), delay=0.0, record=True) as proxy:
        mnt = mount(up.url, "-o", f"ro,cache_size=0,cache_dir={cache},endpoint=http://127.0.0.1:{proxy.port}",
                    env=up.env)
        np.testing.assert_array_equal(read_zarr2(mnt / "w"), exp)
        umount(mount, mnt)
        shard_gets = [r.headers.get("range", "") for r in proxy.log if r.method == "GET" and "/c/" in r.path]
    assert shard_gets and all(g.startswith("bytes=-") for g in shard_gets), shard_gets
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine").write_text("x")
    r = run_shardfs("mount", up.url, str(mnt_dir), "-o", f"ro,cache_dir={foreign}", env={**os.environ, **up.env})
    assert (r.returncode, r.stderr) == (1, f"shardfs: error: -o cache_dir {foreign}: not empty and not a "
                                           "cache directory (no CACHEDIR.TAG)\n")
    assert not os.path.ismount(mnt_dir) and daemon_pids(mnt_dir) == []


# --------------------------------------------------------------------------- the mount.fuse3 form, df, az://


def test_bare_form_of_a_url_mounts_and_df_shows_the_url(bucket_w, mnt_dir):
    """``shardfs s3://... MNT -o ro,dev,suid`` (what mount.fuse3 runs): mounted, the mount
    table and ``df`` name the URL, statfs reports 1 EiB free in 1 MiB blocks, and without
    syslog the log is in the URL's state directory."""
    up, exp = bucket_w
    env = {**os.environ, **up.env}
    r = run_shardfs(up.url, str(mnt_dir), "-o", "ro,dev,suid", env=env)
    assert (r.returncode, r.stderr) == (0, "")  # where the log goes is said with --debug only
    assert mounts()[str(mnt_dir)] == up.url
    st = os.statvfs(mnt_dir)
    assert (st.f_frsize, st.f_blocks * st.f_frsize, st.f_bavail, st.f_namemax) == (1 << 20, 1 << 60, st.f_blocks, 255)
    np.testing.assert_array_equal(read_zarr2(mnt_dir / "w"), exp)
    assert run_shardfs("umount", str(mnt_dir), env=env).returncode == 0


@pytest.fixture
def az_source(tmp_path, azure, monkeypatch):
    """``W`` uploaded to a fresh prefix of the Azurite container: ``(url, env, expected)``."""
    for name, value in azure.env.items():
        monkeypatch.setenv(name, value)
    exp = build(tmp_path / "src", [W])["w"]
    url = f"az://{AZ_CONTAINER}/t-{uuid.uuid4().hex[:12]}"
    storage = ObjectStorage(url, endpoint=azure.endpoint)
    try:
        for path in sorted(p for p in (tmp_path / "src").rglob("*") if p.is_file()):
            storage.replace(path.relative_to(tmp_path / "src").as_posix(), [path.read_bytes()])
    finally:
        storage.close()
    return url, azure, exp


def test_az_url_mounts_reads_and_folds_writes_into_the_container(az_source, mount):
    """``az://CONTAINER/PREFIX`` against Azurite: zarr 2.18 reads the array through the mount,
    chunks written there (an existing shard and a new one) are folded into the container by
    ``shardfs umount``, and zarr-python 3 reads them natively."""
    from obstore.store import from_url
    from zarr.storage import ObjectStore

    url, azure, exp = az_source
    mnt = mount(url, "-o", f"endpoint={azure.endpoint}", env=azure.env)
    np.testing.assert_array_equal(read_zarr2(mnt / "w"), exp)
    write_chunk(mnt, W, (1, 1), 41, exp)
    write_chunk(mnt, W, (2, 3), 42, exp)
    umount(mount, mnt)
    store = from_url(url, config={"endpoint": azure.endpoint}, client_options={"allow_http": True})
    np.testing.assert_array_equal(zarr.open_array(ObjectStore(store, read_only=True), path="w", mode="r")[...], exp)


def test_az_url_with_a_missing_prefix_is_one_line(az_source, mnt_dir):
    url, azure, _ = az_source
    missing = f"az://{AZ_CONTAINER}/no-such-prefix"
    want = f"shardfs: error: {missing}: no such prefix (no object below it)\n"
    assert mount_fails(missing, mnt_dir, azure.env, "-o", f"endpoint={azure.endpoint}") == [want, want]


def test_a_foreground_mount_supervises_without_the_object_store_client(tmp_path, mount):
    """``shardfs mount -f s3://...`` checks the bucket in a child process, then supervises the
    mount: the process left holding it loaded no obstore (its check did: 37 MiB of memory against
    18 for the mount's life; the suite's mounts are all foreground ones)."""
    server = SeaweedS3(tmp_path / "weed").start()
    try:
        build(tmp_path / "src", [W])
        up = upload(server, tmp_path / "src")
        mnt = mount(up.url, env=up.env)
        assert "w" in os.listdir(mnt)
        doc = json.loads(run_shardfs("status", str(mnt), "--json", env={**os.environ, **up.env}).stdout)
        loaded = ["_obstore" in Path(f"/proc/{pid}/maps").read_text() for pid in (doc["pid"], doc["worker"]["pid"])]
        assert loaded == [False, True]  # (the supervisor, its worker)
    finally:
        server.stop()


def test_a_background_mount_checks_the_bucket_once_as_a_foreground_one(bucket_w, mount, tmp_path):
    """Seen on the wire: ``shardfs mount`` in the background (its parent checks the bucket, the
    daemon it starts does not) makes the requests that ``-f`` makes (its check in a child
    process, then the mount's own), not a second check."""
    up, _ = bucket_w
    seen = []
    for foreground in (True, False):
        with DelayProxy(("127.0.0.1", up.server.ports["s3.port"]), delay=0.0, record=True) as proxy:
            opts = f"ro,workers=1,endpoint=http://127.0.0.1:{proxy.port}"  # (N workers: each lists when it starts)
            if foreground:
                umount(mount, mount(up.url, "-o", opts, env=up.env))
            else:
                mnt = tmp_path / "bg"
                mnt.mkdir()
                try:
                    env = {**os.environ, **up.env}
                    assert run_shardfs("mount", "-o", opts, up.url, str(mnt), env=env).returncode == 0
                    assert run_shardfs("umount", str(mnt), env=env).returncode == 0
                finally:
                    lazy_unmount(mnt)
            seen.append(sorted((r.method, r.path) for r in proxy.log))
    assert seen[0] == seen[1] and len(seen[0]) > 2, seen


def test_umount_of_a_mount_whose_root_cannot_be_read_unmounts_it(tmp_path, mount):
    """The server gone, a ``stat`` of the mount's root fails (its metadata cannot be read again:
    attributes are not cached here), so ``os.path.ismount`` says False; ``shardfs umount`` still
    unmounts it (it said "not mounted" and left it, during the soak's S3 stalls), exit 0 with
    nothing pending."""
    server = SeaweedS3(tmp_path / "weed").start()
    try:
        build(tmp_path / "src", [W])
        up = upload(server, tmp_path / "src")
        mnt = mount(up.url, "-o", "attr_timeout=0,entry_timeout=0,timeout=2", env=up.env)
        assert sorted(os.listdir(mnt)) == [".zattrs", ".zgroup", ".zmetadata", "w"]
        server.kill()
        time.sleep(1.5)  # (the root's metadata is read again after a second)
        with pytest.raises(OSError) as e:
            os.stat(mnt)
        assert e.value.errno == errno.EIO and not os.path.ismount(mnt)
        r = run_shardfs("umount", str(mnt), env={**os.environ, **up.env}, timeout=120)
        assert (r.returncode, r.stderr) == (0, "")
        assert str(mnt) not in mounts()
    finally:
        server.stop()


def test_umount_with_the_server_down_keeps_the_changes_for_the_next_mount(tmp_path, mount):
    """The server dies with chunks pending: ``shardfs umount --timeout 5`` cannot fold them,
    names each shard kept in the journal and exits 1; once the server is back, the next
    mount of the URL folds them into the bucket."""
    server = SeaweedS3(tmp_path / "weed").start()
    try:
        exp = build(tmp_path / "src", [W])["w"]
        up = upload(server, tmp_path / "src")
        mnt = mount(up.url, env=up.env)
        write_chunk(mnt, W, (0, 0), 51, exp)
        write_chunk(mnt, W, (3, 3), 52, exp)
        server.kill()
        r = run_shardfs("umount", str(mnt), "--timeout", "5", env={**os.environ, **up.env}, timeout=120)
        assert r.returncode == 1, r.stderr
        for key in ("w/c/0/0", "w/c/1/1"):
            assert any(line.startswith(f"shardfs: 1 change to {key} kept in the journal: ")
                       for line in r.stderr.splitlines()), r.stderr
        assert r.stderr.endswith(f"shardfs: they are folded by the next mount of {up.url}\n"), r.stderr
        mount.info(mnt).proc.wait(timeout=30)
        server.start()
        again = mount(up.url, env=up.env)
        umount(mount, again)
        np.testing.assert_array_equal(native(up, "w"), exp)
        assert segments_under(str(journal_of(up))) == []
    finally:
        server.stop()
