"""Small things every layer of the tree shares: ``Attr`` (what ``stat`` shows), ``fail``
(the ``OSError`` a FUSE handler answers with), ``join`` and ``list_entries`` (source keys).
No imports of the tree's modules."""

from __future__ import annotations

import os
from typing import NamedTuple

from shardfs.storage import Entry, Storage


def fail(code: int, msg: str = "") -> OSError:
    """An ``OSError`` with errno ``code`` and ``msg`` (default: the errno's text)."""
    return OSError(code, msg or os.strerror(code))


class Attr(NamedTuple):
    """What ``stat`` shows for one node (a tuple: listings make one per chunk file)."""

    ino: int
    mode: int
    size: int
    mtime_ns: int
    nlink: int = 1


def join(path: str, name: str) -> str:
    """Source key ``name`` below ``path`` ("" the root)."""
    return f"{path}/{name}" if path else name


def list_entries(source: Storage, key: str) -> list[Entry]:
    """Every entry directly below ``key`` (all pages of ``Storage.list``), in a worker thread."""
    return [entry for page in source.list(key) for entry in page]
