"""Differential, stateful test of the mount against a real v2 directory (issue 12, item 8).

A hypothesis ``RuleBasedStateMachine`` applies random sequences of what v2
writers and shell tools do — create, write and truncate chunk files and
temporaries, rename and link temporaries onto chunk keys, unlink, rename or
truncate chunk files, read, fsync, unmount and remount (at most ``REMOUNTS`` times
an example: without the cap two of the six ci examples were that rule, the one
without arguments, at all 25 steps, a second of CPU each) — to one array of the
mount and, side by side, to a real Zarr v2 directory that starts as a copy of
it. Each operation runs on the mount first: when the mount refuses it with
the errno the README documents for it (EINVAL for bytes that are not one
chunk, EFBIG past the largest valid chunk, EPERM for renaming or truncating a
chunk file), the reference directory is left as it was; otherwise the
reference runs it too and both must give the same result. After every step
both directories hold the same names, sizes and bytes, and the mount's shard
directories hold exactly the chunk files of the array root. After the last
step, zarr-python 3 reading the source natively equals zarr-python 2.18
reading the reference directory.

Examples: ``CI_EXAMPLES`` under the ci hypothesis profile (a minute or two);
``SHARDFS_HYPOTHESIS=thorough`` runs ten times as many, drawn at random.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import AbstractSet, Callable

import numcodecs
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from conftest import MountFactory, assert_same_array, budget, read_native, zarr2
from writers import umount
from sources import Spec, build

pytestmark = pytest.mark.long(80)

s = slice
CI_EXAMPLES = 6
REMOUNTS = 2
SPEC = Spec("a", (6, 7), (2, 3), (4, 6), "<i2", 7, ("zstd", 1), inner_crc=True,
            index_location="end", index_crc=True, initial=((s(0, 4), s(0, 6)), (s(4, 6), s(6, 7))), write=())
CODEC = numcodecs.Zstd(level=1)
RAW = 2 * 3 * 2  # bytes of one inner chunk
BOUND = RAW + RAW // 8 + RAW // 64 + 4096  # the largest valid chunk file (README "Limits")
KEYS = [f"{i}.{j}" for i in range(3) for j in range(3)]
TEMPS = ["0.1.cafe.partial", "2.2.beef.partial", "x.__lock", ".tmp"]

# What the mount may refuse, per operation (README): the reference then does nothing.
REFUSED_WRITE = {errno.EINVAL, errno.EFBIG}
REFUSED_RENAME_CHUNK = {errno.EPERM}
REFUSED_TRUNCATE_CHUNK = {errno.EPERM, errno.EFBIG}
REFUSED_COMMIT = {errno.EINVAL}


def chunk_bytes(seed: int) -> bytes:
    block = np.random.default_rng(seed).integers(-300, 300, size=(2, 3), dtype="<i2")
    return bytes(CODEC.encode(block.tobytes()))


# Contents a writer may put in a file: a valid chunk, garbage, nothing, or too much.
contents = st.one_of(
    st.integers(0, 2**16).map(chunk_bytes),
    st.binary(max_size=40),
    st.just(b""),
    st.integers(BOUND - 2, BOUND + 2).map(lambda n: b"z" * n),
)
keys = st.sampled_from(KEYS)
temps = st.sampled_from(TEMPS)
offsets = st.integers(0, 64)
sizes = st.one_of(st.integers(0, 64), st.sampled_from([BOUND, BOUND + 1, 9 << 20]))


def outcome(op: Callable[[Path], object], root: Path) -> int | None:
    """``op(root)``'s errno, or None if it succeeded."""
    try:
        op(root)
    except OSError as e:
        return e.errno
    return None


def write_file(path: Path, data: bytes, offset: int = 0, trunc: bool = True) -> None:
    """open (O_CREAT, O_TRUNC if ``trunc``), write ``data`` at ``offset``, close: errors of every call."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if trunc else 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.pwrite(fd, view, offset + len(data) - len(view)):]
    except OSError:
        try:
            os.close(fd)
        except OSError:
            pass
        raise
    os.close(fd)


def tree(root: Path) -> dict[str, bytes]:
    """Every file directly in ``root`` (not in subdirectories) with its bytes; the size that
    ``stat`` shows must be the length read."""
    out = {}
    for name in os.listdir(root):
        path = root / name
        if path.is_dir():
            continue
        data = path.read_bytes()
        assert os.stat(path).st_size == len(data), f"{path}: st_size {os.stat(path).st_size} != {len(data)} read"
        out[name] = data
    return out


def fsync_path(path: Path, flags: int) -> None:
    """Open ``path`` with ``flags``, fsync it, close it."""
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MountVsDirectory(RuleBasedStateMachine):
    """One array of a shardfs mount against a real v2 copy of it."""

    def __init__(self, tmp_factory: pytest.TempPathFactory, factory: MountFactory) -> None:
        super().__init__()
        self.factory = factory
        base = tmp_factory.mktemp("stateful")
        self.src = base / "src"
        build(self.src, [SPEC])
        self.mnt = factory(self.src)
        self.remounts = 0
        self.ref = base / "ref"
        shutil.copytree(self.arr, self.ref, ignore=shutil.ignore_patterns("c"))
        assert set(os.listdir(self.ref)) >= {".zarray", ".zattrs", "0.0", "2.2"}

    @property
    def arr(self) -> Path:
        return self.mnt / SPEC.name

    def both(self, op: Callable[[Path], object], refused: AbstractSet[int] = frozenset()) -> None:
        """Run ``op`` on the mount, then (unless the mount refused it) on the reference."""
        got = outcome(op, self.arr)
        if got in refused:
            return
        want = outcome(op, self.ref)
        assert got == want, f"mount: {got and errno.errorcode[got]}, v2 directory: {want and errno.errorcode[want]}"

    # ----- chunk files ------------------------------------------------------------------

    @rule(key=keys, data=contents)
    def write_chunk(self, key: str, data: bytes) -> None:
        """``cp``/``dd``/FSStore: open with O_TRUNC, write, close (the commit)."""
        self.both(lambda root: write_file(root / key, data), REFUSED_WRITE)

    @rule(key=keys, data=st.binary(min_size=1, max_size=8), offset=offsets)
    def patch_chunk(self, key: str, data: bytes, offset: int) -> None:
        """``dd conv=notrunc seek=N``: bytes written into an existing chunk file in place."""
        self.both(lambda root: write_file(root / key, data, offset, trunc=False), REFUSED_WRITE)

    @rule(key=keys, size=sizes)
    def truncate_open_chunk(self, key: str, size: int) -> None:
        """``ftruncate`` of a chunk file open for writing, then close (the commit)."""
        def op(root: Path) -> None:
            with open(root / key, "r+b") as f:
                f.truncate(size)
        self.both(op, REFUSED_WRITE)

    @rule(key=keys, size=sizes)
    def truncate_chunk_by_path(self, key: str, size: int) -> None:
        self.both(lambda root: os.truncate(root / key, size), REFUSED_TRUNCATE_CHUNK)

    @rule(key=keys)
    def unlink_chunk(self, key: str) -> None:
        self.both(lambda root: os.unlink(root / key))

    @rule(key=keys, name=temps)
    def rename_chunk(self, key: str, name: str) -> None:
        self.both(lambda root: os.rename(root / key, root / name), REFUSED_RENAME_CHUNK)

    @rule(key=keys)
    def read_chunk(self, key: str) -> None:
        got = outcome(lambda root: (root / key).read_bytes(), self.arr)
        assert got == outcome(lambda root: (root / key).read_bytes(), self.ref)

    @rule(key=keys)
    def fsync_chunk(self, key: str) -> None:
        self.both(lambda root: fsync_path(root / key, os.O_WRONLY))

    # ----- temporaries --------------------------------------------------------------------

    @rule(name=temps, data=contents)
    def write_temp(self, name: str, data: bytes) -> None:
        self.both(lambda root: write_file(root / name, data))

    @rule(name=temps, data=st.binary(min_size=1, max_size=16), offset=st.one_of(offsets, st.just(9 << 20)))
    def patch_temp(self, name: str, data: bytes, offset: int) -> None:
        self.both(lambda root: write_file(root / name, data, offset, trunc=False))

    @rule(name=temps, size=sizes)
    def truncate_temp_by_path(self, name: str, size: int) -> None:
        self.both(lambda root: os.truncate(root / name, size))

    @rule(name=temps, key=keys)
    def rename_temp_onto_chunk(self, name: str, key: str) -> None:
        """zarr-python: write ``<key>.<uuid>.partial``, then rename it over the key (the commit)."""
        self.both(lambda root: os.rename(root / name, root / key), REFUSED_COMMIT)

    @rule(name=temps, other=temps)
    def rename_temp(self, name: str, other: str) -> None:
        self.both(lambda root: os.rename(root / name, root / other))

    @rule(name=temps, key=keys)
    def link_temp_onto_chunk(self, name: str, key: str) -> None:
        """zarr 3's exclusive create: link the temporary onto the key, then unlink it."""
        self.both(lambda root: os.link(root / name, root / key), REFUSED_COMMIT)
        self.both(lambda root: os.unlink(root / name))

    @rule(name=temps)
    def unlink_temp(self, name: str) -> None:
        self.both(lambda root: os.unlink(root / name))

    @rule(name=temps)
    def fsync_temp(self, name: str) -> None:
        self.both(lambda root: fsync_path(root / name, os.O_RDONLY))

    # ----- the mount ------------------------------------------------------------------------

    @precondition(lambda self: self.remounts < REMOUNTS)
    @rule()
    def remount(self) -> None:
        """``shardfs umount`` and mount again: chunks stay; temporaries do not survive (README)."""
        self.remounts += 1
        umount(self.factory, self.mnt)
        for name in TEMPS:
            if (self.ref / name).exists():
                os.unlink(self.ref / name)
        self.mnt = self.factory(self.src)

    # ----- checks ---------------------------------------------------------------------------

    @invariant()
    def same_files(self) -> None:
        got, want = tree(self.arr), tree(self.ref)
        assert sorted(got) == sorted(want), f"names: mount {sorted(got)}, v2 directory {sorted(want)}"
        for name in want:
            assert got[name] == want[name], f"{name}: mount {got[name][:40]!r}, v2 directory {want[name][:40]!r}"

    @invariant()
    def shard_directories_hold_the_chunks(self) -> None:
        found = {}
        for dirpath, _dirs, files in os.walk(self.arr / "c"):
            for name in files:
                found[name] = Path(dirpath, name).read_bytes()
                i, j = map(int, name.split("."))
                assert Path(dirpath).relative_to(self.arr) == Path("c", str(i // 2), str(j // 2)), dirpath
        want = {k: v for k, v in tree(self.ref).items() if k in KEYS}
        assert found == want

    def teardown(self) -> None:
        daemon = self.factory.info(self.mnt)
        assert "Traceback" not in daemon.output(), daemon.output()[-5000:]
        umount(self.factory, self.mnt)
        native = read_native(self.src / SPEC.name)
        v2 = zarr2("result = zarr.open(path, mode='r')[...]", path=str(self.ref))
        assert_same_array(native, v2, "zarr 3 on the source vs zarr 2.18 on the v2 directory")


def test_mount_behaves_like_a_v2_directory(tmp_path_factory):
    factory = MountFactory(tmp_path_factory)
    try:
        run_state_machine_as_test(
            lambda: MountVsDirectory(tmp_path_factory, factory),
            settings=settings(max_examples=budget(CI_EXAMPLES), stateful_step_count=25, deadline=None,
                              suppress_health_check=list(HealthCheck)))
    finally:
        factory.close()


# ----- examples the machine found, kept as regression tests ------------------------------------


def run_steps(tmp_path_factory, steps: list[tuple[str, dict]]) -> None:
    """Run ``steps`` (rule name, arguments) on a fresh machine, checking after each as hypothesis does."""
    factory = MountFactory(tmp_path_factory)
    try:
        machine = MountVsDirectory(tmp_path_factory, factory)
        for name, args in steps:
            getattr(machine, name)(**args)
            machine.same_files()
            machine.shard_directories_hold_the_chunks()
        machine.teardown()
    finally:
        factory.close()


def test_a_new_shard_is_listed_in_its_key_directory_before_it_is_folded(tmp_path_factory):
    """Found by the machine: ``c/0/`` did not list ``1``, the shard directory of a chunk written
    into a shard that is not in the source yet, until the shard was folded."""
    run_steps(tmp_path_factory, [("write_chunk", {"key": "0.2", "data": chunk_bytes(307)})])


def test_a_chunk_whose_create_was_refused_can_be_created_again(tmp_path_factory):
    """Found by the machine: after ``close`` refused a new chunk file (EINVAL), the kernel kept
    its name, and the next ``open(O_CREAT)`` through that name failed with ENOENT."""
    run_steps(tmp_path_factory, [("write_chunk", {"key": "1.2", "data": b"z" * (BOUND + 1)}),
                                 ("write_chunk", {"key": "1.2", "data": b""}),
                                 ("write_chunk", {"key": "1.2", "data": chunk_bytes(0)})])
