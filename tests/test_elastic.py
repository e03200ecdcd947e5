"""``-o workers=auto`` (the default): of the workers it starts, the first serves always and the
others only while requests queue up (doc/SEMANTICS.md, "Workers"; ``shardfs.kernel.elastic``).

The daemons of the tests count 2 cores (``SHARDFS_TEST_CORES``, set by conftest), so ``auto`` is
one worker; these tests count 4: two workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import run_shardfs, status, wait_for
from test_restart import two_arrays

pytestmark = pytest.mark.skipif(
    "workers" not in __import__("importlib.metadata").metadata.version("pyfuse3"),
    reason="needs the pyfuse3 scripts/pyfuse3 builds (non-blocking reads of clones)")

FOUR_CORES = {"SHARDFS_TEST_CORES": "4"}
OPTIONS = "ro,entry_timeout=0,attr_timeout=0"  # every open is a LOOKUP and an OPEN: they reach a worker


@pytest.fixture
def src(tmp_path) -> Path:
    return two_arrays(tmp_path / "src")


def chunk_files(mnt: Path) -> list[Path]:
    return sorted(p for name in "ab" for p in (mnt / name).iterdir() if not p.name.startswith("."))


def each_worker(mnt: Path) -> dict[int, dict]:
    """Each worker's entry of ``shardfs status`` by slot, once every worker wrote its counts
    after its last request (up to a second: ``shardfs.app.peers``)."""
    time.sleep(1.2)
    return {w["index"]: w for w in status(mnt)["workers"]}


def read_serially(files: list[Path], passes: int = 1) -> None:
    for _ in range(passes):
        for p in files:
            with open(p, "rb") as f:
                f.read()


def test_auto_starts_half_the_cores_and_a_serial_reader_is_served_by_the_first_alone(mount, src):
    """4 cores: two workers. A serial reader's 1536 opens are all served by worker 0 (worker 1
    parked: no request); four readers at once queue requests up, and worker 1 is woken and serves
    some; a second after, it parks again, and a serial reader is worker 0's alone again (under
    load a pass may look busy and wake it for a second: then the next pass is).
    ``shardfs status`` shows worker 1 parked (``parked``; "(parked)" in its text)."""
    mnt = mount(src, "-o", OPTIONS, env=FOUR_CORES)
    files = chunk_files(mnt)
    assert len(files) == 512
    wait_for(lambda: len(status(mnt).get("workers", [])) == 2, 30, "two workers listed")
    read_serially(files, 3)
    workers = each_worker(mnt)
    assert workers[1]["requests"] == 0, workers
    assert workers[0]["requests"] >= 3 * 512 * 2
    assert (workers[0]["parked"], workers[1]["parked"]) == (False, True)
    assert "(parked)" in run_shardfs("status", str(mnt)).stdout

    def four_readers() -> bool:
        readers = [subprocess.Popen(["cat", *map(str, files[i::4])], stdout=subprocess.DEVNULL) for i in range(4)]
        assert [r.wait(timeout=120) for r in readers] == [0] * 4
        return each_worker(mnt)[1]["requests"] > 0

    wait_for(four_readers, 120, "worker 1 woken by four readers")
    served: list[tuple[int, int, bool, bool]] = []

    def a_serial_pass_is_worker_0s() -> bool:
        # (worker 1 parks at its next look for a request a second after it was woken; on a
        # loaded machine a serial pass may look busy and wake it for a second again: the next one
        # is worker 0's alone, which a worker 1 that never parks never gives)
        before = each_worker(mnt)
        read_serially(files)
        after = each_worker(mnt)
        served.append((after[0]["requests"] - before[0]["requests"], after[1]["requests"] - before[1]["requests"],
                       after[0]["parked"], after[1]["parked"]))
        return served[-1][1] == 0

    wait_for(a_serial_pass_is_worker_0s, 120, "a serial pass served by worker 0 alone")
    assert served[-1][0] >= 512 * 2 and served[-1][2:] == (False, True), served
    assert status(mnt)["internal_errors"]["total"] == 0


def test_the_parked_workers_serve_while_the_first_is_replaced(mount, src):
    """A serial reader runs while worker 0 is SIGKILLed: the supervisor wakes worker 1, which
    serves the reader until the new worker 0 does; no read fails or returns other bytes."""
    mnt = mount(src, "-o", OPTIONS, env=FOUR_CORES)
    files = chunk_files(mnt)
    want = {p: p.read_bytes() for p in files}
    wait_for(lambda: len(status(mnt).get("workers", [])) == 2, 30, "two workers listed")
    first = {w["index"]: w["pid"] for w in status(mnt)["workers"]}
    served_by_1 = each_worker(mnt)[1]["requests"]
    stop = threading.Event()
    problems: list[str] = []
    reads = [0]

    def reader() -> None:
        while not stop.is_set():
            for p in files:
                try:
                    if p.read_bytes() != want[p]:
                        problems.append(f"{p.name}: other bytes")
                except OSError as e:
                    problems.append(f"{p.name}: {e}")
                reads[0] += 1

    t = threading.Thread(target=reader)
    t.start()
    try:
        time.sleep(0.5)
        os.kill(first[0], signal.SIGKILL)

        def replaced() -> bool:
            now = {w["index"]: w["pid"] for w in status(mnt).get("workers", [])}
            return now.get(0) not in (None, first[0])

        wait_for(replaced, 30, "a new worker 0")
        during = reads[0]  # (the reads from before the kill until the new worker 0 is listed)
        # every file read again since: a pass's time, not a fixed 0.5 s (in the CI run of f7c1631
        # the reader had not begun its second pass of the 512 files when those ended)
        wait_for(lambda: reads[0] >= during + len(files), 60, "every file read again after the replacement")
    finally:
        stop.set()
        t.join(timeout=120)
    assert problems == [] and during > 0
    assert each_worker(mnt)[1]["requests"] > served_by_1
    assert mount.info(mnt).log_text().count("starting another on the same connection") == 1
