"""``shardfs umount`` with many pending chunks shows the folds' progress (issue 26, item 3).

Through a real mount: chunks kept pending by a lock on their shard (tensorstore's
``.__lock``) until ``umount`` starts; its stderr (not a terminal) has a line when the folds
start and one when they are done. ``FoldProgress`` itself against a fake daemon: plain periodic
lines (rate, ETA, the shard being folded), and a tqdm bar on a terminal.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import threading

import numpy as np
import pytest

from conftest import SHARDFS, is_mounted, shard_locks, status, wait_for
import stopping
from shardfs.app import progress, statusdoc
from sources import Spec, build
from test_hostile import chunk_bytes, write_file
from test_workers import open_handles, socket_of

s = slice
# one shard of 20x20 inner chunks: 150 written chunks leave it incomplete (folded only when idle)
P = Spec("p", (40, 40), (2, 2), (40, 40), "<i4", 0, ("zstd", 1), inner_crc=False, index_location="end",
         index_crc=True, initial=((s(0, 2), s(0, 2)),), write=(s(0, 40), s(0, 40)))
WRITTEN = [(i, j) for i in range(1, 20) for j in range(20)][:150]


@pytest.mark.parametrize("workers", [1, 2])
def test_umount_shows_fold_progress(tmp_path, mount, workers):
    """With 2 workers the owner (which holds the pending chunks) is stopped while ``umount``
    starts: the other worker answers its first look at the status, with the owner's pending
    chunks as they were up to a second before (perhaps none); the progress starts once the owner,
    alone after the SIGTERM, says how many are pending."""
    src = tmp_path / "src"
    exp = build(src, [P])
    with shard_locks(P.shard_file(src, (0, 0))) as (locker,):
        mnt = mount(src, "-o", f"workers={workers}")
        for k, idx in enumerate(WRITTEN):
            block, data = chunk_bytes(k, P)
            write_file(mnt / "p" / P.chunk_name(idx), data)
            exp["p"][P.chunk_region(idx)] = block
        pids = [w["pid"] for w in status(mnt)["workers"]] if workers > 1 else []
        if pids:
            # the last files' RELEASEs reached the owner (one still in flight when the owner
            # stops keeps the other worker waiting for its answer: it never ended, a CI run)
            sock = socket_of(mnt)
            wait_for(lambda: open_handles(mnt, sock) == [0, 0], 30, "every written file released")
            stopping.stopped(pids[0])
        umount = subprocess.Popen([SHARDFS, "umount", str(mnt)], stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                  text=True)
        if pids:  # (the other worker ends at the SIGTERM umount sends once it looked)
            wait_for(lambda: not os.path.exists(f"/proc/{pids[1]}"), 30, "the other worker ending")
            os.kill(pids[0], signal.SIGCONT)
        first = umount.stderr.readline()
        locker.kill()  # the folds may go on
        rest = umount.stderr.read().splitlines()
        assert umount.wait(timeout=120) == 0, rest
    assert first == f"shardfs: {mnt}: folding {len(WRITTEN)} pending chunks into 1 shards\n"
    assert rest[-1].startswith(f"shardfs: {mnt}: folded {len(WRITTEN)} chunks into 1 shards in "), rest
    assert all(line.startswith(f"shardfs: {mnt}: folded 0 of {len(WRITTEN)} chunks") for line in rest[:-1]), rest
    assert not is_mounted(mnt)
    import zarr

    np.testing.assert_array_equal(zarr.open_array(str(src / "p"), mode="r")[...], exp["p"])


# a status document with every key the schema requires (``statusdoc.read`` takes it), each empty
EMPTY_DOC = {key: kinds[0]() for key, kinds in statusdoc.SCHEMA.items() if key in statusdoc.StatusDoc.__required_keys__}


class FakeDaemon:
    """A status socket answering documents whose pending chunks go down by ``step`` per answer,
    after ``stale`` answers of another worker than the owner (worker 1 of 2), with the owner's
    chunks as it last published them: ``published`` pending (none yet, or fewer than it holds)."""

    def __init__(self, path: str, chunks: int, shards: int, step: int, stale: int = 0, published: int = 0) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
        self.sock.listen(8)
        self.left, self.shards, self.total, self.step, self.stale = chunks, shards, chunks, step, stale
        self.published = published
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            done = 1 - self.left / self.total
            pending = {"chunks": self.left, "shards": self.shards - round(done * self.shards)}
            doc = {**EMPTY_DOC, "pending": {"chunks": self.published, "shards": 1} if self.stale else pending,
                   "folds": {"current": "s3://b/a/c/1"}}
            if self.stale or self.published:  # (a mount of 2 workers: the one that answered)
                doc["workers"] = [{"index": i, "pid": 100 + i, "started": 0.0, "rss_bytes": 0, "cpu_s": 0.0,
                                   "this": i == (1 if self.stale else 0)} for i in range(2)]
            conn.sendall(json.dumps(doc).encode())
            conn.close()
            if self.stale:
                self.stale -= 1
            else:
                self.left = max(0, self.left - self.step)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tty", [False, True])
def test_fold_progress_lines_and_bar(tmp_path, monkeypatch, tty):
    monkeypatch.setattr(progress, "EVERY", 0.0)
    monkeypatch.setattr(progress, "POLL", 0.0)
    daemon = FakeDaemon(str(tmp_path / "s.sock"), 1000, 10, 100)
    out = Terminal() if tty else io.StringIO()
    shown = progress.FoldProgress("/mnt/x", str(tmp_path / "s.sock"), out)
    for _ in range(4):
        shown.poll()
    shown.close(False)
    daemon.sock.close()
    text = out.getvalue()
    if tty:  # tqdm's bar: chunks of the total, shards, the shard being folded
        assert "folding into 10 shards" in text and "/1000" in text and "s3://b/a/c/1" in text, text
        assert "chunk/s" in text or "s/chunk" in text or "it/s" in text or "?chunk" in text, text
        return
    lines = text.splitlines()
    assert lines[0] == "shardfs: /mnt/x: folding 1,000 pending chunks into 10 shards"
    assert lines[1].startswith("shardfs: /mnt/x: folded 100 of 1,000 chunks (1 of 10 shards), ")
    assert "chunks/s, about " in lines[1] and lines[1].endswith("s left; folding s3://b/a/c/1")
    assert lines[-1].startswith("shardfs: /mnt/x: folded 1,000 chunks into 10 shards in ")
    assert len(lines) == 6


def test_few_pending_chunks_show_nothing(tmp_path):
    daemon = FakeDaemon(str(tmp_path / "s.sock"), progress.MIN_CHUNKS - 1, 1, 10)
    out = io.StringIO()
    shown = progress.FoldProgress("/mnt/x", str(tmp_path / "s.sock"), out)
    shown.poll()
    shown.close(False)
    daemon.sock.close()
    assert out.getvalue() == ""
    assert os.path.exists(tmp_path / "s.sock")


@pytest.mark.parametrize("stale, published", [(2, 0), (1, 600)], ids=["none_published", "fewer_published"])
def test_progress_starts_at_the_owners_own_count_of_the_pending_chunks(tmp_path, monkeypatch, stale, published):
    """The first answers are another worker's, with the owner's pending chunks as it published them
    last: none yet (two answers), or fewer than it holds now (600 of 1,000, more than
    ``MIN_CHUNKS``: a CI run of scripts/test-workers started the progress at such a count). The
    progress starts at the owner's own answer."""
    monkeypatch.setattr(progress, "EVERY", 0.0)
    monkeypatch.setattr(progress, "POLL", 0.0)
    daemon = FakeDaemon(str(tmp_path / "s.sock"), 1000, 10, 500, stale=stale, published=published)
    out = io.StringIO()
    shown = progress.FoldProgress("/mnt/x", str(tmp_path / "s.sock"), out)
    for _ in range(stale + 1):
        shown.poll()
    shown.close(False)
    daemon.sock.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "shardfs: /mnt/x: folding 1,000 pending chunks into 10 shards"
    assert lines[1].startswith("shardfs: /mnt/x: folded 500 of 1,000 chunks (5 of 10 shards), ")
    assert lines[-1].startswith("shardfs: /mnt/x: folded 1,000 chunks into 10 shards in ")
    assert len(lines) == 3
