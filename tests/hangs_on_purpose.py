"""Not part of the suite (its name does not start with ``test_``): tests/test_mutants.py runs it
through scripts/mutants's ``run_tests`` with a short timeout, which must stop it. Its test wedges
the way a mutant can: the test process waits in a ``stat`` that a mount's worker never answers
(``SHARDFS_TEST_HANG``), beside a second mount started by the CLI (a daemon outside pytest's
process tree). Before it hangs it writes the daemons' pids to ``$SHARDFS_HANG_PIDS``."""

from __future__ import annotations

import json
import os
import shutil

from conftest import run_shardfs


def test_a_stat_that_is_never_answered(mount, tmp_path, mnt_dir):
    import zarr

    src = tmp_path / "src"
    g = zarr.open_group(str(src), mode="w")
    g.create_array("a", shape=(8,), chunks=(4,), shards=(8,), dtype="<i4", fill_value=0)[...] = 1
    mnt = mount(src, env={"SHARDFS_TEST_HANG": "a"})
    other = tmp_path / "other"
    shutil.copytree(src, other)
    r = run_shardfs("mount", str(other), str(mnt_dir))
    assert r.returncode == 0, r.stderr
    daemon = json.loads(run_shardfs("status", str(mnt_dir), "--json").stdout)["pid"]
    pids = [mount.info(mnt).pid, daemon]
    with open(os.environ["SHARDFS_HANG_PIDS"], "w") as f:
        json.dump(pids, f)
    os.stat(mnt / "a")  # never answered
