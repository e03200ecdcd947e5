"""The kinds of source, in one registry: what ``SRC`` may be, and what each kind means to the mount.

A ``Kind`` says, for one kind of source: the URL schemes that name it (none: a local directory,
any path), the kind's own ``-o`` options it takes (the others of ``KIND_OPTIONS`` are refused
with one line), whether it takes writes, whether it is reached over the network (checked before
the daemon starts; its fetched ranges cached: ``-o cache_size,cache_dir``), its own settings
(``s3://``: the AWS configuration), how it is reached (its credential chain) and which
``Storage`` it opens; that ``Storage`` says which read path serves it (``read_path``:
``"local"``, a ``pread`` at an extent; ``"objects"``, ranged GETs pinned to a version:
``shardfs.reads.factory``) and whether its files have owners (``owner_path``: checked for
another user under ``-o allow_other``). Client libraries are imported only when a source of
that kind is opened. Nothing here is imported by a ``Storage`` module (they are opened from here).

A new kind is a ``Storage`` module of its own and one ``register(Kind(...))`` here;
``kind_of(src)`` and ``named(name)`` find it. A URL of a scheme no kind names is an object-store
URL that fails to open (one line: which schemes there are).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from shardfs.config import StorageConfig
from shardfs.storage.listings import Listings
from shardfs.storage.sharedversions import SharedVersions
from shardfs.storage.urls import is_url
from shardfs.storage.versions import Remembered, Versions

Source = Any  # ``shardfs.storage.source.Source`` (not imported: it imports this module)

URL_OPTIONS = frozenset({"endpoint", "region", "anonymous", "cache_size", "cache_dir", "timeout", "profile",
                         "ca_bundle", "insecure", "requester_pays", "addressing"})
OBJECT_STORE_OPTIONS = frozenset({"endpoint", "region", "anonymous"})  # not a web server's
S3_OPTIONS = frozenset({"region", "profile", "requester_pays", "addressing"})
DIRECTORY_OPTIONS = frozenset({"follow_symlinks"})
KIND_OPTIONS = URL_OPTIONS | DIRECTORY_OPTIONS  # the options some kinds take and others refuse
Credentials = tuple[Any, str]  # a credential provider (None: the store's own chain) and the hint of its failure
Opener = Callable[[Source, float, Listings, bool, "int | None"], contextlib.AbstractContextManager[Any]]
# seconds a local directory's stats are remembered (by N workers only in the table they share)
LOCAL_STAT_TTL = 1.0


@dataclass(frozen=True)
class Kind:
    """One kind of source (see the module's docstring)."""

    name: str
    schemes: tuple[str, ...]
    options: frozenset[str]
    # (source, version_ttl, listings, alone, versions_fd) -> the Storage, open in the block (``Source.opened``)
    opened: Opener = field(repr=False)
    writable: bool = True
    remote: bool = True
    settings: Callable[[StorageConfig, Mapping[str, str]], StorageConfig] | None = field(default=None, repr=False)
    credentials: Callable[[Source], Credentials] | None = field(default=None, repr=False)
    # modules a worker of this kind imports before it opens anything (a zygote: ``shardfs.app.zygote``)
    preload: tuple[str, ...] = ()

    def imports(self) -> None:
        """Import the kind's ``preload`` modules, opening nothing."""
        for module in self.preload:
            importlib.import_module(module)

    def refusal(self, option: str) -> str | None:
        """The one line refusing ``-o option`` for this kind; None if it takes it (or it is no
        kind's own)."""
        if option not in KIND_OPTIONS or option in self.options:
            return None
        if not self.remote:
            return f"-o {option}: applies to an object-store URL (s3://...), not to a local directory"
        if option in DIRECTORY_OPTIONS:
            return f"-o {option}: applies to a local directory, not to an object-store URL"
        if option in OBJECT_STORE_OPTIONS and not self.options & OBJECT_STORE_OPTIONS:
            return f"-o {option}: applies to an object store (s3://...), not to a web server"
        return f"-o {option}: applies to s3:// URLs only"


KINDS: list[Kind] = []


def register(kind: Kind) -> Kind:
    """Add ``kind`` to the registry (its schemes must be new)."""
    taken = {s for k in KINDS for s in k.schemes}
    if taken & set(kind.schemes) or any(k.name == kind.name for k in KINDS):
        raise ValueError(f"source kind {kind.name}: a scheme or the name is registered already")
    KINDS.append(kind)
    return kind


def kind_of(src: str) -> Kind:
    """The kind of source ``src`` names: a URL's by its scheme, else a local directory."""
    if not is_url(src):
        return DIRECTORY
    scheme = src.split("://", 1)[0].lower()
    return next((k for k in KINDS if scheme in k.schemes), OTHER)


def named(name: str) -> Kind:
    """The registered kind called ``name``."""
    return next(k for k in [DIRECTORY, *KINDS, OTHER] if k.name == name)


# ----- the kinds ----------------------------------------------------------------------------


def _versions(ttl: float, versions_fd: int | None) -> Versions:
    """Where a storage remembers versions for ``ttl`` seconds: the table of N workers (the memfd
    ``versions_fd``), or its own."""
    return Remembered(ttl) if versions_fd is None else SharedVersions(versions_fd, ttl)


@contextlib.contextmanager
def _directory(source: Source, version_ttl: float, listings: Listings, alone: bool,
               versions_fd: int | None) -> Iterator[Any]:
    from shardfs.storage.local import LocalStorage

    ttl = LOCAL_STAT_TTL if alone or versions_fd is not None else 0.0
    yield LocalStorage(source.name, follow_symlinks=source.config.follow_symlinks, listings=listings,
                       versions=_versions(ttl, versions_fd))


@contextlib.contextmanager
def _object_store(source: Source, version_ttl: float, listings: Listings, alone: bool,
                  versions_fd: int | None) -> Iterator[Any]:
    from shardfs.storage.objects import ObjectStorage
    from shardfs.storage.requests import Retry

    cfg = source.config
    storage = ObjectStorage(source.name, endpoint=cfg.endpoint, region=cfg.region, anonymous=cfg.anonymous,
                            retry=Retry.for_timeout(cfg.timeout), versions=_versions(version_ttl, versions_fd),
                            listings=listings,
                            access=source.access())
    try:
        yield storage
    finally:
        storage.close()


@contextlib.contextmanager
def _web(source: Source, version_ttl: float, listings: Listings, alone: bool,
         versions_fd: int | None) -> Iterator[Any]:
    from shardfs.storage.requests import Retry
    from shardfs.storage.web import WebStorage

    storage = WebStorage(source.name, retry=Retry.for_timeout(source.config.timeout),
                         versions=_versions(version_ttl, versions_fd),
                         listings=listings, access=source.access())
    try:
        yield storage
    finally:
        storage.close()


TRUE = ("true", "1", "yes", "on", "y")  # object_store's true values (of AWS_SKIP_SIGNATURE)


def _aws_settings(cfg: StorageConfig, environ: Mapping[str, str]) -> StorageConfig:
    """The AWS configuration as the AWS CLI reads it (``shardfs.storage.aws``); the options
    override it (see ``shardfs.storage.source``)."""
    from shardfs.storage.aws import settings

    aws = settings(cfg.profile, environ)
    return dataclasses.replace(
        cfg, endpoint=cfg.endpoint or aws.endpoint or environ.get("AWS_ENDPOINT") or None,
        region=cfg.region or environ.get("AWS_REGION") or aws.region, addressing=cfg.addressing or aws.addressing,
        ca_bundle=cfg.ca_bundle or aws.ca_bundle,
        anonymous=cfg.anonymous or environ.get("AWS_SKIP_SIGNATURE", "").lower() in TRUE)


def _aws_credentials(source: Source) -> Credentials:
    from shardfs.storage.awscredentials import credentials

    return credentials(source.config.profile)


def _google_credentials(source: Source) -> Credentials:
    from shardfs.storage.cloudcredentials import google

    return google()


def _azure_credentials(source: Source) -> Credentials:
    from shardfs.storage.cloudcredentials import azure

    return azure()


OBJECTS = ("shardfs.storage.objects",)
DIRECTORY = Kind("directory", (), DIRECTORY_OPTIONS, _directory, remote=False)
OTHER = Kind("object store", (), URL_OPTIONS - S3_OPTIONS, _object_store,  # a scheme no kind names: refused at open
             preload=OBJECTS)
register(Kind("s3", ("s3", "s3a"), URL_OPTIONS, _object_store, settings=_aws_settings, credentials=_aws_credentials,
              preload=(*OBJECTS, "shardfs.storage.awscredentials")))  # botocore's chain, obstore's provider: 0.8 s
register(Kind("gcs", ("gs",), URL_OPTIONS - S3_OPTIONS, _object_store, credentials=_google_credentials,
              preload=OBJECTS))
register(Kind("azure", ("az", "azure", "abfs", "abfss"), URL_OPTIONS - S3_OPTIONS, _object_store,
              credentials=_azure_credentials, preload=OBJECTS))
register(Kind("web", ("http", "https"), URL_OPTIONS - OBJECT_STORE_OPTIONS - S3_OPTIONS, _web, writable=False,
              preload=("shardfs.storage.web",)))
