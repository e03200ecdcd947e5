"""scripts/mutants itself: a mutant whose tests hang (a mount that never answers) is stopped at
its timeout and counted as caught, and what its tests left (mounts, daemons) is cleaned up."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

import shardfs

pytestmark = pytest.mark.long(50)

TIMEOUTS = (40.0, 150.0)  # seconds given to the wedged test: again with the second if it had not hung by the first

REPO = Path(__file__).resolve().parent.parent


def load_mutants():
    loader = importlib.machinery.SourceFileLoader("mutants_script", str(REPO / "scripts" / "mutants"))
    spec = importlib.util.spec_from_loader("mutants_script", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutants_script"] = module  # (its dataclass looks its module up)
    loader.exec_module(module)
    return module


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_hung_test_is_stopped_at_the_timeout_and_its_mounts_and_daemons_cleaned_up(tmp_path, monkeypatch):
    mutants = load_mutants()
    root = tmp_path / "copy"
    root.mkdir()
    (root / "shardfs").symlink_to(Path(shardfs.__file__).parent)  # the package under test, as a mutant's copy
    pids_file = tmp_path / "pids.json"
    monkeypatch.setenv("SHARDFS_HANG_PIDS", str(pids_file))
    # The wedged test mounts twice before it hangs: a few seconds, tens on a loaded machine. A
    # timeout that stopped it before it hung (no pids written) is tried again, longer.
    for timeout in TIMEOUTS:
        t0 = time.monotonic()
        rc, out = mutants.run_tests(root, ("tests/hangs_on_purpose.py",), timeout)
        took = time.monotonic() - t0
        assert rc == mutants.HUNG, out
        assert took < timeout + 120, took  # stopped and cleaned up, not waited for
        assert mutants.mounts_under(root) == []
        if pids_file.exists():
            break
    pids = json.loads(pids_file.read_text())
    assert len(pids) == 2, pids  # the test got to its hanging stat, with both mounts up
    assert "mount(s) lazily unmounted" in out and "still" not in out.rpartition("[scripts/mutants")[2], out
    assert [p for p in pids if mutants.living(p)] == []
    assert [p for p in mutants.naming(root / "pytest") if mutants.living(p)] == []
    inner = [p for p in mutants.descendants(os.getpid()) if mutants.living(p) and b"hangs_on_purpose" in cmdline(p)]
    assert inner == []  # the wedged pytest itself is gone
