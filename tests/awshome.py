"""Fixtures and helpers for the AWS configuration tests (registered in conftest.py).

``home``: a clean AWS environment (a temporary ``HOME`` with ``~/.aws``, no ``AWS_*`` variable,
instance metadata off, a short state directory); ``src``: an array uploaded to the session's
SeaweedFS, with its local copy; ``fake``: tests/awsfake.py's STS, SSO, container and instance
metadata services. Helpers: ``write_aws`` (the shared files), ``reads_exactly`` (mount and compare
with zarr 2.18), ``credential_process`` (a script giving the server's keys, counting its runs,
failing on demand), ``sso_profile`` (an SSO profile and the token `aws sso login` leaves).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from awsfake import AwsFake
from testkit.seaweed import ACCESS_KEY, REGION, SECRET_KEY
from conftest import read_native, read_zarr2
from sources import Spec, build

S = Spec("s", (8, 10), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
         index_location="end", index_crc=True, initial=((slice(0, 8), slice(0, 5)),),
         write=(slice(0, 4), slice(0, 5)))


@pytest.fixture
def src(tmp_path, s3_upload):
    """(local copy, S3Source): the array ``s`` uploaded to a fresh prefix."""
    build(tmp_path / "src", [S])
    return tmp_path / "src", s3_upload(tmp_path / "src")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A clean AWS environment: ``HOME`` an empty temporary directory (``~/.aws`` in it), no
    ``AWS_*`` variable, instance metadata off (nothing to wait for), the state directory in a
    short temporary path (a status socket's path must fit AF_UNIX's 108 bytes)."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    h = tmp_path / "home"
    (h / ".aws").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    state = tempfile.mkdtemp(prefix="sfs-")
    monkeypatch.setenv("XDG_STATE_HOME", state)
    try:
        yield h
    finally:
        shutil.rmtree(state, ignore_errors=True)


def write_aws(home: Path, config: str = "", credentials: str = "") -> None:
    (home / ".aws" / "config").write_text(textwrap.dedent(config))
    (home / ".aws" / "credentials").write_text(textwrap.dedent(credentials))


LAB_KEYS = f"""
    [lab]
    aws_access_key_id = {ACCESS_KEY}
    aws_secret_access_key = {SECRET_KEY}
"""


def reads_exactly(mount, src, *opts: str, env: dict | None = None) -> Path:
    local, s3src = src
    mnt = mount(s3src.url, *opts, env=env)
    assert (read_zarr2(mnt / "s") == read_native(local / "s")).all()
    return mnt


PROCESS = """\
#!{python}
import datetime, json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "count"), "a") as f:
    f.write("x")
if os.path.exists(os.path.join(here, "fail")):
    print("starting the broker", file=sys.stderr)
    print("the token broker is down", file=sys.stderr)
    sys.exit(3)
out = {{"Version": 1, "AccessKeyId": {key!r}, "SecretAccessKey": {secret!r}}}
lifetime = {lifetime}
if lifetime:
    out["Expiration"] = (datetime.datetime.now(datetime.timezone.utc)
                         + datetime.timedelta(seconds=lifetime)).isoformat()
print(json.dumps(out))
"""


def credential_process(where: Path, lifetime: int = 0) -> Path:
    """A credential_process script in ``where`` giving the server's keys (valid ``lifetime``
    seconds, 0: no expiry); it counts its runs in ``where/count`` and fails while
    ``where/fail`` exists (two lines on stderr, status 3)."""
    where.mkdir(exist_ok=True)
    script = where / "creds.py"
    script.write_text(PROCESS.format(python=sys.executable, key=ACCESS_KEY, secret=SECRET_KEY, lifetime=lifetime))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def runs(where: Path) -> int:
    try:
        return len((where / "count").read_text())
    except FileNotFoundError:
        return 0


def sso_profile(home: Path, endpoint: str, expires_at: str) -> None:
    """Profile ``sso`` of sso-session ``corp`` (S3 at ``endpoint``), and the token `aws sso login`
    left for it, expiring at ``expires_at``."""
    write_aws(home, f"""
        [profile sso]
        endpoint_url = {endpoint}
        sso_session = corp
        sso_account_id = 123456789012
        sso_role_name = Reader
        region = {REGION}
        [sso-session corp]
        sso_region = {REGION}
        sso_start_url = https://corp.awsapps.com/start
        """)
    cache = home / ".aws" / "sso" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / (hashlib.sha1(b"corp").hexdigest() + ".json")).write_text(json.dumps({
        "startUrl": "https://corp.awsapps.com/start", "region": REGION, "accessToken": "the-sso-access-token",
        "expiresAt": expires_at}))


@pytest.fixture
def fake():
    server = AwsFake(ACCESS_KEY, SECRET_KEY).start()
    try:
        yield server
    finally:
        server.close()
