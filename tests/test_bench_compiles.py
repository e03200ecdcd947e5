"""scripts/bench byte-compiles the packages it measures (``bench_lib.harness.byte_compile``): this
checkout's and the ``--baseline`` one's, whose daemons would otherwise compile each module from
source at every mount where ``PYTHONDONTWRITEBYTECODE`` is set (doc/BENCHMARKING.md: an uncompiled
checkout measured 0.37 s slower to mount)."""

from __future__ import annotations

import importlib.util
import os
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from bench_lib import harness  # noqa: E402


def fresh(source: Path) -> bool:
    """Whether ``source`` has the byte code an import would use: its cached file, stamped with the
    source's mtime and size (what the interpreter checks)."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    try:
        head = cached.read_bytes()[:16]
    except FileNotFoundError:
        return False
    st = source.stat()
    return head[:4] == importlib.util.MAGIC_NUMBER and struct.unpack("<III", head[4:16]) == (
        0, int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)


def test_the_bench_byte_compiles_this_checkout_and_the_baseline(tmp_path):
    base = tmp_path / "base"
    (base / "shardfs" / "app").mkdir(parents=True)
    theirs = [base / "shardfs" / "__init__.py", base / "shardfs" / "app" / "run.py"]
    for source in theirs:
        source.write_text("X = 1\n")
    ours = sorted((harness.REPO / "shardfs").rglob("*.py"))
    assert len(ours) > 100
    edited = harness.REPO / "shardfs" / "format" / "printable.py"  # as if edited since the install
    st = edited.stat()
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert not any(map(fresh, [*theirs, edited]))
    harness.byte_compile(str(base))
    assert [s for s in theirs + ours if not fresh(s)] == []
