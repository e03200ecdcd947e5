"""Source keys: ``join`` (a key below another) and ``list_entries`` (every entry below a key)."""

from __future__ import annotations

from shardfs.storage import Entry, Storage


def join(path: str, name: str) -> str:
    """Source key ``name`` below ``path`` ("" the root)."""
    return f"{path}/{name}" if path else name


def list_entries(source: Storage, key: str) -> list[Entry]:
    """Every entry directly below ``key`` (all pages of ``Storage.list``), in a worker thread."""
    return [entry for page in source.list(key) for entry in page]
