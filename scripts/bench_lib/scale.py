"""The scale points of ``scripts/bench --only scale`` (issue 27): how the mount holds at the sizes
real stores reach. Not in the default run (it takes minutes); ``--smoke`` runs it small.

1. Local: an array of ``LOCAL_CHUNKS`` (1M) inner chunks of one byte (shape 1024x1024, chunks
   1x1, shards 64x64: 256 shards of 4096 chunks, written byte by byte below), mounted fresh:
   ``ls -l`` of the array directory (every chunk file), cold, then ``find . -type f`` there, in
   entries per second (target >= 20k/s), and the daemon's RSS afterwards (target < 150 MiB; its peak in the note).
2. Object storage: ``S3_SHARDS`` (100k) shards of 2 one-byte chunks in SeaweedFS (seaweed.py,
   loopback): ``shardfs mount`` time against a mount of a one-shard prefix, alternated (target
   <= 1.5x: mounting lists nothing, O(1) in the shards), ``ls -l`` of the array
   (200k chunk files: the shards listed, then 100k index reads), ``RANDOM`` random chunk reads
   (p50/p99 of open+read+close, a fresh process each time would measure Python: one process),
   and the daemon's RSS (target < 200 MiB; its peak in the note).
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import time
from pathlib import Path

import crc32c
import numpy as np

from bench_lib.harness import Bench, Row, proc_status, rotate
from testkit.seaweed import REGION, S3Source, SeaweedS3, aws_env, put_all

LOCAL_CHUNKS = 1 << 20  # 1024 x 1024
S3_SHARDS = 100_000
RANDOM = 200
BUCKET = "shardfs-scale"
MiB = 1 << 20


def figure(bench: Bench) -> list[Row]:
    """Both scale points (module docstring)."""
    return _local(bench) + _s3(bench)


def shard_bytes(chunks: int) -> bytes:
    """A shard of ``chunks`` one-byte inner chunks (values 1, 2, ...), raw, with its index at the
    end (little-endian (offset, nbytes) pairs, then their crc32c)."""
    data = (np.arange(chunks) % 255 + 1).astype(np.uint8).tobytes()
    index = np.stack([np.arange(chunks), np.ones(chunks, dtype=np.int64)], axis=1).astype("<u8").tobytes()
    return data + index + crc32c.crc32c(index).to_bytes(4, "little")


def array_doc(shape: tuple[int, ...], shard: tuple[int, ...]) -> dict:
    """``zarr.json`` of a uint8 array of one-byte inner chunks in shards of ``shard``."""
    return {"zarr_format": 3, "node_type": "array", "shape": list(shape), "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(shard)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "attributes": {},
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": [1] * len(shape), "codecs": [{"name": "bytes"}], "index_location": "end",
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]}


GROUP = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()


def _listing_rate(bench: Bench, cmd: str, cwd: Path, out: Path, files: bool) -> tuple[float, int]:
    """``(seconds, entries)`` of ``cmd`` in ``cwd`` (its output in ``out``): lines, or for
    ``ls -l`` the lines of regular files."""
    seconds = bench.shell(cmd, cwd=cwd, out=out)
    lines = out.read_text().splitlines()
    return seconds, (sum(1 for ln in lines if ln.startswith("-")) if files else len(lines))


def _rate_row(label: str, seconds: float, entries: int, expected: int) -> Row:
    row = Bench.abs_check(Row(label, "entries/s", entries / seconds), 20000, ">=", "≥ 20k/s")
    row.note = f"{entries} entries in {seconds:.1f} s"
    if entries != expected:
        row.status, row.note = "ERROR", f"listed {entries} entries, expected {expected}"
    return row


def _local(bench: Bench) -> list[Row]:
    side = 128 if bench.smoke else 1024
    shard = 32 if bench.smoke else 64
    src = bench.work / "scale-local"
    (src / "a").mkdir(parents=True)
    (src / "zarr.json").write_bytes(GROUP)
    (src / "a" / "zarr.json").write_text(json.dumps(array_doc((side, side), (shard, shard))))
    body = shard_bytes(shard * shard)
    for i in range(side // shard):
        (src / "a" / "c" / str(i)).mkdir(parents=True)
        for j in range(side // shard):
            (src / "a" / "c" / str(i) / str(j)).write_bytes(body)
    chunks = side * side
    bench.log(f"  scale: local array of {chunks} chunks in {(side // shard) ** 2} shards")
    out = bench.work / "scale-listing.out"
    with bench.mounted(src, "scale-local") as m:
        bench.drop_caches()
        ls_s, ls_n = _listing_rate(bench, "ls -l .", m.mnt / "a", out, files=True)
        find_s, find_n = _listing_rate(bench, "find . -type f", m.mnt / "a", out, files=False)
        rss, peak = _rss(m.pid)
    bench.raw["scale_local"] = {"chunks": chunks, "ls": [ls_s, ls_n], "find": [find_s, find_n], "rss": rss,
                                "peak_rss": peak}
    return [_rate_row(f"scale: ls -l over {chunks} chunk files (local, cold)", ls_s, ls_n, chunks),
            _rate_row(f"scale: find -type f over {chunks} chunk files (local, warm)", find_s, find_n,
                      chunks + 2),  # and .zarray, .zattrs (shard directories are one lookup away, unlisted)
            _rss_row(f"scale: daemon RSS after listing {chunks} chunks", rss, peak, 150)]


def _rss(pid: int) -> tuple[int, int]:
    """The daemon's resident set now and at its peak (VmRSS, VmHWM), in bytes (a supervised
    mount: its supervisor and worker, ``harness.proc_status``)."""
    st = proc_status(pid)
    return st["VmRSS"], st["VmHWM"]


def _rss_row(label: str, rss: int, peak: int, target_mib: int) -> Row:
    """RSS after the work against ``target_mib`` (as the listing figure measures it); the peak in the note."""
    row = Bench.abs_check(Row(label, "MiB", rss / MiB), target_mib, "<", f"< {target_mib} MiB")
    row.note = f"peak {peak / MiB:.0f} MiB"
    return row


def _s3(bench: Bench) -> list[Row]:
    shards = 1000 if bench.smoke else S3_SHARDS
    server = SeaweedS3(bench.work / "scale-seaweed", bucket=BUCKET)
    with aws_env():
        server.start()
        try:
            return _s3_rows(bench, server, shards)
        finally:
            server.stop()


def _s3_rows(bench: Bench, server: SeaweedS3, shards: int) -> list[Row]:
    t0 = time.perf_counter()
    body = shard_bytes(2)
    items: list[tuple[str, bytes | Path]] = [("zarr.json", GROUP),
                                             ("a/zarr.json", json.dumps(array_doc((2 * shards,), (2,))).encode())]
    items += [(f"a/c/{i}", body) for i in range(shards)]
    put_all(S3Source(server, "scale").store(), items, concurrency=128)
    put_all(S3Source(server, "one").store(), [("zarr.json", GROUP), ("a/zarr.json", items[1][1]), ("a/c/0", body)])
    bench.log(f"  scale: uploaded {len(items)} objects in {time.perf_counter() - t0:.0f} s")
    url = f"s3://{BUCKET}/scale"
    options = f"endpoint=http://127.0.0.1:{server.ports['s3.port']},region={REGION}"
    out = bench.work / "scale-s3.out"
    seconds: dict[str, list[float]] = {"scale": [], "one": []}
    for rep in bench.repeat(3):
        for prefix in rotate(["scale", "one"], rep):
            with bench.mounted(f"s3://{BUCKET}/{prefix}", f"scale-mount-{prefix}", options=options) as m:
                seconds[prefix].append(m.seconds)
    mount_s, one_s = statistics.median(seconds["scale"]), statistics.median(seconds["one"])
    with bench.mounted(url, "scale-s3", options=options) as m:
        ls_s, ls_n = _listing_rate(bench, "ls -l .", m.mnt / "a", out, files=True)
        rng = random.Random(7)
        names = [f"{rng.randrange(2 * shards)}" for _ in range(RANDOM)]
        lat = _timed_reads(bench, m.mnt / "a", names)
        rss, peak = _rss(m.pid)
    bench.raw["scale_s3"] = {"shards": shards, "mount_s": seconds, "ls": [ls_s, ls_n], "reads_s": lat,
                             "rss": rss, "peak_rss": peak}
    p50, p99 = statistics.median(lat), sorted(lat)[int(0.99 * (len(lat) - 1))]
    mount_row = Bench.ratio_row(f"scale: S3 mount time, {shards} shards vs 1 shard", "s", mount_s, one_s, 1.5)
    ls_row = _rate_row(f"scale: S3 ls -l over {2 * shards} chunk files ({shards} shards)", ls_s, ls_n, 2 * shards)
    ls_row.abs_target, ls_row.target, ls_row.status = None, "report", "report" if ls_row.status != "ERROR" else "ERROR"
    return [mount_row, ls_row,
            Row(f"scale: S3 random chunk read (open+read+close), p50 / p99 of {len(lat)}", "ms", p50 * 1000,
                note=f"p99 {p99 * 1000:.1f} ms"),
            _rss_row(f"scale: S3 daemon RSS, {shards} shards listed and read", rss, peak, 200)]


def _timed_reads(bench: Bench, root: Path, names: list[str]) -> list[float]:
    """Seconds of each open+read+close of ``root/NAME`` (one Python process, so that each figure
    is the file system's, not an interpreter start)."""
    code = ("import json, sys, time\nout = []\nfor n in sys.argv[2:]:\n    t = time.perf_counter()\n"
            "    with open(sys.argv[1] + '/' + n, 'rb') as f:\n        f.read()\n"
            "    out.append(time.perf_counter() - t)\nprint(json.dumps(out))")
    r = subprocess.run(["python3", "-c", code, str(root), *names], capture_output=True, text=True,
                       timeout=bench.op_timeout(), check=True)
    return json.loads(r.stdout)
