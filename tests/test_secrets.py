"""Secrets stay secret (issue 25 item 7): no secret key, session token or signature in a command
line, a log (``--debug``: every daemon the suite starts runs with it), ``shardfs status`` or
``inspect`` output, or a state file.

The mount gets its keys from a ``credential_process`` (with a session token) and from the
environment in turn; the array is read, a write is folded, an unknown key is looked up (a
404) and the source is inspected; then everything the daemon and the commands wrote is searched.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from awshome import credential_process, reads_exactly, write_aws
from testkit.seaweed import REGION, SECRET_KEY
from conftest import run_shardfs


def everything_written(mount, mnt: Path, state: Path, said: list[str]) -> str:
    info = mount.info(mnt)
    parts = [info.output(), *said, Path(f"/proc/{info.pid}/cmdline").read_bytes().decode(errors="replace")]
    for child in Path(f"/proc/{info.pid}/task/{info.pid}/children").read_text().split():
        parts.append(Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"))
    for p in state.rglob("*"):
        if p.is_file():
            parts.append(p.read_bytes().decode(errors="replace"))
    return "\n".join(parts)


@pytest.mark.parametrize("route", ["credential_process", "environment"])
def test_no_secret_in_logs_outputs_command_lines_or_state(mount, src, home, tmp_path, monkeypatch, route):
    endpoint = src[1].server.endpoint
    if route == "credential_process":
        script = credential_process(tmp_path / "proc", lifetime=3600)
        write_aws(home, f"[default]\nregion = {REGION}\nendpoint_url = {endpoint}\ncredential_process = {script}\n")
    else:
        for name, value in src[1].env.items():
            monkeypatch.setenv(name, value)
    mnt = reads_exactly(mount, src)
    assert not (mnt / "s" / "nope").exists()  # a 404 logged at --debug
    said = []
    for args in (("status", str(mnt), "--json"), ("status", str(mnt)), ("inspect", str(mnt / "s"), "--json"),
                 ("inspect", src[1].url + "/s")):
        r = run_shardfs(*args, timeout=60)
        assert r.returncode == 0, (args, r.stderr)
        said += [r.stdout, r.stderr]
    text = everything_written(mount, mnt, Path(os.environ["XDG_STATE_HOME"]), said)
    assert "GET" in text or "mounted" in text  # the log is there
    assert SECRET_KEY not in text
    for needle in ("X-Amz-Signature", "Signature=", "X-Amz-Security-Token", "aws_secret_access_key",
                   "Looking for credentials via"):  # the last: botocore's DEBUG lines are held back
        assert needle not in text, needle
