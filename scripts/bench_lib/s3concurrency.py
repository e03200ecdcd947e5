"""How to keep many S3 GETs in flight from trio: the measurement behind shardfs.storage.requests.

Usage: ``.venv/bin/python scripts/bench_lib/s3concurrency.py [N] [DELAY_MS]`` (defaults: 200
GETs, 100 ms each way, i.e. 200 ms per GET). Starts its own SeaweedFS (seaweed.py) with
a DelayProxy in front (its own process, so it does not share the client's GIL), stores N small
objects, then from one trio task per GET reads them all at once three ways, 3 rounds each
(cold = fresh client, warm = same client again), and prints wall time and client CPU time per round:

- ``trio.to_thread`` with trio's default limiter (40 threads): obstore's sync ``get``;
- ``trio.to_thread`` with a limiter of N (N threads);
- obstore's async ``get_async`` on one asyncio loop thread, awaited from trio through
  ``shardfs.storage.loop.LoopThread.trio_run``.
"""

from __future__ import annotations

import functools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent.parent), str(HERE.parent)]

import obstore  # noqa: E402
import trio  # noqa: E402
from obstore.store import S3Store  # noqa: E402

from testkit.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3  # noqa: E402
from shardfs.storage.loop import LoopThread  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    delay = (float(sys.argv[2]) if len(sys.argv) > 2 else 100.0) / 1000
    workdir = tempfile.TemporaryDirectory(prefix="s3concurrency-")
    server = SeaweedS3(Path(workdir.name)).start()
    loop = LoopThread()
    try:
        def store(port: int) -> S3Store:
            return S3Store(server.bucket, config={"endpoint": f"http://127.0.0.1:{port}", "region": REGION,
                                                  "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
                           client_options={"allow_http": True})

        direct = store(server.ports["s3.port"])
        for i in range(n):
            obstore.put(direct, f"k/{i}", bytes([i % 256]) * 4096)

        async def threads(s: S3Store, limiter: trio.CapacityLimiter | None) -> None:
            def get(i: int) -> bytes:
                return bytes(obstore.get(s, f"k/{i}").bytes())

            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(functools.partial(trio.to_thread.run_sync, get, i, limiter=limiter))

        async def bridged(s: S3Store) -> None:
            async def get(i: int) -> bytes:
                return bytes(await (await obstore.get_async(s, f"k/{i}")).bytes_async())

            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(loop.trio_run, get(i))

        ways = {
            "trio.to_thread, default limiter (40)": lambda s: threads(s, None),
            f"trio.to_thread, limiter {n}": lambda s: threads(s, trio.CapacityLimiter(n)),
            "asyncio loop thread bridged to trio": bridged,
        }
        proxy = subprocess.Popen([sys.executable, "-m", "testkit.delayproxy", "--delay-ms", str(delay * 1000),
                                  "--upstream", f"127.0.0.1:{server.ports['s3.port']}"],
                                 stdout=subprocess.PIPE, text=True, cwd=HERE.parent.parent)
        try:
            assert proxy.stdout is not None
            port = int(proxy.stdout.readline().rsplit(":", 1)[1])
            results: dict[str, list[tuple[float, float, float]]] = {w: [] for w in ways}
            for _ in range(3):
                for name, way in ways.items():
                    s = store(port)
                    t0 = time.perf_counter()
                    trio.run(way, s)
                    cold = time.perf_counter() - t0
                    c0, t0 = time.process_time(), time.perf_counter()
                    trio.run(way, s)
                    warm, cpu = time.perf_counter() - t0, time.process_time() - c0
                    results[name].append((cold, warm, cpu))
        finally:
            proxy.terminate()
            proxy.wait()
        print(f"{n} concurrent GETs, {delay * 2000:.0f} ms each (medians of 3):")
        for name, rows in results.items():
            cold, warm, cpu = (statistics.median(col) for col in zip(*rows))
            print(f"  {name:40s} cold {cold:.3f} s  warm {warm:.3f} s  client CPU {cpu:.3f} s")
    finally:
        loop.close()
        server.stop()
        workdir.cleanup()


if __name__ == "__main__":
    main()
