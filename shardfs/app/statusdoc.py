"""The status document's schema: one type, ``StatusDoc``, made of each layer's snapshot type
(the ``TypedDict`` beside the object that counts: ``kernel.stats.Requests``/``Reads``,
``storage.stats.Store``, ``base.lru.CacheCounts``, ``base.faults.FaultCounts``,
``writes.writeback.PendingCounts``/``FoldCounts``). Everything shown of a mount is made from
it: the daemon's JSON (``shardfs.app.status``: the document served as it is), the screen of
``shardfs status`` (``shardfs.app.status_client.format_text``), the ``-o stats_interval`` line,
the Prometheus series (``shardfs.app.metrics``) and umount's progress (``shardfs.app.progress``).

``read`` is the way back: a document a daemon sent, checked against the schema (a JSON object
with every key ``StatusDoc`` requires, each of the JSON kind its type says) before anything
reads it as a ``StatusDoc``; ``NotADocument`` (one line) otherwise, as from a daemon of another
version of shardfs. A mount no daemon answers for is an ``Unserved`` one.

Three readers take a daemon's JSON as it came (``mounts.Daemon.doc``), each one key or two,
because that daemon may run another version of shardfs and must still be served: finding a
mount's daemon by its ``mountpoint`` (``mounts.daemon_of``), the handover of a live mount to a
new worker at an upgrade (``handover``: its ``options``, ``read_only`` and ``worker``), and
umount's report of what each process's journal kept (``cli``: the ``worker``/``workers`` pids).

Imported by the client, so it imports no layer: their types are named for the type checker
only (quoted names), and what ``read`` checks is the top level. (No ``from __future__ import
annotations`` here: ``NotRequired`` must be seen at run time to tell the required keys.)
"""

import types
import typing
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast, final

if TYPE_CHECKING:
    from shardfs.base.faults import FaultCounts
    from shardfs.base.lru import CacheCounts
    from shardfs.kernel.stats import Reads
    from shardfs.storage.stats import Store
    from shardfs.writes.writeback import FoldCounts, PendingCounts


class Worker(TypedDict):
    """A supervised mount's serving worker."""

    pid: int
    started: float
    restarts: int
    takeovers: int
    last_reason: str | None


class WorkerEntry(TypedDict):
    """One of the N workers of a mount with ``-o workers=N`` (``Status._workers``; the last three
    added by ``shardfs.app.peers.total``)."""

    index: int
    pid: int
    started: float | None
    rss_bytes: int
    cpu_s: float
    this: bool  # the worker that answered
    requests: NotRequired[int]
    forwarded: NotRequired[int]
    open_handles: NotRequired[int]
    parked: NotRequired[bool]  # ``-o workers=auto``: not reading the connection (``shardfs.kernel.elastic``)


class StatusDoc(TypedDict):
    """The status document (``Status.snapshot``; doc/SEMANTICS.md lists its fields)."""

    mountpoint: str
    source: str
    endpoint: str | None
    pid: int
    uptime_s: float
    read_only: bool
    options: dict[str, str]
    worker: NotRequired[Worker]  # a supervised mount's serving worker
    requests: dict[str, int]
    errors: dict[str, dict[str, int]]
    reads: "Reads"
    store: "Store"
    cache: dict[str, "CacheCounts | None"]
    pending: "PendingCounts"
    folds: "FoldCounts"
    internal_errors: "FaultCounts"
    errors_last_minute: dict[str, dict[str, int]]
    rss_bytes: int
    open_files: int
    open_handles: int
    forwarded: dict[str, int]  # ``-o workers=N``, a writable mount: requests sent to the owner worker
    workers: NotRequired[list[WorkerEntry]]  # ``-o workers=N``: each worker


@final
class Unserved(TypedDict):
    """A shardfs mount whose status no daemon gives: its daemon is gone (``dead``), answers no
    request (``stuck``), or sent what ``read`` does not take (``unreadable``: why)."""

    mountpoint: str
    source: str
    dead: NotRequired[bool]
    stuck: NotRequired[bool]
    unreadable: NotRequired[str]


class NotADocument(ValueError):
    """What a daemon sent is not a ``StatusDoc``; ``str()`` says why in one line."""


def _kinds(hint: Any) -> tuple[type, ...]:
    """The JSON kinds (Python types ``json`` reads) of a value of type ``hint``."""
    if hint is types.NoneType:
        return (type(None),)
    if hint is float:
        return (int, float)
    if isinstance(hint, type) and typing.is_typeddict(hint):
        return (dict,)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return tuple(k for arg in typing.get_args(hint) for k in _kinds(arg))
    if origin is NotRequired:
        return _kinds(typing.get_args(hint)[0])
    if isinstance(origin, type):
        return (origin,)
    return (hint,) if isinstance(hint, type) else (dict,)  # a layer's TypedDict, named for the checker only


def _schema() -> dict[str, tuple[type, ...]]:
    """Each key of ``StatusDoc``: the JSON kinds its value may be."""
    layers = {name: dict for name in ("Reads", "Store", "CacheCounts", "FaultCounts", "FoldCounts", "PendingCounts")}
    hints = typing.get_type_hints(StatusDoc, localns=layers)
    return {key: _kinds(hint) for key, hint in hints.items()}


SCHEMA = _schema()


def read(value: Any) -> StatusDoc:
    """``value`` (a JSON document a daemon sent) as a ``StatusDoc``; ``NotADocument`` if it is not
    one (not an object, a key missing, a value of another kind)."""
    if not isinstance(value, dict):
        raise NotADocument("not a JSON object")
    missing = sorted(StatusDoc.__required_keys__ - value.keys())
    if missing:
        raise NotADocument(f"no {', '.join(missing)}")
    wrong = sorted(k for k, kinds in SCHEMA.items() if k in value and not isinstance(value[k], kinds))
    if wrong:
        raise NotADocument(f"{', '.join(wrong)} of another kind")
    return cast(StatusDoc, value)
