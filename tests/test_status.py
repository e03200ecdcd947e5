"""``shardfs status``: each counter against what the test did, through real mounts.

The daemon answers over a 0600 unix socket in its state directory (never an entry of the
mount); ``--json`` gives the document, the plain form one screen per mount. Counters checked:
chunk files opened and bytes read; requests and errors by operation; chunks pending, folds
done, store replaces; a shard that cannot be folded (a FIFO) backing off by name; the GETs,
HEADs and LISTs of an ``s3://`` mount against what a recording proxy saw; ``-o
stats_interval`` logging a summary line.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from testkit.delayproxy import DelayProxy
from conftest import SHARDFS, run_shardfs, wait_for
from shardfs.app.peers import PUBLISH_S
from shardfs.app.status_client import status_of
from shardfs.app.state import status_sockets
from source_kinds import BucketSource, unique_prefix
from sources import build
from test_hostile import H, chunk_bytes, errno_of, read_bytes, write_file
from writers import umount


def status_json(mnt: Path | None = None) -> dict | list:
    r = run_shardfs("status", "--json", *([str(mnt)] if mnt else []))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def status_once(mnt: Path, cond: Callable[[dict], bool], what: str) -> dict:
    """The first status document of ``mnt`` for which ``cond(doc)`` holds (within 20 s): with
    ``-o workers=N`` the worker that answers adds the others' counts as they were up to
    ``PUBLISH_S`` before (doc/SEMANTICS.md "Workers"): what another worker did shows a moment later."""
    got: list[dict] = []

    def shown() -> bool:
        doc = status_json(mnt)
        assert isinstance(doc, dict), doc
        got[:] = [doc]
        return cond(doc)

    wait_for(shown, 20, what)
    return got[0]


COUNTED = ("requests", "errors", "reads", "store", "folds", "pending")  # what ``settled`` waits to agree on


def settled(mnt: Path, seconds: float = 30) -> dict:
    """The status of ``mnt`` once every worker answers the same counts (``COUNTED``), unchanged for
    more than ``PUBLISH_S``: with ``-o workers=N`` the worker that answers adds the others' counts
    as they last wrote them (every ``PUBLISH_S`` while busy: later on a loaded machine), so an
    answer right after a request may lack it. One worker: its first unchanged answer."""
    answered: dict[int, dict] = {}  # by the index of the worker that answered: its counts
    last: dict | None = None
    since = time.monotonic()
    deadline = since + seconds
    while True:
        doc: Any = status_of(str(mnt))
        counts = {k: doc[k] for k in COUNTED}
        if counts != last:
            last, since = counts, time.monotonic()
        workers = doc.get("workers") or [{"index": 0, "this": True}]
        answered[next(w["index"] for w in workers if w["this"])] = counts
        if (time.monotonic() - since > PUBLISH_S and len(answered) == len(workers)
                and all(c == counts for c in answered.values())):
            return doc
        assert time.monotonic() < deadline, f"the workers' counts of {mnt} differ after {seconds} s: {answered}"
        time.sleep(0.2)


def test_reads_requests_and_errors_are_counted(tmp_path, mount):
    src = tmp_path / "src"
    build(src, [H])
    mnt = mount(src)
    pid = mount.info(mnt).proc.pid
    names = ["0.0", "0.1", "1.0", "3.3", "2.1"]
    sizes = [len(read_bytes(mnt / "h" / n)) for n in names]
    assert errno_of(os.stat, mnt / "h" / "9.9") == errno.ENOENT  # beyond the edge
    assert errno_of(os.mkdir, mnt / "h" / "c" / "0" / "0" / "x") == errno.EPERM  # no directories in a shard

    settled(mnt)
    doc = status_json(mnt)
    assert doc["mountpoint"] == str(mnt) and doc["source"] == str(src) and doc["pid"] == pid
    assert doc["read_only"] is False and doc["uptime_s"] >= 0 and doc["options"] == {}
    assert doc["reads"] == {"chunk_files": len(names), "bytes": sum(sizes)}
    assert doc["requests"]["open"] == len(names)
    assert doc["requests"]["release"] == len(names)
    assert doc["errors"]["ENOENT"]["lookup"] >= 1 and doc["errors"]["EPERM"] == {"mkdir": 1}
    assert doc["errors_last_minute"] == {"EPERM": {"mkdir": 1}}  # ENOENT is an answer, not a problem
    assert doc["store"]["requests"]["READ"] >= 1 and doc["store"]["failures"] == 0
    assert doc["store"]["latency_ms"]["p50"] is not None
    assert doc["cache"]["index"]["limit"] > 0 and doc["cache"]["range"] is None
    assert doc["pending"] == {"chunks": 0, "bytes": 0, "shards": 0, "arrays": {}, "journal_bytes": 0,
                              "journal_error": None, "spill_bytes": 0}
    assert doc["folds"] == {"done": 0, "failed": 0, "backing_off": [], "current": None}
    assert doc["rss_bytes"] > 10 << 20 and doc["open_files"] > 3
    # the socket: the daemon's own, mode 0600, in the state directory, not in the mount
    (sock,) = [p for p in status_sockets() if p.endswith(f"/status-{pid}.sock")]
    assert stat.S_ISSOCK(os.stat(sock).st_mode) and stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert not any("status" in name for name in os.listdir(mnt))
    # without MNT: a list holding this mount; the plain form: one screen
    assert str(mnt) in [d["mountpoint"] for d in status_json()]
    text = run_shardfs("status", str(mnt))
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"{mnt}  <-  {src}\n")
    assert f"  reads     {len(names)} chunk files opened" in text.stdout
    assert text.stdout.endswith("\nproblems:\n  errors in the last minute: EPERM mkdir x1\n")
    umount(mount, mnt)
    assert not any(p.endswith(f"/status-{pid}.sock") for p in status_sockets())  # removed at exit


def test_watch_shows_it_again(tmp_path, mount):
    src = tmp_path / "src"
    build(src, [H])
    mnt = mount(src)
    proc = subprocess.Popen([SHARDFS, "status", "--watch", "0.2", str(mnt)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    shown = threading.Event()

    def count() -> None:
        seen = 0
        assert proc.stdout is not None  # (stdout=PIPE)
        for line in proc.stdout:
            seen += line == f"{mnt}  <-  {src}\n"
            if seen == 3:
                shown.set()

    reader = threading.Thread(target=count, daemon=True)
    reader.start()
    try:  # three screens: a generous time-out that catches a hang (a loaded machine is slow), not a rate
        assert shown.wait(60), "shardfs status --watch 0.2 did not show the mount three times in 60 s"
    finally:
        proc.kill()  # our own child
        proc.wait()
        reader.join(10)  # (it reads to the end of the output: closing it first broke its loop)
        assert proc.stdout is not None
        proc.stdout.close()


def test_status_of_something_else_is_one_line(tmp_path):
    r = run_shardfs("status", str(tmp_path))
    assert (r.returncode, r.stderr) == (1, f"shardfs: error: {tmp_path}: not a shardfs mount\n")
    r = run_shardfs("status", "--watch", "0", str(tmp_path))
    assert r.returncode == 1 and "--watch 0: not a positive number of seconds" in r.stderr


def test_the_document_and_the_screen_are_made_from_one_schema(tmp_path):
    """In-process: a mount's document (``Status`` over the counters ``compose`` registered) is
    read back from its JSON as a ``StatusDoc`` (``statusdoc.read``) and the screen is made from
    that; a document without a key of the schema, or with a value of another kind, is refused
    (``NotADocument``) and its mount shown as ``unreadable``, saying why, never as figures."""
    from inproc import InProcess
    from shardfs.app import status_client, statusdoc
    from shardfs.app.status import Status

    src = tmp_path / "src"
    build(src, [H])
    with InProcess(src) as fs:
        assert "0.0" in (fs / "h").iterdir() and (fs / "h" / "0.0").read_bytes()
        status = Status(fs.mount.counters(), "/mnt/x", str(src), None, True, {"ro": ""}, None)
        doc = statusdoc.read(json.loads(json.dumps(status.snapshot())))
    assert set(doc) == set(statusdoc.SCHEMA) - {"worker", "workers"}
    assert doc["reads"]["chunk_files"] == 0 and doc["reads"]["bytes"] == 0  # (no kernel: no FUSE request)
    text = status_client.format_text(doc)
    assert text.startswith(f"/mnt/x  <-  {src}\n  pid {os.getpid()}, up ") and text.endswith("\nno problems")
    assert "  caches    index hit rate " in text and "  pending   0 chunks (0 B) in 0 shards" in text
    for broken, why in [({k: v for k, v in doc.items() if k != "forwarded"}, "no forwarded"),
                        ({**doc, "store": [], "pid": "1"}, "pid, store of another kind"), ([doc], "not a JSON object")]:
        with pytest.raises(statusdoc.NotADocument) as e:
            statusdoc.read(broken)
        assert str(e.value) == why
    shown = status_client._read({**doc, "pending": None}, "/mnt/x")
    assert shown == {"mountpoint": "/mnt/x", "source": str(src), "unreadable": "pending of another kind"}
    assert status_client.format_text(shown) == (
        f"/mnt/x  <-  {src}\n  unreadable: its daemon's status document is not this shardfs's (pending of another "
        "kind): a daemon of another version; shardfs mount over it hands it to a new worker")


def test_written_chunks_are_pending_then_folded(tmp_path, mount):
    src = tmp_path / "src"
    build(src, [H])
    mnt = mount(src)
    written = [(0, 1), (1, 0), (3, 2)]  # shards (0, 0) and (1, 1): incomplete, folded once idle
    for k, idx in enumerate(written):
        write_file(mnt / "h" / H.chunk_name(idx), chunk_bytes(k)[1])
    doc = status_once(mnt, lambda d: d["folds"]["done"] >= 2, "the writes folded")
    assert doc["pending"]["chunks"] == 0 and doc["pending"]["shards"] == 0 and doc["pending"]["arrays"] == {}
    assert doc["folds"]["failed"] == 0 and doc["folds"]["backing_off"] == []
    assert doc["store"]["requests"]["REPLACE"] == doc["folds"]["done"] == 2
    assert doc["store"]["bytes_out"] == sum(os.stat(H.shard_file(src, s)).st_size for s in ((0, 0), (1, 1)))
    assert doc["requests"]["flush"] >= len(written) and doc["errors"] == {}
    umount(mount, mnt)


def test_a_fifo_shard_is_one_backing_off_entry(tmp_path, mount):
    src = tmp_path / "src"
    build(src, [H])
    mnt = mount(src)
    write_file(mnt / "h" / H.chunk_name((0, 1)), chunk_bytes(1)[1])
    fifo = H.shard_file(src, (0, 0))
    os.rename(fifo, tmp_path / "shard00")  # well within the idle time before the fold
    os.mkfifo(fifo)
    doc = status_once(mnt, lambda d: d["folds"]["failed"] >= 1, "the fold failed")
    (entry,) = doc["folds"]["backing_off"]
    assert entry["shard"] == str(fifo) and entry["reason"] == "not a regular file (a FIFO)"
    assert entry["chunks"] == 1 and entry["failures"] >= 1 and 0 <= entry["retry_in_s"] <= 300
    assert doc["pending"]["chunks"] == 1 and doc["pending"]["shards"] == 1
    assert doc["pending"]["arrays"] == {"h": {"chunks": 1, "bytes": len(chunk_bytes(1)[1]), "shards": 1}}
    assert doc["pending"]["journal_bytes"] > len(chunk_bytes(1)[1])
    texts: list[str] = []

    def problem_shown() -> bool:  # (by a worker that knows the owner's failure: see ``status_once``)
        texts[:] = [run_shardfs("status", str(mnt)).stdout]
        return "backing off (" in texts[0]

    wait_for(problem_shown, 20, "the fold's failure shown by shardfs status")
    text = texts[0]
    assert f"problems:\n  fold of {fifo} backing off (" in text and "not a regular file (a FIFO)" in text
    os.unlink(fifo)
    os.rename(tmp_path / "shard00", fifo)
    doc = status_once(mnt, lambda d: d["pending"]["chunks"] == 0, "the kept change folded")
    assert doc["folds"]["backing_off"] == []
    umount(mount, mnt)


def test_stats_interval_logs_a_summary_line(tmp_path, mount):
    src = tmp_path / "src"
    build(src, [H])
    mnt = mount(src, "-o", "stats_interval=0.3")
    read_bytes(mnt / "h" / "0.0")
    m = mount.info(mnt)
    wait_for(lambda: "1 chunk files" in m.log_text(), 10, "a stats line")
    line = next(ln for ln in m.log_text().splitlines() if "stats: " in ln and "1 chunk files" in ln)
    assert "pending 0 chunks in 0 shards; folds 0 done, 0 failed, 0 backing off; rss " in line
    r = run_shardfs("mount", str(src), str(tmp_path / "m2"), "-o", "stats_interval=0")
    assert r.returncode == 1 and "-o stats_interval=0: not a positive number of seconds" in r.stderr


def test_s3_store_requests_are_what_the_server_saw(s3, tmp_path, mount, request):
    build(tmp_path / "src", [H])
    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0, record=True) as proxy:
        src = BucketSource(tmp_path / "src", s3, unique_prefix(request), endpoint=f"http://127.0.0.1:{proxy.port}")
        mnt = src.mount(mount)
        time.sleep(0.3)  # anything the mount started is done
        before = settled(mnt)["store"]
        proxy.log.clear()
        for name in ("0.0", "0.1", "2.3", "3.3"):
            read_bytes(mnt / "h" / name)
        write_file(mnt / "h" / H.chunk_name((1, 1)), chunk_bytes(1)[1])
        wait_for(lambda: status_of(str(mnt))["folds"]["done"] == 1, 20, "the write folded")
        time.sleep(0.3)
        after = settled(mnt)["store"]
        seen = collections.Counter(r.method for r in proxy.log)
    counted = collections.Counter(after["requests"]) - collections.Counter(before["requests"])
    assert seen["GET"] >= 2 and seen["PUT"] == 1
    assert counted == seen, (counted, seen)
    assert after["bytes_out"] - before["bytes_out"] == s3_size(src, H.shard_key((0, 0)))
    assert after["failures"] == before["failures"] == 0
    assert status_of(str(mnt))["cache"]["range"]["hits"] + status_of(str(mnt))["cache"]["range"]["misses"] >= 4


def s3_size(src: BucketSource, key: str) -> int:
    import obstore

    return obstore.head(src.objects.store(), key)["size"]


@pytest.fixture(autouse=True)
def _no_user_state(monkeypatch):
    """Status sockets are looked up in the suite's XDG_STATE_HOME (conftest), never the user's."""
    assert os.environ.get("XDG_STATE_HOME", "").startswith("/")
