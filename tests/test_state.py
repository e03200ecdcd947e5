"""The state directory (shardfs/app/state.py): the write journal lives outside the source.

A mount of SRC journals into a directory of its own under ``$XDG_STATE_HOME/shardfs/<id>/journal``
(the suite sets XDG_STATE_HOME to a temporary directory, see conftest) or under
``-o journal_dir=DIR``; the next mount of SRC replays what a killed daemon left, never the
journal of a live one; a journal an earlier version left in ``SRC/.shardfs`` is replayed and
removed. After a write session the source holds only Zarr data.
"""

from __future__ import annotations

import os
import signal
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import STATE_HOME, lazy_unmount, read_zarr2, serving_pids
from inproc import InProcess
from shardfs.app import state
from shardfs.writes.journal import DAEMON_DIR, Change, Journal, segments_under
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
    assert DAEMON_DIR.fullmatch(entries[0].split("/")[0]), entries
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
    assert os.listdir(journal_path(src)) == [], "the daemon's journal directory outlived a clean umount"


def test_after_a_write_session_zarr3_lists_the_source_without_warnings(tmp_path):
    """In-process (``tests/inproc.py``: closing the tree folds, as an unmount does): the journal
    and the spill files live in the state directory, never in the source."""
    import zarr

    src = tmp_path / "src"
    exp = build(src, [S])["s"]
    with InProcess(src, read_only=False) as fs:
        block = S.values(S.chunk, 7)
        (fs / "s" / "1.0").write_bytes(S.encode(block))
        exp[S.chunk_region((1, 0))] = block
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
    left = segments_under(str(jdir))
    assert len(left) == 1 and left[0].endswith(".seg"), left
    assert journal_entries(src) == [], "the default journal directory was used despite -o journal_dir"
    assert not (src / ".shardfs").exists()
    mnt = mount(src, "-o", f"journal_dir={jdir}")
    assert segments_under(str(jdir)) == [], "journal_dir not replayed before the mount went live"
    umount(mount, mnt)
    assert_source_equals(src, "s", exp)
    assert os.listdir(jdir) == []


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
    Journal(str(journal_path(src) / f"{1:020d}-1")).append(Change("s", (0, 0), 0, S.encode(new)))
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


def test_a_second_mount_of_the_source_leaves_the_first_ones_journal_alone(tmp_path, mount):
    """Two writable mounts of one source: each journals in its own locked directory; the second
    replays only what a killed daemon left, and the first one's writes reach the shards."""
    src = tmp_path / "src"
    exp = build(src, [S])["s"]
    kill_with_pending_writes(mount, src, exp)  # leaves one orphan journal
    [orphan] = os.listdir(journal_path(src))
    first = mount(src)
    assert "replayed 2 journalled chunk changes" in mount.info(first).log_text()
    [first_dir] = os.listdir(journal_path(src))
    assert first_dir != orphan and first_dir.rsplit("-", 1)[1] in map(str, serving_pids(first))  # (the owner's)
    second = mount(src)
    assert "replayed" not in mount.info(second).log_text()
    dirs = sorted(os.listdir(journal_path(src)))
    assert len(dirs) == 2 and first_dir in dirs, dirs
    a = S.values(S.chunk, 70)
    (first / "s" / "0.1").write_bytes(S.encode(a))
    exp[S.chunk_region((0, 1))] = a
    umount(mount, second)
    umount(mount, first)
    assert_source_equals(src, "s", exp)
    assert os.listdir(journal_path(src)) == []


def test_claim_hands_over_only_unlocked_journals(tmp_path):
    from shardfs.writes import journal

    root = tmp_path / "state" / "j"
    live = journal.claim(str(root))
    assert live.orphans == [] and DAEMON_DIR.fullmatch(os.path.basename(live.directory))
    assert stat_mode(root) == stat_mode(tmp_path / "state") == 0o700
    dead = root / f"{5:020d}-999999"
    dead.mkdir()
    other = journal.claim(str(root))
    assert other.orphans == [str(dead)], "a live daemon's journal was handed over, or a dead one not"
    other.drop_orphans()
    assert sorted(os.listdir(root)) == sorted(os.path.basename(c.directory) for c in (live, other))
    other.release()
    live.release()
    assert os.listdir(root) == []


def stat_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777


def test_mount_refuses_a_journal_root_with_foreign_files(tmp_path):
    from conftest import run_shardfs

    src = tmp_path / "src"
    build(src, [S])
    journal_path(src).mkdir(parents=True)
    (journal_path(src) / "junk").write_text("?")
    mnt = tmp_path / "mnt"
    try:
        r = run_shardfs("mount", str(src), str(mnt))
    finally:
        lazy_unmount(mnt)
    assert (r.returncode, r.stderr) == (1, f"shardfs: error: {src}: cannot replay the write journal: "
                                           f"{journal_path(src)}: not journal directories: junk\n")
    assert os.listdir(journal_path(src)) == ["junk"]


def test_an_uncreatable_journal_is_one_clear_line(tmp_path):
    from conftest import run_shardfs

    src = tmp_path / "src"
    build(src, [S])
    (tmp_path / "file").write_text("")
    mnt = tmp_path / "mnt"
    try:
        r = run_shardfs("mount", str(src), str(mnt), "-o", f"journal_dir={tmp_path}/file/j")
    finally:
        lazy_unmount(mnt)
    assert (r.returncode, r.stderr) == (1, f"shardfs: error: {tmp_path}/file/j: cannot create the write "
                                           "journal: Not a directory (-o journal_dir=DIR puts it elsewhere)\n")
