"""The ledger of a supervised mount (``shardfs.tree.ledger``): the numbers a worker gave the
kernel, kept where a worker replacing a dead one finds them, and nowhere a disk can hold up a
request: a memfd the supervisor keeps.

A file on the source's disk cost each open and release a ``write`` that ext4, busy with other
work, held for milliseconds at times (136 ms at worst, 0.5 s in all in a 3072-chunk read
measured with ``perf trace``): the reads of a supervised mount waited for it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardfs.app import state
from shardfs.tree.ledger import COMPACT_BYTES, Ledger, memory

from conftest import open_files
from test_restart import kill_worker, two_arrays, worker_of

pytestmark = pytest.mark.skipif(
    "takeover" not in __import__("importlib.metadata").metadata.version("pyfuse3"),
    reason="needs the pyfuse3 scripts/pyfuse3 builds (pyfuse3.takeover)")


@pytest.fixture
def src(tmp_path) -> Path:
    return two_arrays(tmp_path / "src")


def opened(fd: int) -> Ledger:
    """A worker's ledger on the supervisor's memfd ``fd`` (given a copy, as a worker inherits it)."""
    led = Ledger(fd=os.dup(fd))
    led.start()
    return led


def shared(fd: int, index: int) -> Ledger:
    """Worker ``index``'s of two (``-o workers=2``) on the supervisor's memfd ``fd``."""
    led = Ledger(fd=os.dup(fd))
    led.share(index, 2)
    led.start()
    return led


def test_a_worker_finds_every_record_its_dead_predecessor_appended():
    fd = memory()
    try:
        first = opened(fd)
        first.note("a", 0, "vol")
        first.note_line('["h",1,4611686018427387904,"r"]')
        first.note_line('["x",1]')
        del first  # (a death: nothing closed in order)
        second = opened(fd)
        # (handle 1 was released: only its release is kept, for new numbers to follow it)
        assert second.records() == [["a", 0, "vol"], ["x", 1]]
        second.note("k", 2, "d", "vol")
        assert opened(fd).records()[-1] == ["k", 2, "d", "vol"]
    finally:
        os.close(fd)


def test_a_release_is_written_with_the_next_record_and_an_open_at_once():
    """One ``write`` a chunk file read: a release's record waits for the next record (a death
    may lose it: the successor keeps a handle the kernel never names again); an open's is
    written before its reply, so a successor always has it."""
    fd = memory()
    try:
        led = opened(fd)
        led.note_line('["h",1,4611686018427387904,"r"]')
        led.note_later('["x",1]')
        assert opened(fd).records() == [["h", 1, 4611686018427387904, "r"]]
        led.note_line('["h",2,4611686018427387905,"r"]')  # (handle 1's records in effect: its release)
        assert opened(fd).records() == [["x", 1], ["h", 2, 4611686018427387905, "r"]]
        shared = Ledger(fd=os.dup(fd))
        shared.share(0, 2)
        shared.start()
        shared.note_later('["x",2]')  # other workers let go of what they hold for it: at once
        assert opened(fd).records()[-1] == ["x", 2]
    finally:
        os.close(fd)


def test_a_compacted_memory_ledger_keeps_the_records_in_effect_and_frees_the_rest():
    """``rewrite`` appends the records in effect and punches out what came before them: the next
    worker reads those alone, the memory held stays bounded however long the mount lives, and
    a death between the append and the punch leaves records that say the same (the old ones,
    then the same numbers again)."""
    fd = memory()
    try:
        led = opened(fd)
        line = '["h",%d,4611686018427387904,"r"]'
        n = 0
        for _ in range(3):
            while not led.full:
                n += 1
                led.note_line(line % n)
                led.note_line(f'["x",{n}]')
            before = opened(fd).records()  # (the handles noted since are released: the last one's number)
            assert before in ([["x", n]], [["a", 0, "vol"], ["h", 7, 42, "r"], ["x", n]]), before[:5]
            led.rewrite([["a", 0, "vol"], ["h", 7, 42, "r"]])
            assert opened(fd).records() == [["a", 0, "vol"], ["h", 7, 42, "r"]]
            assert not led.full
        held = os.fstat(fd).st_blocks * 512
        assert held < 2 * COMPACT_BYTES, held  # 3 rounds of 8 MiB were appended
        led.note("w", 7)
        assert opened(fd).records() == [["a", 0, "vol"], ["h", 7, 42, "r"], ["w", 7]]
    finally:
        os.close(fd)


def test_a_supervised_mount_keeps_its_ledger_in_memory_not_on_disk(mount, src):
    """Reading files through a supervised mount writes no ledger file into the state directory;
    the worker holds the supervisor's memfd, and a worker replacing a killed one still finds the
    handles open before the kill there (the restart tests check the rest through it)."""
    mnt = mount(src, "-o", "workers=1")  # (one worker's restart, as in tests/test_restart.py)
    m = mount.info(mnt)
    for name in ("0.0", "1.1", "3.3"):
        (mnt / "b" / name).read_bytes()
    f = open(mnt / "a" / "2.7", "rb")  # the last request before the kill: its record was written at once
    where = Path(state.state_dir(str(src)))
    assert not list(where.glob("kernel-*.ledger")), sorted(p.name for p in where.iterdir())
    w = worker_of(m)
    links = open_files(w)
    assert any(link.startswith("/memfd:shardfs-ledger") for link in links), links
    kill_worker(m, mnt)
    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # no pages: a READ through the handle
    assert f.read() == (mnt / "a" / "2.7").read_bytes()
    f.close()
    assert not list(where.glob("kernel-*.ledger"))


def test_a_restored_ledger_leaves_out_released_handles_and_numbers_follow_the_highest():
    """A long-lived ledger is mostly handles opened and released (two records per file opened);
    the next worker reads only what is still open (a ledger of 8 MiB cost it 77 MiB of memory
    read whole, most of which stayed: the soak's RSS growing with each worker kill), and gives
    out numbers above every one the dead worker gave, released ones included."""
    from shardfs.kernel.handles import Handles

    fd = memory()
    ledger = opened(fd)
    ledger.note("k", 5, "d", "x")
    for fh in range(1, 2001):
        ledger.note("h", fh, 1000 + fh, "r")
        if fh not in (7, 1500):
            ledger.note("x", fh)
    ledger.note("w", 7)
    records = opened(fd).records()
    os.close(fd)
    assert records == [["k", 5, "d", "x"], ["h", 7, 1007, "r"], ["h", 1500, 2500, "r"], ["x", 2000], ["w", 7]]
    handles = Handles()
    handles.restore(records)
    assert sorted(handles._open) == [7, 1500]
    assert handles.add(handles._open[7]) == 2001


def test_the_worker_replacing_one_of_two_reads_only_the_records_in_effect_and_follows_on():
    """``-o workers=2``: the worker that replaces worker 1 takes over what both gave out so far
    (parsing every record of a ledger near ``COMPACT_BYTES`` cost it 47 MiB of PSS more than the
    worker it replaced: the soak's S3 mount), but only what is still in effect: the handles
    still open, the highest released one (numbers follow it), the other records; then it
    follows what the live worker appends, from where it read."""
    from shardfs.kernel.handles import Handles, Lost

    fd = memory()
    try:
        w0, w1 = shared(fd, 0), shared(fd, 1)
        w0.note("a", 0, "vol")
        for fh in range(1, 2001):  # both workers' opens (odd: worker 0's), all but two released
            (w0 if fh % 2 else w1).note_line(f'["h",{fh},{1000 + fh},"r",10,1]')
            if fh not in (7, 1500):
                (w1 if fh % 3 else w0).note_line(f'["x",{fh}]')
        w1.note("w", 1500)
        successor = shared(fd, 1)
        records = successor.records()
        assert records == [["a", 0, "vol"], ["h", 7, 1007, "r", 10, 1], ["h", 1500, 2500, "r", 10, 1],
                           ["x", 2000], ["w", 1500]]
        handles = Handles(successor)
        handles.restore(records)
        assert sorted(handles._open) == [7, 1500] and handles._open[1500].dirty
        successor.followers.append(handles.follow)
        w0.note_line('["h",2001,3001,"r",10,1]')
        w0.note_line('["x",7]')
        assert successor.catch_up() == [["h", 2001, 3001, "r", 10, 1], ["x", 7]]
        assert isinstance(handles.get(2001), Lost) and handles.get(7) is None
        assert handles.add(handles._open[1500]) == 2002  # (worker 1's numbers: even ones)
    finally:
        os.close(fd)


def test_a_shared_ledger_is_compacted_and_a_worker_behind_lets_go_of_what_was_released(monkeypatch):
    """``-o workers=2``: worker 0 fills the shared memfd with opens and releases until it is
    full and compacts it (the records in effect of both workers, then the rest punched out);
    worker 1, which had not read the last records, finds every record in effect, and lets go of
    its own handle whose release (by worker 0) was punched out, not of the one still open. The
    memory held stays bounded; a successor reads only the records in effect."""
    from shardfs.kernel.handles import Handles, Lost
    from shardfs.reads import ReadHandle
    from shardfs.tree import ledger

    monkeypatch.setattr(ledger, "COMPACT_BYTES", 256 << 10)
    fd = memory()
    try:
        w0, w1 = shared(fd, 0), shared(fd, 1)
        handles1 = Handles(w1)
        released: list[int] = []
        w1.followers.append(lambda recs: released.extend(fh for fh, _ in handles1.follow(recs)))
        w0.note("a", 0, "vol")
        w1.note_line('["h",2,4611686018427387904,"r",10,1]')  # worker 1's handles: even numbers
        w1.note_line('["h",4,4611686018427387905,"r",10,1]')
        for fh in (2, 4):
            handles1._open[fh] = ReadHandle.__new__(ReadHandle)  # (held here: what a let-go frees)
        w1.catch_up()
        w0.note_line('["x",2]')  # released through worker 0; worker 1 has not read it yet
        n = 1
        for _ in range(2):
            while not w0.full:
                n += 2
                w0.note_line(f'["h",{n},4611686018427387906,"r",10,1]')
                w0.note_line(f'["x",{n}]')
            w0.compact()
            assert not w0.full
        assert os.fstat(fd).st_blocks * 512 < 2 * ledger.COMPACT_BYTES
        w1.catch_up()
        assert released == [2] and handles1.get(4) is not None and handles1.get(2) is None
        succ = opened(fd).records()
        assert ["a", 0, "vol"] in succ and ["h", 4, 4611686018427387905, "r", 10, 1] in succ
        assert not any(r[0] == "h" and r[1] in (2, n) for r in succ)
        w0.note_line('["h",7,1,"r",10,1]')  # appended after a compaction: followed as ever
        w1.catch_up()
        assert isinstance(handles1.get(7), Lost)
    finally:
        os.close(fd)


def test_the_handle_records_read_without_json_are_what_json_reads():
    """``Handles.add``'s records (every worker of a shared ledger parses every other's, without
    ``json``): the lists ``json.loads`` gives, with and without a read handle's version and the
    number of the request that made the handle, which a worker restoring them finds it by."""
    from shardfs.kernel.handles import Handles, Lost
    from shardfs.tree.ledger import _parse

    lines = [b'["h",1,2,"w"]', b'["h",3,4,"d",77]', b'["h",5,6,"r",10,-20]', b'["h",7,8,"r",10,20,99]',
             b'["x",5]']
    assert _parse(lines) == [json.loads(line) for line in lines]
    handles = Handles()
    handles.restore(_parse(lines))
    assert (handles.made_by(77), handles.made_by(99), handles.made_by(1)) == ((True, 3), (False, 7), None)
    lost = handles.get(7)
    assert handles.get(5) is None and isinstance(lost, Lost) and lost.version == (10, 20)
