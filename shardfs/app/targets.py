"""What a path given to ``shardfs inspect`` names: a source and a key in it.

- ``s3://BUCKET/KEY`` (any object-store URL): the bucket, and KEY in it (``-o`` options and the
  AWS variables as for ``shardfs mount``);
- a path inside a shardfs mount: the mount's source (for an object store, reached as its daemon
  reaches it: the endpoint from ``shardfs status``) and the source key the path shows (a shard
  directory is its shard; a chunk file or an inner-shard directory the nearest key above it
  that exists: its shard, or the array);
- any other path: the local filesystem, the path as the key.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath

from shardfs.app import options
from shardfs.app.mounts import mounts
from shardfs.app.options import Parsed
from shardfs.storage.source import Source
from shardfs.storage.urls import is_url, normalize_url
from shardfs.storage import Storage, Unusable


def locate(path: str, opts: Parsed) -> tuple[Source, str, bool]:
    """``(source, key, in_mount)`` for ``path`` (see the module docstring); ``opts``: the ``-o``
    options for a URL. ``ValueError`` (one line) for an unusable URL or option."""
    if is_url(path):
        url = normalize_url(path)
        scheme, rest = url.split("://", 1)
        bucket, _, key = rest.partition("/")
        return options.source(f"{scheme}://{bucket}", opts), key, False
    path = os.path.abspath(path)
    for mnt, src in sorted(mounts().items(), key=lambda item: -len(item[0])):
        if path == mnt or path.startswith(mnt.rstrip("/") + "/"):
            rel = os.path.relpath(path, mnt)
            key = "" if rel == "." else rel.replace(os.sep, "/")
            return _mounted(mnt, src, opts), key, True
    return Source("/"), path.lstrip("/"), False


def _mounted(mnt: str, src: str, opts: Parsed) -> Source:
    """The source of the mount at ``mnt`` (``src``: its device name), as its daemon reaches it."""
    if not is_url(src):
        return Source(src)
    from shardfs.app.status_client import StatusError, status_of

    source = options.source(src, opts)
    try:
        doc = status_of(mnt)
    except StatusError:
        return source
    if "pid" not in doc:  # no daemon's document (``Unserved``)
        return source
    its = doc["options"]  # the daemon's own -o options
    cfg = source.config
    return dataclasses.replace(source, config=dataclasses.replace(
        cfg, endpoint=doc["endpoint"] or cfg.endpoint, region=its.get("region") or cfg.region,
        anonymous=cfg.anonymous or "anonymous" in its))


def shown_key(storage: Storage, key: str) -> str:
    """The nearest key at or above ``key`` (a path of the view) that the source holds: a shard
    directory of the view is its shard, a chunk file its shard or array (``<key>.shard`` is a
    1-D array's shard ``<key>``)."""
    while key:
        if exists(storage, key):
            return key
        unsuffixed = key.removesuffix(".shard")
        if unsuffixed != key and exists(storage, unsuffixed):
            return unsuffixed
        key = posixpath.dirname(key)
    return key


def exists(storage: Storage, key: str) -> bool:
    """True if the source holds ``key`` (an object or file, or a prefix or directory)."""
    try:
        return storage.version(key) is not None or storage.is_dir(key)
    except Unusable:
        return True  # there, if unusable: inspect says why
