"""Google Cloud and Azure credentials through the vendors' own libraries, when their extras are installed.

- ``gs://`` with ``pip install 'shardfs[gcs]'`` (google-auth): Application Default Credentials
  as gcloud resolves them (``GOOGLE_APPLICATION_CREDENTIALS``, the file ``gcloud auth
  application-default login`` writes, workload identity federation, the metadata server), through
  obstore's ``GoogleCredentialProvider``; a token is fetched at mount, so missing or broken
  credentials fail it with one line. Without the extra: obstore's own resolution (a service
  account file, the ADC file, the metadata server), checked by the mount-time listing.
- ``az://`` with ``pip install 'shardfs[azure]'`` (azure-identity): ``DefaultAzureCredential``
  (environment, workload identity, managed identity, ``az login``...) through obstore's
  ``AzureCredentialProvider``, a token fetched at mount; unless the environment names a shared
  key, a SAS, a token or the emulator (``AZURE_NATIVE``), which obstore uses itself. Without
  the extra: obstore's own resolution.

Either provider is wrapped in ``Kept`` (a failed refresh is logged once and retried). Failures at
mount raise ``CloudConfigError`` (a ``ValueError``), whose ``str()`` is one line.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from shardfs.storage.kept import Kept, quiet

AZURE_NATIVE = ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_MASTER_KEY",
                "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_TOKEN", "AZURE_STORAGE_USE_EMULATOR",
                "AZURE_USE_AZURE_CLI")
QUIET = ("google.auth", "azure", "msal", "urllib3")  # their DEBUG lines carry tokens
GCS_HINT = "GOOGLE_APPLICATION_CREDENTIALS or gcloud's application default credentials"
AZURE_HINT = "the AZURE_* variables, a managed identity or az login"


class CloudConfigError(ValueError):
    """The credentials of a ``gs://`` or ``az://`` source cannot be used; one line."""


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def google() -> tuple[Kept | None, str]:
    """The ``gs://`` provider (None without the ``gcs`` extra: obstore resolves) and its hint."""
    quiet(*QUIET)
    try:
        from google.auth.exceptions import GoogleAuthError
        from obstore.auth.google import GoogleCredentialProvider
    except ImportError:
        return None, GCS_HINT
    try:
        provider = Kept(GoogleCredentialProvider(), _first_line, "Google credentials")
        provider()
    except GoogleAuthError as e:
        raise CloudConfigError(f"Google credentials: {_first_line(e)} (gcloud auth application-default login, "
                               "or GOOGLE_APPLICATION_CREDENTIALS=FILE)") from None
    return provider, GCS_HINT


def azure(environ: Mapping[str, str] = os.environ) -> tuple[Kept | None, str]:
    """The ``az://`` provider (None without the ``azure`` extra, or when the environment names
    credentials obstore uses itself) and its hint."""
    if any(environ.get(name) for name in AZURE_NATIVE):
        return None, AZURE_HINT
    quiet(*QUIET)
    try:
        from azure.core.exceptions import ClientAuthenticationError
        from azure.identity import DefaultAzureCredential
        from obstore.auth.azure import AzureCredentialProvider
    except ImportError:
        return None, AZURE_HINT
    try:
        credential: Any = DefaultAzureCredential()
        provider = Kept(AzureCredentialProvider(credential), _first_line, "Azure credentials")
        provider()
    except ClientAuthenticationError as e:
        raise CloudConfigError(f"Azure credentials: {_first_line(e)} (az login, a managed identity, or the "
                               "AZURE_* variables)") from None
    return provider, AZURE_HINT
