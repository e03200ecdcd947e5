"""s3:// configured the way the AWS CLI is: profiles, shared files, credential_process (issue 25).

Each configuration route mounts the same source from the session's SeaweedFS (credentials
enforced) with a temporary ``HOME`` holding ``~/.aws/config`` and ``~/.aws/credentials`` and no
``AWS_*`` variable but the ones the route needs, and zarr 2.18 reads the array exactly. Each
configuration mistake fails the mount with one line on stderr, status 1, nothing mounted.
The routes that need an AWS service SeaweedFS does not offer (STS, SSO, instance metadata) are
tested as far as botocore's resolution (``test_chain_*``: the credentials obstore is given).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench_lib.seaweed import ACCESS_KEY, REGION, SECRET_KEY
from conftest import read_native, read_zarr2, run_shardfs, wait_for
from sources import Spec, build
from shardfs.source import Source
from test_s3_mount import closed_port, mount_fails

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


def test_profile_from_aws_profile(mount, src, home, monkeypatch):
    """AWS_PROFILE names a profile of ~/.aws/credentials; region and endpoint_url come from ~/.aws/config."""
    write_aws(home, f"[profile lab]\nregion = {REGION}\nendpoint_url = {src[1].server.endpoint}\n", LAB_KEYS)
    monkeypatch.setenv("AWS_PROFILE", "lab")
    reads_exactly(mount, src)


def test_profile_option_overrides_aws_profile(mount, src, home, monkeypatch):
    """-o profile=NAME wins over AWS_PROFILE (which names a profile without keys)."""
    write_aws(home, f"[profile lab]\nregion = {REGION}\nendpoint_url = {src[1].server.endpoint}\n"
                    "[profile other]\nregion = eu-west-1\n", LAB_KEYS)
    monkeypatch.setenv("AWS_PROFILE", "other")
    reads_exactly(mount, src, "-o", "profile=lab")


def test_default_profile_and_files_elsewhere(mount, src, home, monkeypatch, tmp_path):
    """The [default] profile of AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE (not ~/.aws)."""
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (elsewhere / "conf").write_text(f"[default]\nregion = {REGION}\nendpoint_url = {src[1].server.endpoint}\n")
    (elsewhere / "creds").write_text(LAB_KEYS.replace("[lab]", "[default]"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(elsewhere / "conf"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(elsewhere / "creds"))
    reads_exactly(mount, src)


def test_services_section_endpoint(mount, src, home):
    """The profile's `services` section gives the S3 endpoint (and wins over its endpoint_url)."""
    write_aws(home, f"""
        [profile lab]
        region = {REGION}
        endpoint_url = http://127.0.0.1:{closed_port()}
        services = store
        [services store]
        s3 =
          endpoint_url = {src[1].server.endpoint}
        """, LAB_KEYS)
    reads_exactly(mount, src, "-o", "profile=lab")


def test_endpoint_option_overrides_profile(mount, src, home):
    """-o endpoint wins over the profile's endpoint_url (a closed port here)."""
    write_aws(home, f"[profile lab]\nregion = {REGION}\nendpoint_url = http://127.0.0.1:{closed_port()}\n", LAB_KEYS)
    reads_exactly(mount, src, "-o", f"profile=lab,endpoint={src[1].server.endpoint}")


def test_environment_keys(mount, src, home, monkeypatch):
    """The AWS_* variables alone (no file)."""
    for name, value in src[1].env.items():
        monkeypatch.setenv(name, value)
    reads_exactly(mount, src)


def test_precedence(home, monkeypatch):
    """What the parse keeps, option > AWS_ENDPOINT_URL_S3 > AWS_ENDPOINT_URL > services > profile."""
    write_aws(home, """
        [profile p]
        region = eu-west-1
        endpoint_url = http://profile:1
        s3 =
          addressing_style = virtual
        [profile q]
        endpoint_url = http://profile:1
        services = svc
        [services svc]
        s3 =
          endpoint_url = http://services:1
        """)
    url = "s3://b/p"
    got = Source.parse(url, {"profile": "p"})
    assert (got.endpoint, got.region, got.addressing) == ("http://profile:1", "eu-west-1", "virtual")
    assert Source.parse(url, {"profile": "q"}).endpoint == "http://services:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:1")
    assert Source.parse(url, {"profile": "q"}).endpoint == "http://env:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://env-s3:1")
    assert Source.parse(url, {"profile": "q"}).endpoint == "http://env-s3:1"
    assert Source.parse(url, {"profile": "q", "endpoint": "http://opt:1"}).endpoint == "http://opt:1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    assert Source.parse(url, {"profile": "p"}).region == "ap-south-1"
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert Source.parse(url, {"profile": "p"}).region == "us-west-2"
    assert Source.parse(url, {"profile": "p", "region": "sa-east-1"}).region == "sa-east-1"
    assert Source.parse(url, {"profile": "p", "addressing": "path"}).addressing == "path"
    monkeypatch.setenv("AWS_PROFILE", "p")
    assert Source.parse(url, {}).region == "us-west-2" and Source.parse(url, {}).addressing == "virtual"
    assert Source.parse(url, {"profile": "q"}).addressing is None


# ------------------------------------------------------------------ credential_process

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


def test_credential_process(mount, src, home, tmp_path):
    script = credential_process(tmp_path / "proc")
    write_aws(home, f"[profile lab]\nregion = {REGION}\nendpoint_url = {src[1].server.endpoint}\n"
                    f"credential_process = {script}\n")
    reads_exactly(mount, src, "-o", "profile=lab")
    assert runs(tmp_path / "proc") == 2, "once to check the source, once in the daemon"


def test_credential_process_refreshed_before_expiry(mount, src, home, tmp_path):
    """Credentials valid 5 min + 4 s: obstore asks again when 5 min are left, botocore runs the
    process again. A failing refresh is logged once and the old credentials keep working; the
    next good one is logged too."""
    where = tmp_path / "proc"
    script = credential_process(where, lifetime=304)
    write_aws(home, f"[profile lab]\nregion = {REGION}\nendpoint_url = {src[1].server.endpoint}\n"
                    f"credential_process = {script}\n")
    mnt = reads_exactly(mount, src, "-o", "profile=lab,attr_timeout=0,entry_timeout=0")
    local = read_native(src[0] / "s")
    started = runs(where)

    def read_again() -> bool:
        assert (read_zarr2(mnt / "s") == local).all()
        return True

    wait_for(lambda: read_again() and runs(where) > started, 30, "a refresh through credential_process")
    (where / "fail").touch()
    failed_from = runs(where)
    wait_for(lambda: read_again() and runs(where) >= failed_from + 2, 40, "two failed refreshes")
    log = mount.info(mnt).log_text()
    failures = [line for line in log.splitlines() if "refresh failed" in line]
    assert len(failures) == 1, failures
    assert "credential_process failed: the token broker is down" in failures[0]
    (where / "fail").unlink()
    wait_for(lambda: read_again() and "AWS credentials: refreshed again" in mount.info(mnt).log_text(), 30,
             "the refresh after the failure")


# ------------------------------------------------------------------ mistakes: one line, nothing mounted


def test_unknown_profile(src, home, mnt_dir):
    write_aws(home, "[profile lab]\nregion = us-east-1\n")
    cfg = home / ".aws"
    want = (f"shardfs: error: AWS profile 'nope' not found (looked in {cfg / 'config'} and "
            f"{cfg / 'credentials'})\n")
    assert mount_fails(src[1].url, mnt_dir, {}, "-o", "profile=nope") == [want, want]
    assert mount_fails(src[1].url, mnt_dir, {"AWS_PROFILE": "nope"}) == [want, want]


def test_failing_credential_process(src, home, mnt_dir, tmp_path):
    script = credential_process(tmp_path / "proc")
    (tmp_path / "proc" / "fail").touch()
    write_aws(home, f"[profile lab]\nendpoint_url = {src[1].server.endpoint}\ncredential_process = {script}\n")
    want = "shardfs: error: AWS profile 'lab': credential_process failed: the token broker is down\n"
    assert mount_fails(src[1].url, mnt_dir, {}, "-o", "profile=lab") == [want, want]


def test_expired_sso_token(src, home, mnt_dir):
    """An SSO profile whose token cache holds nothing valid (never logged in, or expired)."""
    write_aws(home, f"""
        [profile sso]
        endpoint_url = {src[1].server.endpoint}
        sso_session = corp
        sso_account_id = 123456789012
        sso_role_name = Reader
        region = {REGION}
        [sso-session corp]
        sso_region = {REGION}
        sso_start_url = https://corp.awsapps.com/start
        """)
    cache = home / ".aws" / "sso" / "cache"
    cache.mkdir(parents=True)
    import hashlib

    (cache / (hashlib.sha1(b"corp").hexdigest() + ".json")).write_text(json.dumps({
        "startUrl": "https://corp.awsapps.com/start", "region": REGION, "accessToken": "expired-token",
        "expiresAt": "2020-01-01T00:00:00Z"}))
    want = ("shardfs: error: AWS profile 'sso': the SSO token has expired or is missing: "
            "run aws sso login --profile sso\n")
    assert mount_fails(src[1].url, mnt_dir, {}, "-o", "profile=sso") == [want, want]


def test_no_credentials(src, home, mnt_dir):
    write_aws(home, f"[default]\nendpoint_url = {src[1].server.endpoint}\n")
    cfg = home / ".aws"
    want = ("shardfs: error: no AWS credentials found (looked in: the environment "
            f"AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, profile 'default' in {cfg / 'config'} and "
            f"{cfg / 'credentials'}, web identity AWS_WEB_IDENTITY_TOKEN_FILE, container and instance "
            "metadata); -o anonymous reads public data without them\n")
    assert mount_fails(src[1].url, mnt_dir, {}) == [want, want]


def test_wrong_keys_in_profile_named(src, home, mnt_dir):
    write_aws(home, f"[profile lab]\nendpoint_url = {src[1].server.endpoint}\n",
              LAB_KEYS.replace(SECRET_KEY, "not-the-secret"))
    want = (f"shardfs: error: {src[1].url}: access denied (check the credentials: the profile in the "
            "shared credentials file)\n")
    assert mount_fails(src[1].url, mnt_dir, {}, "-o", "profile=lab") == [want, want]
