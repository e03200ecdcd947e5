"""The registry of source kinds (``shardfs.storage.kinds``): what each scheme is, which ``-o``
options each kind takes, and that a new kind is one registration. No mount, no server: the
kinds are told apart here and nowhere else (the mounted refusals are in test_s3_mount.py and
test_web.py)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest

from shardfs.config import StorageConfig
from shardfs.storage import kinds
from shardfs.storage.kinds import KINDS, Kind, kind_of, named, register
from shardfs.storage.listings import Listings
from shardfs.storage.source import Source


@pytest.mark.parametrize("src,name", [
    ("/data/x", "directory"), ("relative/dir", "directory"), ("s3://b/p", "s3"), ("S3A://b", "s3"),
    ("gs://b/p", "gcs"), ("az://c/p", "azure"), ("abfss://c/p", "azure"), ("http://h/p", "web"),
    ("https://h/p", "web"), ("ftp://h/p", "object store")])
def test_each_scheme_names_one_kind(src, name):
    kind = kind_of(src)
    assert kind.name == name and named(name) is kind
    assert kind.remote == (name != "directory") and kind.writable == (name != "web")


@pytest.mark.parametrize("src,given,message", [
    ("s3://b/p", ["follow_symlinks"], "-o follow_symlinks: applies to a local directory, not to an object-store URL"),
    ("gs://b/p", ["region"], "-o region: applies to s3:// URLs only"),
    ("az://c/p", ["profile", "endpoint"], "-o profile: applies to s3:// URLs only"),
    ("https://h/p", ["cache_size", "endpoint"],
     "-o endpoint: applies to an object store (s3://...), not to a web server"),
    ("https://h/p", ["region"], "-o region: applies to an object store (s3://...), not to a web server"),
    ("https://h/p", ["requester_pays"], "-o requester_pays: applies to s3:// URLs only"),
    ("/d", ["timeout", "region"], "-o region: applies to an object-store URL (s3://...), not to a local directory"),
    ("s3://b/p", ["follow_symlinks", "region"],
     "-o follow_symlinks: applies to a local directory, not to an object-store URL")])
def test_an_option_of_another_kind_is_refused_in_one_line(src, given, message):
    with pytest.raises(ValueError) as e:
        Source.parse(src, StorageConfig(), given, environ={})
    assert str(e.value) == message


@pytest.mark.parametrize("src,given", [("s3://b/p", ["region", "profile", "addressing", "cache_dir"]),
                                       ("gs://b", ["endpoint", "anonymous", "timeout"]),
                                       ("http://h", ["cache_size", "ca_bundle", "insecure", "timeout"]),
                                       ("/d", ["follow_symlinks", "ro"])])
def test_the_options_a_kind_takes_are_accepted(src, given):
    Source.parse(src, StorageConfig(), given, environ={})


def test_a_source_holds_the_storage_slice_as_given():
    cfg = StorageConfig(endpoint="http://127.0.0.1:1", timeout=7.0, insecure=True, addressing="path")
    source = Source.parse("gs://Bucket//p/", cfg, environ={})
    assert (source.name, source.kind.name, source.config, source.endpoint) == (
        "gs://Bucket/p", "gcs", cfg, "http://127.0.0.1:1")
    local = Source.parse("/d", StorageConfig(follow_symlinks=True, timeout=7.0))
    assert local.config == StorageConfig(follow_symlinks=True) and local.kind.name == "directory"


def test_s3_settings_come_from_the_environment_under_the_options():
    env = {"AWS_ENDPOINT_URL": "http://e:1", "AWS_REGION": "r1", "AWS_SKIP_SIGNATURE": "true",
           "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
    source = Source.parse("s3://b/p", StorageConfig(region="r2"), ["region"], environ=env)
    assert (source.endpoint, source.config.region, source.config.anonymous) == ("http://e:1", "r2", True)
    other = Source.parse("gs://b/p", StorageConfig(), environ=env)  # not the AWS configuration
    assert (other.endpoint, other.config.region, other.config.anonymous) == (None, None, False)


def test_a_new_kind_is_one_registration():
    opened: list[Any] = []

    @contextlib.contextmanager
    def memory(source: Source, version_ttl: float, listings: Listings, alone: bool,
               versions_fd: int | None) -> Iterator[Any]:
        opened.append((source.name, version_ttl, listings.ttl, alone, versions_fd))
        yield "a storage"

    kind = register(Kind("memory", ("mem",), frozenset({"timeout"}), memory, writable=False))
    try:
        assert kind_of("mem://x/y") is kind and named("memory") is kind
        source = Source.parse("MEM://x//y", StorageConfig(timeout=3.0), ["timeout"], environ={})
        with source.opened(2.0, Listings(1.0)) as storage:
            assert storage == "a storage"
        with source.opened(2.0, Listings(1.0), alone=False, versions_fd=7):
            pass
        assert opened == [("mem://x/y", 2.0, 1.0, True, None), ("mem://x/y", 2.0, 1.0, False, 7)]
        assert source.config.timeout == 3.0
        with pytest.raises(ValueError, match="-o endpoint: applies to an object store"):
            Source.parse("mem://x", StorageConfig(), ["endpoint"], environ={})
        with pytest.raises(ValueError, match="registered already"):
            register(Kind("other", ("mem",), frozenset(), memory))
    finally:
        KINDS.remove(kind)
    assert kind_of("mem://x") is kinds.OTHER


def test_a_web_source_is_its_own_kind_that_shares_the_object_request_path_and_refuses_writes():
    """``WebStorage`` is no ``ObjectStorage`` (nothing of S3's writes, listings or check is
    inherited and overridden): both hold an ``ObjectRequests`` (the obstore request path) and
    share only the read half of ``Storage`` answered by it; every change is EROFS. No request
    is made (opening a web source contacts no server)."""
    import errno

    from shardfs.storage.objects import ObjectStorage
    from shardfs.storage.requests import ObjectRequests, OverRequests
    from shardfs.storage.web import WebStorage

    assert not issubclass(WebStorage, ObjectStorage) and not issubclass(ObjectStorage, WebStorage)
    st = WebStorage("http://127.0.0.1:9/data.zarr/")
    try:
        assert isinstance(st, OverRequests) and isinstance(st.requests, ObjectRequests)
        assert st.url == "http://127.0.0.1:9/data.zarr" and st.read_path == "objects" and st.loop is st.requests.loop
        assert st.stats is st.requests.stats and st.describe("a/zarr.json") == "http://127.0.0.1:9/data.zarr/a/zarr.json"
        for change in (lambda: st.replace("k", [b"x"]), lambda: st.delete("k"), lambda: st.move("a", "b"),
                       lambda: st.check_write("k")):
            with pytest.raises(OSError) as e:
                change()
            assert e.value.errno == errno.EROFS
    finally:
        st.close()


@pytest.mark.parametrize("src,modules", [
    ("/d", ()), ("s3://b/p", ("shardfs.storage.objects", "shardfs.storage.awscredentials")),
    ("gs://b/p", ("shardfs.storage.objects",)), ("az://c/p", ("shardfs.storage.objects",)),
    ("https://h/p", ("shardfs.storage.web",)), ("ftp://h/p", ("shardfs.storage.objects",))])
def test_a_kind_names_what_its_workers_import_ahead(src, modules):
    """What a zygote imports before it forks a worker (``run.preload``) is the kind's own
    ``preload`` (its ``Storage`` module; ``s3://``: botocore's credential chain too, without
    boto3), imported in a fresh interpreter by ``Kind.imports``; nothing above ``storage/`` tells
    the kinds apart by name."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    assert kind_of(src).preload == modules
    probe = (f"import sys; from shardfs.storage.kinds import kind_of; before = set(sys.modules); "
             f"kind_of({src!r}).imports(); print(sorted(m for m in set(sys.modules) - before "
             f"if m.startswith('shardfs.storage.') or m in ('botocore.credentials', 'boto3')))")
    # -P: the shardfs on PYTHONPATH (scripts/mutants' copy), not the working directory's
    r = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    imported = set(eval(r.stdout))
    assert set(modules) <= imported
    assert imported & {"botocore.credentials", "boto3"} == ({"botocore.credentials"} if src.startswith("s3") else set())
    package = Path(kinds.__file__).parent.parent
    by_name = [f"{p.relative_to(package)}:{i}" for p in sorted(package.rglob("*.py")) if p.parent.name != "storage"
               for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"kind\.name\s*[!=]=", line)]
    assert by_name == []
