"""A full disk under the write journal (issue 26, item 4): the writer gets ENOSPC (not EIO),
``shardfs status`` shows the condition, nothing acknowledged is lost, and writes work again once
there is room. The journal is a small tmpfs (``-o journal_dir``), mounted for the test (root only).
"""

from __future__ import annotations

import errno
import os
import subprocess

import numpy as np
import pytest

from conftest import run_shardfs, wait_for
from shardfs.app.status_client import status_of
from sources import Spec, build
from test_hostile import chunk_bytes, errno_of, write_file
from writers import umount

s = slice
# one shard of 8x8 chunks of 32x32 int32 (4 KiB each, random: incompressible), folded only when idle
F = Spec("f", (256, 256), (32, 32), (256, 256), "<i4", 0, ("zstd", 1), inner_crc=False, index_location="end",
         index_crc=True, initial=((s(0, 32), s(0, 32)),), write=(s(0, 256), s(0, 256)))


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs, unmounted afterwards."""
    where = tmp_path / "journal-disk"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_full_journal_disk_is_enospc_and_recovers(tmp_path, mount, small_disk):
    src = tmp_path / "src"
    exp = build(src, [F])
    mnt = mount(src, "-o", f"journal_dir={small_disk}")
    ballast = small_disk / "ballast"
    with open(ballast, "wb") as f:  # leave about 24 KiB: room for a few chunks' records
        f.write(b"\0" * (512 * 1024 - 24 * 1024))
    acknowledged, refused = [], None
    for k, idx in enumerate((i, j) for i in range(8) for j in range(8) if (i, j) != (0, 0)):
        block, data = chunk_bytes(k, F)
        code = errno_of(write_file, mnt / "f" / F.chunk_name(idx), data)
        if code is None:
            acknowledged.append(idx)
            exp["f"][F.chunk_region(idx)] = block
            continue
        assert code == errno.ENOSPC
        refused = (idx, block, data)
        break
    assert refused is not None and 1 <= len(acknowledged) <= 24, acknowledged
    doc: dict = {}

    def shown() -> bool:  # (the owner worker's state through another is up to a second old: SEMANTICS#workers)
        doc.update(status_of(str(mnt)))
        return doc["pending"]["journal_error"] is not None and "ENOSPC" in doc["errors"]

    wait_for(shown, 10, "the journal's error shown by shardfs status")
    failed = doc["pending"]["journal_error"]
    assert failed["errno"] == "ENOSPC" and failed["reason"] == os.strerror(errno.ENOSPC)
    assert failed["directory"].startswith(str(small_disk))
    assert doc["errors"]["ENOSPC"] == {"flush": 1}
    line = f"  write journal {failed['directory']}: No space left on device (ENOSPC)"
    wait_for(lambda: line in run_shardfs("status", str(mnt)).stdout, 10, "the journal's error in the status text")
    os.unlink(ballast)  # room again: the same write now succeeds
    idx, block, data = refused
    write_file(mnt / "f" / F.chunk_name(idx), data)
    exp["f"][F.chunk_region(idx)] = block
    wait_for(lambda: status_of(str(mnt))["pending"]["journal_error"] is None, 10, "the journal's error gone")
    umount(mount, mnt)
    import zarr

    np.testing.assert_array_equal(zarr.open_array(str(src / "f"), mode="r")[...], exp["f"])
