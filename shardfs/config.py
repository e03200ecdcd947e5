"""The mount's configuration, typed: one frozen slice per layer, each ``-o`` value's default
defined once, here.

``shardfs.app.options`` names every ``-o`` option and the field of ``Config`` it sets
(``Option.field``); ``options.config`` builds a ``Config`` from the options given, the others
keeping the defaults below, which are also what ``--help`` and ``doc/CONFIGURATION.md`` show.
The composition root (``shardfs.app.run``) hands each layer its slice: ``kernel`` to the
pyfuse3 adapter, ``reads`` to the caches of the read path, ``tree`` to the view, ``writes``
to the writer and the journal, ``storage`` to the source (``Source.parse``). Where a source
takes an option (a directory or a URL) is ``shardfs.storage.source``'s to say.

Imports nothing of shardfs: every room may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_DEFAULT_WORKERS = 8  # ``-o workers=auto`` on a machine of more cores


@dataclass(frozen=True)
class KernelConfig:
    entry_timeout: float = 10.0  # seconds the kernel caches names
    attr_timeout: float = 10.0  # seconds the kernel caches attributes
    uid: int | None = None  # the owner every node shows (None: the mounting user)
    gid: int | None = None  # the group every node shows (None: the mounting user's)
    file_mode: int | None = None  # the permission bits of files (None: 0644, 0444 read-only)
    dir_mode: int | None = None  # of directories (None: 0755, 0555 read-only)


@dataclass(frozen=True)
class ReadConfig:
    chunk_cache: int = 64 << 20  # bytes of decoded chunk files kept (0: none)
    cache_size: int = 96 << 20  # bytes of fetched object ranges in memory; a worker's RSS < 200 MiB with it
    cache_dir: str | None = None  # where fetched ranges are kept across mounts (None: memory only)
    max_chunk: int = 256 << 20  # bytes of one inner chunk decoded at most (transcoded arrays; beyond: EIO)


@dataclass(frozen=True)
class TreeConfig:
    ome: bool = True  # OME-Zarr 0.5 attributes translated for v2 readers
    c_order: bool = False  # arrays stored transposed served as C-order chunks


@dataclass(frozen=True)
class WriteConfig:
    shard_size: int = 64 << 20  # uncompressed bytes of one shard of an array created through the mount
    journal_dir: str | None = None  # None: the source's state directory


@dataclass(frozen=True)
class StorageConfig:
    """How the source is reached. ``None`` for ``endpoint``, ``region``, ``profile``, ``ca_bundle``
    and ``addressing``: what the environment and, for ``s3://``, the AWS configuration say
    (``shardfs.storage.source``). Which kind of source takes which option is
    ``shardfs.storage.kinds``'s to say."""

    follow_symlinks: bool = False  # a directory: read through symlinks that leave it
    endpoint: str | None = None  # an object store's server
    region: str | None = None  # s3://: the bucket's region
    profile: str | None = None  # s3://: the AWS profile
    anonymous: bool = False  # unsigned requests
    ca_bundle: str | None = None  # a PEM file of CAs to trust besides the system's
    insecure: bool = False  # TLS certificates not verified
    requester_pays: bool = False  # s3://: requests billed to the requester
    addressing: str | None = None  # s3://: "path" | "virtual"
    # Seconds one object-store request may take, connecting and the whole answer included: obstore's
    # own default, under which a whole shard (up to 64 MiB, one GET or one PUT) still passes at about
    # 2.2 MB/s. s3fs waits 120 s for a stalled transfer, mountpoint-s3 has no request timeout at
    # all; a hung server costs a read this long before EIO (see ``Retry.for_timeout``).
    timeout: float = 30.0


@dataclass(frozen=True)
class Config:
    """What one mount runs with."""

    read_only: bool = False
    debug: bool = False  # log every request
    stats_interval: float | None = None  # seconds between logged summaries of the counters (None: none)
    nonempty: bool = False  # mount over a mountpoint that holds files (else refused)
    metrics: str | None = None  # HOST:PORT (or PORT, on loopback) serving /metrics (None: not served)
    workers: int | None = None  # worker processes serving the mount (-o workers=N; None: auto, run._workers)
    kernel: KernelConfig = field(default_factory=KernelConfig)
    reads: ReadConfig = field(default_factory=ReadConfig)
    tree: TreeConfig = field(default_factory=TreeConfig)
    writes: WriteConfig = field(default_factory=WriteConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)


def default_workers(cores: int) -> int:
    """The workers of ``-o workers=auto`` (the default) on a local directory: half the ``cores``
    the daemon may use (``shardfs.base.cores.available``: those it may run on, which a cpuset or
    ``taskset`` narrows, fewer if its cgroup's CPU quota says so), at least 1, at most
    ``MAX_DEFAULT_WORKERS``. Half: the readers need cores
    too (the kernel's side of each request runs in the reader); on 2 cores, 2 workers under 4
    readers take as long as one, with more CPU (doc/BENCHMARKING.md)."""
    return max(1, min(cores // 2, MAX_DEFAULT_WORKERS))


def parse_size(text: str) -> int:
    """``"64M"`` -> bytes (suffixes K, M, G, powers of 1024); ``ValueError`` if malformed."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (text[:-1], text[-1]) if text[-1:] in units and text[-1:] else (text, "")
    value = int(number) * units[unit]
    if value < 0:
        raise ValueError(f"negative size {text!r}")
    return value


def size_text(size: int) -> str:
    """``64 << 20`` -> ``"64M"``: a size as ``parse_size`` reads it, in the largest whole unit."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)
