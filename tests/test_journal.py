"""The write journal (shardfs/writes/journal.py): record format, segment lifecycle, recovery.

Property tests (hypothesis) check the record format against torn and damaged
tails; unit tests drive one ``Journal`` in a temporary directory; the last
tests SIGKILL a real daemon and check what the next mount replays or refuses.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import struct
import tempfile
from pathlib import Path

import crc32c
import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import budget, lazy_unmount, read_native, read_tensorstore, run_shardfs, wait_for
from shardfs.writes import journal as journal_mod
from shardfs.writes.journal import HEADER, Change, Journal, JournalError, decode_records, encode_record
from sources import Spec, assert_source_equals, build, journal_bytes, journal_entries, journal_path, leftovers
from writers import umount

SETTINGS = settings(max_examples=budget(150))

changes = st.builds(
    Change,
    array=st.text(max_size=12),
    shard=st.lists(st.integers(0, 2**31), max_size=4).map(tuple),
    pos=st.integers(0, 2**40),
    data=st.none() | st.binary(max_size=300),
)


def encode_all(items: list[Change]) -> tuple[bytes, list[int]]:
    """The records of ``items`` back to back, and the offset where each one ends."""
    records = [encode_record(c) for c in items]
    ends = np.cumsum([len(r) for r in records]).tolist()
    return b"".join(records), ends


# --------------------------------------------------------------------------- record format


@SETTINGS
@given(items=st.lists(changes, max_size=8))
def test_records_round_trip(items):
    buf, _ = encode_all(items)
    assert decode_records(buf) == (items, len(buf))


@SETTINGS
@given(items=st.lists(changes, min_size=1, max_size=6), data=st.data())
def test_a_cut_anywhere_keeps_exactly_the_complete_records_before_it(items, data):
    buf, ends = encode_all(items)
    cut = data.draw(st.integers(0, len(buf)), label="cut")
    complete = sum(end <= cut for end in ends)
    assert decode_records(buf[:cut]) == (items[:complete], ends[complete - 1] if complete else 0)


@SETTINGS
@given(items=st.lists(changes, min_size=1, max_size=6), data=st.data())
def test_a_damaged_byte_stops_decoding_at_its_record(items, data):
    buf, ends = encode_all(items)
    at = data.draw(st.integers(0, len(buf) - 1), label="offset")
    flip = data.draw(st.integers(1, 255), label="xor")
    damaged = bytearray(buf)
    damaged[at] ^= flip
    k = sum(end <= at for end in ends)  # the record holding the damaged byte
    assert decode_records(bytes(damaged)) == (items[:k], ends[k - 1] if k else 0)


def test_intact_record_with_unreadable_meta_is_an_error():
    meta = b"not json"
    record = HEADER.pack(journal_mod.MAGIC, len(meta), 0, crc32c.crc32c(meta)) + meta
    with pytest.raises(JournalError, match="unreadable meta"):
        decode_records(record)


# --------------------------------------------------------------------------- segment lifecycle


def change(k: int, size: int = 100) -> Change:
    return Change("a/b", (k % 3, 1), k, bytes([k % 256]) * size)


def segments(d: Path) -> list[str]:
    return sorted(os.listdir(d)) if d.is_dir() else []


def test_released_records_empty_the_directory(tmp_path):
    d = tmp_path / ".shardfs" / "journal"
    j = Journal(str(d))
    assert not d.exists(), "the directory is created by the first append, not before"
    records = [j.append(change(k)) for k in range(5)]
    assert segments(d) == [f"{0:020d}.seg"]
    j.release(records[:4])
    assert segments(d) == [f"{0:020d}.seg"], "a segment with a live record was deleted"
    j.release(records[4:])
    assert segments(d) == [], "the current segment was kept though no record in it is live"
    j.append(change(9))
    assert segments(d) == [f"{1:020d}.seg"], "appending after the journal emptied starts a new segment"


def test_segments_rotate_and_go_once_their_records_are_released(tmp_path):
    d = tmp_path / "journal"
    j = Journal(str(d), segment_bytes=1000)
    records = [j.append(change(k, size=300)) for k in range(9)]  # 3 records per segment
    assert len(segments(d)) == 3
    j.release(records[3:6])  # the middle segment
    assert segments(d) == [f"{0:020d}.seg", f"{2:020d}.seg"]
    j.release(records[:3] + records[6:])
    assert segments(d) == []
    assert Journal(str(d)).recover() == []


def test_recover_replays_segments_in_order_and_skips_a_torn_tail(tmp_path, caplog):
    d = tmp_path / "journal"
    j = Journal(str(d), segment_bytes=1000)
    items = [change(k, size=300) for k in range(7)]
    for c in items:
        j.append(c)
    first = d / f"{0:020d}.seg"
    torn = encode_record(change(99, size=300))[:150]
    with open(first, "ab") as f:  # as if the daemon was killed inside that write
        f.write(torn)
    with caplog.at_level(logging.WARNING, logger="shardfs"):
        again = Journal(str(d))
        assert again.recover() == items
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(first) in warnings[0] and "150 bytes" in warnings[0], warnings
    again.append(change(7))  # a later daemon appends after the segments it recovered
    assert segments(d)[-1] == f"{3:020d}.seg"
    again.discard_recovered()  # the recovered segments go; the one appended to since stays
    assert segments(d) == [f"{3:020d}.seg"]


def test_released_records_of_a_segment_that_stays_are_not_recovered(tmp_path):
    """A fold marker names the released records of a segment that other records keep:
    the current segment and an older one (opened again for the marker)."""
    d = tmp_path / "journal"
    j = Journal(str(d), segment_bytes=1000)
    items = [change(k, size=300) for k in range(6)]  # 3 records per segment
    records = [j.append(c) for c in items]
    j.release([records[0], records[2]])  # segment 0 is no longer the current one
    j.release([records[4]])
    assert segments(d) == [f"{0:020d}.seg", f"{1:020d}.seg"]
    assert Journal(str(d)).recover() == [items[1], items[3], items[5]]
    j.release([records[1]])  # segment 0 empty: deleted, no marker needed
    assert segments(d) == [f"{1:020d}.seg"]
    assert Journal(str(d)).recover() == [items[3], items[5]]


def test_records_whose_marker_cannot_be_appended_are_released_in_place(tmp_path, monkeypatch, caplog):
    """A full disk: the marker append fails (and ends markers in that segment), so the released
    records are marked in place; ``recover`` skips them, and a value released after it (a newer
    one of the same chunk, folded) is never replayed over by the old one. Found by scripts/soak
    (a full journal tmpfs, then a SIGKILL: the replay wrote old values over acknowledged ones)."""
    d = tmp_path / "journal"
    j = Journal(str(d))
    records = [j.append(change(k)) for k in range(3)]
    real_write = os.write

    def disk_full(fd: int, data) -> int:
        real_write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal_mod.os, "write", disk_full)
    with caplog.at_level(logging.ERROR, logger="shardfs"):
        j.release([records[0]])
    monkeypatch.setattr(journal_mod.os, "write", real_write)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == []
    j.release([records[1]])  # a torn segment: released in place as well
    later = j.append(change(3))  # a new segment for new records
    assert segments(d) == [f"{0:020d}.seg", f"{1:020d}.seg"]
    assert Journal(str(d)).recover() == [change(2), change(3)]
    j.release([later])
    assert Journal(str(d)).recover() == [change(2)]
    j.release([records[2]])
    assert segments(d) == []


def test_adopted_segments_are_released_as_this_journals_own(tmp_path):
    """A worker replacing a dead one takes its segments over (``Journal.adopt``): live changes
    in commit order, those a marker names left out, a segment all folded removed at once; a
    release then marks the adopted segment (or, past a torn tail, marks in place) and removes
    it once nothing in it is live; the dead one's note of kept changes goes."""
    dead = tmp_path / "dead"
    old = Journal(str(dead), segment_bytes=1000)
    items = [change(k, size=300) for k in range(9)]  # 3 records per segment
    records = [old.append(c) for c in items]
    old.release(records[3:6])  # segment 1: all folded (removed) ...
    old.release([records[0]])  # ... segment 0: one marked
    old.note_kept({"a/c/0": (1, "why")})
    with open(dead / f"{2:020d}.seg", "ab") as f:  # the death cut a record in segment 2
        f.write(encode_record(change(99, size=300))[:100])
    (dead / f"{1:020d}.seg").write_bytes(b"")  # (a segment left empty by a rotation)
    mine = Journal(str(tmp_path / "mine"))
    adopted = mine.adopt(str(dead))
    assert [c for c, _ in adopted] == [items[1], items[2], *items[6:]]
    assert segments(dead) == [f"{0:020d}.seg", f"{2:020d}.seg"]
    assert not (dead / journal_mod.KEPT).exists()
    by_change = {c: r for c, r in adopted}
    mine.release([by_change[items[1]], by_change[items[6]]])  # a marker; in place past the torn tail
    assert Journal(str(dead)).recover() == [items[2], items[7], items[8]]
    mine.release([by_change[items[2]], by_change[items[7]], by_change[items[8]]])
    assert segments(dead) == []


def test_an_adopted_journal_is_removed_and_unlocked_once_nothing_in_it_is_live(tmp_path):
    """A worker replacing dead ones (``Claim.adopt_orphans``, ``Journal.adopt``) removes and
    unlocks each adopted directory once no segment is left in it: at once if its records were
    all folded, else when its last record is released. Before, each kept its lock (one fd)
    until the worker's exit, so each new worker held one more fd per worker killed before it
    (the soak's fd flatness flag)."""
    root = tmp_path / "root"
    first = journal_mod.claim(str(root))  # a dead worker whose records were all folded
    second = journal_mod.claim(str(root))  # one that died with two records live, in two segments
    dead = Journal(second.directory, segment_bytes=300)
    records = [dead.append(change(k, size=300)) for k in range(3)]
    dead.release([records[1]])
    for c in (first, second):
        for fd in c._locks.values():
            os.close(fd)  # (their daemons died)
    claim = journal_mod.claim(str(root))
    assert sorted(claim.orphans) == sorted([first.directory, second.directory])
    fds = len(os.listdir("/proc/self/fd"))
    mine = Journal(claim.directory)
    adopted = [pair for d in claim.adopt_orphans() for pair in mine.adopt(d, emptied=claim.drop_adopted)]
    assert [c for c, _ in adopted] == [change(0, size=300), change(2, size=300)]
    assert not os.path.exists(first.directory)
    assert claim.adopted == [second.directory]
    assert len(os.listdir("/proc/self/fd")) == fds - 1
    mine.release([adopted[0][1]])  # one of its two segments gone: the directory stays, locked
    assert claim.adopted == [second.directory] and os.path.isdir(second.directory)
    mine.release([adopted[1][1]])
    assert claim.adopted == [] and not os.path.exists(second.directory)
    assert len(os.listdir("/proc/self/fd")) == fds - 2
    assert sorted(os.listdir(root)) == [os.path.basename(claim.directory)]
    claim.release()


def test_recover_refuses_anything_but_segments(tmp_path):
    d = tmp_path / "journal"
    Journal(str(d)).append(change(1))
    (d / "00000000000000000001.j").write_bytes(b"{}\n")  # an entry of the per-file journal
    with pytest.raises(JournalError, match="00000000000000000001.j"):
        Journal(str(d)).recover()


def test_a_failed_append_fails_and_abandons_its_segment(tmp_path, monkeypatch):
    d = tmp_path / "journal"
    j = Journal(str(d))
    kept = j.append(change(1))
    real_write = os.write

    def disk_full(fd: int, data) -> int:
        real_write(fd, bytes(data[:50]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal_mod.os, "write", disk_full)
    with pytest.raises(OSError):
        j.append(change(2))
    monkeypatch.setattr(journal_mod.os, "write", real_write)
    later = j.append(change(3))
    assert segments(d) == [f"{0:020d}.seg", f"{1:020d}.seg"], "no new segment after a torn record"
    assert Journal(str(d)).recover() == [change(1), change(3)]
    j.release([kept, later])
    assert segments(d) == []


def test_short_writes_are_continued(tmp_path, monkeypatch):
    d = tmp_path / "journal"
    j = Journal(str(d))
    real_write = os.write
    monkeypatch.setattr(journal_mod.os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    j.append(change(1))
    j.append(change(2, size=0))
    monkeypatch.setattr(journal_mod.os, "write", real_write)
    assert Journal(str(d)).recover() == [change(1), change(2, size=0)]


def test_sync_fsyncs_appended_segments_and_new_directory_entries(tmp_path, monkeypatch):
    d = tmp_path / "src" / ".shardfs" / "journal"
    (tmp_path / "src").mkdir()
    j = Journal(str(d), segment_bytes=1000)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)

    def sync() -> list[str]:
        synced.clear()
        trio.run(j.sync)
        return sorted(synced)

    seg = [str(d / f"{n:020d}.seg") for n in range(3)]
    first = j.append(change(1, size=1000))
    j.append(change(2, size=10))  # rotates
    assert sync() == sorted([seg[0], seg[1], str(d), str(d.parent), str(tmp_path / "src")])
    assert sync() == [], "nothing appended since the last sync"
    j.append(change(3, size=10))
    assert sync() == [seg[1]], "an append to an existing segment needs no directory fsync"
    j.release([first])
    j.append(change(4, size=1000))  # the segment is now past segment_bytes
    j.append(change(5, size=10))  # rotates into a new segment
    assert sync() == sorted([seg[1], seg[2], str(d)])


# --------------------------------------------------------------------------- through the mount

J2 = Spec("j2", (8, 10), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
          index_location="end", index_crc=True, initial=((slice(0, 8), slice(0, 5)),),
          write=(slice(0, 4), slice(0, 5)))


def test_sigkilled_daemons_journal_is_replayed_without_its_torn_tail(tmp_path, mount):
    """Chunks committed before a SIGKILL reach the shard at the next mount; a torn record at
    the end of the segment (a commit the kill interrupted) is ignored with one warning."""
    src = tmp_path / "src"
    exp = build(src, [J2])["j2"]
    shard = J2.shard_file(src, (0, 0))
    before = shard.read_bytes()
    mnt = mount(src)
    m = mount.info(mnt)
    writes = [(idx, J2.values(J2.chunk, 10 + k)) for k, idx in enumerate([(0, 0), (1, 1), (0, 0)])]
    for idx, block in writes:  # (0, 0) twice: the later value must win
        (mnt / "j2" / J2.chunk_name(idx)).write_bytes(J2.encode(block))
        exp[J2.chunk_region(idx)] = block
    os.kill(m.pid, signal.SIGKILL)
    m.proc.wait(timeout=10)
    lazy_unmount(mnt)
    assert shard.read_bytes() == before, "the shard was folded before the kill: nothing to replay"
    names = journal_entries(src)
    assert len(names) == 1 and names[0].endswith(".seg"), names
    segment = journal_path(src) / names[0]
    assert journal_bytes(src) > sum(len(J2.encode(b)) for _, b in writes)
    torn = encode_record(Change("j2", (0, 0), 2, J2.encode(J2.values(J2.chunk, 99))))
    with open(segment, "ab") as f:
        f.write(torn[: len(torn) // 2])

    mnt = mount(src)
    assert journal_entries(src) == [], "journal not replayed (and emptied) before the mount went live"
    assert_source_equals(src, "j2", exp)
    np.testing.assert_array_equal(read_tensorstore(mnt / "j2"), exp)
    log = mount.info(mnt).log_text()
    warnings = [line for line in log.splitlines() if "incomplete or damaged record" in line]
    assert len(warnings) == 1 and names[0] in warnings[0], log[-3000:]
    assert "replayed 3 journalled chunk changes" in log, log[-3000:]
    umount(mount, mnt)
    assert_source_equals(src, "j2", exp)
    assert leftovers(src) == []


def test_mount_refuses_a_journal_it_cannot_replay(tmp_path):
    src = tmp_path / "src"
    build(src, [J2])
    journal = src / ".shardfs" / "journal"
    journal.mkdir(parents=True)
    (journal / "00000000000000000007.j").write_text(json.dumps({"array": "j2"}) + "\n")
    with tempfile.TemporaryDirectory() as mnt:
        try:
            r = run_shardfs("mount", str(src), mnt)
        finally:
            lazy_unmount(mnt)
    assert r.returncode == 1, r
    assert "cannot replay the write journal" in r.stderr and "00000000000000000007.j" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert os.listdir(journal) == ["00000000000000000007.j"], "a journal that was refused must be kept"


R = Spec("r", (8, 10), (4, 5), (4, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
         index_location="end", index_crc=True, initial=((slice(0, 8), slice(0, 10)),),
         write=(slice(0, 8), slice(0, 10)))


def test_replay_skips_folded_records_and_keeps_a_newer_value_written_since(tmp_path, mount):
    """Chunk X is folded while chunk Y, in another shard (locked by another writer), keeps
    their segment; zarr-python 3 then writes X again in the source; the daemon is killed.
    The next mount replays Y only: X keeps zarr-python 3's value, not the folded one."""
    import zarr

    src = tmp_path / "src"
    exp = build(src, [R])["r"]
    x, y = (0, 0), (1, 0)  # shards (0, 0) and (1, 0)
    lock = os.open(f"{R.shard_file(src, R.shard_of(y))}.__lock", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.fcntl(lock, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
        mnt = mount(src)
        m = mount.info(mnt)
        vy, v1, v2 = (R.values(R.chunk, seed) for seed in (1, 2, 3))
        (mnt / "r" / R.chunk_name(y)).write_bytes(R.encode(vy))
        (mnt / "r" / R.chunk_name(x)).write_bytes(R.encode(v1))
        folded = f"{R.shard_file(src, R.shard_of(x))}: folded 1 chunk changes"
        wait_for(lambda: folded in m.log_text(), 20, "the fold of chunk X")
        np.testing.assert_array_equal(read_native(src / "r")[R.chunk_region(x)], v1)
        zarr.open_array(str(src / "r"), mode="r+")[R.chunk_region(x)] = v2
        exp[R.chunk_region(x)], exp[R.chunk_region(y)] = v2, vy
        os.kill(m.pid, signal.SIGKILL)
        m.proc.wait(timeout=10)
        lazy_unmount(mnt)
        assert len(journal_entries(src)) == 1, "Y's record keeps the segment holding X's"
    finally:
        os.close(lock)
    mnt = mount(src)
    assert journal_entries(src) == []
    assert_source_equals(src, "r", exp)
    assert "replayed 1 journalled chunk changes" in mount.info(mnt).log_text()
    np.testing.assert_array_equal(read_tensorstore(mnt / "r"), exp)
    umount(mount, mnt)
    assert_source_equals(src, "r", exp)
    assert leftovers(src) == []
