"""The typed configuration (shardfs/config.py) built from the ``-o`` option table: each option
sets one field, each default is defined once. No mount: runs in milliseconds."""

from __future__ import annotations

import pytest

from shardfs.app import options
from shardfs.config import Config, KernelConfig, ReadConfig, StorageConfig, TreeConfig, WriteConfig, size_text
from shardfs.storage import kinds, source


def test_every_own_option_sets_a_config_field():
    """An option has a ``Config`` field, but ``rw`` (which clears ``ro``); the options that one
    kind of source takes alone are in the ``storage`` slice, or the object-store caches'."""
    for opt in options.OWN:
        if opt.field:
            options._get(Config(), opt.field.lstrip("!"))  # the field exists
        else:
            assert opt.name == "rw", opt.name
    for name in sorted(kinds.KIND_OPTIONS):
        assert options._BY_NAME[name].field in (f"storage.{name}", f"reads.{name}"), name


def test_no_option_given_is_the_default_config():
    assert options.config(options.parse([])) == Config()


def test_each_option_sets_its_field():
    parsed = options.parse(["ro,entry_timeout=2.5,attr_timeout=0,chunk_cache=1M,shard_size=0,journal_dir=/j",
                            "cache_size=2K,timeout=5,cache_dir=/c,debug,stats_interval=3,no_ome_translation,c_order"])
    assert options.config(parsed) == Config(
        read_only=True, debug=True, stats_interval=3.0,
        kernel=KernelConfig(entry_timeout=2.5, attr_timeout=0.0),
        reads=ReadConfig(chunk_cache=1 << 20, cache_size=2 << 10, cache_dir="/c"),
        tree=TreeConfig(ome=False, c_order=True),
        writes=WriteConfig(shard_size=1, journal_dir="/j"),  # a shard size is at least one byte
        storage=StorageConfig(timeout=5.0))


def test_the_source_takes_the_storage_slice(tmp_path):
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----")
    parsed = options.parse([f"endpoint=http://e:1,anonymous,timeout=5,insecure,ca_bundle={pem}"])
    assert options.config(parsed).storage == StorageConfig(endpoint="http://e:1", anonymous=True, timeout=5.0,
                                                           insecure=True, ca_bundle=str(pem))
    got = options.source("gs://b/p", parsed)
    assert got.config == options.config(parsed).storage  # the slice as it is, not copied field by field
    assert options.source(str(tmp_path), options.parse(["follow_symlinks"])).config.follow_symlinks is True
    assert options.source(str(tmp_path), options.parse([])).config.follow_symlinks is False


def test_ro_then_rw_is_writable():
    assert options.config(options.parse(["ro", "rw"])).read_only is False


@pytest.mark.parametrize("name, shown", [("entry_timeout", "10"), ("attr_timeout", "10"), ("chunk_cache", "64M"),
                                         ("shard_size", "64M"), ("cache_size", "96M"), ("timeout", "30"),
                                         ("journal_dir", None), ("cache_dir", None), ("stats_interval", None),
                                         ("ro", None), ("c_order", None)])
def test_the_default_shown_is_the_configs(name, shown):
    """``--help`` and doc/CONFIGURATION.md show the ``Config`` default (none for a flag or a
    default that depends on the source, which the help text says)."""
    opt = options._BY_NAME[name]
    assert opt.default == shown
    line = next(x for x in options.help_text().splitlines() if x.split()[:1] in ([name], [f"{name}={opt.value}"]))
    assert (f"(default {shown})" in line) == (shown is not None), line


def test_the_layers_defaults_are_the_configs():
    """The constants the layers use when built without a configuration are the ``Config``
    defaults, not values of their own."""
    from shardfs.format.create import DEFAULT_SHARD_BYTES
    from shardfs.reads.chunkcache import DEFAULT_BYTES
    from shardfs.reads.objects import DEFAULT_CACHE_BYTES
    from shardfs.storage.urls import DEFAULT_TIMEOUT

    config = Config()
    assert (DEFAULT_BYTES, DEFAULT_CACHE_BYTES) == (config.reads.chunk_cache, config.reads.cache_size)
    assert DEFAULT_SHARD_BYTES == config.writes.shard_size
    assert DEFAULT_TIMEOUT == source.Source("x").config.timeout == config.storage.timeout


def test_sizes_are_shown_as_parsed():
    assert [size_text(n) for n in (64 << 20, 5 << 30, 3 << 10, 1000, 0)] == ["64M", "5G", "3K", "1000", "0"]
