"""``-o metrics=HOST:PORT``: the mount's counters at ``/metrics`` in the Prometheus text format.

Real mounts, real scrapes over HTTP (parsed with prometheus_client's own parser): each series
against what the test did (chunk files opened and bytes read, requests and errors by operation
and errno, a write folded), and every counter against what ``shardfs status --json`` says at
the same moment (one source of truth). ``PORT`` alone listens on loopback only (seen in
/proc/net/tcp); a port in use or a bad value fails the mount with one line; the port is
closed once the mount ends.
"""

from __future__ import annotations

import errno
import os
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import lazy_unmount, run_shardfs, wait_for
from shardfs.app.metrics import SERIES
from shardfs.app.status_client import status_of
from sources import build
from test_fuse_cli import env
from test_hostile import H, chunk_bytes, errno_of, read_bytes, write_file
from test_status import settled
from writers import umount


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of ``http://127.0.0.1:PORT/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain"), r.headers
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[("shardfs_" + name, tuple(sorted(labels.items())))]


def listening_on(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) listening on ``port``."""
    out = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and int(local.split(":")[1], 16) == port:
            out.append(local.split(":")[0])
    return out


def test_scrape_counts_what_the_test_did_as_status_does(tmp_path, mount):
    src = tmp_path / "src"
    build(src, [H])
    port = free_port()
    mnt = mount(src, "-o", f"metrics={port}")
    assert listening_on(port) == ["0100007F"]  # 127.0.0.1 only
    names = ["0.0", "0.1", "1.0", "3.3"]
    sizes = [len(read_bytes(mnt / "h" / n)) for n in names]
    assert errno_of(os.stat, mnt / "h" / "9.9") == errno.ENOENT
    assert errno_of(os.mkdir, mnt / "h" / "c" / "0" / "0" / "x") == errno.EPERM
    write_file(mnt / "h" / H.chunk_name((0, 1)), chunk_bytes(1)[1])
    wait_for(lambda: status_of(str(mnt))["folds"]["done"] == 1, 20, "the write folded")
    settled(mnt)  # (with N workers, each answer adds the others' counts as they last wrote them)

    got = scrape(port)
    doc = status_of(str(mnt))
    assert value(got, "info", mountpoint=str(mnt), source=str(src)) == 1
    assert value(got, "chunk_files_opened_total") == len(names) == doc["reads"]["chunk_files"]
    assert value(got, "read_bytes_total") == sum(sizes) == doc["reads"]["bytes"]
    assert value(got, "requests_total", operation="open") == len(names) + 1  # the write's open too
    assert value(got, "errors_total", operation="mkdir", errno="EPERM") == 1
    assert value(got, "errors_total", operation="lookup", errno="ENOENT") >= 1
    assert value(got, "folds_total") == 1 and value(got, "fold_failures_total") == 0
    assert value(got, "store_requests_total", kind="REPLACE") == 1
    assert value(got, "pending_chunks") == 0 and value(got, "folds_backing_off") == 0
    assert value(got, "restarts_total") == 0 and value(got, "internal_errors_total") == 0
    # every counter is the status document's figure (nothing happened in between)
    assert {op: value(got, "requests_total", operation=op) for op in doc["requests"]} == doc["requests"]
    assert {(op, name): value(got, "errors_total", operation=op, errno=name)
            for name, by_op in doc["errors"].items() for op in by_op} == \
        {(op, name): n for name, by_op in doc["errors"].items() for op, n in by_op.items()}
    store = doc["store"]
    assert {k: value(got, "store_requests_total", kind=k) for k in store["requests"]} == store["requests"]
    assert (value(got, "store_received_bytes_total"), value(got, "store_sent_bytes_total")) == \
        (store["bytes_in"], store["bytes_out"])
    latency = store["latency_s"]
    assert value(got, "store_request_duration_seconds_count") == latency["counts"][-1] == \
        store["latency_ms"]["samples"] > 0  # the timed requests (fewer than 1024: all kept for the percentiles)
    assert value(got, "store_request_duration_seconds_bucket", le="+Inf") == latency["counts"][-1]
    assert [value(got, "store_request_duration_seconds_bucket", le=f"{le:g}") for le in latency["le"]] == \
        latency["counts"][:-1]
    for cache in ("index", "chunk"):
        assert (value(got, "cache_hits_total", cache=cache), value(got, "cache_misses_total", cache=cache)) == \
            (doc["cache"][cache]["hits"], doc["cache"][cache]["misses"])
    assert value(got, "cache_hits_total", cache="index") + value(got, "cache_misses_total", cache="index") > 0
    assert value(got, "journal_bytes") == doc["pending"]["journal_bytes"]
    families = {name.removesuffix("_total") for name in SERIES}
    exposed = {name.removeprefix("shardfs_").removesuffix("_total") for name, _ in got}
    assert families <= {n.removesuffix("_count").removesuffix("_sum").removesuffix("_bucket") for n in exposed}

    umount(mount, mnt)
    with pytest.raises(OSError):
        scrape(port)


def test_a_port_in_use_or_a_bad_address_fails_the_mount_with_one_line(tmp_path, mnt_dir):
    src = tmp_path / "src"
    build(src, [H])
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = run_shardfs("mount", str(src), str(mnt_dir), "-o", f"metrics=127.0.0.1:{port}", env=env())
        assert (r.returncode, r.stderr) == (
            1, f"shardfs: error: -o metrics=127.0.0.1:{port}: cannot listen: Address already in use\n")
    assert not os.path.ismount(mnt_dir)
    r = run_shardfs("mount", str(src), str(mnt_dir), "-o", "metrics=localhost", env=env())
    assert (r.returncode, r.stderr) == (1, "shardfs: error: -o metrics=localhost: not HOST:PORT "
                                           "(or PORT, on 127.0.0.1)\n")
    lazy_unmount(mnt_dir)


def test_a_worker_restart_is_counted_and_the_port_served_again(tmp_path, mount):
    """The supervisor's worker SIGKILLed: the next worker serves ``/metrics`` on the same port,
    ``shardfs_restarts_total`` 1 (the status's ``worker.restarts``)."""
    from test_restart import kill_worker

    src = tmp_path / "src"
    build(src, [H])
    port = free_port()
    mnt = mount(src, "-o", f"metrics={port},workers=1")  # (one worker's restart, as in tests/test_restart.py)
    assert value(scrape(port), "restarts_total") == 0
    kill_worker(mount.info(mnt), mnt)
    wait_for(lambda: listening_on(port) == ["0100007F"], 20, "the new worker listening")
    got = scrape(port)
    assert value(got, "restarts_total") == 1 == status_of(str(mnt))["worker"]["restarts"]
    assert len(read_bytes(mnt / "h" / "0.0")) > 0
    assert value(scrape(port), "chunk_files_opened_total") == 1  # counted since the new worker started
