"""``scripts/soak``: mixed load and faults on real mounts, checked against a model (issue 27).

    scripts/soak [--minutes N] [--source local|s3|both] [--seed S] [--out DIR]

``both`` runs the two sources side by side (``--one-at-a-time``: one after the other). Per
source: build the arrays (``dataset``), start two daemons on the same source (A with its journal
on a small tmpfs, B with a state directory of its own: another host), the S3 server and
the ``FaultProxy`` in front of it for ``s3``; run 16 readers (zarr 2.18, zarr 3 v2-mode,
tensorstore), 4 writers (two per mount, overlapping on a hot set), one structure worker, and
the seeded fault schedule for N minutes; check reads as they age (``checks.Ledger``); then the
#3682 pattern through mount A, ``shardfs umount`` of both (timed), the source read natively
against the model, the same #3682 write natively with zarr-python 3. Writes ``DIR/SOURCE/``
(op logs, daemon logs, ``minutes.csv``, ``soak.png``) and ``DIR/summary.md``; prints the
failures with the seed and their op log, and last
``soak: N operations, F faults, lost L, forbidden R, wedged W (seed S)``; exit status 0 only
when L = R = W = 0.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

import numpy as np

from soak_lib import dataset, hazard, metrics, report
from soak_lib.checks import Ledger
from soak_lib.daemons import Daemon, Wedged, immutable
from soak_lib.faults import LOCAL_KINDS, S3_KINDS, Injector, JournalDisk, schedule
from soak_lib.grid import Grid
from soak_lib.model import Model

REPO = Path(__file__).resolve().parents[2]

MAIN_PYTHON = str(REPO / ".venv" / "bin" / "python")
ZARR2_PYTHON = os.environ.get("SHARDFS_ZARR2_PYTHON") or str(REPO / ".venv-zarr2" / "bin" / "python")
READERS = 16
READER_LIBS = ("zarr2", "zarr3", "tensorstore")
WRITERS = (("zarr2", 0), ("main", 0), ("zarr2", 1), ("main", 1))  # (venv, mount)
HANG = 180.0  # an operation still running after this long is wedged
LAG = 30.0  # reads are checked once this old (every write that began before them has logged)
TIMEOUT = 5  # -o timeout for the S3 mounts: stalls last longer
UMOUNT_TIMEOUT = 120.0
FAULT_EVERY = 40.0  # seconds between faults, on average
HAZARD_PARTS, HAZARD_THREADS = 3, 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="scripts/soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="minutes of load per source (default 10)")
    ap.add_argument("--source", choices=("local", "s3", "both"), default="both")
    ap.add_argument("--seed", type=int, default=None, help="seed of every random choice (default: drawn)")
    ap.add_argument("--out", type=Path, default=Path("soak-out"), help="output directory (default soak-out)")
    ap.add_argument("--faults", default=None, metavar="KIND,...",
                    help="only these fault kinds (default: all the source allows: " + ", ".join(S3_KINDS) + ")")
    ap.add_argument("--mounts", type=int, choices=(1, 2), default=2,
                    help="daemons on the source (default 2: the second one is another host, its own state)")
    ap.add_argument("--workers", type=int, default=None, metavar="N",
                    help="daemon A serves with -o workers=N (default: the mount's own, as daemon B; "
                         "a worker-kill kills one of them)")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="with --source both, run the sources one after the other (default: side by side)")
    ap.add_argument("--fault-every", type=float, default=FAULT_EVERY, metavar="S",
                    help=f"seconds between faults on average (default {FAULT_EVERY:g})")
    return ap.parse_args(argv)


class Run:
    """One source's soak (see the module docstring); ``result`` once ``run()`` returned."""

    def __init__(self, kind: str, minutes: float, seed: int, out: Path, faults: tuple[str, ...] | None = None,
                 fault_every: float = FAULT_EVERY, mounts: int = 2, workers: int | None = None):
        self.kind, self.minutes, self.seed, self.out = kind, minutes, seed, out
        kinds = S3_KINDS if kind == "s3" else LOCAL_KINDS
        self.fault_kinds = tuple(k for k in kinds if faults is None or k in faults)
        self.fault_every = fault_every
        self.mounts = mounts
        self.n_workers = workers  # ``-o workers=N`` of daemon A (None: the mount's default)
        self.rng = random.Random(f"{seed}-{kind}")
        self.result = report.Result(kind, minutes)
        self.model = Model()
        self.workers: list[subprocess.Popen] = []
        self.daemons: list[Daemon] = []
        self.server: Any = None
        self.proxy: Any = None
        self.objects: Any = None

    # ---------------------------------------------------------------- setup

    def _source(self, stack: ExitStack, src: Path) -> tuple[str, list[str], dict[str, str]]:
        """The URL to mount, its mount options and the daemons' environment."""
        if self.kind == "local":
            return str(src), [], {}
        from testkit.seaweed import SeaweedS3, upload
        from testkit.faultproxy import ProxyProcess

        self.server = SeaweedS3(self.out / "s3").start()
        stack.callback(self.server.stop)
        self.objects = upload(self.server, src, f"soak-{self.seed}")
        self.proxy = ProxyProcess(("127.0.0.1", self.server.ports["s3.port"]), stall=3 * TIMEOUT)
        self.proxy.start()
        stack.callback(self.proxy.close)
        env = {k: v for k, v in self.server.env.items() if k != "AWS_ENDPOINT_URL"}
        return self.objects.url, [f"endpoint=http://127.0.0.1:{self.proxy.port}", f"timeout={TIMEOUT}"], env

    def _spawn(self, index: int, role: str, python: str, params: dict[str, Any], deadline: float,
               heartbeat: Path) -> Path:
        name = f"{index:02d}-{role}-{params.get('lib', '')}-m{params.get('m', 0)}"
        log = self.out / "ops" / f"{name}.jsonl"
        config = {"role": role, "worker": name, "index": index, "seed": f"{self.seed}-{self.kind}-{index}",
                  "deadline": deadline, "log": str(log), "heartbeat": str(heartbeat), **params}
        cfg = self.out / "ops" / f"{name}.json"
        cfg.write_text(json.dumps(config))
        with open(self.out / "ops" / f"{name}.stderr", "wb") as err:
            # scripts/soak puts scripts/ on PYTHONPATH, which the worker inherits
            self.workers.append(subprocess.Popen([python, "-m", "soak_lib.worker", str(cfg)], stdout=err,
                                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        return log

    # ---------------------------------------------------------------- the run

    def run(self) -> report.Result:
        for old in self.out.glob("mnt-*"):  # a run that ended without its finally blocks
            immutable(old, False)
        shutil.rmtree(self.out, ignore_errors=True)
        (self.out / "ops").mkdir(parents=True)
        src = self.out / "src"
        specs = dataset.build(src, self.rng, self.model)
        with ExitStack() as stack:
            try:
                self._run(stack, src, specs)
            except Wedged as e:
                self.result.wedged.append(str(e))
            finally:
                for p in self.workers:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
        return self.result

    def _run(self, stack: ExitStack, src: Path, specs: dict[str, dataset.ArraySpec]) -> None:
        url, options, env = self._source(stack, src)
        disk = JournalDisk(self.out / "journal-A")
        disk.mount()
        stack.callback(disk.unmount)
        for name in "AB"[: self.mounts]:
            state = self.out / f"state-{name}"
            opts = options + ([f"journal_dir={disk.path}"] if name == "A" else []) + (
                [f"workers={self.n_workers}"] if name == "A" and self.n_workers is not None else [])
            d = Daemon(name, url, self.out / f"mnt-{name}", opts, {**env, "XDG_STATE_HOME": str(state)}, self.out)
            stack.callback(d.close)
            self.daemons.append(d)
            d.start()
        journals = {"A": disk.path, "B": self._state_journal(url, options, self.out / "state-B")}
        journals = {d.name: journals[d.name] for d in self.daemons}
        mnt = [str(d.mnt) for d in self.daemons]
        zarrays = {n: json.loads((Path(mnt[0]) / n / ".zarray").read_text()) for n in specs}
        arrays = {n: {"zarray": zarrays[n], "shard": list(specs[n].shard)} for n in specs}
        grids = {n: Grid(zarrays[n]) for n in specs}
        injector = Injector(self.daemons, disk, self.proxy, self.server)
        ledger = Ledger(self.model, grids, len(self.daemons), injector)
        sampler = metrics.Sampler(self.daemons, journals)
        heartbeat = self.out / "ops" / "heartbeat"
        heartbeat.write_bytes(b"\0" * 8 * 64)
        t0 = time.monotonic()
        deadline = t0 + 60 * self.minutes
        logs = []
        for i in range(READERS):
            lib = READER_LIBS[i % len(READER_LIBS)]
            m = 1 if i % 4 == 3 and self.mounts > 1 else 0
            logs.append(self._spawn(1 + i, "reader", ZARR2_PYTHON if lib == "zarr2" else MAIN_PYTHON,
                                    {"lib": lib, "mount": mnt[m], "m": m, "arrays": arrays}, deadline, heartbeat))
        for j, (venv, m) in enumerate(w for w in WRITERS if w[1] < self.mounts):
            logs.append(self._spawn(1 + READERS + j, "writer", ZARR2_PYTHON if venv == "zarr2" else MAIN_PYTHON,
                                    {"lib": venv, "mount": mnt[m], "m": m, "mounts": len(mnt), "arrays": arrays},
                                    deadline, heartbeat))
        logs.append(self._spawn(1 + READERS + len(WRITERS), "structure", ZARR2_PYTHON,
                                {"lib": "zarr2", "mount": mnt[0], "m": 0}, deadline, heartbeat))
        events = schedule(self.rng, 60 * self.minutes, self.fault_kinds, self.fault_every,
                          len(self.daemons)) if self.fault_kinds else []
        (self.out / "faults.json").write_text(json.dumps([e.__dict__ for e in events], indent=1))
        stop = threading.Event()
        injector.start(events, t0, stop)
        print(f"soak [{self.kind}]: {len(self.workers)} client processes, {len(events)} faults scheduled, "
              f"{self.minutes:g} min (seed {self.seed}); logs in {self.out}", flush=True)
        self._watch(ledger, sampler, injector, logs, heartbeat, t0, deadline)
        stop.set()
        if not injector.join(120):
            self.result.wedged.append("the fault injector did not finish within 120 s of the end")
        if self.proxy is not None:
            self.proxy.set_fault(None)
        self.result.wedged += [f"fault injection: {e}" for e in injector.errors]
        self._hazard_through_mount(mnt[0])
        for d in reversed(self.daemons):
            status, seconds, rc = d.umount(UMOUNT_TIMEOUT)
            self.result.umount_seconds.append(seconds)
            if status == -1 or rc is None:
                self.result.wedged.append(f"shardfs umount of daemon {d.name} not done within {UMOUNT_TIMEOUT:g} s")
            elif status or rc:
                self.result.unclean.append(f"shardfs umount of daemon {d.name}: status {status}, daemon exit {rc}:\n"
                                           + d.tail(2000))
        ledger.poll(logs)
        ledger.validate(math.inf)
        reader = self._native_reader(src)
        ledger.final_check(reader)
        self._hazard_results(reader)
        self._finish(ledger, sampler, injector, t0)

    def _state_journal(self, url: str, options: list[str], state_home: Path) -> Path:
        """Daemon B's journal directory (the state directory under its own XDG_STATE_HOME)."""
        from shardfs.app.state import source_id

        endpoint = next((o.split("=", 1)[1] for o in options if o.startswith("endpoint=")), None)
        return state_home / "shardfs" / source_id(url, endpoint) / "journal"

    def _watch(self, ledger: Ledger, sampler: metrics.Sampler, injector: Injector, logs: list[Path],
               heartbeat: Path, t0: float, deadline: float) -> None:
        """Sample, ingest and check until every worker ended (or is wedged past the deadline)."""
        hung: set[tuple[int, float]] = set()
        next_print = t0 + 60
        while True:
            now = time.monotonic()
            sampler.sample(now)
            ledger.poll(logs)
            ledger.validate(now - LAG)
            beats = np.frombuffer(heartbeat.read_bytes(), dtype="d")
            for slot, started in enumerate(beats):
                if started and now - started > HANG and (slot, started) not in hung:
                    hung.add((slot, started))
                    self.result.wedged.append(f"worker {slot}: an operation started at t={started:.1f} still runs "
                                              f"after {HANG:g} s (active fault: {injector.current})")
            alive = [p for p in self.workers if p.poll() is None]
            if not alive:
                return
            if now > deadline + HANG:
                for p in alive:
                    self.result.wedged.append(f"worker pid {p.pid} still running {HANG:g} s after the end; killed")
                    p.kill()
                    p.wait()
                return
            if now >= next_print:
                next_print += 60
                print(f"soak [{self.kind}] minute {int((now - t0) // 60)}: {len(ledger.ops)} operations, "
                      f"{len(injector.windows)} faults, {ledger.reads_checked} reads checked, "
                      f"forbidden {len(ledger.forbidden)}, unclean {len(ledger.unclean)}", flush=True)
            time.sleep(5)

    # ---------------------------------------------------------------- final checks

    def _native_reader(self, src: Path) -> Callable[[str], np.ndarray]:
        """zarr-python 3 reading an array of the source natively (the directory, or the bucket)."""
        import zarr

        if self.kind == "local":
            return lambda name: np.asarray(zarr.open_array(str(src / name), mode="r")[...])
        if self.server.proc is None or self.server.proc.poll() is not None:
            self.server.start()
        store = self.objects.zarr_store()
        return lambda name: np.asarray(zarr.open_array(store, path=name, mode="r")[...])

    def _hazard_through_mount(self, mnt: str) -> None:
        errors = hazard.store_everywhere(f"{mnt}/{dataset.HAZARD.name}", ZARR2_PYTHON, "zarr2", HAZARD_PARTS,
                                         HAZARD_THREADS, dict(os.environ), HANG)
        self.result.unclean += [f"#3682 writer through the mount failed: {e}" for e in errors]

    def _hazard_results(self, reader: Callable[[str], np.ndarray]) -> None:
        self.result.hazard_mount = hazard.lost_fraction(reader(dataset.HAZARD.name))
        native = self.out / "native-hazard"
        dataset.S.write_group(native)
        dataset.write_empty(native, dataset.HAZARD)
        path = str(native / dataset.HAZARD.name)
        errors = hazard.store_everywhere(path, MAIN_PYTHON, "zarr3", HAZARD_PARTS, HAZARD_THREADS, dict(os.environ),
                                         HANG)
        self.result.notes += [f"#3682 native writer failed: {e}" for e in errors]
        import zarr

        self.result.hazard_native = hazard.lost_fraction(np.asarray(zarr.open_array(path, mode="r")[...]))

    def _finish(self, ledger: Ledger, sampler: metrics.Sampler, injector: Injector, t0: float) -> None:
        r = self.result
        r.operations = len(ledger.ops)
        r.reads = sum(o.kind == "read" for o in ledger.ops)
        r.writes = sum(o.kind == "write" for o in ledger.ops)
        r.structure = sum(o.kind == "structure" for o in ledger.ops)
        r.acknowledged = sum(w.ok and w.how != "initial" for w in self.model.writes())
        r.chunks_checked = ledger.chunks_checked
        r.faults = collections.Counter(w.kind for w in injector.windows)
        r.errors = collections.Counter("other" if o.err.startswith("X:") else o.err for o in ledger.ops if o.err)
        r.masked, r.raced, r.cross_mount = ledger.masked, ledger.raced, ledger.cross_mount
        r.excused, r.worker_kill = ledger.excused, ledger.worker_kill
        r.lost, r.forbidden, r.unclean = ledger.lost, ledger.forbidden, r.unclean + ledger.unclean
        names = [d.name for d in self.daemons]
        rows = metrics.minutes(ledger.ops, sampler.samples, t0, [w.start for w in injector.windows], names)
        metrics.write_csv(rows, self.out / "minutes.csv")
        metrics.write_samples(sampler.samples, t0, self.out / "samples.jsonl")
        metrics.plot(rows, names, self.out / "soak.png", f"shardfs soak, {self.kind} source, seed {self.seed}")
        r.flat = metrics.flatness(rows[: max(1, int(self.minutes))], names)  # the wind-down minute is not load
        (self.out / "windows.json").write_text(json.dumps([w.__dict__ for w in injector.windows], indent=1))
        if r.lost or r.forbidden_count or r.wedged:
            r.evidence = report.evidence([(w.kind, w.start, w.end) for w in injector.windows], t0,
                                         [d.log for d in self.daemons])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    kinds = ("local", "s3") if args.source == "both" else (args.source,)
    args.out.mkdir(parents=True, exist_ok=True)
    faults = tuple(args.faults.split(",")) if args.faults is not None else None
    runs = [Run(kind, args.minutes, seed, args.out / kind, faults, args.fault_every, args.mounts, args.workers)
            for kind in kinds]
    if args.one_at_a_time:
        results = [run.run() for run in runs]
    else:  # side by side: each run's processes, server and mounts are its own
        with ThreadPoolExecutor(len(runs)) as pool:
            results = list(pool.map(Run.run, runs))
    summary = report.table(results)
    (args.out / "summary.md").write_text(summary + "\n")
    print(summary)
    for r in results:
        text = report.failures(r, seed)
        if text:
            print(text)
        for note in r.notes:
            print(f"soak [{r.source}] note: {note}")
        for line in r.evidence:
            print(f"soak [{r.source}] {line}")
    line = report.last_line(results, seed)
    print(line, flush=True)
    bad = any(r.lost or r.forbidden_count or r.wedged for r in results)
    return 1 if bad else 0


def run() -> None:
    """``python -m soak_lib`` (scripts/soak)."""
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    sys.exit(main())
