"""Source URLs without a client library: ``is_url``, ``normalize_url``, ``is_web``, the endpoint
``AWS_ENDPOINT_URL`` names (``env_endpoint``) and the default request timeout.

Shared by the factory (``shardfs.storage.source``) and the object stores it makes, and by the
state directory and the mount table above them (which key on normalized URLs).
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from shardfs.config import StorageConfig

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)(.*)$")
WEB_SCHEMES = ("http", "https")
DEFAULT_TIMEOUT = StorageConfig.timeout  # seconds one object-store request may take (-o timeout)


def is_url(src: str) -> bool:
    """True if ``src`` is ``scheme://...`` (an object store), not a path."""
    return _URL.match(src) is not None


def normalize_url(url: str) -> str:
    """``url`` with its scheme in lower case and its path without empty segments or a final "/"."""
    m = _URL.match(url)
    if m is None:
        raise ValueError(f"{url}: not a URL")
    scheme, host, path = m.groups()
    parts = [p for p in path.split("/") if p]
    return f"{scheme.lower()}://{host}" + "".join("/" + p for p in parts)


def is_web(url: str) -> bool:
    """True if ``url`` names a plain web server (``http://``, ``https://``)."""
    return url.split("://", 1)[0].lower() in WEB_SCHEMES


def env_endpoint(environ: Mapping[str, str] = os.environ) -> str | None:
    """The endpoint an ``s3://`` URL reaches without ``-o endpoint``: ``AWS_ENDPOINT_URL``
    (or ``AWS_ENDPOINT``); None for the service's default."""
    return environ.get("AWS_ENDPOINT_URL") or environ.get("AWS_ENDPOINT") or None
