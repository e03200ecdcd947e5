"""What a ``SRC`` argument names: a local directory or an object-store URL, and its options.

``Source.parse(src, storage, given)`` takes the options typed by the configuration's ``storage``
slice (``shardfs.config.StorageConfig``) and refuses the ``-o`` options ``given`` (their names)
that belong to another kind of source (``ValueError``, one line): ``follow_symlinks`` is a
directory's; ``URL_ONLY`` a URL's, of which a plain web server, ``http(s)://``, refuses
``OBJECT_STORE_ONLY``; ``S3_ONLY`` for ``s3://`` alone. A URL is normalized (scheme in lower
case, no empty path segments, no trailing "/").

For ``s3://`` the AWS configuration is read as the AWS CLI reads it (``shardfs.storage.aws``:
the profile's endpoint, region, addressing style and CA bundle, and the ``AWS_*`` variables);
the ``-o`` options override it. Precedence, first wins:
endpoint: ``-o endpoint``, ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the profile's
``services`` section, the profile's ``endpoint_url``, the service's default;
region: ``-o region``, ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the profile's ``region``;
unsigned requests: ``-o anonymous``, or ``AWS_SKIP_SIGNATURE`` true (obstore's and object_store's own variable);
CA bundle: ``-o ca_bundle``, ``AWS_CA_BUNDLE``, the profile's ``ca_bundle``;
profile: ``-o profile``, ``AWS_PROFILE``, ``default``.
``(name, endpoint)`` identifies the source: the state directory (``shardfs.app.state``) is keyed on
it, so the next mount of the same URL through the same server finds its journal.

This module imports no client library: ``parse`` imports botocore for ``s3://`` only,
``opened()`` obstore only for a URL.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Mapping

from shardfs.config import StorageConfig
from shardfs.storage.urls import DEFAULT_TIMEOUT, is_url, is_web, normalize_url

log = logging.getLogger("shardfs")
LOCAL_ONLY = ("follow_symlinks",)
URL_ONLY = ("endpoint", "region", "anonymous", "cache_size", "cache_dir", "timeout", "profile", "ca_bundle", "insecure",
            "requester_pays", "addressing")
OBJECT_STORE_ONLY = ("endpoint", "region", "anonymous")  # not for a web server (http(s)://)
S3_ONLY = ("region", "profile", "requester_pays", "addressing")
TRUE = ("true", "1", "yes", "on", "y")  # object_store's true values (of AWS_SKIP_SIGNATURE)


@dataclass(frozen=True)
class Source:
    """A source as the mount uses it. ``name``: the absolute path of a directory, or the
    normalized URL; ``endpoint``: a URL's endpoint in effect (None: the service's default)."""

    name: str
    url: bool
    endpoint: str | None = None
    region: str | None = None
    anonymous: bool = False
    follow_symlinks: bool = False
    timeout: float = DEFAULT_TIMEOUT  # seconds per object-store request (``-o timeout``)
    profile: str | None = None  # ``-o profile`` (None: AWS_PROFILE, else "default")
    ca_bundle: str | None = None  # a PEM file of CAs to trust besides the system's
    insecure: bool = False
    requester_pays: bool = False
    addressing: str | None = None  # "path" | "virtual"

    @classmethod
    def parse(cls, src: str, storage: StorageConfig = StorageConfig(), given: Collection[str] = (),
              environ: Mapping[str, str] = os.environ) -> "Source":
        """The source named by ``src`` with the options of ``storage``; ``ValueError`` (one line)
        for an option of ``given`` (the names of the ``-o`` options given) that does not apply
        to this kind of source."""
        url = is_url(src)
        wrong = [n for n in (LOCAL_ONLY if url else URL_ONLY) if n in given]
        if wrong:
            raise ValueError(f"-o {wrong[0]}: applies to a local directory, not to an object-store URL" if url
                             else f"-o {wrong[0]}: applies to an object-store URL (s3://...), not to a local directory")
        if not url:
            return cls(os.path.abspath(src), False, follow_symlinks=storage.follow_symlinks)
        name = normalize_url(src)
        web = [n for n in OBJECT_STORE_ONLY if n in given] if is_web(name) else []
        if web:
            raise ValueError(f"-o {web[0]}: applies to an object store (s3://...), not to a web server")
        s3 = name.startswith(("s3://", "s3a://"))
        wrong = [n for n in S3_ONLY if n in given and not s3]
        if wrong:
            raise ValueError(f"-o {wrong[0]}: applies to s3:// URLs only")
        endpoint, region = storage.endpoint, storage.region
        addressing, ca_bundle = storage.addressing, storage.ca_bundle
        if s3:  # the AWS configuration as the AWS CLI reads it; the options override it
            from shardfs.storage.aws import settings

            aws = settings(storage.profile, environ)
            endpoint = endpoint or aws.endpoint or environ.get("AWS_ENDPOINT") or None
            region = region or environ.get("AWS_REGION") or aws.region
            addressing = addressing or aws.addressing
            ca_bundle = ca_bundle or aws.ca_bundle
        if ca_bundle is not None and not os.path.isfile(ca_bundle):
            raise ValueError(f"ca_bundle {ca_bundle}: no such file")
        anonymous = storage.anonymous or (s3 and environ.get("AWS_SKIP_SIGNATURE", "").lower() in TRUE)
        return cls(name, True, endpoint=endpoint, region=region, anonymous=anonymous,
                   timeout=storage.timeout, profile=storage.profile, ca_bundle=ca_bundle, insecure=storage.insecure,
                   requester_pays=storage.requester_pays, addressing=addressing)

    def access(self) -> Any:
        """How the store is reached (``shardfs.storage.access.Access``): without ``-o anonymous``,
        the credentials resolved now, for ``s3://`` the AWS chain (``AwsConfigError``, one line,
        if it yields nothing usable: nothing is mounted), for ``gs://``/``az://`` the vendors'
        chains when their extras are installed (``shardfs.storage.cloudcredentials``); the CA
        bundle read (``ValueError``)."""
        from shardfs.storage.access import Access

        credentials, hint = None, Access.hint
        if self.name.startswith(("s3://", "s3a://")) and not self.anonymous:
            from shardfs.storage.awscredentials import credentials as resolve

            credentials, hint = resolve(self.profile)
        elif self.name.startswith("gs://") and not self.anonymous:
            from shardfs.storage.cloudcredentials import google

            credentials, hint = google()
        elif self.name.startswith(("az://", "azure://", "abfs://", "abfss://")) and not self.anonymous:
            from shardfs.storage.cloudcredentials import azure

            credentials, hint = azure()
        ca_pem = None
        if self.ca_bundle is not None:
            try:
                with open(self.ca_bundle) as f:
                    ca_pem = f.read()
            except (OSError, UnicodeDecodeError) as e:
                why = getattr(e, "strerror", None) or e
                raise ValueError(f"ca_bundle {self.ca_bundle}: cannot read it: {why}") from None
            if "-----BEGIN CERTIFICATE-----" not in ca_pem:
                raise ValueError(f"ca_bundle {self.ca_bundle}: no PEM certificate in it")
        if self.insecure:
            log.warning("%s: TLS certificates are not verified (-o insecure): anyone on the path can "
                        "read and change the data", self.name)
        return Access(credentials, ca_pem, self.insecure, self.requester_pays, self.addressing, hint)

    @property
    def web(self) -> bool:
        """True for a plain web server (``http(s)://``): read-only, no listing."""
        return self.url and is_web(self.name)

    @contextlib.contextmanager
    def opened(self, version_ttl: float = 1.0, list_ttl: float = 0.0) -> Iterator[Any]:
        """The ``Storage`` of this source, open for the ``with`` block (an object store's
        request loop thread runs only inside it: start it after any fork, never before).
        ``version_ttl``: how long an object store remembers a key's version (the mount passes
        its ``attr_timeout``: the lag it promises for changes behind its back); a local
        directory remembers stats for 1 s whatever it is. ``list_ttl``: how long either
        remembers a listing (the mount passes its ``entry_timeout``)."""
        if not self.url:
            from shardfs.storage.local import LocalStorage

            yield LocalStorage(self.name, follow_symlinks=self.follow_symlinks, list_ttl=list_ttl)
            return
        from shardfs.storage.objects import ObjectStorage, Retry

        retry = Retry.for_timeout(self.timeout)
        if self.web:
            from shardfs.storage.web import WebStorage

            storage: Any = WebStorage(self.name, retry=retry, stat_ttl=version_ttl, list_ttl=list_ttl,
                                      access=self.access())
        else:
            storage = ObjectStorage(self.name, endpoint=self.endpoint, region=self.region, anonymous=self.anonymous,
                                    retry=retry, stat_ttl=version_ttl, list_ttl=list_ttl, access=self.access())
        try:
            yield storage
        finally:
            storage.close()
