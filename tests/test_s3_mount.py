"""``shardfs mount s3://BUCKET[/PREFIX] MNT`` against a real S3 server (SeaweedFS, tests/s3server.py).

Mount-time checks: bad credentials, a missing bucket or prefix, an unreachable endpoint and
options meant for the other kind of source fail with one line on stderr, a non-zero status
and nothing mounted, in the background form and with ``-f``. The state directory of a URL
is keyed on the normalized URL and the endpoint it is reached through.
"""

from __future__ import annotations

import os
import socket

import pytest

from conftest import daemon_pids, run_shardfs
from shardfs import state
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
