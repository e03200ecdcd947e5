"""The state directory (shardfs/state.py): the write journal lives outside the source.

A mount of SRC journals into ``$XDG_STATE_HOME/shardfs/<id>/journal`` (the suite sets
XDG_STATE_HOME to a temporary directory, see conftest) or into ``-o journal_dir=DIR``;
the next mount of SRC replays it; a journal an earlier version left in ``SRC/.shardfs``
is replayed and removed. After a write session the source holds only Zarr data.
"""

from __future__ import annotations

import os
import signal
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import STATE_HOME, lazy_unmount, read_zarr2
from shardfs import state
from shardfs.journal import Change, Journal
from sources import Spec, assert_source_equals, build, journal_entries, journal_path, leftovers
from writers import umount

S = Spec("s", (8, 10), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
         index_location="end", index_crc=True, initial=((slice(0, 8), slice(0, 5)),),
         write=(slice(0, 4), slice(0, 5)))


# --------------------------------------------------------------------------- the key


def test_state_dir_is_readable_and_unique_per_source(tmp_path, monkeypatch):
    a, b = tmp_path / "a" / "raw data", tmp_path / "b" / "raw data"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    (tmp_path / "link").symlink_to(a)
    ida, idb = state.source_id(str(a)), state.source_id(str(b))
    assert ida.startswith("raw_data-") and len(ida) == len("raw_data-") + 12, ida
    assert idb.startswith("raw_data-") and ida != idb
    assert state.source_id(str(tmp_path / "link")) == ida, "a symlink to the source is the same source"
    assert state.source_id(f"{a}/") == ida
    assert state.source_id("s3://bucket/pre/fix/") == state.source_id("s3://bucket/pre/fix")
    assert state.source_id("s3://bucket/pre/fix").startswith("fix-")
    assert state.source_id("s3://bucket").startswith("bucket-")
    assert state.state_dir(str(a)) == os.path.join(STATE_HOME, "shardfs", ida)
    monkeypatch.setenv("XDG_STATE_HOME", "relative/dir")  # ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state.journal_dir(str(a)) == str(tmp_path / "home" / ".local/state/shardfs" / ida / "journal")
    monkeypatch.delenv("XDG_STATE_HOME")
    assert state.log_file(str(a)) == str(tmp_path / "home" / ".local/state/shardfs" / ida / "log")
    assert state.journal_dir(str(a), "j") == os.path.abspath("j")


# --------------------------------------------------------------------------- through the mount


def kill_with_pending_writes(mount, src: Path, exp: np.ndarray, *extra: str) -> None:
    """Mount, commit two chunks, SIGKILL the daemon before it folds them."""
    mnt = mount(src, *extra)
    m = mount.info(mnt)
    for k, idx in enumerate([(0, 0), (1, 1)]):
        block = S.values(S.chunk, 50 + k)
        (mnt / "s" / S.chunk_name(idx)).write_bytes(S.encode(block))
        exp[S.chunk_region(idx)] = block
    os.kill(m.pid, signal.SIGKILL)
    m.proc.wait(timeout=10)
    lazy_unmount(mnt)


def source_files(src: Path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs)


def test_journal_is_in_the_state_dir_and_replayed_by_the_next_mount(tmp_path, mount):
    src = tmp_path / "src"
    exp = build(src, [S])["s"]
    files = source_files(src)
    kill_with_pending_writes(mount, src, exp)
    entries = journal_entries(src)
    assert len(entries) == 1 and entries[0].endswith(".seg"), entries
    assert journal_path(src).parent == Path(STATE_HOME) / "shardfs" / state.source_id(str(src))
    assert source_files(src) == files, "the journal or anything else was written into the source"
    assert not (src / ".shardfs").exists()

    mnt = mount(src)
    assert journal_entries(src) == [], "journal not replayed before the mount went live"
    np.testing.assert_array_equal(read_zarr2(mnt / "s"), exp)
    assert "replayed 2 journalled chunk changes" in mount.info(mnt).log_text()
    umount(mount, mnt)
    assert_source_equals(src, "s", exp)
    assert leftovers(src) == []


def test_after_a_write_session_zarr3_lists_the_source_without_warnings(tmp_path, mount):
    import zarr

    src = tmp_path / "src"
    exp = build(src, [S])["s"]
    mnt = mount(src)
    block = S.values(S.chunk, 7)
    (mnt / "s" / "1.0").write_bytes(S.encode(block))
    exp[S.chunk_region((1, 0))] = block
    umount(mount, mnt)
    assert sorted(os.listdir(src)) == ["s", "zarr.json"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        group = zarr.open_group(str(src), mode="r")
        members = sorted(name for name, _ in group.members(max_depth=None))
        data = group["s"][...]
    assert [str(w.message) for w in caught] == []
    assert members == ["s"]
    np.testing.assert_array_equal(data, exp)


def test_journal_dir_option_puts_the_journal_there(tmp_path, mount):
    src, jdir = tmp_path / "src", tmp_path / "elsewhere" / "j"
    exp = build(src, [S])["s"]
    kill_with_pending_writes(mount, src, exp, "-o", f"journal_dir={jdir}")
    assert len(os.listdir(jdir)) == 1 and os.listdir(jdir)[0].endswith(".seg")
    assert journal_entries(src) == [], "the default journal directory was used despite -o journal_dir"
    assert not (src / ".shardfs").exists()
    mnt = mount(src, "-o", f"journal_dir={jdir}")
    assert os.listdir(jdir) == [], "journal_dir not replayed before the mount went live"
    umount(mount, mnt)
    assert_source_equals(src, "s", exp)


@pytest.mark.parametrize("other_file", [False, True], ids=["only-journal", "with-other-file"])
def test_a_journal_left_in_the_source_is_replayed_and_removed(tmp_path, mount, other_file):
    """An earlier version's ``SRC/.shardfs/journal`` is replayed before the state-dir journal
    (same chunk in both: the newer, state-dir value wins), then removed with ``SRC/.shardfs``
    unless something else is in it."""
    src = tmp_path / "src"
    exp = build(src, [S])["s"]
    old, new, only_old = S.values(S.chunk, 1), S.values(S.chunk, 2), S.values(S.chunk, 3)
    legacy = Journal(str(src / ".shardfs" / "journal"))
    legacy.append(Change("s", (0, 0), 0, S.encode(old)))  # chunk (0, 0): position 0 in the shard
    legacy.append(Change("s", (0, 0), 3, S.encode(only_old)))  # chunk (1, 1)
    Journal(str(journal_path(src))).append(Change("s", (0, 0), 0, S.encode(new)))
    if other_file:
        (src / ".shardfs" / "notes").write_text("mine")
    exp[S.chunk_region((0, 0))] = new
    exp[S.chunk_region((1, 1))] = only_old

    mnt = mount(src)
    log = mount.info(mnt).log_text()
    assert "replayed 3 journalled chunk changes" in log, log[-2000:]
    assert f"{src}/.shardfs/journal replayed and removed" in log, log[-2000:]
    assert journal_entries(src) == []
    assert not (src / ".shardfs" / "journal").exists()
    if other_file:
        assert os.listdir(src / ".shardfs") == ["notes"]
    else:
        assert not (src / ".shardfs").exists()
    np.testing.assert_array_equal(read_zarr2(mnt / "s"), exp)
    umount(mount, mnt)
    assert_source_equals(src, "s", exp)
