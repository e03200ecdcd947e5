"""An ``s3://`` source's AWS configuration, resolved by botocore exactly as the AWS CLI resolves it.

Two steps, so that commands that only need to *name* a source never run a credential process:

- ``settings(profile, environ)``: the profile in effect (``-o profile``, else ``AWS_PROFILE``,
  else ``default``) and what the shared files and variables say for S3: the configured endpoint
  (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the profile's ``services`` section, the profile's
  ``endpoint_url``: botocore's own order), ``region``, ``s3.addressing_style`` and ``ca_bundle``
  (``AWS_CA_BUNDLE`` or the profile's). No credentials are resolved. An unknown profile raises
  ``AwsConfigError`` naming it and the files looked in.
- ``shardfs.storage.awscredentials.credentials(profile)``: botocore's whole credential chain,
  resolved at mount, behind obstore's credential provider (imports botocore's session and
  credentials: this module imports neither).

Every failure is an ``AwsConfigError`` whose ``str()`` is one line that says what to do; no
message carries a secret. botocore's loggers are held at ERROR: at DEBUG they print request and
response bodies, where STS and SSO answers carry secret keys.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from shardfs.storage.kept import quiet

log = logging.getLogger("shardfs")
QUIET = ("botocore", "urllib3")  # (boto3 and s3transfer are never imported)
_ENVIRON_LOCK = threading.Lock()


class AwsConfigError(ValueError):
    """The AWS configuration cannot be used; ``str()`` is one line saying why and what to do."""


@dataclass(frozen=True)
class Settings:
    """What the AWS configuration says for S3, credentials aside (None: not configured)."""

    profile: str
    endpoint: str | None
    region: str | None
    addressing: str | None  # "path" or "virtual" (botocore's "auto": None)
    ca_bundle: str | None


@contextlib.contextmanager
def _environment(environ: Mapping[str, str]) -> Iterator[None]:
    """botocore reads ``os.environ``: another process's environment (``shardfs umount`` finding a
    dead daemon's journal) is looked at through a temporarily swapped ``os.environ``."""
    if environ is os.environ:
        yield
        return
    with _ENVIRON_LOCK:
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(environ)
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)


def open_session(profile: str | None) -> Any:
    """A botocore session on ``profile`` (None: ``AWS_PROFILE`` or ``default``), its profile checked."""
    import botocore.session
    from botocore.exceptions import ProfileNotFound

    quiet(*QUIET)
    session = botocore.session.Session(profile=profile)
    try:
        session.get_scoped_config()
    except ProfileNotFound:
        raise AwsConfigError(f"AWS profile {profile_name(session)!r} not found "
                             f"(looked in {config_files(session)})") from None
    return session


def profile_name(session: Any) -> str:
    return session.get_config_variable("profile") or "default"


def config_files(session: Any) -> str:
    return " and ".join(os.path.expanduser(session.get_config_variable(v)) for v in ("config_file", "credentials_file"))


def settings(profile: str | None, environ: Mapping[str, str] = os.environ) -> Settings:
    """See the module docstring; ``AwsConfigError`` for an unknown profile or unreadable files."""
    from botocore.configprovider import ConfiguredEndpointProvider
    from botocore.exceptions import BotoCoreError

    with _environment(environ):
        session = open_session(profile)
        try:
            endpoint = None
            if not session.get_config_variable("ignore_configured_endpoint_urls"):
                # botocore's resolver of configured endpoints (the one its clients use): env for S3,
                # env global, the profile's services section for S3, the profile's endpoint_url.
                endpoint = ConfiguredEndpointProvider(session.full_config, session.get_scoped_config(), "s3",
                                                      environ).provide()
            addressing = (session.get_config_variable("s3") or {}).get("addressing_style")
            return Settings(profile_name(session), endpoint or None, session.get_config_variable("region") or None,
                            addressing if addressing in ("path", "virtual") else None,
                            session.get_config_variable("ca_bundle") or None)
        except BotoCoreError as e:
            raise AwsConfigError(f"AWS profile {profile_name(session)!r}: {first_line(str(e))}") from None


def first_line(text: str) -> str:
    return (text.strip().splitlines() or ["unknown error"])[0]


def last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no message"])[-1]
