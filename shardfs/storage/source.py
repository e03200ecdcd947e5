"""What a ``SRC`` argument names: a local directory or an object-store URL, and its options.

``Source.parse(src, storage, given)`` finds the kind of source (``shardfs.storage.kinds``),
keeps the configuration's ``storage`` slice (``shardfs.config.StorageConfig``) as the source's
``config``, with what the kind's own settings add, and refuses the ``-o`` options ``given``
(their names) that belong to another kind of source (``ValueError``, one line: ``Kind.refusal``).
A URL is normalized (scheme in lower case, no empty path segments, no trailing "/").

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

The settings a kind finds in its configuration are found once, by ``shardfs mount``: its daemon
and every worker are given them on their command line (``resolved()``, ``--resolved``), so
every process of a mount, a worker restarted a week later included, uses what was found at
mount, and the supervisor needs no client library to name its source.

This module imports no client library: ``parse`` imports botocore for ``s3://`` only (unless
given what was resolved), ``opened()`` obstore only for a URL (the kind's ``opened``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Mapping

from shardfs.config import StorageConfig
from shardfs.storage.kinds import DIRECTORY, KIND_OPTIONS, Kind, kind_of
from shardfs.storage.listings import Listings
from shardfs.storage.urls import normalize_url

log = logging.getLogger("shardfs")
RESOLVED = ("endpoint", "region", "addressing", "ca_bundle", "anonymous")  # what ``Kind.settings`` fills in
ORDER = ("follow_symlinks", "endpoint", "region", "anonymous", "cache_size", "cache_dir", "timeout", "profile",
         "ca_bundle", "insecure", "requester_pays", "addressing")  # which refusal comes first
assert set(ORDER) == KIND_OPTIONS


@dataclass(frozen=True)
class Source:
    """A source as the mount uses it. ``name``: the absolute path of a directory, or the
    normalized URL; ``kind``: what kind of source it is; ``config``: the ``storage`` slice of
    the configuration, with what the kind's settings add (``s3://``: the AWS configuration)."""

    name: str
    kind: Kind = DIRECTORY
    config: StorageConfig = StorageConfig()

    @property
    def endpoint(self) -> str | None:
        """A URL's endpoint in effect (None: the service's default, or a directory)."""
        return self.config.endpoint

    @classmethod
    def parse(cls, src: str, storage: StorageConfig = StorageConfig(), given: Collection[str] = (),
              environ: Mapping[str, str] = os.environ, resolved: str | None = None) -> "Source":
        """The source named by ``src`` with the options of ``storage``; ``ValueError`` (one line)
        for an option of ``given`` (the names of the ``-o`` options given) that does not apply
        to this kind of source. ``resolved``: what ``resolved()`` gave in the process that found
        the settings (its kind's are then not looked for)."""
        kind = kind_of(src)
        refused = next((r for n in ORDER if n in given and (r := kind.refusal(n)) is not None), None)
        if refused is not None:
            raise ValueError(refused)
        if not kind.remote:
            return cls(os.path.abspath(src), kind, StorageConfig(follow_symlinks=storage.follow_symlinks))
        cfg = dataclasses.replace(storage, follow_symlinks=False)
        if kind.settings is not None:
            cfg = kind.settings(cfg, environ) if resolved is None else _with_resolved(cfg, resolved)
        if cfg.ca_bundle is not None and not os.path.isfile(cfg.ca_bundle):
            raise ValueError(f"ca_bundle {cfg.ca_bundle}: no such file")
        return cls(normalize_url(src), kind, cfg)

    def resolved(self) -> str | None:
        """The settings this source's kind found in its configuration (for ``s3://``: the AWS
        configuration's, with the options), as ``parse`` takes them back (``resolved``); None
        for a kind that has none to find."""
        if self.kind.settings is None:
            return None
        return json.dumps({name: getattr(self.config, name) for name in RESOLVED}, separators=(",", ":"))

    def access(self) -> Any:
        """How the store is reached (``shardfs.storage.access.Access``): without ``-o anonymous``,
        the credentials its kind resolves now (``Kind.credentials``: for ``s3://`` the AWS chain,
        ``AwsConfigError``, one line, if it yields nothing usable: nothing is mounted; for
        ``gs://``/``az://`` the vendors' chains when their extras are installed,
        ``shardfs.storage.cloudcredentials``); the CA bundle read (``ValueError``)."""
        from shardfs.storage.access import Access

        cfg = self.config
        credentials, hint = None, Access.hint
        if self.kind.credentials is not None and not cfg.anonymous:
            credentials, hint = self.kind.credentials(self)
        ca_pem = None
        if cfg.ca_bundle is not None:
            try:
                with open(cfg.ca_bundle) as f:
                    ca_pem = f.read()
            except (OSError, UnicodeDecodeError) as e:
                why = getattr(e, "strerror", None) or e
                raise ValueError(f"ca_bundle {cfg.ca_bundle}: cannot read it: {why}") from None
            if "-----BEGIN CERTIFICATE-----" not in ca_pem:
                raise ValueError(f"ca_bundle {cfg.ca_bundle}: no PEM certificate in it")
        return Access(credentials, ca_pem, cfg.insecure, cfg.requester_pays, cfg.addressing, hint)

    def warn(self) -> None:
        """Log what this source's options put at risk (``-o insecure``). A mount's warning: its
        serving process calls it once per start (of N workers, slot 0's), not each worker."""
        if self.config.insecure:
            log.warning("%s: TLS certificates are not verified (-o insecure): anyone on the path can "
                        "read and change the data", self.name)

    @contextlib.contextmanager
    def opened(self, version_ttl: float = 1.0, listings: Listings | None = None, alone: bool = True,
               versions_fd: int | None = None) -> Iterator[Any]:
        """The ``Storage`` of this source (its kind's ``opened``), open for the ``with`` block (an
        object store's request loop thread runs only inside it: start it after any fork, never
        before). ``version_ttl``: how long an object store remembers a key's version (the mount
        passes its ``attr_timeout``: the lag it promises for changes behind its back); a local
        directory remembers stats for 1 s whatever it is. Not ``alone`` (one of N workers), the
        versions are remembered in the mount's table every worker shares, the memfd ``versions_fd``
        (``shardfs.storage.sharedversions``); without one (a supervisor of an older package) a
        local directory remembers none: two workers remembering different stats would answer
        different versions of a chunk changed behind the mount's back, for as long. ``listings``:
        the listings either remembers (the mount's: its ``entry_timeout``, its share of the
        memory; None: none)."""
        with self.kind.opened(self, version_ttl, listings or Listings(0.0), alone, versions_fd) as storage:
            yield storage


def _with_resolved(cfg: StorageConfig, resolved: str) -> StorageConfig:
    """``cfg`` with the settings of ``resolved`` (``Source.resolved``, from the command line
    ``shardfs mount`` gave a daemon: ``ValueError`` if it is not JSON)."""
    found = json.loads(resolved)
    return dataclasses.replace(cfg, **{name: found[name] for name in RESOLVED if name in found})
