"""The credentials of an ``s3://`` source: botocore's whole chain behind obstore's credential provider.

``credentials(profile)`` resolves botocore's credential chain (environment, shared credentials
and config files, ``credential_process``, assume-role, SSO, web identity, container and instance
metadata) once at mount: deferred providers (SSO, assume-role) are made to fetch, so an expired
SSO token or a failing ``credential_process`` fails the mount with one line
(``AwsConfigError``). What it returns is an obstore credential provider over the session's
credentials giving each one's real expiry (``AwsCredentials``), kept through failed refreshes
(``Kept``). Not obstore's ``Boto3CredentialProvider``: it imports boto3 (and s3transfer) for
nothing a mount uses, about 5 MiB of every S3 mount's zygote and worker (doc/BENCHMARKING.md).
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

import botocore.session  # noqa: F401  (a zygote's preload imports it: each worker resolves the chain)
from botocore.exceptions import (
    BotoCoreError,
    CredentialRetrievalError,
    NoCredentialsError,
    SSOError,
    TokenRetrievalError,
    UnauthorizedSSOTokenError,
)

from shardfs.storage.aws import (
    AwsConfigError,
    config_files,
    first_line,
    last_line,
    open_session,
    profile_name,
)
from shardfs.storage.kept import Kept


def _why(e: Exception, session: Any) -> str:
    """The one line for a failure to resolve credentials."""
    name = profile_name(session)
    if isinstance(e, (SSOError, UnauthorizedSSOTokenError)) or \
            (isinstance(e, TokenRetrievalError) and "sso" in str(getattr(e, "kwargs", {}).get("provider", ""))):
        return f"AWS profile {name!r}: the SSO token has expired or is missing: run aws sso login --profile {name}"
    if isinstance(e, CredentialRetrievalError) and e.kwargs.get("provider") == "custom-process":
        return f"AWS profile {name!r}: credential_process failed: {last_line(str(e.kwargs.get('error_msg', '')))}"
    if isinstance(e, NoCredentialsError):
        return _nothing_found(session)
    return f"AWS profile {name!r}: cannot get credentials: {first_line(str(e))}"


def _nothing_found(session: Any) -> str:
    return (f"no AWS credentials found (looked in: the environment AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            f"profile {profile_name(session)!r} in {config_files(session)}, web identity AWS_WEB_IDENTITY_TOKEN_FILE, "
            "container and instance metadata); -o anonymous reads public data without them")


def credentials(profile: str | None) -> tuple[Kept, str]:
    """The credential chain of ``profile`` resolved now (``AwsConfigError``, one line, if it
    yields nothing usable), as an obstore credential provider that keeps them fresh, and where
    they came from (for an "access denied" line)."""
    session = open_session(profile)
    try:
        found = session.get_credentials()
        if found is None:
            raise AwsConfigError(_nothing_found(session))
        aws = AwsCredentials(found)
        provider = Kept(aws, lambda e: _why(e, session), "AWS credentials")
        provider()  # deferred providers (SSO, assume-role) fetch here: their failure fails the mount
    except BotoCoreError as e:
        raise AwsConfigError(_why(e, session)) from None
    except OSError as e:  # a credential_process that cannot be started
        raise AwsConfigError(f"AWS profile {profile_name(session)!r}: "
                             f"cannot get credentials: {e.strerror or e}") from None
    return provider, hint(aws.method)


def hint(method: str | None) -> str:
    """Where credentials of botocore's ``method`` came from, for an "access denied" line."""
    return {"env": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
            "shared-credentials-file": "the profile in the shared credentials file",
            "config-file": "the profile in the shared config file",
            "custom-process": "the profile's credential_process",
            "assume-role": "the profile's role_arn", "sso": "the profile's SSO session",
            "assume-role-with-web-identity": "AWS_WEB_IDENTITY_TOKEN_FILE/AWS_ROLE_ARN",
            "container-role": "the container's role", "iam-role": "the instance's role"}.get(method or "", str(method))


class AwsCredentials:
    """An obstore credential provider (a callable obstore calls for credentials) over botocore's
    ``credentials`` (a session's ``get_credentials()``), giving obstore each credential's real
    expiry (botocore's, for temporary credentials; None for static keys) instead of a fixed 30
    minutes. obstore asks again when less than 5 minutes are left; botocore then refreshes (it
    does within 10 minutes of expiry)."""

    def __init__(self, credentials: Any) -> None:
        self.credentials = credentials
        self.method: str | None = getattr(self.credentials, "method", None)

    def __call__(self) -> dict[str, Any]:
        frozen = self.credentials.get_frozen_credentials()
        # botocore's RefreshableCredentials keep their expiry here (no public accessor):
        # None for static credentials, which then never expire for obstore either.
        expiry = getattr(self.credentials, "_expiry_time", None)
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key,
                "token": frozen.token or None,  # an empty token is none
                "expires_at": expiry.astimezone(UTC) if expiry is not None else None}  # obstore takes UTC only
