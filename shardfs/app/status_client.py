"""The client's side of ``shardfs status``: find the live mounts, ask their daemons, show it.

A mount is found in the kernel's mount table, its daemon through its status socket in this
user's own state directories (``shardfs.app.mounts.daemon_of``: the kernel names the listening
process, which must be this user's): mounts of other users have none there, so without a
mountpoint only this user's mounts are shown.

What a daemon sends is read back as the one schema it was made from (``shardfs.app.statusdoc``:
``StatusDoc``, checked by ``read``); the screen (``format_text``) is made from that type. A
mount whose daemon sends what the schema does not take (a daemon of another version) is shown
as ``unreadable``, with why, beside the ``dead`` and ``stuck`` ones (``Unserved``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from shardfs.app import statusdoc
from shardfs.app.mounts import PROBE_TIMEOUT, daemon_of, daemons, mounts, unserved
from shardfs.app.statusdoc import StatusDoc, Unserved

if TYPE_CHECKING:
    from shardfs.base.lru import CacheCounts

Shown = StatusDoc | Unserved  # what ``shardfs status`` shows of one mount


class StatusError(Exception):
    """A mount's status cannot be had; ``str()`` is one line saying why."""


def status_of(mnt: str) -> Shown:
    """The status of the shardfs mount at ``mnt``; ``StatusError`` if there is none to ask."""
    mnt = os.path.abspath(mnt)
    if mnt not in mounts():
        raise StatusError(f"{mnt}: not a shardfs mount")
    daemon = daemon_of(mnt)
    if daemon is not None:
        return _read(daemon.doc, mnt)
    gone = unserved_doc(mnt)
    if gone is None:
        raise StatusError(f"{mnt}: no shardfs daemon of this user answers for it (another user's mount, a dead "
                          "one, or one that could not make its status socket: its log says why)")
    return gone


def _read(doc: dict[str, Any], mnt: str) -> Shown:
    """The document a daemon sent for ``mnt`` as a ``StatusDoc``, or an ``unreadable`` one."""
    try:
        return statusdoc.read(doc)
    except statusdoc.NotADocument as e:
        return {"mountpoint": mnt, "source": str(doc.get("source", "?")), "unreadable": str(e)}


def unserved_doc(mnt: str) -> Unserved | None:
    """The status of ``mnt`` if it is a shardfs mount no daemon serves (``unserved``):
    ``{"mountpoint", "source", "dead": true}`` or ``{..., "stuck": true}``; else None."""
    gone = unserved(mnt)
    if gone is None:
        return None
    return {"mountpoint": mnt, "source": gone[0], "dead": True} if gone[1] == "dead" else \
        {"mountpoint": mnt, "source": gone[0], "stuck": True}


def all_statuses() -> list[Shown]:
    """The status of every live shardfs mount of this user (those with a socket that answers),
    and of every one no daemon serves (``unserved_doc``)."""
    live = mounts()
    docs = {mnt: _read(d.doc, mnt) for d in daemons() if (mnt := d.doc.get("mountpoint")) in live}
    for mnt in live:
        gone = None if mnt in docs else unserved_doc(mnt)
        if gone is not None:
            docs[mnt] = gone
    return [docs[mnt] for mnt in sorted(docs)]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _uptime(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _counts(counts: dict[str, int], most: int = 6) -> str:
    top = sorted(counts.items(), key=lambda item: -item[1])
    shown = ", ".join(f"{k} {v:,}" for k, v in top[:most])
    return shown + (", ..." if len(top) > most else "")


def _n(count: int, word: str, plural: str = "") -> str:
    """``1 chunk``, ``2 chunks``, ``1,024 chunk files``: ``word``, or unless ``count`` is 1 its
    plural (``plural``, else ``word`` + "s")."""
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


def _hit_rate(c: CacheCounts | None) -> str:
    if c is None:
        return "-"
    asked = c["hits"] + c["misses"]
    rate = f"hit rate {100 * c['hits'] / asked:.0f}% of {_n(asked, 'lookup')}" if asked else "unused"
    return f"{rate}, {_size(c['bytes'])} of {_size(c['limit'])}"


def format_text(doc: Shown) -> str:
    """One screen for one mount: a header, the figures that matter, then the problems."""
    if "pid" not in doc:
        return _unserved_text(doc)
    store, reads, pending, folds = doc["store"], doc["reads"], doc["pending"], doc["folds"]
    lat = store["latency_ms"]
    n_requests = sum(doc["requests"].values())
    n_errors = sum(n for by_op in doc["errors"].values() for n in by_op.values())
    lines = [f"{doc['mountpoint']}  <-  {doc['source']}",
             f"  pid {doc['pid']}, up {_uptime(doc['uptime_s'])}, {'read-only' if doc['read_only'] else 'read-write'}"
             f", RSS {_size(doc['rss_bytes'])}, {_n(doc['open_files'], 'open file')}",
             *(["  workers   " + ", ".join(
                 f"{w['index']}: pid {w['pid']} {_size(w['rss_bytes'])} {w['cpu_s']:.1f} s CPU"
                 + (f" {w['requests']:,} requests" if "requests" in w else "")
                 + (f" ({w['forwarded']:,} forwarded)" if w.get("forwarded") else "")
                 + (" (parked)" if w.get("parked") else "")
                 + (" (answered)" if w.get("this") else "") for w in doc["workers"])]
               if doc.get("workers") else []),
             f"  requests  {n_requests:,}" + (f" ({_counts(doc['requests'])})" if n_requests else "")
             + f"; {_n(n_errors, 'error')}",
             f"  reads     {_n(reads['chunk_files'], 'chunk file')} opened, {_size(reads['bytes'])} read",
             f"  store     {_counts(store['requests']) or 'no requests'}; {_size(store['bytes_in'])} in, "
             f"{_size(store['bytes_out'])} out; latency p50 {lat['p50']} ms, p99 {lat['p99']} ms; "
             f"{_n(store['retries'], 'retry', 'retries')}, {_n(store['failures'], 'failure')}",
             f"  caches    index {_hit_rate(doc['cache']['index'])}; chunk {_hit_rate(doc['cache']['chunk'])}"
             + (f"; range {_hit_rate(doc['cache']['range'])}" if doc["cache"]["range"] else ""),
             f"  pending   {_n(pending['chunks'], 'chunk')} ({_size(pending['bytes'])}) in "
             f"{_n(pending['shards'], 'shard')}; "
             f"journal {_size(pending['journal_bytes'])}, spill {_size(pending['spill_bytes'])}",
             f"  folds     {folds['done']:,} done, {folds['failed']:,} failed, {len(folds['backing_off'])} backing off"]
    for array, per in sorted(pending["arrays"].items()):
        lines.append(f"            {array or '/'}: {_n(per['chunks'], 'chunk')} in {_n(per['shards'], 'shard')}")
    problems = [f"  fold of {b['shard']} backing off ({_n(b['failures'], 'failure')}, "
                f"{_n(b['chunks'], 'chunk')} kept): {b['reason']}; next try in {b['retry_in_s']:g} s"
                for b in folds["backing_off"]]
    failed = pending.get("journal_error")
    if failed:
        problems.append(f"  write journal {failed['directory']}: {failed['reason']} ({failed['errno']}), "
                        f"{failed['seconds_ago']:g} s ago: writes fail until there is room again")
    problems += [f"  internal error in {b['where']} x{b['count']}, last {b['seconds_ago']:g} s ago: {b['error']} "
                 "(a bug: its traceback is in the log)" for b in doc["internal_errors"]["by_place"]]
    recent = doc["errors_last_minute"]
    if recent:
        problems.append("  errors in the last minute: " + ", ".join(
            f"{name} {op} x{n}" for name, by_op in recent.items() for op, n in by_op.items()))
    lines += ["problems:", *problems] if problems else ["no problems"]
    return "\n".join(lines)


def _unserved_text(doc: Unserved) -> str:
    """The screen of a mount no daemon gives the status of (``Unserved``)."""
    head = f"{doc['mountpoint']}  <-  {doc['source']}\n"
    if doc.get("dead"):
        return (f"{head}  dead: its daemon is gone (Transport endpoint is not connected); shardfs umount "
                f"{doc['mountpoint']} detaches it, the next mount of the source folds its pending writes")
    if doc.get("stuck"):
        return (f"{head}  stuck: its daemon has not answered a request for {PROBE_TIMEOUT:g} s (stopped, or stuck: "
                "its log may say why); every access to the mount waits until it answers (kill -CONT a stopped "
                f"one); fusermount3 -u -z {doc['mountpoint']} detaches it")
    return (f"{head}  unreadable: its daemon's status document is not this shardfs's ({doc.get('unreadable')}): "
            f"a daemon of another version; shardfs mount over it hands it to a new worker")


def clear_screen() -> str:
    """The terminal's clear-screen sequence (terminfo: ``--watch`` redraws), or "" if it has none."""
    import curses

    try:
        curses.setupterm()
        return (curses.tigetstr("clear") or b"").decode()
    except curses.error:
        return ""
