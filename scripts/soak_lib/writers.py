"""The writer and structure roles: whole-chunk writes of unique tokens, and structure changes.

``run_writer(worker)``: until the deadline, picks an array and one inner chunk it owns
(``grid.owner``; half the time from a small *hot set* every writer shares, so writers overlap
on purpose), a token (``index * TOKEN_STRIDE + seq``, unique per array) and a method, logs a
``begin`` line ``{"k": "wb", "a", "c", "tok", "how", "op", "t0"}``, writes, then logs
``{"k": "we", "a", "op", "t0", "t1", "ok", "err"?}``; ``ok`` means the call that commits
returned success (``close()`` for in-place, ``rename()`` for temp+rename, the library's write
for zarr/tensorstore, ``cp``'s exit status 0, ``unlink()`` for ``rm``: token 0; its ENOENT is a failure).
Methods: ``zarr2`` / ``zarr3`` / ``tensorstore`` (the library writes the chunk's region), ``rename``
(``<key>.<uuid>.partial`` then ``rename``, as zarr does), ``inplace`` (``open(O_TRUNC)``, write,
close), ``cp`` (coreutils from a file outside the mount), ``rm`` (unlink: the chunk becomes fill).
A string array's chunks hold ``Grid.value(token)``; tensorstore (no v2 ``vlen-utf8``) does not write them.

``run_structure(worker)``: every few seconds one of: create a scratch array with zarr 2.18 and
write it, resize one, consolidate the root, ``rm -r`` one; each logged as
``{"k": "s", "op", "t0", "t1", "ok", "err"?, "bad"?}`` (``bad``: what was read back differed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from typing import Any, Callable

import numpy as np

from soak_lib.grid import Grid, owner

TOKEN_STRIDE = 100_000
LIB_METHODS = {"zarr2": ("zarr2", "rename", "inplace", "cp"),
               "main": ("zarr3", "tensorstore", "rename", "inplace", "cp")}
RM_RATE = 0.04


class _Writes:
    """The write methods for one array in one mount."""

    def __init__(self, path: str, grid: Grid, tmp: str):
        self.path, self.grid, self.tmp = path, grid, tmp

    def _key(self, chunk: tuple[int, ...]) -> str:
        # No makedirs: the arrays use "." keys, and a directory made while a daemon restarts
        # would be in the bare mountpoint (immutable anyway: see daemons.Daemon).
        return os.path.join(self.path, self.grid.key(chunk))

    def zarr2(self, chunk: tuple[int, ...], token: int) -> None:
        import zarr

        zarr.open_array(self.path, mode="r+")[self.grid.chunk_region(chunk)] = self.grid.value(token)

    def zarr3(self, chunk: tuple[int, ...], token: int) -> None:
        import zarr

        zarr.open_array(self.path, mode="r+", zarr_format=2)[self.grid.chunk_region(chunk)] = self.grid.value(token)

    def tensorstore(self, chunk: tuple[int, ...], token: int) -> None:
        import tensorstore as ts

        spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": self.path}}
        t = ts.open(spec, open=True, context=ts.Context()).result()
        t[self.grid.chunk_region(chunk)].write(np.asarray(token, dtype=self.grid.dtype)).result()

    def rename(self, chunk: tuple[int, ...], token: int) -> None:
        key = self._key(chunk)
        tmp = f"{key}.{uuid.uuid4().hex}.partial"
        with open(tmp, "wb") as f:
            f.write(self.grid.encode(token))
        os.rename(tmp, key)

    def inplace(self, chunk: tuple[int, ...], token: int) -> None:
        with open(self._key(chunk), "wb") as f:
            f.write(self.grid.encode(token))

    def cp(self, chunk: tuple[int, ...], token: int) -> None:
        local = os.path.join(self.tmp, "chunk")
        with open(local, "wb") as f:
            f.write(self.grid.encode(token))
        r = subprocess.run(["cp", local, self._key(chunk)], capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise OSError(f"cp exited with {r.returncode}: {r.stderr.strip()}")

    def rm(self, chunk: tuple[int, ...], token: int) -> None:
        # ENOENT fails the op too: the chunk may be empty already, or the mount is not there
        # (a restart); either way nothing was acknowledged.
        os.unlink(os.path.join(self.path, self.grid.key(chunk)))


def run_writer(worker: Any) -> None:
    cfg = worker.config
    grids = {name: Grid(a["zarray"]) for name, a in cfg["arrays"].items()}
    mine = {name: [c for c in g.all_chunks() if owner(name, c, cfg["mounts"]) == cfg["m"]]
            for name, g in grids.items()}
    hot = {name: chunks[: max(2, len(chunks) // 8)] for name, chunks in mine.items()}
    names = sorted(n for n in grids if mine[n])
    methods = LIB_METHODS[cfg["lib"]]
    tmp = tempfile.mkdtemp(prefix=f"soak-{worker.name}-")
    try:
        while worker.running() and worker.seq < TOKEN_STRIDE - 1:
            worker.seq += 1
            name = worker.rng.choice(names)
            chunk = worker.rng.choice(hot[name] if worker.rng.random() < 0.5 else mine[name])
            how = "rm" if worker.rng.random() < RM_RATE else worker.rng.choice(
                [m for m in methods if m != "tensorstore"] if grids[name].strings else methods)
            token = 0 if how == "rm" else cfg["index"] * TOKEN_STRIDE + worker.seq
            writes = _Writes(f"{cfg['mount']}/{name}", grids[name], tmp)
            fn: Callable[[tuple[int, ...], int], None] = getattr(writes, how)
            op = {"a": name, "op": worker.seq}
            worker.log({"k": "wb", **op, "c": list(chunk), "tok": token, "how": how, "t0": time.monotonic()})
            t0, t1, _, err = worker.timed(lambda: fn(chunk, token))
            worker.log({"k": "we", **op, "how": how, "t0": t0, "t1": t1, "ok": err is None,
                        **({"err": err, "msg": worker.detail} if err else {})})
            time.sleep(worker.rng.uniform(0, cfg.get("pause", 0.2)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_structure(worker: Any) -> None:
    import zarr

    cfg = worker.config
    root = cfg["mount"]
    live: list[str] = []
    n = 0
    while worker.running():
        time.sleep(worker.rng.uniform(2, cfg.get("pause", 8)))
        if not os.path.ismount(root):
            continue  # a daemon being restarted: never create in the bare mountpoint
        roll = worker.rng.random()
        bad: list[str] = []
        if not live or (roll < 0.4 and len(live) < 3):
            n += 1
            path = f"{root}/scratch/s{worker.rng.randrange(1 << 30)}"

            def op() -> None:
                data = np.arange(40 * 30, dtype="i4").reshape(40, 30) + n
                z = zarr.open_array(path, mode="w", shape=(40, 30), chunks=(10, 10), dtype="i4", fill_value=0)
                z[...] = data
                if not np.array_equal(zarr.open_array(path, mode="r")[...], data):
                    bad.append(f"{path}: read back differs from what was written")
                live.append(path)
            what = "create"
        elif roll < 0.65:
            path = worker.rng.choice(live)

            def op() -> None:
                z = zarr.open_array(path, mode="r+")
                before = np.asarray(z[...])
                shape = (worker.rng.randrange(5, 60), worker.rng.randrange(5, 60))
                z.resize(shape)
                after = np.asarray(zarr.open_array(path, mode="r")[...])
                keep = tuple(slice(0, min(a, b)) for a, b in zip(before.shape, shape))
                if after.shape != shape or not np.array_equal(after[keep], before[keep]):
                    bad.append(f"{path}: resize to {shape} changed the values kept")
            what = "resize"
        elif roll < 0.8:
            def op() -> None:
                zarr.consolidate_metadata(root)
            what = "consolidate"
        else:
            path = live.pop(worker.rng.randrange(len(live)))

            def op() -> None:
                shutil.rmtree(path)
                if os.path.exists(path):
                    bad.append(f"{path}: still there after rm -r")
            what = "rm -r"
        t0, t1, _, err = worker.timed(op)
        worker.log({"k": "s", "op": what, "t0": t0, "t1": t1, "ok": err is None,
                    **({"err": err, "msg": worker.detail} if err else {}), **({"bad": bad} if bad else {})})
