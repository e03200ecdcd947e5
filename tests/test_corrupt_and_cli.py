"""Corrupt shards, absurd metadata, bad sources and the command line.

What corrupt shards and chunks show (EIO on their chunk files alone, one log line each) is
checked in-process (``tests/inproc.py``: the filesystem the kernel adapter calls, no mount;
clients read a copy of the files shown); the rest through real mounts and the command line.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import time
from pathlib import Path

import logging

import crc32c
import numpy as np
import pytest

from conftest import daemon_pids, read_native, read_zarr2, read_zarr3_v2, run_shardfs
from inproc import InPath, InProcess
from sources import CRC, LE, ArrayCase, read_index, write_case, write_group

# ------------------------------------------------------------------ helpers


def read_errno(path: InPath) -> int | None:
    """errno of reading ``path`` (None if it reads fine)."""
    try:
        path.read_bytes()
    except OSError as e:
        return e.errno
    return None


def log_lines(caplog) -> list[str]:
    """What the daemon would have logged (``--debug``, as the suite mounts), one line a record
    (``shardfs LEVEL message``, as in its log file)."""
    return [f"shardfs {r.levelname} {r.getMessage()}" for r in caplog.records if r.name.startswith("shardfs")]





def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


GOOD = ArrayCase("good", shape=(6, 7), chunk=(2, 2), shard=(4, 4), dtype="int16", fill=0,
                 inner=(LE,), empty_frac=0.0)
BAD = ArrayCase("bad", shape=(8, 8), chunk=(2, 2), shard=(4, 4), dtype="uint16", fill=0,
                inner=(LE,), empty_frac=0.0)  # index at the end, little endian, crc32c


def local_chunks(shard):
    return [(shard[0] * 2 + i, shard[1] * 2 + j) for i in range(2) for j in range(2)]


# ------------------------------------------------------------------ corrupt shards


@pytest.fixture
def corrupt_src(tmp_path):
    src = tmp_path / "src"
    write_group(src, {})
    write_case(GOOD, src)
    write_case(BAD, src, data=np.arange(1, 65, dtype="uint16").reshape(8, 8))
    arr = src / "bad"
    nbytes = 4 * 16 + 4
    # c/0/1: index checksum wrong.
    f = arr / "c/0/1"
    b = bytearray(f.read_bytes())
    b[-1] ^= 0xFF
    f.write_bytes(bytes(b))
    # c/1/0: shorter than its index.
    f = arr / "c/1/0"
    f.write_bytes(f.read_bytes()[:30])
    # c/1/1: entry 0 points past the end of the file (checksum recomputed: valid).
    f = arr / "c/1/1"
    b = f.read_bytes()
    table = read_index(BAD, b).reshape(-1, 2).copy()
    table[0, 0] = len(b) + 100
    body = table.astype("<u8").tobytes()
    f.write_bytes(b[: len(b) - nbytes] + body + crc32c.crc32c(body).to_bytes(4, "little"))
    return src


def test_corrupt_shards_give_eio_and_one_log_line(corrupt_src, caplog, tmp_path):
    """In-process; zarr 3 (v2 mode) and zarr 2.18 read a copy of the intact array shown."""
    caplog.set_level(logging.DEBUG, logger="shardfs")
    with InProcess(corrupt_src) as fs:
        _corrupt_shards_give_eio(fs / "", corrupt_src, tmp_path)
    lines = log_lines(caplog)
    reasons = {"c/0/1": r"checksum|crc", "c/1/0": r"short|truncat|small", "c/1/1": r"outside|past|beyond|offset"}
    for key, reason in reasons.items():
        hits = [ln for ln in lines if f"bad/{key}" in ln and re.search(reason, ln, re.I)]
        assert len(hits) == 1, \
            f"want one log line naming bad/{key} with reason /{reason}/, got {len(hits)}:\n" + "\n".join(lines[-40:])


def _corrupt_shards_give_eio(mnt: InPath, corrupt_src: Path, tmp_path: Path) -> None:
    bad = mnt / "bad"
    affected = {"c/0/1": local_chunks((0, 1)), "c/1/0": local_chunks((1, 0)), "c/1/1": [(2, 2)]}
    for key, chunks in affected.items():
        for i in chunks:
            name = f"{i[0]}.{i[1]}"
            assert read_errno(bad / name) == errno.EIO, f"bad/{name} (shard {key})"
            assert read_errno(bad / key / name) == errno.EIO, f"bad/{key}/{name}"
        # the corrupt shard's directory is listed empty (its chunks are unknown)
        assert (bad / key).iterdir() == [], key

    # The intact shard of the same array, and another array, still read correctly.
    for i in local_chunks((0, 0)):
        want = bytes(np.arange(1, 65, dtype="<u2").reshape(8, 8)[i[0] * 2:i[0] * 2 + 2, i[1] * 2:i[1] * 2 + 2])
        assert (bad / f"{i[0]}.{i[1]}").read_bytes() == want
        assert (bad / "c/0/0" / f"{i[0]}.{i[1]}").read_bytes() == want
    good = (mnt / "good").copy_to(tmp_path / "shown" / "good")
    np.testing.assert_array_equal(read_zarr3_v2(good), read_native(corrupt_src / "good"))
    np.testing.assert_array_equal(read_zarr2(good), read_native(corrupt_src / "good"))


def absurd_source(tmp_path: Path) -> Path:
    """A source with a good array and ``huge``: 2**40 inner chunks per shard, one shard stored."""
    src = tmp_path / "src"
    write_group(src, {})
    write_case(GOOD, src)
    huge = src / "huge"
    huge.mkdir()
    side = 2**20
    (huge / "zarr.json").write_text(json.dumps({
        "zarr_format": 3, "node_type": "array", "shape": [side, side], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [side, side]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "attributes": {},
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [1, 1], "codecs": [{"name": "bytes"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}],
    }))
    (huge / "c" / "0").mkdir(parents=True)
    (huge / "c" / "0" / "0").write_bytes(b"\x00" * 4096)
    return src


def test_absurd_metadata_is_refused(tmp_path, caplog):
    """In-process (``tests/inproc.py``): the refused array is a directory without ``.zarray``,
    said once in the log; the daemon's memory: ::absurd_metadata_costs_the_daemon_no_memory."""
    src = absurd_source(tmp_path)
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(src) as fs:
        # Poke the refused array every way a client would.
        errors = {}
        for rel in ["huge/.zarray", "huge/0.0", "huge/c/0/0/0.0", "huge"]:
            p = fs / rel
            try:
                if p.is_dir():
                    p.iterdir()
                else:
                    p.read_bytes()
            except OSError as e:
                errors[rel] = e.errno
        # a directory without .zarray (and without chunk files)
        assert errors == {"huge/.zarray": errno.ENOENT, "huge/0.0": errno.ENOENT, "huge/c/0/0/0.0": errno.ENOENT}
        assert (fs / "huge").iterdir() == []
        assert (fs / "good" / ".zarray").is_file()
    lines = [r.getMessage() for r in caplog.records
             if "huge" in r.getMessage() and r.levelno in (logging.WARNING, logging.ERROR)]
    assert len(lines) == 1 and "inner chunks per shard" in lines[0], lines


def test_absurd_metadata_costs_the_daemon_no_memory(mount, tmp_path):
    src = absurd_source(tmp_path)
    mnt = mount(src, "-o", "workers=1")  # (the RSS of the one process serving)
    info = mount.info(mnt)
    for rel in ["huge/.zarray", "huge/0.0", "huge/c/0/0/0.0"]:
        assert not (mnt / rel).exists()
    assert os.listdir(mnt / "huge") == []
    assert info.alive() and os.path.ismount(mnt)
    assert rss_mib(info.serving_pid) < 150
    np.testing.assert_array_equal(read_zarr3_v2(mnt / "good"), read_native(src / "good"))


# ------------------------------------------------------------------ bad sources


def _bad_source(kind: str, tmp_path: Path) -> Path:
    src = tmp_path / "src"
    if kind == "missing":
        return src
    src.mkdir()
    if kind == "no_zarr_json":
        (src / "data.bin").write_bytes(b"x")
    elif kind == "zarr_v2":
        (src / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
        (src / "a").mkdir()
        (src / "a" / ".zarray").write_text(json.dumps({
            "zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<i4", "compressor": None,
            "fill_value": 0, "filters": None, "order": "C"}))
    elif kind == "garbage_json":
        (src / "zarr.json").write_text("{this is not json")
    elif kind == "json_not_zarr":
        (src / "zarr.json").write_text(json.dumps(["not", "metadata"]))
    else:
        raise AssertionError(kind)
    return src


@pytest.mark.parametrize("foreground", [False, True], ids=["daemon", "foreground"])
@pytest.mark.parametrize("kind", ["missing", "no_zarr_json", "zarr_v2", "garbage_json", "json_not_zarr"])
def test_bad_source_is_refused(kind, foreground, tmp_path, mnt_dir):
    src = _bad_source(kind, tmp_path)
    r = run_shardfs("mount", str(src), str(mnt_dir), *(["-f"] if foreground else []))
    assert r.returncode == 1, r
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, f"expected one line on stderr, got:\n{r.stderr}"
    assert "Traceback" not in err
    assert str(src) in err, err
    assert not os.path.ismount(mnt_dir)
    assert daemon_pids(mnt_dir) == []


# ------------------------------------------------------------------ command line


@pytest.mark.parametrize("argv", [[], ["--bogus"], ["mount", "--bogus", "a", "b"], ["mount"], ["frobnicate"]],
                         ids=["no_args", "unknown_option", "unknown_mount_option", "missing_args", "unknown_cmd"])
def test_bad_usage_exits_2(argv):
    r = run_shardfs(*argv)
    assert r.returncode == 2, r
    assert "usage" in r.stderr.lower()
    assert "Traceback" not in r.stderr


def test_version():
    import pyfuse3
    import zarr

    r = run_shardfs("--version")
    assert r.returncode == 0, r.stderr
    out = r.stdout.lower()
    for name in ("pyfuse3", "zarr", "libfuse"):
        assert name in out
    assert pyfuse3.__version__ in r.stdout
    assert zarr.__version__ in r.stdout
    assert re.search(r"libfuse\D*3\.\d+", out), r.stdout


def test_daemonized_mount_and_umount(tmp_path, mnt_dir):
    write_case(GOOD, tmp_path)
    src = tmp_path / "good"  # the source root is an array
    log = tmp_path / "daemon.log"
    r = run_shardfs("mount", str(src), str(mnt_dir), "--log-file", str(log))
    assert r.returncode == 0, r.stderr
    assert os.path.ismount(mnt_dir), "mount must be live when 'shardfs mount' returns"
    assert daemon_pids(mnt_dir), "no daemon process left running"
    np.testing.assert_array_equal(read_zarr3_v2(mnt_dir), read_native(src))
    assert json.loads((mnt_dir / ".zarray").read_text())["chunks"] == [2, 2]

    r = run_shardfs("umount", str(mnt_dir))
    assert r.returncode == 0, r.stderr
    assert not os.path.ismount(mnt_dir)
    deadline = time.monotonic() + 5
    while daemon_pids(mnt_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert daemon_pids(mnt_dir) == [], "daemon still running after 'shardfs umount'"
    assert "Traceback" not in log.read_text()

    r = run_shardfs("umount", str(mnt_dir))
    assert r.returncode == 1 and r.stderr.strip() == f"shardfs: error: {mnt_dir}: not mounted", r


def test_mount_table_names_the_source_and_no_xattrs_are_served(mount, tmp_path):
    """``mount``/``df`` show the source as the device (what ``shardfs inspect`` and ``umount``
    rely on), and getxattr is unsupported so that ``ls -l`` costs no extra round trips."""
    src = tmp_path / "a,b c"  # a comma (escaped in the fsname option) and a space (octal in mountinfo)
    write_group(src, {})
    write_case(GOOD, src)
    mnt = mount(src)
    rows = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    row = next(r for r in rows if r[4] == str(mnt))
    sep = row.index("-")
    assert row[sep + 1] == "fuse.shardfs"
    assert row[sep + 2].replace("\\040", " ") == str(src)
    for path in (mnt, mnt / "good", mnt / "good" / "0.0"):
        with pytest.raises(OSError) as e:
            os.getxattr(path, "user.anything")
        assert e.value.errno in (errno.EOPNOTSUPP, errno.ENOTSUP), path
    out = json.loads(run_shardfs("inspect", "--json", str(mnt / "good")).stdout)
    assert out["array"] == str(src / "good"), out


def test_read_only_option_refuses_writes(mount, tmp_path):
    src = tmp_path / "src"
    write_group(src, {})
    write_case(GOOD, src)
    mnt = mount(src, "-o", "ro")
    chunk = mnt / "good" / "0.0"
    before = chunk.read_bytes()
    assert os.stat(chunk).st_mode == stat.S_IFREG | 0o444, oct(os.stat(chunk).st_mode)
    assert os.stat(mnt / "good").st_mode == stat.S_IFDIR | 0o555, oct(os.stat(mnt / "good").st_mode)
    for attempt in (lambda: open(chunk, "r+b"), lambda: open(mnt / "good" / "new.tmp", "wb"),
                    lambda: os.unlink(chunk), lambda: os.mkdir(mnt / "good" / "d")):
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno == errno.EROFS
    assert chunk.read_bytes() == before
    np.testing.assert_array_equal(read_zarr3_v2(mnt / "good"), read_native(src / "good"))


# ------------------------------------------------------------------ corrupt inner chunks

CRC_CASE = ArrayCase("crc", shape=(4, 4), chunk=(2, 2), shard=(4, 4), dtype="uint16", fill=0,
                     inner=(LE, CRC), empty_frac=0.0)


def test_inner_crc32c_mismatch_gives_eio_and_one_log_line(tmp_path, caplog):
    """A stored inner chunk whose trailing crc32c does not match its bytes: EIO on that chunk
    file only (both names), one log line naming the shard and the chunk; the others read.
    In-process."""
    src = tmp_path / "src"
    write_group(src, {})
    data = np.arange(1, 17, dtype="uint16").reshape(4, 4)
    write_case(CRC_CASE, src, data=data)
    shard = src / "crc" / "c" / "0" / "0"
    blob = bytearray(shard.read_bytes())
    off, n = (int(v) for v in read_index(CRC_CASE, bytes(blob))[1, 0])
    assert n == 2 * 2 * 2 + 4, n
    blob[off] ^= 0x01  # one data bit of chunk (1, 0): its stored crc32c no longer matches
    shard.write_bytes(bytes(blob))

    caplog.set_level(logging.DEBUG, logger="shardfs")
    with InProcess(src) as fs:
        mnt = fs / ""
        assert read_errno(mnt / "crc" / "1.0") == errno.EIO
        lines = [ln for ln in log_lines(caplog) if "crc/c/0/0" in ln and "1.0" in ln]
        assert len(lines) == 1, lines
        assert " ERROR " in lines[0] and "crc32c" in lines[0], lines[0]
        for i in ((0, 0), (0, 1), (1, 1)):
            want = data[i[0] * 2:i[0] * 2 + 2, i[1] * 2:i[1] * 2 + 2].astype("<u2").tobytes()
            assert (mnt / "crc" / f"{i[0]}.{i[1]}").read_bytes() == want, i
            assert (mnt / "crc" / "c/0/0" / f"{i[0]}.{i[1]}").read_bytes() == want, i
        assert read_errno(mnt / "crc" / "c/0/0" / "1.0") == errno.EIO
