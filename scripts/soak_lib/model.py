"""The reference model of the soak's data: which value each inner chunk may hold at any time.

Every write of the soak fills one whole inner chunk with one *token* (an integer, unique per
array, 0 = the fill value), so a chunk read is either uniform (one token) or torn. The model
records each write's chunk, token and times (``time.monotonic()``, comparable across the
processes of one machine): ``start`` before the writer began, ``end`` when the call that commits
returned, ``ok`` when it returned success (acknowledged). A write whose end is unknown is still
in flight; a failed write may or may not have landed, so it stays possible until superseded.

Contract of ``allowed(chunk, token, t0, t1)`` (a read that began at ``t0`` and ended at ``t1``
saw ``token`` in ``chunk``): true iff some write ``w`` of that chunk with that token (the
initial content counts as a write acknowledged at time -inf) began before ``t1`` and was not
superseded before ``t0``, where ``w`` is superseded at ``t`` when an acknowledged write of the
same chunk that *began after ``w`` ended* was acknowledged before ``t``. Writes that overlap in
time may commit in either order, so both stay allowed. This never forbids a correct value
when some ends are still unknown (an unknown end never supersedes), so the check can run while
the soak goes on. ``final_allowed`` is ``allowed`` at t0 = t1 = +inf: only the acknowledged
writes nobody superseded (and failed or unfinished ones not superseded either).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

Chunk = tuple[int, ...]
NEVER = -math.inf


@dataclass
class Write:
    """One write of ``token`` into ``chunk`` of ``array`` (see the module docstring for the times)."""

    array: str
    chunk: Chunk
    token: int
    start: float
    end: float | None = None
    ok: bool = False
    how: str = ""
    worker: str = ""


@dataclass
class _ChunkHistory:
    writes: list[Write] = field(default_factory=list)
    acks: list[float] = field(default_factory=list)  # ack times of acknowledged writes, sorted
    max_start: list[float] = field(default_factory=list)  # prefix max of their start times

    def acknowledge(self, w: Write) -> None:
        assert w.end is not None
        i = bisect.bisect(self.acks, w.end)
        self.acks.insert(i, w.end)
        self.max_start.insert(i, w.start)
        for j in range(i, len(self.max_start)):  # keep the prefix maximum
            self.max_start[j] = max(self.max_start[j], self.max_start[j - 1]) if j else self.max_start[j]

    def latest_start_acked_before(self, t: float) -> float:
        i = bisect.bisect_left(self.acks, t)
        return self.max_start[i - 1] if i else NEVER


class Model:
    """Writes per (array, chunk) and tokens per array; the judge of every value read."""

    def __init__(self) -> None:
        self._chunks: dict[tuple[str, Chunk], _ChunkHistory] = {}
        self._by_token: dict[tuple[str, int], Write] = {}
        self._pending: dict[tuple[str, int, str], Write] = {}  # writes in flight by (array, op, worker)
        self._by_array: dict[str, list[Write]] = {}

    def _history(self, array: str, chunk: Chunk) -> _ChunkHistory:
        return self._chunks.setdefault((array, chunk), _ChunkHistory())

    def initial(self, array: str, chunk: Chunk, token: int) -> None:
        """The chunk's content before the soak began (token 0: empty)."""
        w = Write(array, chunk, token, NEVER, NEVER, True, "initial")
        self._add(w, key=None)
        self._history(array, chunk).acknowledge(w)

    def begin(self, array: str, chunk: Chunk, token: int, start: float, how: str, worker: str, op: int) -> None:
        """A write is about to start (``op``: the worker's sequence number, unique per worker)."""
        self._add(Write(array, chunk, token, start, None, False, how, worker), key=(array, op, worker))

    def finish(self, array: str, op: int, worker: str, end: float, ok: bool) -> Write:
        """The write ``op`` of ``worker`` returned (``ok``: success, the write is acknowledged)."""
        w = self._pending.pop((array, op, worker))
        w.end, w.ok = end, ok
        if ok:
            self._history(array, w.chunk).acknowledge(w)
        return w

    def _add(self, w: Write, key: tuple[str, int, str] | None) -> None:
        self._history(w.array, w.chunk).writes.append(w)
        self._by_array.setdefault(w.array, []).append(w)
        if w.token:
            assert (w.array, w.token) not in self._by_token, f"token {w.token} reused in {w.array}"
            self._by_token[(w.array, w.token)] = w
        if key is not None:
            self._pending[key] = w

    def _candidates(self, array: str, chunk: Chunk, token: int) -> list[Write]:
        if token:
            w = self._by_token.get((array, token))
            return [w] if w is not None and w.chunk == chunk else []
        return [w for w in self._history(array, chunk).writes if w.token == 0] or \
            ([Write(array, chunk, 0, NEVER, NEVER, True, "initial")] if (array, chunk) not in self._chunks else [])

    def is_token(self, array: str, token: int) -> bool:
        """Whether ``token`` is the fill (0) or a token some write of ``array`` carried (any chunk)."""
        return not token or (array, token) in self._by_token

    def allowed(self, array: str, chunk: Chunk, token: int, t0: float, t1: float) -> bool:
        """Whether a read over [t0, t1] may see ``token`` in ``chunk`` (module docstring)."""
        hist = self._chunks.get((array, chunk))
        latest = hist.latest_start_acked_before(t0) if hist else NEVER
        for w in self._candidates(array, chunk, token):
            if w.start < t1 and not (w.end is not None and latest > w.end):
                return True
        return False

    def plausible(self, array: str, chunk: Chunk, token: int, t1: float) -> bool:
        """A weaker ``allowed`` for a mount that does not write ``chunk``: another mount's writes reach
        it only once folded, so any write of that chunk (or the fill) that began before ``t1`` may show."""
        return any(w.start < t1 for w in self._candidates(array, chunk, token))

    def final_allowed(self, array: str, chunk: Chunk) -> set[int]:
        """The tokens ``chunk`` may hold once every write ended (after the last umount)."""
        hist = self._chunks.get((array, chunk))
        if hist is None:
            return {0}
        latest = hist.latest_start_acked_before(math.inf)
        return {w.token for w in hist.writes if not (w.end is not None and latest > w.end)}

    def last_acknowledged(self, array: str, chunk: Chunk) -> Write | None:
        """The acknowledged write of ``chunk`` that began last (for the report of a loss)."""
        hist = self._chunks.get((array, chunk))
        acked = [w for w in hist.writes if w.ok] if hist else []
        return max(acked, key=lambda w: w.start) if acked else None

    def chunks(self, array: str) -> list[Chunk]:
        """Every chunk of ``array`` the soak wrote or set initially."""
        return [c for (a, c) in self._chunks if a == array]

    def writes_of(self, array: str) -> list[Write]:
        """The writes of ``array`` (kept per array as they are added)."""
        return self._by_array.get(array, [])

    def writes(self) -> list[Write]:
        return [w for h in self._chunks.values() for w in h.writes]
