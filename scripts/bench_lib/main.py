"""``scripts/bench``: shardfs against its baselines (README.md "Performance"), measured side by side in one run.

Builds its own datasets under a temporary work directory, mounts them with
``shardfs mount``, and compares each operation through the mount with its
baseline (a real v2 copy of the same chunk bytes on the same disk, or zarr 3 /
tensorstore on the sharded source). Where FUSE itself explains the gap, a third
side runs the same operation through ``floorfs.py`` (the thinnest pyfuse3
passthrough of the copy, or of an empty v2 directory for writes): the floor any
pyfuse3 filesystem pays. Each
comparison alternates the sides over several repetitions and reports medians.
Every measured operation runs in its own client process (zarr 2.18 in
``.venv-zarr2``). Page caches are dropped before every cold measurement, on
every side.

Output: a table on stdout, ``OUT/bench.json`` and ``OUT/bench.png``.
Exit status: 1 if any figure errored, 2 if a target was missed (never in
``--smoke``), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from bench_lib import peers, report
from bench_lib.harness import (CLIENTS, PY2, PY3, SHARDFS, Bench, BenchError, MiB, Row, Tally, byte_compile, median,
                               proc_io, proc_status, rotate, tree_bytes)
from shardfs.app.state import journal_dir
from shardfs.writes.journal import segments_under
from testkit import datasets as ds


class Figures(Bench):
    """The figures of the local source (and, through s3rows and scale, the object-storage ones)."""

    # ----- figures ----------------------------------------------------------------------------

    def fig_read(self) -> list[Row]:
        """Whole-array reads, cold: zarr 2.18 / tensorstore v2 via mount and copy; zarr 3 / tensorstore native;
        zarr 2.18 through floorfs over the copy (the pyfuse3 floor)."""
        sides = {  # side: (where, python, client command, extra args); "where" as in ``cold``
            "z2_mount": ("mount", PY2, "zarr_read"),
            "z2_ro": ("ro", PY2, "zarr_read"),
            "z2_copy": ("copy", PY2, "zarr_read"),
            "z2_floor": ("floor", PY2, "zarr_read"),
            "z3_native": ("native", PY3, "zarr_read"),
            "ts3_native": ("native", PY3, "ts_read", "zarr3"),
            "ts2_mount": ("mount", PY3, "ts_read", "zarr"),
            "ts2_copy": ("copy", PY3, "ts_read", "zarr"),
        }
        t: dict[str, list[float]] = {k: [] for k in sides}
        for rep in self.repeat():
            for side in rotate(list(sides), rep):
                where, python, command, *extra = sides[side]
                with self.cold(where, "read") as root:
                    res = self.client(python, command, root / "vol", *extra)
                if res["sum"] != self.vol_sum:
                    raise BenchError(f"{side}: read wrong data (sum {res['sum']} != {self.vol_sum})")
                t[side].append(res["seconds"])
                self.log(f"read rep {rep + 1}: {side} {res['seconds']:.2f} s")
        self.raw["read"] = t
        m = {k: median(v) for k, v in t.items()}
        mb = self.vol_bytes / MiB
        return [
            self.ratio_row(f"zarr 2.18 read {mb:.0f} MiB, cold: mount vs real v2 copy", "s",
                           m["z2_mount"], m["z2_copy"], 1.3),
            self.floor_row("same, mount vs", "s", m["z2_mount"], m["z2_floor"], m["z2_copy"]),
            self.ratio_row("  same, mount vs zarr 3 reading the shards natively", "s",
                           m["z2_mount"], m["z3_native"], 1.0),
            self.ratio_row("  same, read-only mount (-o ro) vs real v2 copy", "s", m["z2_ro"], m["z2_copy"], 1.3),
            self.ratio_row("  same, read-only mount vs zarr 3 natively", "s", m["z2_ro"], m["z3_native"], 1.0),
            self.ratio_row("  same, mount vs tensorstore zarr3 natively", "s", m["z2_mount"], m["ts3_native"], None),
            self.ratio_row("tensorstore zarr (v2) read, cold: mount vs copy", "s",
                           m["ts2_mount"], m["ts2_copy"], None),
        ]

    def fig_cat(self) -> list[Row]:
        """``cat`` of every chunk file of vol: first pass after mounting (cold), then a second pass;
        on the mount, a read-only mount, the copy, and floorfs over the copy."""
        cmd = f"xargs -a {self.work / 'vol.list'} cat > /dev/null"
        sides = ["mount", "ro", "copy", "floor"]
        tally = Tally(self.others_dropped)
        for rep in self.repeat():
            for side in rotate(sides, rep):
                with self.cold(side, "cat") as root:
                    tally.put(side, pass1=self.shell(cmd, cwd=root / "vol"))
                    tally.put(side, pass2=self.shell(cmd, cwd=root / "vol"))
                self.log(f"cat rep {rep + 1}: {side}: {', '.join(tally.shown)} s")
                tally.shown.clear()
        values, spoiled = tally.values()
        if spoiled:
            self.problems.append(f"cat: {spoiled}")
        t = {f"{side}{n}": values[f"pass{n}"][side] for side in sides for n in (1, 2)}
        self.raw["cat"] = t
        n = len(self.vol_names)
        m = {k: median(v) for k, v in t.items()}
        return [
            self.ratio_row(f"cat {n} chunk files, 1st pass after mount (cold)", "s", m["mount1"], m["copy1"], 4.0),
            self.floor_row("same, mount vs", "s", m["mount1"], m["floor1"], m["copy1"]),
            self.ratio_row("  same, read-only mount (-o ro) vs copy", "s", m["ro1"], m["copy1"], 4.0),
            self.ratio_row(f"cat {n} chunk files, 2nd pass", "s", m["mount2"], m["copy2"], 1.25),
            self.floor_row("same, mount vs", "s", m["mount2"], m["floor2"], m["copy2"]),
            self.ratio_row("  same, read-only mount (-o ro) vs copy", "s", m["ro2"], m["copy2"], 1.25),
        ]

    def fig_peers(self) -> list[Row]:
        """shardfs beside ratarmount and fuse-zip (a stored zip of the copy), floorfs and the copy:
        cat, zarr 2.18 reads, ls -l, daemon CPU per chunk (bench_lib/peers.py)."""
        return peers.Peers(self, CLIENTS, PY2, rotate).run()

    def fig_large(self) -> list[Row]:
        """Sequential ``cat`` of 4 MiB chunk files, the source (and the copy) in the page cache; on the
        mount, the copy, and floorfs over the copy."""
        cmd = f"xargs -a {self.work / 'large.list'} cat > /dev/null"
        warm_src = f"find {self.big / 'large' / 'c'} -type f -print0 | xargs -0 cat > /dev/null"
        t: dict[str, list[float]] = {"mount": [], "copy": [], "floor": []}
        for rep in self.repeat():
            for side in rotate(list(t), rep):
                if side == "copy":
                    self.drop_caches()
                    self.shell(cmd, cwd=self.copy / "large")
                    t["copy"].append(self.shell(cmd, cwd=self.copy / "large"))
                else:
                    floor = side == "floor"
                    with self.mounted(self.copy if floor else self.big, f"{side}-large", floor) as m:
                        self.drop_caches()
                        self.shell(f"cat {self.copy / 'large'}/* > /dev/null" if floor else warm_src)
                        t[side].append(self.shell(cmd, cwd=m.mnt / "large"))
                self.log(f"large rep {rep + 1}: {side} {self.large_bytes / t[side][-1] / 1e9:.2f} GB/s")
        self.raw["large"] = t
        gb = self.large_bytes / 1e9
        tm, tc, tf = median(t["mount"]), median(t["copy"]), median(t["floor"])
        chunk_mib = self.large_bytes / len(self.large_names) / MiB
        row = self.ratio_row(f"cat {len(self.large_names)} x {chunk_mib:g} MiB chunk files, source cached",
                             "GB/s", gb / tm, gb / tc, None, ratio=tm / tc)
        return [self.abs_check(row, 1.0, ">=", "≥ 1 GB/s"), self.floor_row("same (time), mount vs", "s", tm, tf, tc)]

    def fig_listing(self) -> list[Row]:
        """``find -type f`` and ``ls -l`` over the >100k chunk files of many, cold after mounting; daemon RSS.
        ``ls -l`` over the chunk files of tiny (a shard each), cold after mounting."""
        t: dict[str, list[float]] = {"find_mount": [], "find_copy": [], "ls_mount": [], "ls_copy": [],
                                     "tiny_mount": [], "tiny_copy": []}
        rss: list[int] = []
        counts: dict[str, int] = {}
        listing = self.work / "listing.out"
        find = "find . -maxdepth 1 -type f"
        ls = "ls -l ."

        def count(kind: str) -> int:
            lines = listing.read_text().splitlines()
            return len(lines) if kind == "find" else sum(1 for ln in lines if ln.startswith("-"))

        for rep in self.repeat():
            for kind, cmd in (("find", find), ("ls", ls), ("tiny", ls)):
                src, name = (self.shards, "tiny") if kind == "tiny" else (self.meta, "many")
                for side in rotate(["mount", "copy"], rep):
                    key = f"{kind}_{side}"
                    if side == "mount":
                        with self.mounted(src, "listing" if kind != "tiny" else "listing-tiny") as m:
                            self.drop_caches()
                            t[key].append(self.shell(cmd, cwd=m.mnt / name, out=listing))
                            if kind != "tiny":
                                rss.append(proc_status(m.pid)["VmRSS"])
                    else:
                        self.drop_caches()
                        t[key].append(self.shell(cmd, cwd=self.copy / name, out=listing))
                    counts[key] = count("find" if kind == "find" else "ls")
                    self.log(f"listing rep {rep + 1}: {key} {counts[key]} entries in {t[key][-1]:.2f} s")
        self.raw["listing"] = {"seconds": t, "counts": counts, "rss": rss}
        rows = []
        for kind, label in (("find", "find -type f"), ("ls", "ls -l"), ("tiny", "ls -l")):
            n_m, n_c = counts[f"{kind}_mount"], counts[f"{kind}_copy"]
            what = f"{n_c} one-chunk shards" if kind == "tiny" else f"{n_c} chunk files"
            row = self.ratio_row(f"{label} over {what}, cold after mount", "entries/s",
                                 n_m / median(t[f"{kind}_mount"]), n_c / median(t[f"{kind}_copy"]), None,
                                 ratio=median(t[f"{kind}_mount"]) / median(t[f"{kind}_copy"]))
            row = self.abs_check(row, 20000, ">=", "≥ 20k/s")
            if n_m != n_c:
                row.status, row.note = "ERROR", f"mount listed {n_m} files, copy {n_c}"
            rows.append(row)
        rows.append(self.abs_check(Row(f"daemon RSS after find + ls -l over {self.many_files} chunk files",
                                       "MiB", max(rss) / MiB), 150, "<", "< 150 MiB"))
        return rows

    def fig_random(self) -> list[Row]:
        """Random single-chunk reads (open, read, close) of vol chunk files, cold: p50/p99 latency, on the
        mount, the copy and floorfs over the copy. Then, warm, one of those files opened, read and closed
        again and again: the per-call cost of the FUSE requests every open+close makes (OPEN, FLUSH,
        RELEASE; no FLUSH on shardfs), whatever the filesystem does."""
        k = min(len(self.vol_names), 30 if self.smoke else 300)
        sides = ["mount", "copy", "floor"]
        lat: dict[str, list[float]] = {side: [] for side in sides}
        reopen: dict[str, list[float]] = {side: [] for side in sides}
        for rep in self.repeat():
            names = random.Random(100 + rep).sample(self.vol_names, k)
            lst = self.work / "random.list"
            lst.write_text("\n".join(names) + "\n")
            for side in rotate(sides, rep):
                with self.cold(side, "random") as root:
                    res = self.client(PY3, "random_reads", root / "vol", lst)
                    again = self.client(PY3, "reopen", root / "vol" / names[0], REOPEN_CALLS)
                lat[side] += res["latencies"]
                reopen[side].append(again["seconds"] / REOPEN_CALLS * 1e6)
                self.log(f"random rep {rep + 1}: {side} {k} reads in {res['seconds']:.2f} s, "
                         f"then {reopen[side][-1]:.0f} µs per open+read+close of one")
        self.raw["random_latencies"] = lat
        self.raw["reopen_us"] = reopen

        def pct(xs: list[float], q: float) -> float:
            xs = sorted(xs)
            return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] * 1000

        rows = []
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            p = {side: pct(lat[side], q) for side in sides}
            rows += [self.ratio_row(f"random single-chunk read {name}, cold", "ms", p["mount"], p["copy"], None),
                     self.floor_row("same, mount vs", "ms", p["mount"], p["floor"], p["copy"])]
        u = {side: median(v) for side, v in reopen.items()}
        rows += [self.ratio_row(f"open+read+close of one cached chunk file, {REOPEN_CALLS}x: per call", "µs",
                                u["mount"], u["copy"], None),
                 self.floor_row("same, mount vs", "µs", u["mount"], u["floor"], u["copy"])]
        return rows

    def fig_write(self) -> list[Row]:
        """zarr 2.18 writes the whole vol through the mount (until folded) vs zarr 3 writing the shards
        natively; and zarr 2.18 writing a real v2 directory through floorfs (the pyfuse3 floor)."""
        t: dict[str, list[float]] = {"mount": [], "mount_client": [], "mount_fold_wait": [], "native": [], "floor": []}
        io: list[dict] = []
        for rep in self.repeat():
            for side in rotate(["mount", "native", "floor"], rep):
                src = self.work / f"write-{side}-{rep}"
                if side == "floor":
                    (src / "vol").mkdir(parents=True)
                    shutil.copyfile(self.copy / "vol" / ".zarray", src / "vol" / ".zarray")
                else:
                    ds.empty_like_vol(self.big, src)
                os.sync()
                if side == "mount":
                    with self.mounted(src, "write") as m:
                        io0 = proc_io(m.pid)
                        res = self.client(PY2, "zarr_write", m.mnt / "vol", self.vol_npy)
                        t_exit = time.perf_counter()
                        self.wait_journal_empty(src)
                        fold = time.perf_counter() - t_exit
                        io1 = proc_io(m.pid)
                    final = tree_bytes(src / "vol" / "c")
                    delta = {k: io1[k] - io0[k] for k in io0}
                    io.append({"final": final, **delta})
                    if rep == 0:
                        got = self.client(PY3, "zarr_read", src / "vol")
                        if got["sum"] != self.vol_sum:
                            raise BenchError(f"array written through the mount reads back wrong (sum {got['sum']})")
                    t["mount"].append(res["seconds"] + fold)
                    t["mount_client"].append(res["seconds"])
                    t["mount_fold_wait"].append(fold)
                    self.log(f"write rep {rep + 1}: mount {res['seconds']:.2f} s + {fold:.2f} s until folded; "
                             f"daemon wrote {delta['write_bytes'] / MiB:.0f} MiB for {final / MiB:.0f} MiB of shards")
                elif side == "floor":
                    with self.mounted(src, "floor-write", floor=True, rw=True) as m:
                        res = self.client(PY2, "zarr_write", m.mnt / "vol", self.vol_npy)
                    t["floor"].append(res["seconds"])
                    self.log(f"write rep {rep + 1}: zarr 2.18 through floorfs {res['seconds']:.2f} s")
                else:
                    res = self.client(PY3, "zarr_write", src / "vol", self.vol_npy)
                    t["native"].append(res["seconds"])
                    self.raw["write_native_final_bytes"] = tree_bytes(src / "vol" / "c")
                    self.log(f"write rep {rep + 1}: zarr 3 native {res['seconds']:.2f} s")
                shutil.rmtree(src, ignore_errors=True)
        self.raw["write"] = {"seconds": t, "io": io}
        ratios = [(d["write_bytes"] or d["wchar"]) / d["final"] for d in io]
        mb = self.vol_bytes / MiB
        row = self.ratio_row(f"zarr 2.18 write {mb:.0f} MiB via mount (until folded) vs zarr 3 native", "s",
                             median(t["mount"]), median(t["native"]), 1.5)
        row.note = f"client part {median(t['mount_client']):.2f} s"
        floor = self.floor_row("same, mount vs", "s", median(t["mount"]), median(t["floor"]), median(t["native"]),
                               "zarr 3 native", "to a real v2 directory")
        wb = median([d["write_bytes"] or d["wchar"] for d in io])
        fin = median([d["final"] for d in io])
        brow = self.ratio_row("  bytes the daemon wrote vs final shard bytes", "MiB", wb / MiB, fin / MiB, 2.5,
                              ratio=median(ratios))
        net = median([(d["write_bytes"] - d["cancelled_write_bytes"]) / d["final"] for d in io])
        brow.note = f"/proc/PID/io write_bytes; {net:.2f}x net of cancelled_write_bytes"
        return [row, floor, brow]

    def wait_journal_empty(self, src: Path) -> None:
        journal = journal_dir(str(src))
        deadline = time.monotonic() + self.op_timeout()
        while True:
            if not segments_under(journal):
                return
            if time.monotonic() > deadline:
                raise BenchError("journal not folded in time")
            time.sleep(0.02)

    def fig_dask(self) -> list[Row]:
        """dask (threads scheduler, zarr 3 in v2 mode reading one chunk file at a time per thread)
        summing half of vol: 2 concurrent readers vs 1, cold."""
        cases = [("mount", 1), ("mount", 2), ("copy", 1), ("copy", 2)]
        if self.smoke:  # the copy cases are the same code; keep the smoke run short
            cases = cases[:2]
        t: dict[str, list[float]] = {f"{s}{n}": [] for s, n in cases}
        for rep in self.repeat():
            for side, n in rotate(cases, rep):
                with self.cold(side, "dask") as root:
                    res = self.client(PY3, "dask_read", root / "vol", n, 2)
                if res["sum"] != self.vol_half_sum:
                    raise BenchError(f"dask {side}: wrong data")
                t[f"{side}{n}"].append(res["seconds"])
                self.log(f"dask rep {rep + 1}: {side} {n} thread(s) {res['seconds']:.2f} s")
        self.raw["dask"] = t
        rows = [self.ratio_row("dask sum of half vol, 2 threads vs 1, via mount (cold)", "s",
                               median(t["mount2"]), median(t["mount1"]), None)]
        if t.get("copy1"):
            rows.append(self.ratio_row("  same on the real v2 copy (reference)", "s",
                                       median(t["copy2"]), median(t["copy1"]), None))
        return rows

    def fig_mount(self) -> list[Row]:
        """``shardfs mount`` until it returns: the >100k-chunk array vs a one-shard array."""
        t: dict[str, list[float]] = {"many": [], "small": []}
        for rep in self.repeat(self.reps if self.smoke else max(self.reps, 3)):
            for side in rotate(["many", "small"], rep):
                with self.mounted(self.meta if side == "many" else self.small, f"mount-{side}") as m:
                    t[side].append(m.seconds)
                    os.listdir(m.mnt)
        self.raw["mount_seconds"] = t
        self.log(f"mount: many {t['many']}, small {t['small']}")
        tm, ts = median(t["many"]), median(t["small"])
        row = self.ratio_row(f"mount time, {self.many_files} chunks / {self.many_info['shards']} shards "
                             "vs 1 shard", "s", tm, ts, None)
        row.target = "< 1 s, ≤ 1.5x"
        row.abs_target, row.abs_dir, row.ratio_max = 1.0, "<", 1.5
        row.status = "PASS" if tm < 1.0 and tm / ts <= 1.5 else "FAIL"
        return [row]

    def fig_scale(self) -> list[Row]:
        """The scale points (scale.py): 1M chunks locally, 100k shards in S3; only with ``--only``."""
        from bench_lib import scale

        return scale.figure(self)

    def fig_workers(self) -> list[Row]:
        """``-o workers=N`` on a read-only mount (workers.py): 4 readers, N = 1, 2, 4; only with ``--only``."""
        from bench_lib import workers

        return workers.figure(self)

    def fig_elastic(self) -> list[Row]:
        """``-o workers=auto`` (2 workers, the second parked while calm) beside 1 and 2 workers, 1 and
        4 readers (workers.py); only with ``--only``."""
        from bench_lib import workers

        return workers.elastic(self)

    def fig_restart(self) -> list[Row]:
        """SIGKILL of a supervised mount's worker to its successor and to the first request it
        serves (restart.py)."""
        from bench_lib import restart

        return restart.figure(self)

    def fig_s3(self) -> list[Row]:
        """The object-storage rows (s3rows.py), against a SeaweedFS started and stopped here."""
        from bench_lib import s3rows

        return s3rows.figure(self)


WEIGHTS = {"read": 0.20, "cat": 0.18, "peers": 0.20, "large": 0.03, "listing": 0.15, "random": 0.04,
           "write": 0.27, "dask": 0.10, "mount": 0.03, "restart": 0.04, "s3": 0.25, "scale": 0.5, "workers": 0.5,
           "elastic": 0.3}
# cheap figures, and the slow S3 one, always get their repetitions
FLOOR = {"peers": 90.0, "large": 25.0, "random": 20.0, "mount": 15.0, "s3": 90.0}
S3_LABELS = ["S3: zarr 2.18 read via mount vs zarr 3 native", "S3, 10 ms each way: same",
             "S3, 10 ms each way: random single-chunk reads, mount vs zarr 3 native",
             "S3: zarr 2.18 read via mount vs zarr 2.18 on a v2 copy (s3fs)",
             "S3: zarr 2.18 read via S3 mount vs via a mount of a local copy",
             "S3, 10 ms each way: same, S3 vs local mount",
             "S3: requests at mount",
             "S3: requests, 1st chunk of a cold shard", "S3: requests per further chunk of a shard",
             "S3: requests per shard read chunk by chunk", "S3: requests per shard, whole-array read",
             "S3: mount time, 10k shards vs 1 shard", "S3: daemon peak RSS"]
REOPEN_CALLS = 2000  # open+read+close of one cached file, per side and repetition of fig_random

FIGURES: list[tuple[str, str, list[str]]] = [
    # (name, method, row labels used when the figure errors)
    ("read", "fig_read", ["zarr 2.18 read, cold: mount vs real v2 copy", "  floor: same, mount vs passthrough",
                          "  same, mount vs zarr 3 native", "  same, read-only mount vs copy",
                          "  same, read-only mount vs zarr 3 native",
                          "  same, mount vs tensorstore native", "tensorstore zarr (v2) read: mount vs copy"]),
    ("cat", "fig_cat", ["cat chunk files, 1st pass after mount", "  floor: same, mount vs passthrough",
                        "  same, read-only mount vs copy", "cat chunk files, 2nd pass",
                        "  floor: same, mount vs passthrough", "  same, read-only mount vs copy"]),
    ("peers", "fig_peers", peers.FIGURE_LABELS),
    ("large", "fig_large", ["cat 4 MiB chunk files, source cached", "  floor: same, mount vs passthrough"]),
    ("listing", "fig_listing", ["find -type f over >100k chunk files", "ls -l over >100k chunk files",
                                "ls -l over 30k one-chunk shards", "daemon RSS after listing >100k chunks"]),
    ("random", "fig_random", ["random single-chunk read p50", "  floor: same, mount vs passthrough",
                              "random single-chunk read p99", "  floor: same, mount vs passthrough",
                              "open+read+close of one cached file", "  floor: same, mount vs passthrough"]),
    ("write", "fig_write", ["zarr 2.18 write via mount vs zarr 3 native", "  floor: same, mount vs passthrough",
                            "  bytes written vs final size"]),
    ("dask", "fig_dask", ["dask 2 threads vs 1 thread, via mount", "  same on the real v2 copy"]),
    ("mount", "fig_mount", ["mount time, >100k chunks vs 1 shard"]),
    ("restart", "fig_restart", ["restart: SIGKILL of the worker to its successor started, p50", "  same, p99",
                                "restart: SIGKILL of the worker to the first request served, p50", "  same, p99",
                                "restart: shardfs mount to live, p50"]),
    ("s3", "fig_s3", S3_LABELS),
    ("workers", "fig_workers", ["workers=1: 4 zarr 2.18 readers, read-only mount, time vs workers=1"]),
    ("elastic", "fig_elastic", ["workers=auto (2): 1 zarr 2.18 reader, read-only, time vs workers=1"]),
    ("scale", "fig_scale", ["scale: ls -l over 1M chunk files", "scale: find -type f over 1M chunk files",
                            "scale: daemon peak RSS, 1M chunks", "scale: S3 mount time, 100k shards",
                            "scale: S3 ls -l, 100k shards", "scale: S3 random chunk read",
                            "scale: S3 daemon peak RSS, 100k shards"]),
]
OPT_IN = {"scale", "workers", "elastic"}  # figures run only when named in --only (they take minutes)


def daemon_log_summary(logs: Path) -> list[str]:
    """Daemon log lines at ERROR level or with a traceback (a bench run should have none)."""
    found = []
    for path in sorted(logs.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if " ERROR " in line or "Traceback" in line or " CRITICAL " in line:
                found.append(f"{path.stem}: {line.strip()[:200]}")
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny datasets, 1 repetition, never fails on targets")
    p.add_argument("--reps", type=int, default=0, help="repetitions per figure (default 3; 1 with --smoke)")
    p.add_argument("--workdir", help="make the temporary work directory here (default /tmp)")
    p.add_argument("--out", default="bench-out", help="where bench.json and bench.png go (default bench-out)")
    p.add_argument("--only", default="", help="comma-separated figures: " + ",".join(f[0] for f in FIGURES))
    p.add_argument("--keep", action="store_true", help="keep the work directory (datasets, daemon logs)")
    p.add_argument("--baseline", metavar="DIR",
                   help="peers, s3, restart: also measure a shardfs side running the package in DIR "
                   "(a checkout: its shardfs/ is imported), alternated with this one")
    p.add_argument("--sides", default="",
                   help="peers: comma-separated sides to measure (of " + ",".join(peers.SIDES) + "; default all): "
                   "with --baseline, --sides shardfs measures shardfs against the baseline alone")
    args = p.parse_args(argv)
    only = [x for x in args.only.split(",") if x]
    bad_sides = set(x for x in args.sides.split(",") if x) - set(peers.SIDES)
    if bad_sides:
        p.error(f"unknown side(s): {', '.join(sorted(bad_sides))}")
    unknown = set(only) - {f[0] for f in FIGURES}
    if unknown:
        p.error(f"unknown figure(s): {', '.join(sorted(unknown))}")
    for exe in (PY3, PY2, SHARDFS):
        if not os.access(exe, os.X_OK):
            p.error(f"{exe} missing: run scripts/install first")

    byte_compile(args.baseline)
    bench = Figures(args)
    if bench.load_start[0] > 1.0:
        bench.problems.append(f"load average {bench.load_start[0]:.1f} at start: other processes share "
                              "this machine, figures are noisy")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    errors = 0
    try:
        try:
            bench.setup()
            setup_error = None
        except Exception as e:  # noqa: BLE001 - every failure becomes an ERROR row
            setup_error = f"setup: {e}"
            bench.log(f"setup failed: {e}\n{traceback.format_exc()}")
        for name, method, labels in FIGURES:
            if (only and name not in only) or (not only and name in OPT_IN):
                continue
            t0 = time.perf_counter()
            if setup_error:
                bench.rows += [Row(lb, status="ERROR", note=setup_error[:120]) for lb in labels]
                continue
            todo = [f[0] for f in FIGURES[[f[0] for f in FIGURES].index(name):]
                    if f[0] in only or (not only and f[0] not in OPT_IN)]
            left = bench.budget - (time.perf_counter() - bench.t_start)
            bench.figure = name
            bench.allowance = max(max(0.0, left) * WEIGHTS[name] / sum(WEIGHTS[f] for f in todo),
                                  0.0 if bench.smoke else FLOOR.get(name, 0.0))
            bench.log(f"== {name} (allowance {bench.allowance:.0f} s)")
            try:
                bench.rows += getattr(bench, method)()
            except Exception as e:  # noqa: BLE001
                bench.log(f"{name} failed: {e}\n{traceback.format_exc()}")
                bench.rows += [Row(lb, status="ERROR", note=f"{type(e).__name__}: {e}"[:160]) for lb in labels]
            bench.raw.setdefault("figure_seconds", {})[name] = time.perf_counter() - t0
        errors = sum(r.status == "ERROR" for r in bench.rows)
        failed = sum(r.status == "FAIL" for r in bench.rows)
        daemon_errors = daemon_log_summary(bench.logs)
        total = time.perf_counter() - bench.t_start
        doc = {
            "smoke": bench.smoke, "reps": bench.reps, "reps_done": bench.reps_done, "seconds": total,
            "load_avg_start": bench.load_start, "load_avg_end": os.getloadavg(), "caches_dropped": bench.drop_ok,
            "machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version()},
            "rows": [asdict(r) for r in bench.rows], "raw": bench.raw, "problems": bench.problems,
            "daemon_peak_rss_mib": {k: v / MiB for k, v in bench.max_rss.items()},
            "mount_memory_mib": {k: {m: v / MiB for m, v in mem.items()} for k, mem in bench.memory.items()},
            "daemon_log_errors": daemon_errors[:50],
        }
        bench.out.mkdir(parents=True, exist_ok=True)
        (bench.out / "bench.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
        print(report.table(bench.rows, smoke=bench.smoke))
        try:
            report.chart(bench.rows, bench.out / "bench.png", title=f"shardfs bench ({'smoke, ' if bench.smoke else ''}"
                         f"medians of up to {bench.reps} alternating reps)")
        except Exception as e:  # noqa: BLE001
            errors += 1
            print(f"chart failed: {e}", file=sys.stderr)
        print("repetitions: " + ", ".join(f"{k} {v}" for k, v in bench.reps_done.items()))
        for line in bench.problems:
            print(f"note: {line}")
        if daemon_errors:
            print(f"daemon logged {len(daemon_errors)} error line(s), first: {daemon_errors[0]}")
        print(f"{len(bench.rows)} rows: {sum(r.status == 'PASS' for r in bench.rows)} PASS, "
              f"{failed} {'missed (ok in --smoke)' if bench.smoke else 'FAIL'}, "
              f"{errors} ERROR in {total:.0f} s; wrote {bench.out / 'bench.json'} and {bench.out / 'bench.png'}")
        if errors:
            return 1
        if failed and not bench.smoke:
            return 2
        return 0
    finally:
        bench.cleanup()

