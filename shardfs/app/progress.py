"""Progress of the folds a daemon makes before it unmounts (``shardfs umount``), read from its
status socket (``shardfs.app.status``) while it flushes.

Shown once a document says at least ``MIN_CHUNKS`` chunks are pending: on a terminal a tqdm
bar on stderr (chunks and shards folded of those pending, rate, ETA, the shard being folded);
otherwise one plain line at the start, one every ``EVERY`` seconds and one at the end. Not only
the first document decides: with ``-o workers=N`` another worker than the owner may answer it,
with the owner's pending chunks up to a second old (``shardfs.app.peers``: none yet, or fewer than
the last writes left), so the progress starts from a document the owner answered (``_current``);
at the SIGTERM the others end and the owner answers alone.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from shardfs.app import statusdoc
from shardfs.app.mounts import ask
from shardfs.app.statusdoc import StatusDoc
from shardfs.kernel.owner import OWNER

MIN_CHUNKS = 100  # pending chunks from which umount shows progress
EVERY = 2.0  # seconds between plain progress lines
POLL = 0.25  # seconds between reads of the status socket


class FoldProgress:
    """The folds of the daemon answering at ``socket`` (None: no progress shown)."""

    def __init__(self, mnt: str, socket: str | None, stream: TextIO = sys.stderr) -> None:
        self.mnt, self.socket, self.stream = mnt, socket, stream
        self.started = time.monotonic()
        self._asked = self._said = 0.0
        self._bar: Any = None
        self.chunks = self.shards = 0
        self.done_chunks = self.done_shards = 0
        self.current: str | None = None
        doc = self._fetch()
        if doc is None:
            self.socket = None
            return
        self._start(doc)

    def _start(self, doc: StatusDoc) -> None:
        """Show progress from now on if ``doc`` says ``MIN_CHUNKS`` or more chunks are pending, as
        counted when it was answered (``_current``)."""
        if doc["pending"]["chunks"] < MIN_CHUNKS or not _current(doc):
            return
        self.chunks, self.shards = doc["pending"]["chunks"], doc["pending"]["shards"]
        if self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=self.chunks, unit="chunk", desc=f"folding into {self.shards} shards",
                             file=self.stream, leave=False)
        else:
            self._line(f"folding {self.chunks:,} pending chunks into {self.shards:,} shards")

    def _fetch(self) -> StatusDoc | None:
        if self.socket is None:
            return None
        try:
            return statusdoc.read(ask(self.socket)[0])
        except (OSError, ValueError):  # the daemon is done (or gone; or of another version: NotADocument)
            return None

    def poll(self) -> None:
        """Read the daemon's progress (at most every ``POLL`` s) and show it."""
        now = time.monotonic()
        if self.socket is None or now - self._asked < POLL:
            return
        self._asked = now
        doc = self._fetch()
        if doc is None:
            return
        if not self.chunks:
            self._start(doc)
            return
        pending = doc["pending"]
        self.done_chunks = max(self.done_chunks, self.chunks - pending["chunks"])
        self.done_shards = max(self.done_shards, self.shards - pending["shards"])
        self.current = doc["folds"].get("current")
        if self._bar is not None:
            self._bar.update(self.done_chunks - self._bar.n)
            self._bar.set_postfix_str(f"{self.done_shards}/{self.shards} shards"
                                      + (f", {self.current}" if self.current else ""))
        elif now - self._said >= EVERY:
            rate = self.done_chunks / max(now - self.started, 1e-9)
            eta = f", about {(self.chunks - self.done_chunks) / rate:.0f} s left" if rate else ""
            self._line(f"folded {self.done_chunks:,} of {self.chunks:,} chunks ({self.done_shards:,} of "
                       f"{self.shards:,} shards), {rate:,.0f} chunks/s{eta}"
                       + (f"; folding {self.current}" if self.current else ""))

    def close(self, kept: bool) -> None:
        """The daemon ended; ``kept``: it left changes in the journal (umount says which)."""
        if self.socket is None or not self.chunks:
            return
        took = time.monotonic() - self.started
        if self._bar is not None:
            if not kept:
                self._bar.update(self.chunks - self._bar.n)
            self._bar.close()
        elif kept:
            self._line(f"folded {self.done_chunks:,} of {self.chunks:,} chunks in {took:.1f} s; the rest is kept")
        else:
            self._line(f"folded {self.chunks:,} chunks into {self.shards:,} shards in {took:.1f} s")
        self.socket = None

    def _line(self, text: str) -> None:
        self._said = time.monotonic()
        print(f"shardfs: {self.mnt}: {text}", file=self.stream, flush=True)


def _current(doc: StatusDoc) -> bool:
    """Whether ``doc``'s pending chunks are counted as it was answered: by a mount's one worker, or
    by the owner of N (``OWNER``, which holds them; another worker adds the owner's last published
    document)."""
    return not any(w["this"] and w["index"] != OWNER for w in doc.get("workers", []))
