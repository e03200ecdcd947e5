"""Structure changes through the mount: the v3 node a ``.zarray``/``.zgroup`` written in a new
directory makes, metadata rewrites (attributes, a resize), ``mkdir`` of new and key directories,
``rmdir`` of an emptied array or group (deleted from the source).

``Structure`` is the ``Writer``'s (``shardfs.tree.writer``): it commits chunks and reads a staging
file's bytes through the mount's ``Commits`` (``shardfs.tree.commits``), and changes the made
structure only through ``Made``. A new
array gets shards of ``shard_bytes`` (``-o shard_size``). Errors are ``OSError``s, one log
line naming the file.
"""

from __future__ import annotations

import errno
import json
import logging
import math
from typing import Any

import numpy as np

from shardfs.format.create import XARRAY_FILL, Refused, array_doc, dimension_names, group_doc, rewrite_kind
from shardfs.format.layout import parse_coord
from shardfs.storage import ABSENT, VersionMismatch
from shardfs.base.attrs import Attr, fail
from shardfs.storage.keys import join
from shardfs.base.threads import blocking
from shardfs.tree.nodes import (ArrayNode, ChunkKey, DirKey, GroupNode, InnerShardKey, KeyDirKey, MetaKey, ShardDirKey)
from shardfs.config import TreeConfig
from shardfs.shards.indexes import ShardIndexes
from shardfs.storage import Storage
from shardfs.tree.chunks import Chunks
from shardfs.tree.commits import Commits
from shardfs.tree.hierarchy import v2
from shardfs.tree.listing import Listing
from shardfs.tree.made import Made
from shardfs.tree.names import Names
from shardfs.tree.nodetable import NodeTable
from shardfs.writes.writeback import Writeback

log = logging.getLogger("shardfs")


def _json(path: str, key: str) -> str:
    return f"{path}/{key}" if path else key


class Structure:
    """Node-level changes of one writable mount (see the module's docstring)."""

    def __init__(self, source: Storage, names: Names, nodes: NodeTable, made: Made, chunks: Chunks,
                 indexes: ShardIndexes, listing: Listing, writeback: Writeback, commits: Commits, tree: TreeConfig,
                 shard_bytes: int) -> None:
        """``tree``: how a node created here is shown (``-o ome``, ``-o c_order``)."""
        self.source = source
        self.names = names
        self.nodes = nodes
        self.made = made
        self.chunks = chunks
        self.indexes = indexes
        self.listing = listing
        self.writeback = writeback
        self.commits = commits
        self.invalidate = commits.invalidate
        self.tree = tree
        self.shard_bytes = shard_bytes  # -o shard_size: shards of arrays created here
        self._read_versions: dict[str, Any] = {}  # node path -> version of the zarr.json last read

    async def commit_metadata(self, node: ArrayNode | GroupNode, name: str, data: bytes) -> None:
        """Apply a metadata file written over an existing node.

        ``.zattrs`` replaces the v3 attributes (``_ARRAY_DIMENSIONS`` become the
        dimension names); ``.zarray`` may change only the shape (a resize) and
        ``.zgroup`` nothing (EPERM otherwise); ``.zmetadata`` is accepted and not
        stored: the mount serves it computed from the source.
        """
        where = self.source.describe(node.path) + "/" + name
        try:
            new = json.loads(data)
        except ValueError as e:
            log.error("%s: write refused: not JSON: %s", where, e)
            raise fail(errno.EINVAL) from None
        if name == ".zarray" and isinstance(node, ArrayNode) and node.info is not None:
            shown = json.loads(node.info.zarray)
            try:
                fills = (shown.get("fill_value"), (await self._doc(node.path)).get("fill_value"))
                change = rewrite_kind(new, shown, fills)
            except Refused as e:
                if self.made.is_hidden(node.path, ".zarray"):  # unlinked before: a new array there
                    await self._replace_array(node, data)
                    return
                log.error("%s: write refused: %s", where, e)
                raise fail(errno.EPERM) from None
            if change == "resize":
                await self.resize(node, tuple(new["shape"]))
        elif name == ".zattrs":
            if not isinstance(new, dict):
                log.error("%s: write refused: attributes must be a JSON object", where)
                raise fail(errno.EINVAL)
            doc = await self._doc(node.path)
            if doc.get("node_type") == "array":
                names = dimension_names(new, len(doc.get("shape", ())))
                if names is not None:
                    doc["dimension_names"] = names
                old = doc.get("attributes") or {}
                if XARRAY_FILL in old and XARRAY_FILL not in new:  # shown as the fill_value, not in .zattrs
                    new[XARRAY_FILL] = old[XARRAY_FILL]
            doc["attributes"] = new
            await self._write_doc(node.path, doc)
        elif name == ".zgroup" and new != {"zarr_format": 2}:
            log.error("%s: write refused: a group's .zgroup can only be {\"zarr_format\": 2}", where)
            raise fail(errno.EPERM)
        elif name == ".zmetadata" and not isinstance(new, dict):
            log.error("%s: write refused: not consolidated metadata", where)
            raise fail(errno.EINVAL)
        self.made.unhide(node.path, name)
        ino = self.nodes.allocated(MetaKey(node.path, name))
        await self.invalidate([ino] if ino else [])

    async def _replace_array(self, node: ArrayNode, zarray: bytes) -> None:
        """A different ``.zarray`` written where the array's was unlinked (``rm .zarray``, then
        a new one): the old array is deleted and a new one made from it (no attributes)."""
        await self._delete_array(node)
        self.made.replaced(node.path)
        dir_ino = self.nodes.inode(DirKey(node.path))
        await self.create_node(dir_ino, ".zarray", zarray)
        await self.invalidate([self.nodes.inode(MetaKey(node.path, ".zarray"))])

    async def _doc(self, path: str) -> dict[str, Any]:
        """The node's ``zarr.json``; its version is remembered for ``_write_doc``."""
        data, version = await blocking(self.source.read_all, _json(path, "zarr.json"))
        self._read_versions[path] = version
        return json.loads(data)

    async def _write_doc(self, path: str, doc: dict[str, Any], new: bool = False) -> None:
        """Replace the node's ``zarr.json`` only if it is still the version ``_doc`` read (or,
        ``new``, still absent): a change made meanwhile behind the mount is not overwritten
        (EBUSY and one log line)."""
        key = _json(path, "zarr.json")
        expected = ABSENT if new else self._read_versions.pop(path, None)
        try:
            await blocking(self.source.replace, key, [json.dumps(doc, indent=2).encode()], expected)
        except VersionMismatch:
            log.error("%s: changed behind the mount meanwhile; not overwritten", self.source.describe(key))
            raise fail(errno.EBUSY) from None

    async def resize(self, arr: ArrayNode, shape: tuple[int, ...]) -> None:
        """Give ``arr`` a new shape: inner chunks (stored or pending) outside the new chunk
        grid are emptied first (journalled like any delete; shards left empty are removed),
        then ``zarr.json`` gets the shape."""
        layout = arr.shown.layout
        if len(shape) != layout.ndim:
            raise fail(errno.EPERM)
        grid = np.array([math.ceil(s / c) for s, c in zip(shape, layout.chunk_shape)], dtype=np.int64)
        for shard in await self.chunks.stored_shards(arr):
            chunks = await self.chunks.shard_chunks(arr, shard)
            for coords in chunks.coords[np.any(chunks.coords >= grid, axis=1)].tolist():
                await self.commits.commit(arr, tuple(coords), None)
        doc = await self._doc(arr.path)
        doc["shape"] = list(shape)
        await self._write_doc(arr.path, doc)
        log.info("%s: resized to %s", self.source.describe(arr.path), list(shape))

    async def create_node(self, parent: int, name: str, data: bytes) -> None:
        """A ``.zarray`` or ``.zgroup`` written in a new directory: make the v3 array or group,
        with the attributes of a ``.zattrs`` written there before; then commit the files
        written there before it whose names are chunk keys."""
        path = self.nodes.node_key(parent).path  # type: ignore[union-attr]  # a new directory's key
        where = self.source.describe(path) + "/" + name
        attrs_file = self.nodes.staged.get((parent, ".zattrs"))
        try:
            meta = json.loads(data)
            raw = await self.commits.metadata_bytes(attrs_file.data, ".zattrs") if attrs_file is not None else b""
            attrs = json.loads(raw) if raw else {}
            if not isinstance(attrs, dict):
                raise ValueError(".zattrs is not a JSON object")
        except ValueError as e:
            log.error("%s: write refused: not JSON: %s", where, e)
            raise fail(errno.EINVAL) from None
        try:
            if name == ".zgroup":
                doc = group_doc(meta, attrs)
            else:
                doc = array_doc(meta, attrs, self.shard_bytes)
                shown = json.loads(v2().describe_array(doc, self.tree.ome, c_order=self.tree.c_order).zarray)
                rewrite_kind(meta, shown, (shown.get("fill_value"), doc.get("fill_value")))
        except (Refused, ValueError) as e:  # Unpresentable is a ValueError
            log.error("%s: cannot create: %s", where, e)
            raise fail(errno.EPERM) from None
        parents = await self._build_parents(path)
        await self._write_doc(path, doc, new=True)
        self.made.created(path, name == ".zarray")  # positional: the ledger notes *args
        if attrs_file is not None:
            await self.became_meta(parent, ".zattrs", path, ".zattrs")
        else:  # shown once written: copy tools create it exclusively (O_EXCL) after .zarray
            self.made.hide(path, ".zattrs")
        if name == ".zgroup":
            self.made.hide(path, ".zmetadata")
        log.info("%s: created a v3 %s", self.source.describe(path), "group" if name == ".zgroup" else "array")
        dirs = [parent] + (await self._adopt_dirs(path) if name == ".zarray" else [])
        for (p, n), st in sorted(self.nodes.staged.items()):
            target = await self.names.chunk_at_name(p, n) if p in dirs else None
            if target is not None:
                await self.commits.commit(*target, await self.commits.staged_chunk(st, *target))
                self.nodes.drop_staging(p, n, committed=ChunkKey(*target))
        await self.invalidate(dirs + parents)

    async def _build_parents(self, path: str) -> list[int]:
        """Make every directory made by mkdir above new node ``path`` a group, outermost first
        (as zarr-python 3 builds a new node's parents): a node is only found below groups, so
        an array made in a plain new directory would not be listed, nor found after the mount.
        Returns the inodes of the directories whose listings change."""
        made = [p for p in _ancestors(path) if self.made.is_new_dir(p)]
        for parent in made:
            await self._write_doc(parent, {"zarr_format": 3, "node_type": "group", "attributes": {}}, new=True)
            self.made.created(parent, False)
            log.info("%s: created a v3 group (a parent of %s)", self.source.describe(parent), path)
        return [self.nodes.inode(DirKey(p)) for p in made]

    async def _adopt_dirs(self, path: str) -> list[int]:
        """Directories made below a new array before its ``.zarray`` (``cp -r`` copies in
        directory order) become its key directories: nested keys (``0/1`` with "/") or
        shard key directories (``c/0``). Their inodes are kept; returns them."""
        arr = await self.names.node(path)
        if not isinstance(arr, ArrayNode) or arr.info is None:
            return []
        layout, inos = arr.info.layout, []
        for made in self.made.new_dirs_below(path):
            rel = made[len(path) + 1:]
            parsed = tuple(map(parse_coord, rel.split("/")))
            coords = tuple(c for c in parsed if c is not None)
            if layout.keys.view_separator == "/" and len(parsed) < layout.ndim and len(coords) == len(parsed):
                new: Any = KeyDirKey(path, coords)
                self.made.mkdir_key_dir(path, coords)
            elif layout.index is not None and (layout.keys.is_prefix(rel) or layout.keys.parse(rel) is not None):
                new = ShardDirKey(path, rel)
                self.made.mkdir_shard_dir(path, rel)
            else:
                continue
            self.made.adopted(made)
            ino = self.nodes.rebind(DirKey(made), new)
            if ino is not None:
                inos.append(ino)
        return inos

    async def became_meta(self, parent: int, name: str, path: str, meta: str) -> None:
        """Staging file ``name`` of ``parent`` was committed as metadata file ``meta`` of node
        ``path``: its inode shows that file now, whose content (served from the v3
        metadata) differs from the bytes written, so the kernel's pages and size go."""
        self.nodes.drop_staging(parent, name, committed=MetaKey(path, meta))
        await self.invalidate([self.nodes.inode(MetaKey(path, meta))])

    def is_new_dir(self, ino: int) -> bool:
        key = self.nodes.node_key(ino)
        return isinstance(key, DirKey) and self.made.is_new_dir(key.path)

    async def rmdir(self, parent: int, name: str) -> int:
        """Remove an empty directory (``rm -r``): an array or group whose files were all
        removed is deleted from the source; ENOTEMPTY while anything is listed. Returns the
        removed directory's inode."""
        attr = await self.names.lookup(parent, name)
        key = self.nodes.node_key(attr.ino)
        if not isinstance(key, (DirKey, ShardDirKey, InnerShardKey, KeyDirKey)):
            raise fail(errno.ENOTDIR)
        if await self._lists_anything(attr.ino):
            raise fail(errno.ENOTEMPTY)
        if isinstance(key, ShardDirKey):
            self.made.rmdir_shard_dir(key.path, key.rel)
        if isinstance(key, KeyDirKey):
            self.made.rmdir_key_dir(key.path, key.prefix)
        if not isinstance(key, DirKey):
            return attr.ino
        path = key.path
        node = await self.names.node(path)
        if isinstance(node, ArrayNode):
            await self._delete_array(node)
        elif isinstance(node, GroupNode):
            if not path:
                raise fail(errno.EBUSY)
            await blocking(_remove_all, self.source, [_json(path, "zarr.json")])
            log.info("%s: group deleted", self.source.describe(path))
        self.made.deleted(path)
        return attr.ino

    async def _delete_array(self, node: ArrayNode) -> None:
        """Delete an array from the source: its pending chunks, shards and ``zarr.json``."""
        if node.info is None:
            log.error("%s: the array is not shown as v2 (%s); not deleted", self.source.describe(node.path),
                      node.error)
            raise fail(errno.EPERM)
        await self.writeback.discard(node.path)
        keys = [self.indexes.shard_key(node, shard) for shard in await self.chunks.stored_shards(node)]
        await blocking(_remove_all, self.source, keys + [_json(node.path, "zarr.json")])
        log.info("%s: array deleted", self.source.describe(node.path))

    async def move(self, p1: int, n1: str, p2: int, n2: str, noreplace: bool) -> None:
        """``rename(2)`` of an array or group directory (``Group.move``, ``mv``) into a group:
        its pending chunks are folded first (EBUSY if some cannot be), then the source renames
        it at once (``Storage.move``: one atomic rename locally; EXDEV on an object store, so
        ``mv`` copies and deletes), and the view follows with the same inodes. A directory
        made here that is no node yet just moves. Anything else: EPERM and one log line.
        The destination may only be absent or an empty directory made here."""
        key = self.nodes.node_key((await self.names.lookup(p1, n1)).ino)
        node = await self.names.node(key.path) if isinstance(key, DirKey) and key.path else None
        new_dir = isinstance(key, DirKey) and self.made.is_new_dir(key.path)
        dir_key, parent = await self.names.dir_node(p2)
        if node is None and not new_dir or not isinstance(dir_key, DirKey) \
                or not (isinstance(parent, GroupNode) or self.is_new_dir(p2)):
            log.error("rename of %s: only temporary files, and arrays and groups into groups, can be renamed", n1)
            raise fail(errno.EPERM)
        old, new = key.path, join(dir_key.path, n2)  # type: ignore[union-attr]  # a DirKey: checked above
        if new == old:
            return
        if new.startswith(old + "/"):
            raise fail(errno.EINVAL)
        if await self.exists(p2, n2):
            if noreplace:
                raise fail(errno.EEXIST)
            target = self.nodes.node_key((await self.names.lookup(p2, n2)).ino)
            if not (isinstance(target, DirKey) and self.made.is_new_dir(target.path)
                    and not await self._lists_anything(self.nodes.inode(target))):
                raise fail(errno.ENOTEMPTY)
            self.made.deleted(new)
        where = self.source.describe(old)
        if node is not None:
            if not await self.writeback.fold_below(old) or self.writeback.dirty_below(old):
                log.error("%s: not moved: its pending changes could not be folded", where)
                raise fail(errno.EBUSY)
            try:  # inline, not in a thread: no commit to the old path can slip in between
                self.source.move(old, new)
            except OSError as e:
                if e.errno != errno.EXDEV:
                    log.error("%s: cannot move to %s: %s", where, new, e.strerror)
                raise fail(e.errno or errno.EIO) from None
            log.info("%s: moved to %s", where, self.source.describe(new))
        self.names.moved(old, new)
        await self.invalidate([p1, p2])

    async def mkdir(self, parent: int, name: str) -> Attr:
        """Make a directory: in a group (or a directory made here), a new directory that a
        ``.zarray``/``.zgroup`` then makes an array/group; in an array, a key directory
        (``c``, ``c/0``, a shard) that writers create before writing chunks into it."""
        if await self.exists(parent, name):
            raise fail(errno.EEXIST)
        key, node = await self.names.dir_node(parent)
        if isinstance(key, DirKey) and not name.startswith(".") and \
                (isinstance(node, GroupNode) or self.is_new_dir(parent)):
            path = f"{key.path}/{name}" if key.path else name
            self.made.mkdir(path)
            return await self.names.getattr(self.nodes.inode(DirKey(path)))
        if isinstance(node, ArrayNode) and node.info is not None and isinstance(key, (DirKey, KeyDirKey)) \
                and node.info.layout.keys.view_separator == "/":
            i = parse_coord(name)
            prefix = None if i is None else (key.prefix if isinstance(key, KeyDirKey) else ()) + (i,)
            if prefix is not None and len(prefix) < node.info.layout.ndim and node.info.layout.in_grid(
                    prefix + (0,) * (node.info.layout.ndim - len(prefix))):
                self.made.mkdir_key_dir(node.path, prefix)
                return await self.names.getattr(self.nodes.inode(KeyDirKey(node.path, prefix)))
        if isinstance(node, ArrayNode) and node.info is not None and isinstance(key, (DirKey, ShardDirKey)):
            rel = f"{key.rel}/{name}" if isinstance(key, ShardDirKey) else name
            keys = node.info.layout.keys
            if node.info.layout.index is not None and (keys.is_prefix(rel) or keys.parse(rel) is not None):
                self.made.mkdir_shard_dir(node.path, rel)
                return await self.names.getattr(self.nodes.inode(ShardDirKey(node.path, rel)))
        log.error("mkdir %s: only groups, arrays and key directories can be made", name)
        raise fail(errno.EPERM)

    async def _lists_anything(self, ino: int) -> bool:
        """True if directory ``ino`` lists something besides fill chunks served for empty
        inner chunks (and key directories holding only those): ``rm -r`` cannot unlink those."""
        for name, attr in await self.listing.listdir(ino):
            if (ino, name) in self.nodes.staged:
                return True
            target = await self.names.chunk_at_name(ino, name)
            if target is not None and target[0].shown.serve_missing and await self.chunks.extent(*target) is None:
                continue
            if isinstance(self.nodes.node_key(attr.ino), KeyDirKey) and not await self._lists_anything(attr.ino):
                continue
            return True
        return False

    async def exists(self, parent: int, name: str) -> bool:
        try:
            await self.names.lookup(parent, name)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return False
            raise
        return True


def _ancestors(path: str) -> list[str]:
    """The ancestors of node ``path`` below the root, outermost first: ``a/b/c`` -> ``a``, ``a/b``."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _remove_all(source: Any, keys: list[str]) -> None:
    """Delete ``keys`` from the source (their emptied directories go too)."""
    for key in keys:
        source.delete(key)
