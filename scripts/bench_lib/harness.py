"""The bench's harness: its rows (``Row``), mounts (``Bench.mounted``: shardfs, floorfs, a peer),
cold runs, client processes, datasets (``Bench.setup``) and time budget; the figures
(bench_lib.main, s3rows, scale, peers) are measured with it.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from shardfs.app.mounts import daemon_of
from testkit import datasets as ds

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PY3 = str(REPO / ".venv" / "bin" / "python")
PY2 = os.environ.get("SHARDFS_ZARR2_PYTHON") or str(REPO / ".venv-zarr2" / "bin" / "python")
SHARDFS = str(REPO / ".venv" / "bin" / "shardfs")
CLIENTS = str(HERE / "clients.py")
FLOORFS = str(HERE / "floorfs.py")
MiB = 1 << 20


class BenchError(Exception):
    """A figure could not be measured (the message goes into its row)."""


def byte_compile(baseline: str | None) -> None:
    """Byte-compile the ``shardfs`` package of this checkout and of ``baseline`` (``--baseline``),
    as ``scripts/install`` and ``scripts/test`` do: a mount starts interpreters that each import
    about 130 of its modules, which ``PYTHONDONTWRITEBYTECODE`` (set by many container images)
    would have each compile from source at every mount, a module edited since the install or a
    checkout never installed (a ``git worktree``) alike: measured, a mount of an uncompiled
    checkout 0.37 s slower to go live and 0.35 s more CPU (doc/BENCHMARKING.md)."""
    for checkout in (REPO, *([Path(baseline)] if baseline else [])):
        compileall.compile_dir(str(checkout / "shardfs"), quiet=1, workers=0)


@dataclass
class Row:
    figure: str
    unit: str = ""
    mount: float | None = None
    baseline: float | None = None
    ratio: float | None = None
    target: str = "report"
    status: str = "report"  # PASS / FAIL / report / ERROR
    note: str = ""
    # for the chart: an upper bound on the ratio, or an absolute bound on ``mount``
    ratio_max: float | None = None
    abs_target: float | None = None
    abs_dir: str = ""  # ">=" or "<"
    # floor rows (baseline = through floorfs): floorfs time / real-copy time, FUSE's own cost
    floor_ratio: float | None = None


@dataclass
class Mounted:
    mnt: Path
    pid: int
    seconds: float  # until mounted
    proc: subprocess.Popen | None = None  # a floorfs or peer child (shardfs daemons are not our children)
    peer: bool = False  # a peer filesystem (ratarmount, fuse-zip): stopped with ``fusermount3 -u -z``
    package: str | None = None  # ``--baseline``: the checkout whose shardfs serves it (and unmounts it)


def _daemon_by_argv(mnt: str) -> int | None:
    """The oldest process of this user whose command line is a shardfs daemon's for ``mnt``
    (``... -m shardfs mount SRC MNT -f ...``): the daemon of a checkout without a status socket."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            started = int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])
        except (OSError, ValueError, IndexError):
            continue
        words = [a.decode(errors="replace") for a in argv]
        if "shardfs" in words and "mount" in words and mnt in words and "-f" in words \
                and os.stat(f"/proc/{pid}").st_uid == os.getuid():
            found.append((started, int(pid)))
    return min(found)[1] if found else None


def status_of(mnt: Path) -> dict[str, Any]:
    """``shardfs status MNT --json``: the mount's status document."""
    r = subprocess.run([str(SHARDFS), "status", str(mnt), "--json"], capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    return dict(json.loads(r.stdout))


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def rotate(items: list, k: int) -> list:
    k %= len(items)
    return items[k:] + items[:k]


def is_mounted(mnt: Path) -> bool:
    target = os.path.realpath(mnt)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == target:
                return True
    return False


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants now: a supervised shardfs mount is a supervisor (the pid the
    bench finds) and its worker, which serves; "the daemon" is both."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass
    return out


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of ``pid`` with its descendants (``process_tree``), in bytes."""
    out = {"VmRSS": 0, "VmHWM": 0}
    for i, p in enumerate(process_tree(pid)):
        try:
            for key, value in proc_status_of(p).items():
                out[key] += value
        except OSError:
            if i == 0:
                raise
    return out


def proc_status_of(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of ``pid`` alone, in bytes (``OSError`` if it is gone)."""
    out = {"VmRSS": 0, "VmHWM": 0}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in out:
                out[key] = int(rest.split()[0]) * 1024
    return out


def pss(pid: int) -> int:
    """The proportional set size of ``pid`` in bytes (0 if it is gone): each page it shares
    counted as its share (a forked worker's pages shared with its zygote: half each)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peaks(pid: int) -> dict[str, int]:
    """The memory of ``pid`` with its descendants (``process_tree``), in bytes: ``hwm``, their
    peak resident sets summed (``proc_status``: a page shared by two of them counted twice),
    ``largest``, the largest one's peak (a supervised mount's serving worker), and ``pss``, their
    proportional set sizes now summed (each page once: the mount's memory)."""
    tree = process_tree(pid)
    hwm = []
    for p in tree:
        with contextlib.suppress(OSError):
            hwm.append(proc_status_of(p)["VmHWM"])
    return {"hwm": sum(hwm), "largest": max(hwm, default=0), "pss": sum(pss(p) for p in tree)}


def proc_io(pid: int) -> dict[str, int]:
    """/proc/PID/io of ``pid`` with its descendants (``process_tree``), summed."""
    out: dict[str, int] = {}
    for p in process_tree(pid):
        with open(f"/proc/{p}/io") as f:
            for k, v in (line.split(":") for line in f if ":" in line):
                out[k] = out.get(k, 0) + int(v)
    return out


def cache_drops() -> int:
    """How many times a process dropped the kernel's caches (``vm.drop_caches``) since boot, as
    ``/proc/vmstat`` counts them (``drop_pagecache`` + ``drop_slab``; 0 where it does not)."""
    n = 0
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith(("drop_pagecache ", "drop_slab ")):
                    n += int(line.split()[1])
    except OSError:
        pass
    return n


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Tally:
    """The figures of each pass by side, less the passes after another process dropped the
    kernel's caches (``others_dropped``: ``Bench.others_dropped``): such a pass found the
    names and pages of its mount evicted, a warm pass made a cold one's requests (measured: a
    2nd ``cat`` pass 2-3x slower, a warm zarr read with a LOOKUP a chunk file) whatever the
    mount's own cost, and one side's spoiled pass against the other's clean one made the
    supervised mount look 2-3x slower than an unsupervised one (doc/BENCHMARKING.md). The
    figures with a second pass keep their figures here (``peers``, ``cat``)."""

    def __init__(self, others_dropped: Callable[[], bool]) -> None:
        self.others_dropped = others_dropped
        self.kept: dict[str, dict[str, list[float]]] = {}  # figure -> side -> values
        self.spoiled: dict[str, dict[str, list[float]]] = {}  # the same, of spoiled passes
        self.left_out: list[str] = []  # the spoiled passes, "figure side" (its first figure)
        self.shown: list[str] = []  # the figures put since the caller last took them, for the log
        self.fallback: set[tuple[str, str]] = set()  # (figure, side) of spoiled passes only (``values``)

    def put(self, side: str, **values: float | None) -> bool:
        """The figures of one pass of ``side``, just ended (None: not measured); True if spoiled."""
        dropped = self.others_dropped()
        if dropped:
            self.left_out.append(f"{next(iter(values))} {side}")
        for key, value in values.items():
            if value is not None:
                (self.spoiled if dropped else self.kept).setdefault(key, {}).setdefault(side, []).append(value)
                self.shown.append(f"{key} {value:.3g}" + " (spoiled)" * dropped)
        return dropped

    def values(self) -> tuple[dict[str, dict[str, list[float]]], str | None]:
        """Each figure's values by side: the clean passes', else (none clean) the spoiled ones'
        (noted in ``fallback``); and the line saying what was left out or kept (None if nothing was
        spoiled)."""
        out = {key: dict(d) for key, d in self.kept.items()}
        if not self.left_out:
            return out, None
        kept = []
        for key, d in self.spoiled.items():
            for side, v in d.items():
                if side not in out.setdefault(key, {}):
                    out[key][side] = v
                    kept.append(f"{key} {side}")
                    self.fallback.add((key, side))
        return out, (f"{len(self.left_out)} passes left out of the medians, another process dropped the kernel's "
                     f"caches before them (vm.drop_caches): {', '.join(self.left_out)}"
                     + (f"; kept for want of a clean one: {', '.join(kept)}" if kept else ""))


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.smoke: bool = args.smoke
        self.sizes = ds.SMOKE if self.smoke else ds.FULL
        self.reps: int = args.reps or (1 if self.smoke else 3)
        self.timeout: float = 120.0 if self.smoke else 300.0
        self.t_start = time.perf_counter()
        self.load_start = os.getloadavg()
        self.out = Path(args.out).resolve()
        if args.workdir:
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
            self.work = Path(tempfile.mkdtemp(prefix="shardfs-bench.", dir=args.workdir))
        else:
            self.work = Path(tempfile.mkdtemp(prefix="shardfs-bench.", dir="/tmp"))
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.active: dict[Path, Mounted] = {}  # mountpoint -> its mount, for cleanup
        self.rows: list[Row] = []
        self.raw: dict[str, Any] = {}
        self.problems: list[str] = []
        self.drop_ok = True
        self.max_rss: dict[str, int] = {}  # mount name -> its processes' peak RSS summed (``peaks``)
        self.memory: dict[str, dict[str, int]] = {}  # mount name -> ``peaks`` at the unmount of its largest PSS
        self.budget: float = 45.0 if self.smoke else 720.0  # seconds, leaving room for overruns and cleanup
        self.figure = ""
        self.allowance = math.inf
        self.reps_done: dict[str, int] = {}
        self.drops_seen = cache_drops()  # after the bench's own last drop (``others_dropped``)
        self.dropped_by_others = False  # since then

    # ----- plumbing ---------------------------------------------------------------------------

    def repeat(self, reps: int | None = None) -> Iterator[int]:
        """Repetition numbers for the current figure: ``reps`` of them, fewer when another one
        would overrun the figure's share of the time budget (always at least one)."""
        reps = reps or self.reps
        start = time.perf_counter()
        done = 0
        for rep in range(reps):
            if rep:
                spent = time.perf_counter() - start
                if spent + spent / rep > self.allowance:
                    self.problems.append(f"{self.figure}: {rep} of {reps} repetitions (time budget)")
                    break
            yield rep
            done = rep + 1
        self.reps_done[self.figure] = done

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def op_timeout(self) -> float:
        """Limit for one operation: the usual one, cut so a hang cannot overrun the budget much."""
        left = self.budget - (time.perf_counter() - self.t_start)
        return max(30.0, min(self.timeout, left + 60.0))

    def run(self, cmd: list[str], cwd: Path | None = None, timeout: float | None = None,
            stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess:
        timeout = timeout or self.op_timeout()
        try:
            r = subprocess.run([str(c) for c in cmd], cwd=cwd, stdout=stdout, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BenchError(f"timed out after {timeout:.0f} s: {' '.join(map(str, cmd))[:120]}") from None
        if r.returncode:
            tail = (r.stderr or "").strip().splitlines()[-3:]
            raise BenchError(f"exit {r.returncode}: {' '.join(map(str, cmd))[:100]}: {' | '.join(tail)[:300]}")
        return r

    def client(self, python: str, *args: Any) -> dict:
        r = self.run([python, CLIENTS, *args])
        return json.loads(r.stdout.strip().splitlines()[-1])

    def shell(self, script: str, cwd: Path | None = None, out: Path | None = None) -> float:
        """Wall time of ``bash -c script`` (a separate process), stdout to ``out`` or /dev/null."""
        with open(out or os.devnull, "w") as f:
            t0 = time.perf_counter()
            self.run(["bash", "-c", f"set -o pipefail; {script}"], cwd=cwd, stdout=f)
            return time.perf_counter() - t0

    def drop_caches(self) -> None:
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError as e:
            if self.drop_ok:
                self.problems.append(f"cannot drop page caches ({e.strerror}): 'cold' figures are warm")
            self.drop_ok = False
        self.drops_seen, self.dropped_by_others = cache_drops(), False

    def others_dropped(self) -> bool:
        """True if another process dropped the kernel's caches (``vm.drop_caches``: the tests and
        benches of other checkouts on a shared machine do) since this bench last dropped them: a
        pass meanwhile, or any later one until the bench drops them again, found names and pages
        of its mount evicted (a drop during the 1st pass evicts what the 2nd would find), and its
        time and requests are a cold pass's (a 2nd ``cat`` pass 2-3x slower, a warm read with a
        LOOKUP a chunk file), whatever the mount's own cost."""
        if cache_drops() != self.drops_seen:
            self.dropped_by_others = True
        return self.dropped_by_others

    @contextlib.contextmanager
    def mounted(self, src: Path | str, name: str, floor: bool = False, rw: bool = False, ro: bool = False,
                options: str = "", peer: list[str] | None = None, package: str | None = None,
                env: dict[str, str] | None = None) -> Iterator[Mounted]:
        """A fresh mount of ``src`` (a directory, or an ``s3://`` URL) on ``WORK/mnt/NAME``, timed:
        ``shardfs mount`` (``-o ro`` with ``ro``, ``-o OPTIONS`` with ``options``),
        or with ``floor`` a ``floorfs.py`` child (the pyfuse3 floor; writable with ``rw``), or with
        ``peer`` that foreground command with ``SRC MNT`` appended, as our child (bench_lib/peers.py);
        ``package``: a checkout whose ``shardfs`` the daemon imports (``--baseline``); ``env``: added
        to the daemon's environment.
        Always unmounted afterwards, lazily if need be; raises BenchError when the clean unmount failed
        (after the body succeeded)."""
        mnt = self.work / "mnt" / name
        mnt.mkdir(parents=True, exist_ok=True)
        if peer is not None:
            m = self._mount_child([*peer, str(src), str(mnt)], mnt, name, peer=True)
        elif floor:
            m = self._mount_child([PY3, FLOORFS, *["--rw"] * rw, str(src), str(mnt)], mnt, name)
        else:
            m = self._mount_shardfs(src, mnt, name, ro, options, package, env)
        self.active[mnt] = m
        try:
            yield m
        except BaseException:
            self._unmount(m, name)
            raise
        else:
            err = self._unmount(m, name)
            if err:
                raise BenchError(err)

    def _mount_shardfs(self, src: Path | str, mnt: Path, name: str, ro: bool, options: str,
                       package: str | None = None, env: dict[str, str] | None = None) -> Mounted:
        """``shardfs mount [-o ro] [-o OPTIONS] SRC MNT`` (it returns once mounted; the daemon is found by
        mountpoint)."""
        t0 = time.perf_counter()
        try:
            # another checkout's package may name another entry point: ``python -m shardfs`` runs its own
            # (-P: not this checkout's, which ``-m`` would find first in the working directory)
            r = subprocess.run([*([PY3, "-P", "-m", "shardfs"] if package else [SHARDFS]), "mount", *["-o", "ro"] * ro,
                                *["-o", options] * bool(options),
                                str(src), str(mnt), "--log-file", str(self.logs / f"{name}.log")],
                               capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                               env={**os.environ, **({"PYTHONPATH": package} if package else {}), **(env or {})})
        except subprocess.TimeoutExpired:
            self._force_unmount(mnt, None)
            raise BenchError("shardfs mount did not return within 60 s") from None
        seconds = time.perf_counter() - t0
        if r.returncode:
            self._force_unmount(mnt, None)
            raise BenchError(f"shardfs mount failed: {r.stderr.strip()[:300]}")
        daemon = daemon_of(str(mnt))
        deadline = time.monotonic() + 10  # (a loaded machine: its status may answer a moment late)
        while daemon is None and time.monotonic() < deadline:
            time.sleep(0.1)
            daemon = daemon_of(str(mnt))
            if daemon is None and package and time.monotonic() > deadline - 8:
                # a checkout older than the status socket (51c2d68): its daemon by command line
                pid = _daemon_by_argv(str(mnt))
                if pid is not None:
                    return Mounted(mnt, pid, seconds, package=package)
        if daemon is None:
            self._force_unmount(mnt, None)
            raise BenchError("mounted, but no daemon answers for the mountpoint on its status socket")
        return Mounted(mnt, daemon.pid, seconds, package=package)

    def _mount_child(self, cmd: list[str], mnt: Path, name: str, peer: bool = False) -> Mounted:
        """Start ``cmd`` (a filesystem serving MNT in the foreground: floorfs.py, or a peer) as our child
        (output to logs/NAME.log); ready once MNT is a mount point. A child that exits or is not
        mounted within 30 s is a BenchError."""
        log = self.logs / f"{name}.log"
        with open(log, "a") as f:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.perf_counter()
        while not is_mounted(mnt):
            if proc.poll() is not None or time.perf_counter() - t0 > 30:
                self._force_unmount(mnt, proc.pid, proc)
                tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
                raise BenchError(f"{Path(cmd[0 if peer else 1]).name} did not mount (exit {proc.returncode}): "
                                 f"{tail[:300]}")
            time.sleep(0.01)
        return Mounted(mnt, proc.pid, time.perf_counter() - t0, proc, peer)

    def _unmount(self, m: Mounted, name: str) -> str | None:
        """Unmount ``m`` the clean way, then make sure it is gone; the clean way's error, if any."""
        if m.proc is None:
            try:
                mem = peaks(m.pid)
                self.max_rss[name] = max(self.max_rss.get(name, 0), mem["hwm"])
                if mem["pss"] >= self.memory.get(name, mem)["pss"]:
                    self.memory[name] = mem
            except OSError:
                pass
        if m.peer:  # fusermount3 -u -z, then its process killed (by pid) only if it does not exit
            killed = len(self.problems)
            self._force_unmount(m.mnt, m.pid, m.proc)
            return self.problems[-1] if len(self.problems) > killed else None
        err = self._stop_floor(m) if m.proc is not None else self._stop_shardfs(m)
        self._force_unmount(m.mnt, m.pid, m.proc)
        return err

    def _stop_shardfs(self, m: Mounted) -> str | None:
        """``shardfs umount MNT`` (it waits for the daemon to fold and exit)."""
        limit = self.op_timeout()
        try:  # (a ``--baseline`` checkout's mount: its own ``shardfs umount``)
            r = subprocess.run([*([PY3, "-P", "-m", "shardfs"] if m.package else [SHARDFS]), "umount", str(m.mnt),
                                "--timeout", str(int(limit))],
                               capture_output=True, text=True, timeout=limit + 30, stdin=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONPATH": m.package} if m.package else None)
            if r.returncode or is_mounted(m.mnt):
                return f"shardfs umount failed: {r.stderr.strip()[:200]}"
        except subprocess.TimeoutExpired:
            return f"shardfs umount did not return within {limit + 30:.0f} s"
        return None

    @staticmethod
    def _stop_floor(m: Mounted) -> str | None:
        """SIGTERM to our floorfs child: it unmounts and exits 0."""
        assert m.proc is not None
        m.proc.send_signal(signal.SIGTERM)
        try:
            rc = m.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            return "floorfs did not exit within 30 s of SIGTERM"
        if rc or is_mounted(m.mnt):
            return f"floorfs exited with status {rc}{', still mounted' if is_mounted(m.mnt) else ''}"
        return None

    def _force_unmount(self, mnt: Path, pid: int | None, proc: subprocess.Popen | None = None) -> None:
        """Lazily unmount ``mnt`` if still mounted, wait up to 10 s for its server ``pid`` to exit, kill it
        (by pid) if it does not; reap ``proc`` (a floorfs child)."""
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=30)
        if pid is not None:
            deadline = time.monotonic() + 10
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive(pid):  # the daemon we started did not exit: kill it, by pid only
                self.problems.append(f"daemon {pid} did not exit after unmount; killed")
                os.kill(pid, signal.SIGKILL)
        if proc is not None:
            proc.wait(timeout=10)
        self.active.pop(mnt, None)

    def cleanup(self) -> None:
        for m in list(self.active.values()):
            self._force_unmount(m.mnt, m.pid, m.proc)
        if not self.args.keep:
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.work)], capture_output=True)

    @contextlib.contextmanager
    def cold(self, side: str, name: str) -> Iterator[Path]:
        """The root under which to measure ``side`` once, cold (page caches dropped just before the
        yield): "mount" a fresh shardfs mount of big (log NAME), "ro" the same read-only (log
        ro-NAME), "floor" a fresh floorfs mount of the real v2 copy (log floor-NAME), "copy" the
        copy, "native" big itself. Mounts end after."""
        if side in ("mount", "ro", "floor"):
            floor, ro = side == "floor", side == "ro"
            log = f"{side}-{name}" if side != "mount" else name
            with self.mounted(self.copy if floor else self.big, log, floor, ro=ro) as m:
                self.drop_caches()
                yield m.mnt
        else:
            self.drop_caches()
            yield self.big if side == "native" else self.copy

    # ----- datasets ---------------------------------------------------------------------------

    def setup(self) -> None:
        s = self.sizes
        self.big, self.meta, self.small = self.work / "big", self.work / "meta", self.work / "small"
        self.shards = self.work / "shards"
        self.log(f"building datasets in {self.work}")
        data = ds.build_big(self.big, s)
        self.vol_sum = int(data.sum(dtype="uint64"))
        self.vol_half_sum = int(data[: -(-data.shape[0] // 2)].sum(dtype="uint64"))  # what dask_read sums
        self.vol_npy = self.work / "vol.npy"
        import numpy as np

        np.save(self.vol_npy, data)
        self.vol_bytes = data.nbytes
        del data
        self.many_info = ds.build_many(self.meta, s)
        ds.build_small(self.small)
        ds.build_tiny(self.shards, s.tiny_shards)
        self.log(f"  vol {s.vol_shape} ({self.vol_bytes / MiB:.0f} MiB), many: {self.many_info['stored']} "
                 f"stored chunks in {self.many_info['shards']} shards")

        self.copy = self.work / "copy"
        self.copy.mkdir()
        with self.mounted(self.big, "setup-big") as m:
            for name in ("vol", "large"):
                dst = self.copy / name
                dst.mkdir()
                t = self.shell(f"find . -maxdepth 1 -type f -print0 | xargs -0 -r cp -t {dst}", cwd=m.mnt / name)
                self.raw[f"copy_{name}_seconds"] = t
        self.vol_names = sorted(p.name for p in (self.copy / "vol").iterdir() if p.name[0] != ".")
        self.large_names = sorted(p.name for p in (self.copy / "large").iterdir() if p.name[0] != ".")
        n_vol = math.prod(-(-a // c) for a, c in zip(s.vol_shape, s.vol_chunk))
        if len(self.vol_names) != n_vol:
            raise BenchError(f"mount shows {len(self.vol_names)} chunk files of vol, expected {n_vol}")
        self.large_bytes = sum((self.copy / "large" / n).stat().st_size for n in self.large_names)
        self.log(f"  real v2 copies of vol ({len(self.vol_names)} files) and large ({len(self.large_names)} files, "
                 f"{self.large_bytes / len(self.large_names) / MiB:.1f} MiB each) copied from the mount with cp")

        with self.mounted(self.meta, "setup-meta") as m:
            n = ds.v2_copy_from_source(self.meta / "many", m.mnt / "many", self.copy / "many", s)
            names_mnt = sorted(e.name for e in os.scandir(m.mnt / "many") if e.is_file())
            names_copy = sorted(e.name for e in os.scandir(self.copy / "many"))
            if names_mnt != names_copy:
                raise BenchError(f"meta/many: mount lists {len(names_mnt)} files, the copy has {len(names_copy)}")
            for name in random.Random(3).sample(names_copy, min(200, len(names_copy))):
                if (m.mnt / "many" / name).read_bytes() != (self.copy / "many" / name).read_bytes():
                    raise BenchError(f"meta/many/{name}: mount and source bytes differ")
        self.many_files = n
        self.log(f"  real v2 copy of many: {n} chunk files cut from the shards, names and a sample checked "
                 "against the mount")
        tiny = self.copy / "tiny"
        tiny.mkdir()
        for i in range(s.tiny_shards):
            (tiny / str(i)).write_bytes(ds.tiny_value(i))
        with self.mounted(self.shards, "setup-shards") as m:
            names = sorted(e.name for e in os.scandir(m.mnt / "tiny") if e.is_file() and e.name[0] != ".")
            if names != sorted(e.name for e in os.scandir(tiny)):
                raise BenchError(f"shards/tiny: mount lists {len(names)} files, the copy has {s.tiny_shards}")
        (self.work / "vol.list").write_text("\n".join(self.vol_names) + "\n")
        (self.work / "large.list").write_text("\n".join(self.large_names) + "\n")

    # ----- rows -------------------------------------------------------------------------------

    @staticmethod
    def ratio_row(figure: str, unit: str, mount: float, baseline: float, ratio_max: float | None,
                  ratio: float | None = None) -> Row:
        r = mount / baseline if ratio is None else ratio
        row = Row(figure, unit, mount, baseline, r, ratio_max=ratio_max)
        if ratio_max is not None:
            row.target = f"≤ {ratio_max:g}x"
            row.status = "PASS" if r <= ratio_max else "FAIL"
        return row

    @classmethod
    def floor_row(cls, figure: str, unit: str, mount: float, floor: float, copy: float,
                  baseline: str = "the copy", over: str = "of the copy") -> Row:
        """``"  floor: FIGURE a pyfuse3 passthrough OVER"``: ratio = mount / floorfs, what shardfs
        adds to the least any pyfuse3 filesystem costs; ``floor_ratio`` (and the note) = floorfs / copy
        (or the figure's other ``baseline``), what FUSE + pyfuse3 cost by themselves. Times (lower is
        better) only."""
        row = cls.ratio_row(f"  floor: {figure} a pyfuse3 passthrough {over}", unit, mount, floor, None)
        row.floor_ratio = floor / copy
        row.note = f"passthrough itself {row.floor_ratio:.2f}x {baseline}"
        return row

    @staticmethod
    def abs_check(row: Row, target: float, direction: str, text: str) -> Row:
        row.abs_target, row.abs_dir, row.target = target, direction, text
        assert row.mount is not None
        ok = row.mount >= target if direction == ">=" else row.mount < target
        row.status = "PASS" if ok else "FAIL"
        return row


# share of the remaining time budget each figure may use (roughly its cost at full size)
