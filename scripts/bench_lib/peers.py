"""The local peers figure of ``scripts/bench``: shardfs beside the archive mounts users pick.

ratarmount (``.venv-ratarmount``, from PyPI) and fuse-zip (Debian) mount a stored
(uncompressed) zip of the real v2 copy of ``vol``; shardfs mounts the sharded source,
floorfs (the pyfuse3 floor) the copy, and the copy itself is the real directory. Every side
answers the same operations, each in a fresh mount with page caches dropped first, the
sides alternating over the repetitions (medians reported):

- zarr 2.18 reading the whole array right after mounting, then again (warm), and the
  daemon's CPU time (utime + stime of all its threads, ``/proc/PID/stat``) per chunk read
  during the read after mounting; then, in the same mount, page caches dropped before each,
  1, 2 and 4 concurrent zarr 2.18 reader processes, each reading a disjoint slab of the
  array along axis 0 (together, every chunk once): how the daemon's CPU per chunk scales;
- ``cat`` of every chunk file, first pass after mounting and second pass;
- ``ls -l`` of the array's directory right after mounting.

The shardfs side is a default (writable) mount (no FLUSH request at the ``close`` of a file
opened for reading, as the peers' read-only mounts); a read-only one (``shardfs-ro``:
``-o ro``) answers every operation too, in a row of its own under each figure (no target:
the targets are the default mount's).
``--smoke`` mounts each side but that one once: one read after mounting, then the two
``cat`` passes.

Each pass of a shardfs side logs the FUSE requests it made (``shardfs status`` before and after:
a 2nd ``cat`` pass makes no READ, a warm read no LOOKUP), kept in bench.json
(``peers_requests``). A pass after another process dropped the kernel's caches (the
tests and benches of other checkouts on a shared machine do) is left out of the medians and
said so (``harness.Tally``).

Targets (DESIGN.md "Performance targets"): shardfs at most ratarmount's time and at most
1.1x fuse-zip's on every timed row, and at most ratarmount's CPU per chunk.
A peer that is not installed is skipped in ``--smoke`` and an error otherwise.
"""

from __future__ import annotations

import os
import shutil
import statistics
import zipfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

from bench_lib.harness import Tally
from bench_lib.readers import zarr_readers
from shardfs.app.mounts import daemon_of

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RATARMOUNT = REPO / ".venv-ratarmount" / "bin" / "ratarmount"
SIDES = ("shardfs", "shardfs-ro", "ratarmount", "fuse-zip", "floorfs", "real")
PEERS = ("ratarmount", "fuse-zip")
READERS = (1, 2, 4)


class PeerError(Exception):
    """A peer figure could not be measured."""


def peer_command(peer: str) -> list[str] | None:
    """The foreground mount command of ``peer`` (``SRC MNT`` to append), or None if not installed."""
    if peer == "ratarmount":
        return [str(RATARMOUNT), "-f"] if os.access(RATARMOUNT, os.X_OK) else None
    exe = shutil.which("fuse-zip")
    return [exe, "-f", "-r"] if exe else None


def build_zip(src: Path, dest: Path, arcdir: str) -> None:
    """A stored (uncompressed) zip at ``dest`` of the files directly in ``src``, as ``arcdir/NAME``."""
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as z:
        for name in sorted(os.listdir(src)):
            z.write(src / name, f"{arcdir}/{name}")


class Asked:
    """The FUSE requests each pass made of a shardfs side's daemon (``shardfs status`` before and
    after): a pass the page cache served sends no READ (a 2nd ``cat`` pass), a warm read no LOOKUP
    while the kernel keeps the names (``-o entry_timeout``). Other sides: nothing counted."""

    def __init__(self) -> None:
        self.passes: dict[str, dict[str, list[dict[str, int]]]] = {}  # pass -> side -> requests made
        self._root: Path | None = None
        self._before: dict[str, int] | None = None
        self.recent: list[str] = []  # ``pass: requests`` since the caller last took them

    @staticmethod
    def requests(root: Path) -> dict[str, int] | None:
        daemon = daemon_of(str(root))
        return None if daemon is None else dict(daemon.doc.get("requests", {}))

    def start(self, side: str, root: Path) -> None:
        """Count the passes of ``side`` in its mount at ``root`` from now on."""
        self._root = root if side.startswith("shardfs") else None
        self._before = None if self._root is None else self.requests(root)

    def done(self, key: str, side: str, spoiled: bool = False) -> dict[str, int] | None:
        """The requests of pass ``key`` of ``side``, just ended (kept in ``passes``); ``spoiled``:
        another process dropped the kernel's caches meanwhile (said in ``recent``)."""
        if self._root is None or self._before is None:
            return None
        now = self.requests(self._root)
        if now is None:
            return None
        made = {op: n - self._before.get(op, 0) for op, n in now.items() if n != self._before.get(op, 0)}
        self.passes.setdefault(key, {}).setdefault(side, []).append(made)
        self.recent.append(f"{key} {made}" + " (spoiled: caches dropped by another process)" * spoiled)
        self._before = now
        return made


class Peers:
    """One run of the peers figure on a ``main.Bench`` (its datasets, mounts and helpers)."""

    def __init__(self, bench: Any, clients: str, py2: str, rotate: Callable[[list, int], list]) -> None:
        """``clients``: clients.py; ``py2``: the zarr 2.18 interpreter; ``rotate(items, k)``: the
        order of the sides in repetition ``k``."""
        self.b = bench
        self.clients, self.py2, self.rotate = clients, py2, rotate
        chosen = [x for x in bench.args.sides.split(",") if x] or list(SIDES)  # ``--sides``
        self.commands = {p: peer_command(p) for p in PEERS if p in chosen}
        missing = [p for p, c in self.commands.items() if c is None]
        if missing and not bench.smoke:
            raise PeerError(f"{', '.join(missing)} not installed: run scripts/install")
        for p in missing:
            bench.problems.append(f"peers: {p} not installed, skipped")
        self.sides = [s for s in SIDES if s in chosen and s not in missing and not (bench.smoke and s == "shardfs-ro")]
        if bench.args.baseline:  # the same figures with another checkout's package (``--baseline``)
            self.sides.insert(1, "shardfs-base")
        self.zip = bench.work / "peers" / "vol.zip"
        self.zip.parent.mkdir(exist_ok=True)
        build_zip(bench.copy / "vol", self.zip, "vol")
        self.n_chunks = len(bench.vol_names)
        self.fallback: set[tuple[str, str]] = set()  # (figure, side) measured in spoiled passes only

    @contextmanager
    def fresh(self, side: str, name: str) -> Iterator[tuple[Path, int | None]]:
        """``side``'s root (holding ``vol``) in a fresh mount, page caches dropped, and its serving
        process (None for the real directory)."""
        b = self.b
        if side == "real":
            b.drop_caches()
            yield b.copy, None
            return
        if side in PEERS:
            ctx = b.mounted(self.zip, f"{side}-{name}", peer=self.commands[side])
        else:
            ctx = b.mounted(b.copy if side == "floorfs" else b.big, f"peers-{side}-{name}", floor=side == "floorfs",
                            ro=side == "shardfs-ro", package=b.args.baseline if side == "shardfs-base" else None)
        with ctx as m:
            b.drop_caches()
            yield m.mnt, m.pid

    def zarr_readers(self, vol: Path, n: int, pid: int | None) -> tuple[float, float | None]:
        """``zarr_readers`` with this figure's bench and zarr 2.18 client."""
        return zarr_readers(self.b, self.py2, self.clients, vol, n, pid)

    def run(self) -> list[Any]:
        b = self.b
        cat = f"xargs -a {b.work / 'vol.list'} cat > /dev/null"
        tally = Tally(b.others_dropped)
        asked = Asked()

        def put(side: str, **values: float | None) -> None:
            asked.done(next(iter(values)), side, tally.put(side, **values))

        readers = READERS[:1] if b.smoke else READERS
        for rep in b.repeat():
            for side in self.rotate(self.sides, rep):
                with self.fresh(side, "zarr") as (root, pid):
                    asked.start(side, root)
                    wall, cpu = self.zarr_readers(root / "vol", 1, pid)
                    put(side, zarr1=wall, cpu_mount=None if cpu is None else cpu / self.n_chunks * 1e6)
                    if b.smoke:  # one mount per side: the smoke run only checks that every step works
                        put(side, cat1=b.shell(cat, cwd=root / "vol"))
                        put(side, cat2=b.shell(cat, cwd=root / "vol"))
                    else:
                        put(side, zarr2=self.zarr_readers(root / "vol", 1, pid)[0])
                    for n in readers if side != "real" and not b.smoke else ():
                        b.drop_caches()
                        asked.start(side, root)
                        wall, cpu = self.zarr_readers(root / "vol", n, pid)
                        put(side, **{f"wall{n}": wall, f"cpu{n}": None if cpu is None else cpu / self.n_chunks * 1e6})
                if not b.smoke:
                    with self.fresh(side, "cat") as (root, _):
                        asked.start(side, root)
                        put(side, cat1=b.shell(cat, cwd=root / "vol"))
                        put(side, cat2=b.shell(cat, cwd=root / "vol"))
                    with self.fresh(side, "ls") as (root, _):
                        asked.start(side, root)
                        put(side, ls=b.shell("ls -l .", cwd=root / "vol"))
                b.log(f"peers rep {rep + 1}: {side}: " + ", ".join(tally.shown))
                tally.shown.clear()
                if asked.recent:
                    b.log("  requests: " + "; ".join(asked.recent))
                    asked.recent.clear()
        t, spoiled = tally.values()
        self.fallback = tally.fallback
        if spoiled:
            b.problems.append(f"peers: {spoiled}")
        b.raw["peers"] = t
        b.raw["peers_spoiled"] = tally.spoiled
        b.raw["peers_requests"] = asked.passes
        m = {k: {s: statistics.median(v) for s, v in d.items()} for k, d in t.items()}
        b.raw["peers_medians"] = m
        n = self.n_chunks
        rows = []
        timed = [("cat1", f"cat {n} chunk files, 1st pass after mount"), ("cat2", f"cat {n} chunk files, 2nd pass"),
                 ("zarr1", "zarr 2.18 read right after mount"), ("zarr2", "zarr 2.18 read again (warm)"),
                 ("ls", f"ls -l of {n} chunk files after mount")]
        for key, label in timed:
            if key in m:
                rows += self.rows(m[key], f"peers: {label}", "s", key != "ls", key=key)
        rows += self.rows(m["cpu_mount"], "peers: daemon CPU per chunk, zarr 2.18 read right after mount", "µs",
                          True, key="cpu_mount")
        for k in readers if "cpu1" in m else ():
            rows += self.rows(m[f"cpu{k}"], f"  same, page caches dropped, {k} reader{'s' * (k > 1)} at once", "µs",
                              False, f"wall {self.values(m[f'wall{k}'])} s", second=False, key=f"cpu{k}")
        return rows

    def values(self, v: dict[str, float], skip: tuple[str, ...] = ()) -> str:
        """``side value, ...`` for the sides in ``v`` (not in ``skip``)."""
        return ", ".join(f"{s} {v[s]:.3g}" for s in self.sides if s in v and s not in skip)

    def rows(self, v: dict[str, float], label: str, unit: str, targets: bool, extra: str = "",
             second: bool = True, key: str = "") -> list[Any]:
        """``label``: shardfs vs ratarmount (target 1x), then (with ``second``) vs fuse-zip (target
        1.1x, not for CPU); the other sides' values in the first row's note. Then the same rows
        for ``shardfs-ro`` (if measured), without targets. A row with a side measured in spoiled
        passes only (figure ``key``: ``Tally.fallback``) says so in its note."""
        b = self.b
        out: list[Any] = []

        def spoiled(row: Any, *sides: str) -> Any:
            only = [s for s in sides if (key, s) in self.fallback]
            if only:
                said = f"spoiled passes only: {', '.join(only)}"
                row.note = f"{row.note}; {said}" if row.note else said
            return row

        for side in ("shardfs", "shardfs-ro"):
            if side not in v:
                continue
            rows: list[Any] = []
            for peer, limit in (("ratarmount", 1.0), ("fuse-zip", 1.1 if unit == "s" else None)):
                if peer not in v or rows and not second:
                    continue
                first = not out and not rows
                # a sub-row's label ("  same, ...") is repeated for each side: it names the case
                full = first or not rows and label.startswith("  ")
                figure = f"{label}: {side} vs {peer}" if full else f"  same, {side} vs {peer}"
                limit = limit if targets and side == "shardfs" else None
                if v[peer] > 0:
                    row = b.ratio_row(figure, unit, v[side], v[peer], limit)
                else:  # under one clock tick of CPU (a --smoke run): no ratio
                    row = replace(b.ratio_row(figure, unit, v[side], 1.0, None), baseline=v[peer], ratio=None)
                if first:
                    row.note = self.values(v, ("shardfs", peer)) + (f"; {extra}" if extra else "")
                rows.append(spoiled(row, side, peer))
            out += rows
        if "shardfs-base" in v and "shardfs" in v and v["shardfs-base"] > 0:
            versus = "shardfs vs shardfs-base (--baseline)"  # (alone with ``--sides shardfs``: the figure named)
            out.append(spoiled(b.ratio_row(f"  same, {versus}" if out else f"{label}: {versus}", unit, v["shardfs"],
                                           v["shardfs-base"], None), "shardfs", "shardfs-base"))
        return out


FIGURE_LABELS = ["peers: cat 1st pass: shardfs vs ratarmount", "  same, shardfs vs fuse-zip",
                 "peers: cat 2nd pass: shardfs vs ratarmount", "  same, shardfs vs fuse-zip",
                 "peers: zarr 2.18 read after mount: shardfs vs ratarmount", "  same, shardfs vs fuse-zip",
                 "peers: zarr 2.18 read warm: shardfs vs ratarmount", "  same, shardfs vs fuse-zip",
                 "peers: daemon CPU per chunk, 1 reader: shardfs vs ratarmount"]
