"""The judge: ingests the workers' op logs into the model and checks every read, during the run
and after it, and the source itself at the end.

``Ledger.poll()`` reads the new complete lines of every worker log (``worker.py``'s format):
write ``begin``/``end`` lines go to the ``Model``; every finished operation goes to ``ops``
(kind, start, end, error) for the metrics; a failed operation's error is *clean* when it is
EIO, ENOSPC or EAGAIN, or when it overlaps the window of a fault that may fail a client (a
killed daemon's ENOTCONN, a stopped server: not a worker kill, which no client may notice).
The rest must be excused by one rule, each counted in ``excused`` (the report shows how many
each excused); a read is excused only by a write of a chunk inside its region (readers log
every read's region, ``r``):

- ``RACE``: a write no filesystem makes atomic for readers (in place, ``cp``, ``rm``: ``RACY``)
  of a chunk in the region was in flight meanwhile (also a fill read while such a write of that
  very chunk was: its ``O_TRUNC`` emptied it, ``FILL_RACE``; and a chunk read torn, several
  tokens, while an in-place write or ``cp`` of it was: their bytes land in the kernel's pages
  of the file as they are written, under its readers, and two of them at once mix theirs,
  ``TORN_RACE``: the soak's uncompressed blosc chunks decode whatever the mixture; so is one
  value that no write of the array carried, a *foreign* one: c-blosc decodes an uncompressed
  frame cut short, the old version's bytes read to the new version's smaller size, without an
  error, into whatever its output buffer held, such as the values the reader decoded before);
- ``REMOVED``: an ENOENT follows an ``rm`` of a chunk in the region by less than the entry
  timeout (zarr 2.18 stats, then opens);
- ``LIB_ENOENT``: a library write that failed with ENOENT while an ``rm`` of its chunk was in
  flight (zarr 2.18 reads an edge chunk before writing part of it); ``LIB_TORN``: one that failed
  to decode that chunk while another worker's in-place write or ``cp`` of it was (the read met
  its ``O_TRUNC`` or its bytes half written, as a reader's would: ``RACE``); ``CP_EEXIST``: a ``cp``
  whose ``O_EXCL`` create met another write of its chunk;
- ``STALE_SIZE``: a read that failed to decode on one mount while the other mount had written
  a chunk in its region in the attribute timeout before (the kernel of the reading mount may
  still hold a chunk's old size: see the report); ``STALE_NAME``: an ENOENT naming a chunk the
  other mount writes and removed before (``_removed_by_other_mount``); both also counted
  *cross-mount*.

Any other failure is *unclean*. During a worker kill alone (``Injector.worker_kill``), what
clients saw is counted in ``worker_kill``: fill reads and other values the model forbids
(forbidden), failed reads and structure changes (unclean unless a rule above excuses them), and
writes that failed with EIO: those whose bytes only the dead worker held, as promised
(doc/SEMANTICS.md "Restarts and upgrades"), not unclean. ``Ledger.validate(before)`` checks
the reads, and judges the failed writes, that ended before ``before`` (call it with a lag: a
write that began before a read or a failed write ended must have logged its ``begin``, in
whichever worker's log is read first): in each chunk a read must have seen one token, allowed by the model
(``Model.allowed`` on the mount that writes that chunk, ``Model.plausible`` on the others);
a fill (0) the model forbids, read while a fault was on, is counted as *masked* (the client
turned an error into the fill value: zarr 2.18 reads a chunk whose ``stat`` fails as missing),
and so is a structure change's read-back that differs while a fault was on; anything else is
*forbidden*. ``final_check(read_array)`` reads every array in the source
natively at the end: each chunk must hold one token of ``Model.final_allowed``; an older
token or the fill is *lost*, anything else *forbidden*. Every failure is kept with the ops that
explain it (the writes of that chunk), for the report.
"""

from __future__ import annotations

import collections
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from soak_lib.faults import WORKER_KILL, Injector
from soak_lib.grid import Grid, owner, tokens_by_chunk
from soak_lib.model import Model

CLEAN = frozenset({"EIO", "ENOSPC", "EAGAIN"})
# Writes a reader may see half done on any POSIX filesystem: in place and cp (open with O_TRUNC,
# then write: the kernel shows the truncated file at once), rm (zarr 2.18 stats, then opens).
RACY = frozenset({"inplace", "cp", "rm"})
TEARING = frozenset({"inplace", "cp"})  # ... of which those whose bytes a reader may see mixed with others
LIBRARIES = frozenset({"zarr2", "zarr3", "tensorstore"})  # writes through a client library
ATTR_TIMEOUT = 10.0  # the mounts' -o attr_timeout/entry_timeout default
# The rules that excuse a failure (module docstring), as the report names them.
RACE = "read: in-place write, cp or rm of a chunk in its region in flight"
FILL_RACE = "fill read: in-place write, cp or rm of that chunk in flight (O_TRUNC)"
TORN_RACE = "torn read: in-place write or cp of that chunk in flight"
REMOVED = "read ENOENT: rm of a chunk in its region within the entry timeout"
LIB_ENOENT = "library write ENOENT: rm of its chunk in flight"
LIB_TORN = "library write undecodable: in-place write or cp of its chunk in flight"
CP_EEXIST = "cp EEXIST: another write of its chunk in flight"
STALE_NAME = "read ENOENT on one mount: the other mount removed that chunk (stale name)"
STALE_SIZE = "read undecodable on one mount: the other mount wrote a chunk in its region (stale size)"


@dataclass
class Op:
    kind: str  # read, write, structure
    start: float
    end: float
    err: str | None
    worker: str


@dataclass
class Ledger:
    model: Model
    grids: dict[str, Grid]
    mounts: int
    faults: Injector
    ops: list[Op] = field(default_factory=list)
    forbidden: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    unclean: list[str] = field(default_factory=list)
    masked: collections.Counter = field(default_factory=collections.Counter)
    raced: collections.Counter = field(default_factory=collections.Counter)
    cross_mount: collections.Counter = field(default_factory=collections.Counter)
    excused: collections.Counter = field(default_factory=collections.Counter)  # failures by the rule excusing them
    worker_kill: collections.Counter = field(default_factory=collections.Counter)  # what clients saw of them
    reads_checked: int = 0
    chunks_checked: int = 0
    _offsets: dict[Path, int] = field(default_factory=dict)
    _reads: list[dict[str, Any]] = field(default_factory=list)
    _failed: list[tuple[Op, dict[str, Any]]] = field(default_factory=list)  # failed writes, judged by validate

    def poll(self, logs: list[Path]) -> None:
        """Ingest the new complete lines of every log."""
        for path in logs:
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1
            self._offsets[path] = self._offsets.get(path, 0) + end
            for line in data[:end].splitlines():
                self._ingest(json.loads(line), path.stem)

    def _ingest(self, rec: dict[str, Any], worker: str) -> None:
        kind = rec["k"]
        if kind == "wb":
            self.model.begin(rec["a"], tuple(rec["c"]), rec["tok"], rec["t0"], rec["how"], worker, rec["op"])
            return
        if kind == "we":
            rec = {**rec, "c": self.model.finish(rec["a"], rec["op"], worker, rec["t1"], rec["ok"]).chunk}
        elif kind == "r":
            self._reads.append({**rec, "w": worker})
        elif kind == "s" and rec.get("bad"):
            if self.faults.overlapping(rec["t0"], rec["t1"]):  # zarr 2.18 reads a chunk it cannot stat as fill
                self.masked["zarr2 structure read-back"] += len(rec["bad"])
            else:
                if self.faults.worker_kill(rec["t0"], rec["t1"]):
                    self.worker_kill["structure read-backs that differ"] += len(rec["bad"])
                self.forbidden.extend(f"{worker}: {b}" for b in rec["bad"])
        op = Op({"r": "read", "we": "write", "s": "structure"}[kind], rec["t0"], rec["t1"], rec.get("err"), worker)
        self.ops.append(op)
        if kind != "r" and rec.get("err"):
            self._failed.append((op, rec))

    def _judge_error(self, op: Op, rec: dict[str, Any]) -> None:
        """Count a failed operation as clean, excused by a rule, or unclean (module docstring)."""
        if not op.err or self.faults.overlapping(op.start, op.end):
            return
        during_kill = self.faults.worker_kill(op.start, op.end)
        if during_kill and op.kind != "read" and op.err == "EIO":  # bytes only the dead worker held
            self.worker_kill[f"{op.kind}s failed with EIO (bytes lost with the worker)"] += 1
            return
        if op.err in CLEAN and not during_kill:
            return
        if rec.get("how") == "rm" and op.err == "ENOENT":  # the chunk was empty already
            return
        # zarr 2.18 writing part of a chunk (an edge chunk) reads it first: stat, then open, and
        # the other writer of this mount removed it in between (ENOENT), or wrote it in place or
        # by cp meanwhile (undecodable: the CI soak of be81f00, zstd's "invalid input data" 11 ms
        # into an in-place write). An open with O_CREAT, in place or cp, has no such excuse.
        lib_race = (({"rm"}, LIB_ENOENT) if op.err == "ENOENT" else (TEARING, LIB_TORN)
                    if op.err.startswith("X:") else None)
        if (op.kind == "write" and rec["how"] in LIBRARIES and lib_race is not None
                and self._racing(rec["a"], op.start, op.end, {rec["c"]}, lib_race[0], other_than=op.worker)):
            self._excuse(lib_race[1], self.raced, f"{rec['how']} write")
            return
        if (op.kind == "write" and op.err == "EEXIST" and rec["how"] == "cp"
                and self._racing(rec["a"], op.start, op.end, {rec["c"]},
                                 set(LIBRARIES) | {"rename", "inplace", "cp"}, other_than=op.worker)):
            # cp creates a file its stat found missing with O_EXCL: another writer of the chunk
            # (another cp too) made it in between (an rm had emptied it), as on any filesystem
            self._excuse(CP_EEXIST, self.raced, "cp write")
            return
        if op.kind == "read":
            region = self._region_chunks(rec)
            if self._racing(rec["a"], op.start, op.end, region):
                self._excuse(RACE, self.raced, rec["lib"])
                return
            if op.err == "ENOENT" and self._removed(rec["a"], op.end, region):
                self._excuse(REMOVED, self.raced, rec["lib"])
                return
            if op.err == "ENOENT" and self._removed_by_other_mount(rec):
                self._excuse(STALE_NAME, self.cross_mount, rec["lib"])
                return
            if op.err.startswith("X:") and self._other_mount_wrote(rec["a"], rec["m"], op.end, region):
                self._excuse(STALE_SIZE, self.cross_mount, rec["lib"])
                return
        if during_kill:
            self.worker_kill[f"failed {op.kind}s"] += 1
        self.unclean.append(f"{op.worker}: {op.kind} {_describe(rec)} failed in [{op.start:.3f}, {op.end:.3f}]"
                            f"{' during a worker kill' if during_kill else ''}: {op.err}"
                            + (f" ({rec['msg']})" if rec.get("msg") else ""))

    def _excuse(self, rule: str, counter: collections.Counter, key: str) -> None:
        self.excused[rule] += 1
        counter[key] += 1

    def _region_chunks(self, rec: dict[str, Any]) -> set[tuple[int, ...]]:
        """The chunks a read's region (``r``) touches; none if it logged no region."""
        if "r" not in rec or rec["a"] not in self.grids:
            return set()
        region = tuple(slice(a, b) for a, b in rec["r"])
        return {chunk for chunk, _part in self.grids[rec["a"]].chunks_of(region)}

    def _removed(self, array: str, t1: float, chunks: set[tuple[int, ...]]) -> bool:
        """One of ``chunks`` of ``array`` was removed (``rm``, either mount) within ``ATTR_TIMEOUT``
        before ``t1`` (any time before, when a replay by a restarted daemon or worker ended within
        it): zarr 2.18 stats a chunk, then opens it; a mount learns of another mount's removal
        when that one folds, and the kernel keeps the name for the entry timeout."""
        replayed = any(w.kind in ("kill", WORKER_KILL) and t1 - ATTR_TIMEOUT < w.end < t1
                       for w in self.faults.windows)
        return any(w.how == "rm" and w.chunk in chunks and w.start < t1
                   and (replayed or w.end is None or w.end > t1 - ATTR_TIMEOUT)
                   for w in self.model.writes_of(array))

    def _removed_by_other_mount(self, rec: dict[str, Any]) -> bool:
        """The chunk an ENOENT read names (its file name, in the error) is written by the other
        mount, which removed it before the read ended. A mount sees another one's removal when
        that one folds it, which under load or faults may be long after the ``rm`` (folds wait
        for an idle mount or a full budget, and back off while the store fails: 12-38 s measured
        after a stall), and the reading kernel keeps the name it looked up before for the
        attribute timeout after that: ``stat`` finds the file, ``open`` does not. Not bounded
        in time, like ``Model.plausible`` for the values that mount reads."""
        name, t1 = rec["a"], rec["t1"]
        chunk = self.grids[name].chunk_named(rec.get("msg", ""), name)
        if chunk is None or owner(name, chunk, self.mounts) == rec["m"]:
            return False
        return any(w.how == "rm" and w.chunk == chunk and w.start < t1 for w in self.model.writes_of(name))

    def _other_mount_wrote(self, array: str, mount: int, t1: float, chunks: set[tuple[int, ...]]) -> bool:
        """A mount other than ``mount`` wrote one of ``chunks`` of ``array`` within ``ATTR_TIMEOUT``
        before ``t1``."""
        return any(w.worker.endswith(f"-m{1 - mount}") and w.how != "initial" and w.chunk in chunks
                   and w.start < t1 and (w.end is None or w.end > t1 - ATTR_TIMEOUT)
                   for w in self.model.writes_of(array))

    def _racing(self, array: str, t0: float, t1: float, chunks: set[tuple[int, ...]],
                racy: frozenset[str] | set[str] = RACY, other_than: str = "") -> bool:
        """A write of one of ``chunks`` of ``array`` that is not atomic for readers (of a kind
        in ``racy``), by a worker other than ``other_than``, was in flight during [t0, t1]."""
        return any(w.how in racy and w.chunk in chunks and w.start < t1 and (w.end is None or w.end > t0)
                   and w.worker != other_than for w in self.model.writes_of(array))

    def validate(self, before: float) -> None:
        """Check the reads and judge the failed writes that ended before ``before`` (module docstring)."""
        failed = []
        for op, rec in self._failed:
            if op.end >= before:
                failed.append((op, rec))
            else:
                self._judge_error(op, rec)
        self._failed = failed
        keep = []
        for rec in self._reads:
            if rec["t1"] >= before:
                keep.append(rec)
            elif "c" in rec:
                self._check_read(rec)
            else:
                self._judge_error(Op("read", rec["t0"], rec["t1"], rec["err"], rec["w"]), rec)
        self._reads = keep

    def _check_read(self, rec: dict[str, Any]) -> None:
        self.reads_checked += 1
        name, t0, t1 = rec["a"], rec["t0"], rec["t1"]
        ndim = len(self.grids[name].shape)
        for entry in rec["c"]:
            self.chunks_checked += 1
            chunk, values = tuple(entry[:ndim]), entry[ndim:]
            token = _token(values)
            if token is not None and not self.model.is_token(name, token):
                token = None  # foreign: as a torn read
            if token is None:
                if self._racing(name, t0, t1, {chunk}, TEARING):
                    self._excuse(TORN_RACE, self.raced, rec["lib"])
                    continue
                self.forbidden.append(f"{rec['w']} ({rec['lib']}, mount {rec['m']}): {name} chunk {chunk} torn or "
                                      f"foreign: values {values[:6]} read in [{t0:.3f}, {t1:.3f}]\n"
                                      + self.history(name, chunk, t1))
                continue
            strict = owner(name, chunk, self.mounts) == rec["m"]
            ok = (self.model.allowed(name, chunk, token, t0, t1) if strict
                  else self.model.plausible(name, chunk, token, t1))
            if ok:
                continue
            if token == 0 and self.faults.overlapping(t0, t1):
                self.masked[rec["lib"]] += 1
                continue
            if token == 0 and self._racing(name, t0, t1, {chunk}):  # truncated by O_TRUNC: read as empty
                self._excuse(FILL_RACE, self.raced, rec["lib"])
                continue
            if self.faults.worker_kill(t0, t1):
                self.worker_kill["fill reads" if token == 0 else "other values the model forbids"] += 1
            self.forbidden.append(f"{rec['w']} ({rec['lib']}, mount {rec['m']}): {name} chunk {chunk} held "
                                  f"{token}, which the model forbids in [{t0:.3f}, {t1:.3f}]\n"
                                  + self.history(name, chunk, t1))

    def final_check(self, read_array: Callable[[str], np.ndarray]) -> None:
        """Every chunk of every array in the source against ``Model.final_allowed`` (module docstring)."""
        for name, grid in self.grids.items():
            try:
                values = read_array(name)
            except Exception as e:  # a torn shard: the native reader refuses it
                self.forbidden.append(f"final: {name} unreadable natively: {type(e).__name__}: {e}")
                continue
            region = tuple(slice(0, s) for s in grid.shape)
            for entry in tokens_by_chunk(grid, region, np.asarray(values)):
                chunk, seen = tuple(entry[:grid_ndim(grid)]), entry[grid_ndim(grid):]
                self.chunks_checked += 1
                allowed = self.model.final_allowed(name, chunk)
                token = _token(seen)
                if token in allowed:
                    continue
                what = (f"final: {name} chunk {chunk} holds {seen[:6]}, allowed {sorted(allowed)}\n"
                        + self.history(name, chunk))
                known = token is not None and (token == 0 or any(
                    w.token == token for w in self.model.writes() if w.array == name and w.chunk == chunk))
                (self.lost if known else self.forbidden).append(what)

    def history(self, name: str, chunk: tuple[int, ...], at: float = math.inf, before: int = 8, after: int = 3) -> str:
        """The op log of one chunk around time ``at``: its last ``before`` writes that began
        before it and the ``after`` next ones, to replay a failure."""
        writes = sorted((w for w in self.model.writes() if w.array == name and w.chunk == chunk), key=lambda w: w.start)
        i = sum(w.start < at for w in writes)
        return "\n".join(f"    {w.start:12.3f} .. {'?' if w.end is None else f'{w.end:.3f}':>12} token {w.token:>9} "
                         f"{w.how:11} {'ok' if w.ok else 'not acknowledged'} {w.worker}"
                         for w in writes[max(0, i - before): i + after])


def grid_ndim(grid: Grid) -> int:
    return len(grid.shape)


def _token(values: list[Any]) -> int | None:
    """The one token a chunk held, or None if it held several or a non-integer."""
    if len(values) != 1:
        return None
    v = values[0]
    if isinstance(v, str):  # a string that is no token (grid.token_of)
        return None
    if isinstance(v, float) and (not math.isfinite(v) or v != int(v)):
        return None
    return int(v)


def _describe(rec: dict[str, Any]) -> str:
    return " ".join(str(rec[k]) for k in ("a", "op") if k in rec)
