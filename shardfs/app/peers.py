"""The status of a mount served by N workers (``-o workers=N``): the mount as a whole.

Each worker writes its own status document every ``PUBLISH_S`` seconds to a file of its slot
beside the supervisor's list of workers (``slot_file``); the worker that answers ``shardfs
status`` (or ``-o metrics``) adds the other slots' last documents to its own (``total``), so
the answer never waits on another worker (one may be busy, or stopped). The others' counts are
then up to ``PUBLISH_S`` seconds old; a worker that died took its counts since its last write
with it (its successor in the slot starts from zero, as a restarted one-worker mount does).

How two documents add up (``plus``): counts add (requests, errors, reads, store requests and
bytes, cache hits, misses, bytes and limits: each worker has its share of the mount's limits,
pending chunks and folds: the owner's), as do histogram counts; a latency percentile is the
highest worker's (not a percentile over every sample); lists of places add up; what names the
mount or the answering process (``IDENTITY``) is the answering worker's.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Mapping, TypeVar

D = TypeVar("D", bound=Any)  # a status document (``shardfs.app.statusdoc.StatusDoc``)
PUBLISH_S = 1.0  # seconds between two writes of a worker's document
IDENTITY = frozenset(("mountpoint", "source", "endpoint", "pid", "uptime_s", "read_only", "options", "worker",
                      "workers", "rss_bytes"))
HIGHEST = frozenset(("p50", "p99"))  # percentiles: the highest worker's
KEPT = frozenset(("le", "current", "journal_error"))  # the same in every worker, or one worker's state


def slot_file(workers_file: str, slot: int) -> str:
    """Where the worker of ``slot`` writes its document."""
    return f"{workers_file.removesuffix('.json')}.{slot}.json"


def publish(workers_file: str, slot: int, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` as slot ``slot``'s (``write_json``)."""
    write_json(slot_file(workers_file, slot), doc)


def write_json(path: str, doc: Any) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (a rename), mode 0600, following no symlink;
    a failure leaves what was there."""
    with contextlib.suppress(OSError):
        fd = os.open(f"{path}.new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, json.dumps(doc).encode())
        finally:
            os.close(fd)
        os.replace(f"{path}.new", path)


def others(workers_file: str, slots: list[int], own: int) -> dict[int, dict[str, Any]]:
    """The last documents the other slots' workers wrote (a slot with none yet is left out)."""
    out = {}
    for slot in slots:
        if slot == own:
            continue
        try:
            with open(slot_file(workers_file, slot), "rb") as f:
                doc = json.loads(f.read())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            out[slot] = doc
    return out


def plus(a: Any, b: Any, key: str = "") -> Any:
    """``a`` and ``b`` (two workers' documents, or parts of them) added up (see the module docstring)."""
    if key in KEPT:
        return a if a is not None else b
    if key in HIGHEST:
        return max((v for v in (a, b) if v is not None), default=None)
    if isinstance(a, bool) or isinstance(b, bool):
        return a or b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a + b
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: (a[k] if k in IDENTITY and not key else plus(a.get(k), b.get(k), k)) if k in a else b[k]
                for k in {**a, **b}}
    if isinstance(a, list) and isinstance(b, list):
        if key == "counts" and len(a) == len(b):  # a histogram's buckets
            return [plus(x, y) for x, y in zip(a, b)]
        return a + b
    return a if a is not None else b


def total(own: D, docs: dict[int, dict[str, Any]]) -> D:
    """``own`` (the answering worker's document) with the other workers' ``docs`` added; each
    entry of ``own["workers"]`` gets its worker's ``requests``, ``forwarded`` and ``open_handles``,
    and ``parked`` (``-o workers=auto``) as that worker's own document says."""
    out = own
    for doc in docs.values():
        out = plus(out, doc)
    for w in out.get("workers", []):
        its = own if w.get("this") else docs.get(w.get("index", -1))
        if its is not None:
            w["requests"] = sum(its.get("requests", {}).values())
            w["forwarded"] = sum(its.get("forwarded", {}).values())
            w["open_handles"] = its.get("open_handles", 0)
            told = [e["parked"] for e in its.get("workers", []) if e.get("this") and "parked" in e]
            if told:
                w["parked"] = told[0]
    return out
