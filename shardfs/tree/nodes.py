"""The kinds of node the mount shows, one small key class each, and the presented
groups and arrays (``GroupNode``, ``ArrayNode``) those keys point into.

A node key names one node of the view; ``shardfs.tree.nodetable.NodeTable`` maps inode
numbers to keys and back (``NodeTable.node_key``). Directory and metadata keys are hashable values: the
same key always gets the same inode. Chunk and staging keys are computed from
the inode (chunk inodes encode the array's slot and the chunk's position) and
never stored in the inode table.

Keys are frozen dataclasses rather than NamedTuples so that keys of different
kinds never compare equal (``ShardDirKey("a", "c") != MetaKey("a", "c")``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardfs.storage import Version
    from shardfs.format.v2 import ArrayInfo
    from shardfs.writes.spill import SpillBuffer


@dataclass
class ArrayNode:
    """A presented array: its slot in the chunk-inode space and its v2 description.

    ``fill_file``: the chunk file of an empty inner chunk, encoded on first use, when
    ``info.serve_missing`` says empty chunks are served; ``fill_unlisted``: the array is
    too large to list them, and that was logged.
    """

    path: str
    slot: int
    version: Version
    info: ArrayInfo | None
    error: str | None
    fill_file: bytes | None = None
    fill_unlisted: bool = False
    image: bool = False  # a level of an OME-Zarr image or label (described with "/" keys)
    parent_mtime_ns: int = 0  # of the image group's metadata, which ``.zarray`` depends on
    shard_keys: dict[tuple[int, ...], str] = field(default_factory=dict)  # see ShardIndexes.shard_key
    indexes_ahead: bool = False  # its shards' indexes were read ahead (see shardfs.reads.prefetch)
    covered: set[int] = field(default_factory=set)  # shards (C order) with the next fetched ahead (reads.prefetch)
    # Every slot the array at this path has had (one per layout: a resize gets a new slot), shared
    # by all its generations: the kernel may still hold chunk inodes of the older ones (NodeTable.aliases).
    lineage: list[int] = field(default_factory=list)

    @property
    def meta_mtime_ns(self) -> int:
        """``st_mtime`` of ``.zarray``/``.zattrs``: changes when what they show may change."""
        return max(self.version.mtime_ns, self.parent_mtime_ns)

    @property
    def shown(self) -> ArrayInfo:
        """``info`` of an array shown as v2. Only arrays that resolved to chunk files, shard
        directories or ``.zarray`` reach the code that asks (a name of an array that cannot be
        shown resolves to nothing but its ``.zattrs``), so None here is a bug: ``RuntimeError``,
        which the adapter logs and answers with EIO."""
        if self.info is None:
            raise RuntimeError(f"{self.path}: not shown as v2 ({self.error})")
        return self.info


GONE = "its array is gone since a worker gave this slot out"  # the error of a slot ``restore`` left empty


class Unbound(Exception):
    """A request names an array a dead worker had read (a chunk inode of its slot, a directory
    or file inode below it) that this worker has not read yet: a restarted worker reads each at
    its first use (``Hierarchy.restore``), not all before it serves. The kernel adapter reads
    it (``Numbers.bind``) and runs the request again. Not an ``OSError``: nothing on the way may
    take it for an answer."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: its array is not read yet")
        self.path = path


@dataclass
class GroupNode:
    """A presented group; ``image``: an OME-Zarr image or label, whose arrays are its levels."""

    path: str
    version: Version
    zgroup: bytes
    zattrs: bytes
    image: bool = False

    @property
    def meta_mtime_ns(self) -> int:
        """``st_mtime`` of ``.zgroup``/``.zattrs``/``.zmetadata``."""
        return self.version.mtime_ns


@dataclass(frozen=True, slots=True)
class DirKey:
    """A group or array directory of the source (``path`` is its key, "" the root)."""

    path: str


@dataclass(frozen=True, slots=True)
class MetaKey:
    """``.zgroup``, ``.zattrs``, ``.zarray`` or ``.zmetadata`` of directory ``path``."""

    path: str
    name: str


@dataclass(frozen=True, slots=True)
class ShardDirKey:
    """A directory mirroring the source below array ``path``: a key prefix (``c``, ``c/0``)
    or, when ``rel`` is a shard key, the shard itself."""

    path: str
    rel: str


@dataclass(frozen=True, slots=True)
class KeyDirKey:
    """A directory of nested v2 keys of array ``path`` (``dimension_separator`` "/"),
    holding the keys that start with ``prefix``."""

    path: str
    prefix: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class InnerShardKey:
    """With nested sharding, an inner shard of array ``path``: ``level`` 1 is inside a shard
    directory, 2 inside a level-1 inner shard, ...; ``box`` its coordinates in that level's
    grid over the whole array."""

    path: str
    level: int
    box: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ChunkKey:
    """The file of inner chunk ``coords`` of array ``arr``."""

    arr: ArrayNode
    coords: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StagingKey:
    """A staging file (a writer's temporary, held in memory)."""

    staging: Staging


ArrayDirKey = ShardDirKey | KeyDirKey | InnerShardKey
ARRAY_DIRS = (ShardDirKey, KeyDirKey, InnerShardKey)  # directories below an array, for isinstance
NodeKey = DirKey | MetaKey | ShardDirKey | KeyDirKey | InnerShardKey | ChunkKey | StagingKey


@dataclass
class Staging:
    """A file with a name that is not a chunk key (a writer's temporary), held by the daemon
    (in memory while small, then in a spill file: ``shardfs.writes.spill``).

    ``committed`` is set when it was renamed onto a chunk or metadata file: its inode then
    shows that node (the node key), so the kernel's dentry for the new name stays valid
    without an entry invalidation.
    """

    ino: int
    data: SpillBuffer
    parent: int = 0  # where it is listed: directory inode and name
    name: str = ""
    mtime_ns: int = field(default_factory=time.time_ns)
    committed: NodeKey | None = None
