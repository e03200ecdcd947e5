"""s3:// configured the way the AWS CLI is: profiles, shared files, credential_process (issue 25).

Each configuration route mounts the same source from the session's SeaweedFS (credentials
enforced) with a temporary ``HOME`` holding ``~/.aws/config`` and ``~/.aws/credentials`` and no
``AWS_*`` variable but the ones the route needs, and zarr 2.18 reads the array exactly. Each
configuration mistake fails the mount with one line on stderr, status 1, nothing mounted.
The routes that need an AWS service SeaweedFS does not offer (STS for assume-role and web identity,
SSO, container credentials, instance metadata) get it from tests/awsfake.py, on loopback, handing
out the server's keys. Fixtures and helpers: tests/awshome.py.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import obstore

from awshome import (
    LAB_KEYS,
    S,
    credential_process,
    reads_exactly,
    runs,
    sso_profile,
    write_aws,
)
from testkit.seaweed import REGION, SECRET_KEY
from conftest import read_native, read_zarr2, run_shardfs, serving_pids, wait_for
from test_s3_mount import closed_port, mount_fails, write_chunk

from shardfs.app import options
from shardfs.storage.source import Source


def resolutions(mnt) -> int:
    """How often a mount resolves its credentials: once to check the source, then each worker
    process its own (doc/OBJECT-STORAGE.md)."""
    return 1 + len(serving_pids(mnt))


def pid_of(line: str) -> int:
    """The pid of a daemon log line (``... shardfs[PID] LEVEL ...``)."""
    return int(line.split("shardfs[", 1)[1].split("]", 1)[0])


def source(url: str, opts: str = "") -> Source:
    """The source ``shardfs mount URL MNT -o OPTS`` mounts."""
    return options.source(url, options.parse([opts]))


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


def test_a_worker_started_later_uses_the_settings_found_at_mount(mount, src, home):
    """The settings are found once, by ``shardfs mount`` (doc/OBJECT-STORAGE.md): after the
    profile's endpoint changed (to a closed port), the zygote and then the worker killed, the
    worker started afresh in their place reads exactly."""
    from test_restart import kill_worker, zygote_of

    write_aws(home, f"[profile lab]\nregion = {REGION}\nendpoint_url = {src[1].server.endpoint}\n", LAB_KEYS)
    mnt = reads_exactly(mount, src, "-o", "profile=lab")
    write_aws(home, f"[profile lab]\nregion = {REGION}\nendpoint_url = http://127.0.0.1:{closed_port()}\n",
              LAB_KEYS)
    m = mount.info(mnt)
    zygote = zygote_of(m)
    os.kill(zygote, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{zygote}").exists(), 30, "the zygote reaped by the supervisor")
    kill_worker(m, mnt, 120)  # (a fresh interpreter: it parses its command line)
    assert (read_zarr2(mnt / "s") == read_native(src[0] / "s")).all()


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
    got = source(url, "profile=p")
    assert (got.endpoint, got.config.region, got.config.addressing) == ("http://profile:1", "eu-west-1", "virtual")
    assert source(url, "profile=q").endpoint == "http://services:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:1")
    assert source(url, "profile=q").endpoint == "http://env:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://env-s3:1")
    assert source(url, "profile=q").endpoint == "http://env-s3:1"
    assert source(url, "profile=q,endpoint=http://opt:1").endpoint == "http://opt:1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    assert source(url, "profile=p").config.region == "ap-south-1"
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert source(url, "profile=p").config.region == "us-west-2"
    assert source(url, "profile=p,region=sa-east-1").config.region == "sa-east-1"
    assert source(url, "profile=p,addressing=path").config.addressing == "path"
    monkeypatch.setenv("AWS_PROFILE", "p")
    assert source(url).config.region == "us-west-2" and source(url).config.addressing == "virtual"
    assert source(url, "profile=q").config.addressing is None


# ------------------------------------------------------------------ credential_process

def test_credential_process(mount, src, home, tmp_path):
    script = credential_process(tmp_path / "proc")
    write_aws(home, f"[profile lab]\nregion = {REGION}\nendpoint_url = {src[1].server.endpoint}\n"
                    f"credential_process = {script}\n")
    mnt = reads_exactly(mount, src, "-o", "profile=lab")
    assert runs(tmp_path / "proc") == resolutions(mnt), "once to check the source, once in each worker"


def test_credential_process_refreshed_before_expiry(mount, src, home, tmp_path):
    """Credentials valid 5 min + 4 s: obstore asks again when 5 min are left, botocore runs the
    process again. A failing refresh is logged once by each worker (each refreshes its own) and
    the old credentials keep working; the next good one is logged too."""
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
    workers = serving_pids(mnt)

    def failures() -> list[str]:
        return [line for line in mount.info(mnt).log_text().splitlines() if "refresh failed" in line]

    wait_for(lambda: read_again() and {pid_of(line) for line in failures()} == set(workers)
             and runs(where) >= failed_from + 2 * len(workers), 60, "two failed refreshes in each worker")
    lines = failures()
    assert sorted(pid_of(line) for line in lines) == sorted(workers), lines
    assert all("credential_process failed: the token broker is down" in line for line in lines)
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
    sso_profile(home, src[1].server.endpoint, "2020-01-01T00:00:00Z")
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
            "shared credentials file; a public bucket: -o anonymous)\n")
    assert mount_fails(src[1].url, mnt_dir, {}, "-o", "profile=lab") == [want, want]


# ------------------------------------------------------------------ routes through AWS credential services
# (STS, SSO, container credentials, instance metadata: tests/awsfake.py hands out the server's keys)


def test_assume_role(mount, src, home, fake):
    """role_arn + source_profile: botocore calls STS AssumeRole with the source profile's keys."""
    write_aws(home, f"""
        [profile lab]
        role_arn = arn:aws:iam::123456789012:role/reader
        source_profile = base
        region = {REGION}
        services = here
        [services here]
        s3 =
          endpoint_url = {src[1].server.endpoint}
        sts =
          endpoint_url = {fake.endpoint}
        """, "[base]\naws_access_key_id = AKIDBASE\naws_secret_access_key = base-secret\n")
    mnt = reads_exactly(mount, src, "-o", "profile=lab")
    assert fake.calls["sts:AssumeRole"] == resolutions(mnt), "once to check the source, once in each worker"


def test_web_identity(mount, src, home, fake, monkeypatch, tmp_path):
    """AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN (an EKS service account): STS AssumeRoleWithWebIdentity."""
    (tmp_path / "token").write_text("eyJ-the-service-account-token")
    write_aws(home, f"[default]\nregion = {REGION}\n")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(tmp_path / "token"))
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/reader")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", fake.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", src[1].server.endpoint)
    mnt = reads_exactly(mount, src)
    assert fake.web_tokens == ["eyJ-the-service-account-token"] * resolutions(mnt)


def test_sso(mount, src, home, fake, monkeypatch):
    """An SSO profile with a valid cached token (after `aws sso login`): SSO GetRoleCredentials."""
    sso_profile(home, src[1].server.endpoint, "2099-01-01T00:00:00Z")
    monkeypatch.setenv("AWS_ENDPOINT_URL_SSO", fake.endpoint)
    mnt = reads_exactly(mount, src, "-o", "profile=sso")
    assert fake.calls["sso"] == resolutions(mnt)


def test_container_credentials(mount, src, home, fake, monkeypatch):
    """AWS_CONTAINER_CREDENTIALS_FULL_URI (ECS tasks, EKS Pod Identity)."""
    write_aws(home, f"[default]\nregion = {REGION}\nendpoint_url = {src[1].server.endpoint}\n")
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", fake.endpoint + "/container")
    mnt = reads_exactly(mount, src)
    assert fake.calls["container"] == resolutions(mnt)


def test_instance_metadata(mount, src, home, fake, monkeypatch):
    """An EC2 instance role, through IMDSv2 (AWS_EC2_METADATA_SERVICE_ENDPOINT points at the fake)."""
    write_aws(home, f"[default]\nregion = {REGION}\nendpoint_url = {src[1].server.endpoint}\n")
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.endpoint + "/")
    mnt = reads_exactly(mount, src)
    assert fake.calls["imds"] == resolutions(mnt) and fake.calls["imds-token"] >= resolutions(mnt)


def test_umount_finds_the_journal_by_the_daemons_profile(mount, src, home):
    """``shardfs umount`` finds a daemon's journal by its URL and the endpoint its profile gives,
    read through the daemon's environment (the umount here runs with another HOME): a change
    that could not be folded (the shard turned to garbage) is named, status 1."""
    write_aws(home, f"[profile lab]\nregion = {REGION}\nendpoint_url = {src[1].server.endpoint}\n", LAB_KEYS)
    mnt = mount(src[1].url, "-o", "profile=lab")
    write_chunk(mnt, S, (0, 0), 21, read_native(src[0] / "s"))
    obstore.put(src[1].store(), "s/c/0/0", b"garbage")
    r = run_shardfs("umount", str(mnt), env={**os.environ, "HOME": str(home / "elsewhere")}, timeout=120)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("shardfs: 1 change to s/c/0/0 kept in the journal: "), lines
    assert lines[1:] == [f"shardfs: they are folded by the next mount of {src[1].url}"], lines
    mount.info(mnt).proc.wait(timeout=30)
