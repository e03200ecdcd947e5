"""The object-storage rows of ``scripts/bench`` (issue 13): ``shardfs mount s3://...`` against
native readers of the same objects, side by side in one run.

``figure(bench)`` starts SeaweedFS (seaweed.py: ``weed mini`` on 127.0.0.1, every port explicit,
credentials enforced) under the work directory, always stops it by PID, and uploads with obstore:
the bench's sharded ``vol`` (prefix ``big``), the real v2 copy of it (``v2/vol``), the one-shard
``small`` and a group ``tenk`` whose array has ``TENK`` shards (each the same small shard). Then,
each repetition alternating the sides, every mount fresh, page caches dropped before every
measurement (SeaweedFS reads its volume files from disk), medians:

1. zarr 2.18 whole-array read of vol through ``shardfs mount s3://BUCKET/big`` / zarr 3 native
   (``ObjectStore`` over obstore's ``S3Store``) on the same objects; target <= 1.6x;
2. the same, both sides through a ``DelayProxy`` adding ``DELAY`` each way per request; <= 1.6x;
3. ``RANDOM`` random single-chunk reads of vol in one process (the array opened once) through
   that proxy: zarr 2.18 through the mount / zarr 3 native; <= 0.6x;
4. row 1's mount side / zarr 2.18 reading the v2 copy through ``FSStore`` (s3fs); <= 0.3x;
4b. row 1's and row 2's mount sides / the same read through a fresh mount of the local copy
   of the same shards (``big``): what the object store adds to the mount's read (the issue
   allows 5%: <= 1.05x directly; with the delay, a report row);
5. through a counting proxy without delay (``DelayProxy.requests``): requests at mount, for the
   first chunk read of a cold shard, per further chunk of a shard whose index is cached, per
   shard read chunk file by chunk file, and per shard in a whole-array read (mount and zarr 3
   native); mount time of ``tenk`` (< 1 s) against ``small``; the largest memory of an S3
   mount after its reads (< 200 MiB): the PSS of its processes summed (``harness.peaks``), at
   rest (``REST_S`` after its readers: an idle worker gives its free heap back, ``shardfs.app.idle``);
6. ``SWEEPERS`` zarr 2.18 readers of vol's slabs at once through a fresh mount (vol larger than
   the default ``cache_size``): the bytes it fetched against vol's stored bytes (a report row;
   with ``--baseline``, against the baseline's mount too).

With ``--smoke`` (kept short: CI runs it) only row 1, the counts made in one mount and the RSS
row run, on the smoke data, without ``tenk``.
The endpoint is always explicit (``-o endpoint=``, the clients' ENDPOINT argument); the
credentials and region are in ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_REGION``
for the figure's duration (mounts and clients inherit them).
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from testkit.delayproxy import DelayProxy, Request
from bench_lib.harness import CLIENTS, PY2, PY3, Bench, BenchError, Row, rotate, status_of
from bench_lib.readers import zarr_readers
from testkit.seaweed import REGION, S3Source, SeaweedS3, aws_env, put_all, upload

BUCKET = "shardfs-bench"
DELAY = 0.010  # seconds each way per request (rows 2 and 3)
RANDOM = 60  # chunks read in row 3 (SMOKE_RANDOM in --smoke)
TENK = 10_000  # shards under the tenk prefix
SHARD_KEYS = f"/{BUCKET}/big/vol/c/"  # path prefix of vol's shards in the proxy's log
COUNT_SHARDS = 8  # shards read in each request-count case (at most a third of vol's shards)
SWEEPERS = 4  # readers of vol at once in the sweep row
REST_S = 3.0  # seconds a mount is left idle after its readers before its memory is taken (> 2 x IDLE_S)
MiB = 1 << 20



def figure(bench: Bench) -> list[Row]:
    """All S3 rows (module docstring); SeaweedFS is stopped by PID whatever happens."""
    server = SeaweedS3(bench.work / "seaweed", bucket=BUCKET)
    with aws_env():
        server.start()
        try:
            return _S3Rows(bench, server).rows()
        finally:
            server.stop()


class _S3Rows:
    def __init__(self, bench: Bench, server: SeaweedS3) -> None:
        self.b = bench
        self.server = server
        self.smoke = bench.smoke
        zarray = json.loads((bench.copy / "vol" / ".zarray").read_text())
        if zarray.get("dimension_separator", ".") != ".":
            raise BenchError(f"v2 view of vol: dimension_separator {zarray['dimension_separator']!r}, not '.'")
        self.chunks = [tuple(int(x) for x in name.split(".")) for name in bench.vol_names]
        s = bench.sizes
        self.per_shard = tuple(sh // c for sh, c in zip(s.vol_shard, s.vol_chunk))
        self.shard_grid = tuple(-(-a // sh) for a, sh in zip(s.vol_shape, s.vol_shard))

    # ----- data -------------------------------------------------------------------------------

    def upload(self) -> None:
        b, server = self.b, self.server
        t0 = time.perf_counter()
        put_all(S3Source(server, "big").store(), [("zarr.json", b.big / "zarr.json")])
        n = 1 + len(upload(server, b.big / "vol", "big/vol").keys())
        n += len(upload(server, b.copy / "vol", "v2/vol").keys())
        n += len(upload(server, b.small, "small").keys())
        if not self.smoke:
            tenk = self._tenk_items(TENK)
            put_all(S3Source(server, "tenk").store(), tenk)
            n += len(tenk)
        b.raw["s3_upload"] = {"objects": n, "seconds": time.perf_counter() - t0}
        b.log(f"  S3: uploaded {n} objects in {time.perf_counter() - t0:.1f} s")

    def _tenk_items(self, n: int) -> list[tuple[str, bytes | Path]]:
        """``tenk``: a group with array ``a`` of ``n`` (a square number) 4x4 uint8 shards of 2x2
        chunks, every shard the same bytes (written once locally by zarr 3)."""
        import numpy as np
        import zarr

        side = int(round(n ** 0.5))
        assert side * side == n
        root = self.b.work / "tenk-src"
        g = zarr.open_group(str(root), mode="w")
        a = g.create_array("a", shape=(4 * side, 4 * side), chunks=(2, 2), shards=(4, 4), dtype="uint8",
                           compressors=None, fill_value=0)
        a[:4, :4] = np.arange(1, 17, dtype=np.uint8).reshape(4, 4)
        shard = (root / "a" / "c" / "0" / "0").read_bytes()
        self.tenk_side = side
        items: list[tuple[str, bytes | Path]] = [("zarr.json", root / "zarr.json"),
                                                ("a/zarr.json", root / "a" / "zarr.json")]
        return items + [(f"a/c/{i}/{j}", shard) for i in range(side) for j in range(side)]

    # ----- sides ------------------------------------------------------------------------------

    @staticmethod
    def _opts(port: int) -> str:
        return f"endpoint=http://127.0.0.1:{port},region={REGION}"

    def _url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def whole_mount(self, port: int, name: str, package: str | None = None) -> dict:
        """zarr 2.18 reading vol through a fresh mount (``readers.zarr_readers``, one reader: its
        seconds are those of ``zarr_read``, from opening the array); also the daemon's CPU
        seconds during the read, from when the client has imported zarr (as the peers figure
        measures it: the daemon's own import of zarr-python at its start is not the read's).
        ``package``: a checkout whose ``shardfs`` the daemon imports (``--baseline``)."""
        b = self.b
        with b.mounted(self._url("big"), name, options=self._opts(port), package=package) as m:
            b.drop_caches()
            seconds, cpu = zarr_readers(b, PY2, CLIENTS, m.mnt / "vol", 1, m.pid)
            time.sleep(REST_S)
        return {"seconds": seconds, "daemon_cpu": cpu}

    def sweep_mount(self, port: int, name: str, package: str | None = None) -> dict:
        """``SWEEPERS`` zarr 2.18 readers of vol's slabs at once through a fresh mount (at the
        default ``cache_size``, less than vol: they come back to their planes' shards once a
        chunk row), and what the mount fetched for them (``shardfs status``: the store's
        ``bytes_in`` and GETs)."""
        b = self.b
        with b.mounted(self._url("big"), name, options=self._opts(port), package=package) as m:
            b.drop_caches()
            seconds, cpu = zarr_readers(b, PY2, CLIENTS, m.mnt / "vol", SWEEPERS, m.pid)
            store = status_of(m.mnt)["store"]
            time.sleep(REST_S)
        return {"seconds": seconds, "daemon_cpu": cpu, "fetched": store["bytes_in"],
                "gets": store["requests"].get("GET", 0)}

    def whole_local(self) -> dict:
        """``whole_mount``'s read through a fresh mount of the local copy of the same shards."""
        b = self.b
        with b.mounted(b.big, "s3-local-read") as m:
            b.drop_caches()
            seconds, cpu = zarr_readers(b, PY2, CLIENTS, m.mnt / "vol", 1, m.pid)
        return {"seconds": seconds, "daemon_cpu": cpu}

    def whole_native(self, port: int, python: str, prefix: str, name: str) -> dict:
        self.b.drop_caches()
        res = self.b.client(python, "zarr_read", self._url(prefix), f"http://127.0.0.1:{port}")
        return self._check_sum(res, name)

    def _check_sum(self, res: dict, side: str) -> dict:
        if res["sum"] != self.b.vol_sum:
            raise BenchError(f"{side}: read wrong data (sum {res['sum']} != {self.b.vol_sum})")
        return res

    # ----- rows -------------------------------------------------------------------------------

    def rows(self) -> list[Row]:
        self.upload()
        with DelayProxy(("127.0.0.1", self.server.ports["s3.port"]), DELAY) as slow, \
                DelayProxy(("127.0.0.1", self.server.ports["s3.port"]), 0.0, record=True) as count:
            rows = self.reads(slow)
            rows += self.counts(count)
        if not self.smoke:
            rows += self.mount_time()
        rows.append(self.rss())
        return rows

    def reads(self, slow: DelayProxy) -> list[Row]:
        """Rows 1-4, all sides alternating in one loop."""
        b = self.b
        direct = self.server.ports["s3.port"]
        sides = {
            "mount": lambda rep: self.whole_mount(direct, "s3-read"),
            "native": lambda rep: self.whole_native(direct, PY3, "big/vol", "native"),
        }
        if not self.smoke:
            sides.update({
                "s3fs": lambda rep: self.whole_native(direct, PY2, "v2/vol", "s3fs"),
                "mount_local": lambda rep: self.whole_local(),
                "mount_delay": lambda rep: self.whole_mount(slow.port, "s3-read-delay"),
                "native_delay": lambda rep: self.whole_native(slow.port, PY3, "big/vol", "native_delay"),
                "random_mount": lambda rep: self.random_mount(slow, rep),
                "random_native": lambda rep: self.random_native(slow, rep),
                "sweep": lambda rep: self.sweep_mount(direct, "s3-sweep"),
            })
        base = b.args.baseline
        if base:  # the mount sides again with another checkout's package (``--baseline``)
            sides["mount_base"] = lambda rep: self.whole_mount(direct, "s3-read-base", base)
            if not self.smoke:
                sides["mount_delay_base"] = lambda rep: self.whole_mount(slow.port, "s3-read-delay-base", base)
                sides["random_mount_base"] = lambda rep: self.random_mount(slow, rep, base)
                sides["sweep_base"] = lambda rep: self.sweep_mount(direct, "s3-sweep-base", base)
        t: dict[str, list[float]] = {k: [] for k in sides}
        cpu: dict[str, list[float]] = {k: [] for k in sides if k.startswith("mount")}
        through_slow = ("mount_delay", "native_delay", "random_mount", "random_native", "mount_delay_base",
                        "random_mount_base")
        requests: dict[str, list[dict[str, int]]] = {k: [] for k in sides if k in through_slow}
        sums: dict[int, dict[str, int]] = {}
        fetched: dict[str, list[dict]] = {k: [] for k in sides if k.startswith("sweep")}
        for rep in b.repeat():
            for side in rotate(list(sides), rep):
                before = slow.snapshot()[0]
                res = sides[side](rep)
                t[side].append(res["seconds"])
                if side in cpu:
                    cpu[side].append(res["daemon_cpu"])
                if side in requests:  # through the delaying proxy
                    requests[side].append(_delta(before, slow.snapshot()[0]))
                if side.startswith("random"):
                    sums.setdefault(rep, {})[side] = res["sum"]
                if side in fetched:
                    fetched[side].append(res)
                b.log(f"s3 rep {rep + 1}: {side} {res['seconds']:.2f} s")
            if len(set(sums.get(rep, {}).values())) > 1:
                raise BenchError(f"random reads rep {rep + 1}: mount and zarr 3 read different data {sums[rep]}")
        b.raw["s3_read"] = {"seconds": t, "daemon_cpu": cpu, "requests": requests, "sweeps": fetched}
        m = {k: statistics.median(v) for k, v in t.items()}
        mb = b.vol_bytes / MiB
        n = len(self.chunks)

        def note(mount: str, native: str | None = None) -> str:
            c = statistics.median(cpu[mount]) if mount in cpu else None
            out = [f"daemon CPU {c:.2f} s ({c / n * 1e6:.0f} µs/chunk)"] if c is not None else []
            if native:
                last = {side: requests[side][-1] for side in (mount, native)}
                out.append(f"requests: mount {_kinds(last[mount])}, zarr 3 {_kinds(last[native])}")
            return "; ".join(out)

        def against_base(side: str) -> None:
            if f"{side}_base" in m:
                rows.append(b.ratio_row("  same, shardfs vs shardfs-base (--baseline)", "s", m[side],
                                        m[f"{side}_base"], None))
                rows[-1].note = f"shardfs-base {note(f'{side}_base')}"

        rows = [b.ratio_row(f"S3: zarr 2.18 read {mb:.0f} MiB via mount vs zarr 3 native", "s",
                            m["mount"], m["native"], 1.6)]
        rows[-1].note = note("mount")
        against_base("mount")
        if self.smoke:
            return rows
        rows.append(b.ratio_row(f"S3, {DELAY * 1e3:g} ms each way: same", "s",
                                m["mount_delay"], m["native_delay"], 1.6))
        rows[-1].note = note("mount_delay", "native_delay")
        against_base("mount_delay")
        rows.append(b.ratio_row(f"S3, {DELAY * 1e3:g} ms each way: {RANDOM} random single-chunk reads, one "
                                "process, mount vs zarr 3 native", "s", m["random_mount"], m["random_native"], 0.6))
        rows[-1].note = note("random_mount", "random_native")
        against_base("random_mount")
        rows.append(b.ratio_row("S3: zarr 2.18 read via mount vs zarr 2.18 on a v2 copy (FSStore, s3fs)", "s",
                                m["mount"], m["s3fs"], 0.3))
        rows.append(b.ratio_row("S3: zarr 2.18 read via S3 mount vs via a mount of a local copy of the shards", "s",
                                m["mount"], m["mount_local"], 1.05))
        rows[-1].note = f"local mount {note('mount_local')}"
        rows.append(b.ratio_row(f"S3, {DELAY * 1e3:g} ms each way: same, S3 mount vs local mount", "s",
                                m["mount_delay"], m["mount_local"], None))
        rows += self.sweep_rows(fetched)
        return rows

    def sweep_rows(self, fetched: dict[str, list[dict]]) -> list[Row]:
        """What ``SWEEPERS`` readers at once made the mount fetch, against vol's stored bytes
        (and against ``--baseline``'s mount, if measured)."""
        b = self.b
        stored = sum(f.stat().st_size for f in (b.big / "vol" / "c").rglob("*") if f.is_file())
        med = {side: {k: statistics.median(r[k] for r in runs) for k in ("fetched", "gets")}
               for side, runs in fetched.items()}

        def spread(side: str) -> str:
            return (f"{med[side]['gets']:.0f} GETs; per repetition "
                    + ", ".join(f"{r['fetched'] / stored:.2f}x" for r in fetched[side]))

        rows = [b.ratio_row(f"S3: {SWEEPERS} zarr 2.18 readers of vol at once (default cache_size): bytes "
                            "fetched vs vol's stored bytes", "MB", med["sweep"]["fetched"] / 1e6, stored / 1e6, None)]
        rows[-1].note = spread("sweep")
        if "sweep_base" in med:
            rows.append(b.ratio_row("  same, shardfs vs shardfs-base (--baseline)", "MB", med["sweep"]["fetched"] / 1e6,
                                    med["sweep_base"]["fetched"] / 1e6, None))
            rows[-1].note = "shardfs-base " + spread("sweep_base")
        mem = {side: b.memory[name] for side, name in (("sweep", "s3-sweep"), ("sweep_base", "s3-sweep-base"))
               if name in b.memory}
        figure = "  memory of that mount after the reads, at rest (PSS of its processes)"
        base = mem.get("sweep_base")
        pss = mem["sweep"]["pss"] / MiB
        rows.append(Row(figure, "MiB", pss) if base is None else
                    b.ratio_row(figure + ", vs shardfs-base", "MiB", pss, base["pss"] / MiB, None))
        rows[-1].note = (f"its worker's peak RSS {mem['sweep']['largest'] / MiB:.0f} MiB"
                         + ("" if base is None else f"; shardfs-base's {base['largest'] / MiB:.0f} MiB"))
        return rows

    def _random_list(self, rep: int) -> Path:
        coords = random.Random(200 + rep).sample(self.chunks, min(RANDOM, len(self.chunks)))
        path = self.b.work / f"s3-random-{rep}.list"
        path.write_text("".join(" ".join(map(str, c)) + "\n" for c in coords))
        return path

    def random_mount(self, slow: DelayProxy, rep: int, package: str | None = None) -> dict:
        b = self.b
        name = "s3-random-base" if package else "s3-random"
        with b.mounted(self._url("big"), name, options=self._opts(slow.port), package=package) as m:
            b.drop_caches()
            res = b.client(PY2, "zarr_chunks", m.mnt / "vol", self._random_list(rep))
            time.sleep(REST_S)
            return res

    def random_native(self, slow: DelayProxy, rep: int) -> dict:
        self.b.drop_caches()
        return self.b.client(PY3, "zarr_chunks", self._url("big/vol"), self._random_list(rep),
                             f"http://127.0.0.1:{slow.port}")

    def counts(self, count: DelayProxy) -> list[Row]:
        """Row 5's request counts, through the counting proxy (one run: counts do not vary)."""
        b = self.b
        n_shards = math.prod(self.shard_grid)
        by_shard: dict[tuple[int, ...], list[str]] = {}  # chunk file names, in order (edge shards hold fewer)
        for c in sorted(self.chunks):
            by_shard.setdefault(tuple(i // p for i, p in zip(c, self.per_shard)), []).append(".".join(map(str, c)))
        usable = sorted(sh for sh, names in by_shard.items() if len(names) > 1)
        k = max(1, min(COUNT_SHARDS, len(usable) // 2))
        shards = random.Random(7).sample(usable, 2 * k)
        first, whole = shards[:k], shards[k:]
        n_whole = sum(len(by_shard[sh]) for sh in whole)
        found: dict[str, dict[str, dict[str, int]]] = {}  # what -> "shard"/"other" -> kind -> count

        @contextmanager
        def counting(what: str) -> Iterator[None]:
            assert count.log is not None  # a recording proxy
            start = len(count.log)
            yield
            found[what] = _split(count.log[start:])

        def read_files(root: Path, names: list[str], what: str) -> None:
            lst = b.work / f"s3-count-{what}.list"
            lst.write_text("\n".join(names) + "\n")
            with counting(what):
                res = b.client(PY3, "random_reads", root, lst)
            if res["bytes"] <= 0:
                raise BenchError(f"request counts: {what}: read nothing")

        assert count.log is not None  # a recording proxy
        start = len(count.log)
        with b.mounted(self._url("big"), "s3-count", options=self._opts(count.port)) as m:
            found["mount"] = _split(count.log[start:])
            vol = m.mnt / "vol"
            read_files(vol, [by_shard[sh][0] for sh in first], "cold")
            read_files(vol, [by_shard[sh][1] for sh in first], "second")
            read_files(vol, [name for sh in whole for name in by_shard[sh]], "whole_shard")
        if not self.smoke:
            with b.mounted(self._url("big"), "s3-count-array", options=self._opts(count.port)) as m:
                with counting("array_mount"):
                    self._check_sum(b.client(PY2, "zarr_read", m.mnt / "vol"), "count mount")
            with counting("array_native"):
                self.whole_native(count.port, PY3, "big/vol", "count native")
        b.raw["s3_requests"] = found
        b.log(f"s3 request counts: {found}")
        unparsed = count.snapshot()[0].get("UNPARSED", 0)

        def row(figure: str, what: str, per: int, target: float | None, baseline: str | None = None) -> Row:
            value: float
            if what == "mount":  # every request
                value, base = sum(map(_total, found[what].values())), None
            else:  # requests for shard keys; the others (metadata) in the note
                value = _total(found[what]["shard"]) / per
                base = _total(found[baseline]["shard"]) / per if baseline else None
            r = b.ratio_row(figure, "req", value, base, None) if base else Row(figure, "req", value)
            if target is not None:
                b.abs_check(r, target + 1e-9, "<", f"≤ {target:g}")
            notes = [f"{part}: {_kinds(found[what][part])}" for part in ("shard", "other") if found[what][part]]
            if baseline:
                notes.append(f"zarr 3 shard: {_kinds(found[baseline]['shard'])}")
            if unparsed:
                notes.append(f"{unparsed} connection(s) unparsed: counts low")
            r.note = "; ".join(notes)
            return r

        return [
            row("S3: requests at mount", "mount", 1, None),
            row(f"S3: requests for the 1st chunk file of a cold shard (x{k})", "cold", k, 2),
            row("S3: requests per further chunk file of a shard, index cached", "second", k, 1),
            row(f"S3: requests per shard read chunk file by chunk file ({n_whole / k:g} files, x{k})",
                "whole_shard", k, 2),
        ] + ([] if self.smoke else [
            row(f"S3: requests per shard, whole-array read ({n_shards} shards): mount vs zarr 3 native",
                "array_mount", n_shards, 2, "array_native")])

    def mount_time(self) -> list[Row]:
        """Mount time of the TENK-shard prefix against the one-shard prefix; checks both show data."""
        b = self.b
        direct = self.server.ports["s3.port"]
        t: dict[str, list[float]] = {"tenk": [], "small": []}
        last = f"{2 * (self.tenk_side - 1)}.{2 * (self.tenk_side - 1)}"
        for rep in b.repeat(b.reps if self.smoke else max(b.reps, 3)):
            for side in rotate(list(t), rep):
                with b.mounted(self._url(side), f"s3-mount-{side}", options=self._opts(direct)) as m:
                    t[side].append(m.seconds)
                    if side == "tenk":
                        first, end = (m.mnt / "a" / "0.0").read_bytes(), (m.mnt / "a" / last).read_bytes()
                        if first != end or first != bytes([1, 2, 5, 6]):
                            raise BenchError(f"tenk via mount: chunk 0.0 {first!r}, chunk {last} {end!r}")
                    else:
                        os.listdir(m.mnt / "tiny")
        b.raw["s3_mount_seconds"] = t
        tm, ts = statistics.median(t["tenk"]), statistics.median(t["small"])
        row = b.ratio_row(f"S3: mount time, {TENK} shards vs 1 shard", "s", tm, ts, None)
        return [b.abs_check(row, 1.0, "<", "< 1 s")]

    def rss(self) -> Row:
        """The largest memory of this package's S3 mounts (not ``--baseline``'s) after their
        reads by one reader: their processes' PSS summed (a supervised mount: supervisor, zygote,
        worker), with the serving worker's peak RSS and the RSS summed in the note (the sweep's
        mount, four readers at once, has a row of its own: ``sweep_rows``)."""
        mem = {k: v for k, v in self.b.memory.items()
               if k.startswith("s3-") and not k.endswith("-base") and not k.startswith("s3-sweep")}
        worst = max(mem, key=lambda k: mem[k]["pss"])
        m = mem[worst]
        r = Row("S3: memory of an S3 mount after its reads, at rest (PSS of its processes), largest", "MiB",
                m["pss"] / MiB)
        r = self.b.abs_check(r, 200, "<", "< 200 MiB")
        r.note = (f"{worst}; its worker's peak RSS {m['largest'] / MiB:.0f} MiB, the peak RSS of its processes "
                  f"summed {m['hwm'] / MiB:.0f} MiB (pages they share counted in each)")
        return r


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def _split(log: list[Request]) -> dict[str, dict[str, int]]:
    """Requests by kind, for vol's shard keys ("shard") and the rest ("other": metadata, listings)."""
    out: dict[str, dict[str, int]] = {"shard": {}, "other": {}}
    for r in log:
        part = out["shard" if r.path.startswith(SHARD_KEYS) else "other"]
        part[r.method] = part.get(r.method, 0) + 1
    return out


def _total(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k != "UNPARSED")


def _kinds(counts: dict[str, int]) -> str:
    return " ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"

