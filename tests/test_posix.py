"""POSIX view of the mount with the real tools: find, stat, cat, cp; what only checks
semantics (names, listings, inodes, sizes, bytes, modes, the metadata shown) runs in-process on
the same source (``tests/inproc.py``).

Expected names are computed from the data written (sources.stored_chunks),
never from the daemon.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from conftest import case_params
from inproc import InPath, InProcess
from sources import CASES, CASES_BY_ID, empty_in_bounds_chunks, stored_chunks, stored_inner_bytes

SHARDED = [c for c in CASES if c.sharded]


@pytest.fixture(scope="module")
def view(matrix, module_mount):
    return module_mount(matrix.root)


@pytest.fixture(scope="module")
def tree(matrix) -> Iterator[InProcess]:
    """The source as the mount shows it, in-process (no kernel)."""
    with InProcess(matrix.root) as fs:
        yield fs


def run(*cmd, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, timeout=60)
    if check:
        assert r.returncode == 0, f"{cmd} -> {r.returncode}: {r.stderr.decode(errors='replace')}"
    return r


def prefixes(rel: str) -> set[str]:
    parts = rel.split("/")
    return {"/".join(parts[:i]) for i in range(1, len(parts))}


def expected_tree(case, data) -> tuple[set[str], set[str], set[str], set[str]]:
    """(files, dirs) relative to the array directory as listed from it (chunk files only),
    and (files, dirs) of its shard directories, relative to the array directory."""
    stored = stored_chunks(case, data)
    files = {".zarray", ".zattrs"} | {case.chunk_file(i) for i in stored}
    dirs: set[str] = set()
    for f in files:
        dirs |= prefixes(f)
    shard_files: set[str] = set()
    shard_dirs: set[str] = set()
    if case.sharded:
        shard_dirs = {case.shard_dir(s) for s in {case.shard_of(i) for i in stored}}
        shard_files = {f"{case.shard_dir(case.shard_of(i))}/{case.chunk_name(i)}" for i in stored}
        for f in list(shard_files) + list(shard_dirs):
            shard_dirs |= prefixes(f)
    return files, dirs, shard_files, shard_dirs


def find_tree(path: Path | InPath) -> tuple[set[str], set[str]]:
    """``(files, directories)`` below ``path``, relative to it: ``find`` through a mount, a walk of
    the listings in-process."""
    if isinstance(path, InPath):
        found: tuple[set[str], set[str]] = set(), set()

        def walk(at: InPath, prefix: str) -> None:
            for name, st in at.entries():
                kind = stat.S_IFMT(st.st_mode)
                assert kind in (stat.S_IFDIR, stat.S_IFREG), f"unexpected node type: {prefix}{name}"
                found[kind == stat.S_IFDIR].add(prefix + name)
                if kind == stat.S_IFDIR:
                    walk(at / name, f"{prefix}{name}/")

        walk(path, "")
        return found
    out = run("find", str(path), "-mindepth", "1", "-printf", r"%y %P\n").stdout.decode()
    files: set[str] = set()
    dirs: set[str] = set()
    other: set[str] = set()
    for line in out.splitlines():
        kind, rel = line.split(" ", 1)
        {"f": files, "d": dirs}.get(kind, other).add(rel)
    assert not other, f"unexpected node types: {other}"
    return files, dirs


def assert_enoent(path) -> None:
    """``stat`` of ``path`` (a mount's ``Path`` or an in-process ``InPath``) fails with ENOENT."""
    with pytest.raises(OSError) as e:
        path.stat()
    assert e.value.errno == errno.ENOENT, f"{path}: {e.value}"


# ------------------------------------------------------------------ listings


@pytest.mark.parametrize("case", case_params(SHARDED))
def test_find_lists_exactly_the_stored_chunks(case, tree, matrix):
    """In-process: the array directory lists each chunk once (copy tools see one file per
    chunk); the shard directories are not listed there but are one lookup away, and list their
    chunks."""
    files, dirs = find_tree(tree / case.relpath)
    exp_files, exp_dirs, shard_files, shard_dirs = expected_tree(case, matrix.data[case.id])
    assert files == exp_files, (
        f"missing {sorted(exp_files - files)[:10]}, unexpected {sorted(files - exp_files)[:10]}"
    )
    assert dirs == exp_dirs, f"missing {sorted(exp_dirs - dirs)[:10]}, unexpected {sorted(dirs - exp_dirs)[:10]}"
    got_files, got_dirs = set(), set()
    for top in {d.split("/")[0] for d in shard_dirs}:
        sub_files, sub_dirs = find_tree(tree / case.relpath / top)
        got_files |= {f"{top}/{f}" for f in sub_files}
        got_dirs |= {top} | {f"{top}/{d}" for d in sub_dirs}
    assert got_files == shard_files, f"missing {sorted(shard_files - got_files)[:10]}"
    assert got_dirs == shard_dirs, f"missing {sorted(shard_dirs - got_dirs)[:10]}"


@pytest.mark.parametrize("case", case_params(SHARDED))
def test_ls_of_each_shard_dir(case, tree, matrix):
    """In-process: each shard directory lists its stored chunks."""
    stored = stored_chunks(case, matrix.data[case.id])
    by_shard: dict[tuple, set[str]] = {}
    for i in stored:
        by_shard.setdefault(case.shard_of(i), set()).add(case.chunk_name(i))
    for s, names in by_shard.items():
        assert set((tree / case.relpath / case.shard_dir(s)).iterdir()) == names, f"shard {s}"


def test_unsharded_array_root_files(tree, matrix):
    """In-process: an unsharded array's directory lists its metadata and stored chunk files."""
    case = CASES_BY_ID["u32_2d_unsharded_gzip"]
    stored = stored_chunks(case, matrix.data[case.id])
    names = set((tree / case.relpath).iterdir())
    assert "zarr.json" not in names
    files = {n for n in names if (tree / case.relpath / n).is_file()}
    assert files == {".zarray", ".zattrs"} | {case.chunk_file(i) for i in stored}


def test_zarr_json_never_shown(tree):
    """In-process: no directory lists a ``zarr.json`` and none resolves."""
    def names_below(path) -> list[str]:
        out = []
        for name in path.iterdir():
            out.append(name)
            if stat.S_ISDIR((path / name).stat().st_mode):
                out += names_below(path / name)
        return out

    assert "zarr.json" not in names_below(tree / "")
    for rel in ["", "grp", "grp/sub", "raw", "grp/sub/deep"]:
        assert_enoent(tree / rel / "zarr.json")
    root = set((tree / "").iterdir())
    assert {".zgroup", ".zattrs", "raw", "grp"} <= root
    assert "zarr.json" not in root
    assert json.loads((tree / ".zgroup").read_text()) == {"zarr_format": 2}
    assert json.loads((tree / "grp" / "sub" / ".zattrs").read_text()) == {"level": 2, "name": "sub"}
    assert set((tree / "grp").iterdir()) >= {".zgroup", ".zattrs", "sub", "empty"}


# ------------------------------------------------------------------ the design doc's example


def test_raw_literal_paths(tree):
    """In-process: the names of the design doc's example."""
    raw = tree / "raw"
    a, b = (raw / "c/0/0/0/0.0.1").stat(), (raw / "0.0.1").stat()
    assert a.st_ino == b.st_ino
    assert a.st_size == b.st_size > 0
    assert (raw / "c/0/0/0/0.0.1").read_bytes() == (raw / "0.0.1").read_bytes()
    assert_enoent(raw / "0.1.0")  # empty inner chunk
    assert_enoent(raw / "c/0/0/0/0.1.0")
    assert_enoent(raw / "c/1/0/0")  # a shard with no stored chunk does not exist
    assert_enoent(raw / "2.0.0")  # ...nor do its chunks
    assert_enoent(raw / "5.0.0")  # beyond the array edge (inside shard c/2/0/0)
    assert_enoent(raw / "c/2/3/1/5.7.3")
    assert (raw / "c/2/3/1/4.6.3").is_file()
    assert (raw / "c/2/3/1/4.6.3").stat().st_ino == (raw / "4.6.3").stat().st_ino


# ------------------------------------------------------------------ stat / content


@pytest.mark.parametrize("case", case_params(SHARDED))
def test_same_inode_size_and_bytes(case, tree, matrix):
    """In-process: a chunk's two names are one inode, of the size and bytes served."""
    arr = tree / case.relpath
    for i in sorted(stored_chunks(case, matrix.data[case.id])):
        root_f = arr / case.chunk_file(i)
        entry_f = arr / case.shard_dir(case.shard_of(i)) / case.chunk_name(i)
        st_r, st_e = root_f.stat(), entry_f.stat()
        assert st_r.st_ino == st_e.st_ino, i
        content = root_f.read_bytes()
        assert st_r.st_size == st_e.st_size == len(content), i
        assert entry_f.read_bytes() == content, i
        if case.passthrough:
            stored = stored_inner_bytes(case, matrix.root / case.relpath, i)
            if case.inner_crc:
                stored = stored[:-4]
            assert content == stored, f"chunk {i} is not the stored bytes"


@pytest.mark.parametrize("case", case_params(SHARDED))
def test_stat_and_cat_agree(case, view, matrix):
    arr = view / case.relpath
    sample = sorted(stored_chunks(case, matrix.data[case.id]))[:4]
    paths = [str(arr / case.chunk_file(i)) for i in sample]
    paths += [str(arr / case.shard_dir(case.shard_of(i)) / case.chunk_name(i)) for i in sample]
    out = run("stat", "-c", "%i %s %F", *paths).stdout.decode().splitlines()
    assert len(out) == len(paths)
    for p, line in zip(paths, out):
        ino, size, kind = line.split(" ", 2)
        assert kind == "regular file", p
        assert int(size) == len(run("cat", p).stdout), p
        assert int(ino) == os.stat(p).st_ino
    # Same inode for the root file and the shard-dir entry.
    n = len(sample)
    assert [line.split()[0] for line in out[:n]] == [line.split()[0] for line in out[n:]]
    # a chunk that is not stored: the errno a client sees
    missing = (empty_in_bounds_chunks(case, matrix.data[case.id]) + case.beyond_edge_chunks())[0]
    r = run("cat", str(arr / case.chunk_file(missing)), check=False)
    assert r.returncode == 1 and r.stderr.decode().rstrip().endswith(os.strerror(errno.ENOENT)), r.stderr


@pytest.mark.parametrize("case", case_params(SHARDED))
def test_cp_r_of_a_shard_dir(case, view, matrix, tmp_path):
    arr = view / case.relpath
    stored = sorted(stored_chunks(case, matrix.data[case.id]))
    shard = case.shard_of(stored[-1])  # the last shard: often an edge shard
    src = arr / case.shard_dir(shard)
    run("cp", "-r", str(src), str(tmp_path / "copy"))
    copied = {p.name: p.read_bytes() for p in (tmp_path / "copy").iterdir()}
    expected = {case.chunk_name(i): (arr / case.chunk_file(i)).read_bytes()
                for i in stored if case.shard_of(i) == shard}
    assert copied == expected


@pytest.mark.parametrize("case", case_params(SHARDED))
def test_empty_and_beyond_edge_chunks_do_not_exist(case, tree, matrix):
    """In-process: fill-only and beyond-edge chunks resolve under neither name."""
    arr = tree / case.relpath
    data = matrix.data[case.id]
    stored = stored_chunks(case, data)
    present_shards = {case.shard_of(i) for i in stored}
    missing = empty_in_bounds_chunks(case, data) + case.beyond_edge_chunks()
    assert missing, "case should have empty or beyond-edge chunks"
    for i in missing:
        assert_enoent(arr / case.chunk_file(i))
        s = case.shard_of(i)
        if s in present_shards:
            assert_enoent(arr / case.shard_dir(s) / case.chunk_name(i))


def test_shard_dirs_are_directories_and_chunk_files_have_two_links(matrix):
    """In-process, writable (as a mount without ``-o ro``): directories 0755, chunk files 0644
    with two links (the array root and the shard directory, same inode)."""
    with InProcess(matrix.root, read_only=False) as view:
        st = (view / "raw" / "c" / "0" / "0" / "0").stat()
        assert st.st_mode == stat.S_IFDIR | 0o755, oct(st.st_mode)
        st = (view / "raw" / "0.0.1").stat()
        assert st.st_mode == stat.S_IFREG | 0o644, oct(st.st_mode)
        assert st.st_nlink == 2
        assert (view / "raw" / "c" / "0" / "0" / "0" / "0.0.1").stat().st_ino == st.st_ino


# ------------------------------------------------------------------ .zarray


@pytest.mark.parametrize("case", case_params(CASES))
def test_zarray_metadata(case, tree):
    """In-process: the ``.zarray`` and ``.zattrs`` of each case."""
    view = tree
    raw = (view / case.relpath / ".zarray").read_bytes()
    assert (view / case.relpath / ".zarray").stat().st_size == len(raw)
    meta = json.loads(raw)
    assert meta["zarr_format"] == 2
    assert meta["shape"] == list(case.shape)
    assert meta["chunks"] == list(case.chunk)
    assert meta["dtype"] == case.expected_v2_dtype()
    assert meta["fill_value"] == case.expected_v2_fill()
    assert meta["dimension_separator"] == case.view_separator
    assert meta.get("filters") is None
    if case.expect_order is not None:
        assert meta["order"] == case.expect_order
    comp = meta["compressor"]
    if callable(case.expect_compressor):
        assert case.expect_compressor(comp), comp
    else:
        assert comp == case.expect_compressor
    assert "zarr.json" not in (view / case.relpath).iterdir()
    assert json.loads((view / case.relpath / ".zattrs").read_text()) == case.attrs
