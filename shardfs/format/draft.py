"""The 2022 sharding storage-transformer draft, as it appears in an array's ``zarr.json``.

The draft (``sharding-storage-transformer-draft.rst``) predates the
``sharding_indexed`` codec and has the same binary layout with fixed index
codecs: ``chunks_per_shard`` inner chunks of the ``chunk_grid`` shape per
shard, coded with the array's ``codecs``; the index of little-endian
``(offset, length)`` uint64 pairs at the end, without a checksum.
"""

from __future__ import annotations

from typing import Any

from shardfs.format.index import IndexFormat
from shardfs.format.layout import Unpresentable

URIS = frozenset({"https://purl.org/zarr/spec/storage_transformers/sharding/1.0",
                  "http://purl.org/zarr/spec/storage_transformers/sharding/1.0"})
# The draft names the transformer with "storage_transformer"; zarr-python 2.13's experimental
# v3 implementation wrote "extension" (and "type": "indexed" beside the configuration).
_NAME_KEYS = ("storage_transformer", "extension", "name")


def draft_index(transformers: Any, ndim: int) -> IndexFormat | None:
    """The index format of an array's ``storage_transformers``; None when there are none.

    Raises ``Unpresentable`` for any transformer other than one draft sharding
    transformer with the ``indexed`` format and a valid ``chunks_per_shard``.
    """
    if not transformers:
        return None
    if not isinstance(transformers, list) or len(transformers) != 1 or not isinstance(transformers[0], dict):
        raise Unpresentable(f"unsupported storage transformers {transformers!r}")
    t = transformers[0]
    name = next((t[k] for k in _NAME_KEYS if k in t), None)
    if name not in URIS:
        raise Unpresentable(f"unsupported storage transformer {name!r}")
    conf = t.get("configuration") or {}
    fmt = conf.get("format", t.get("type", "indexed"))
    if fmt != "indexed":
        raise Unpresentable(f"sharding storage transformer format {fmt!r} is not 'indexed'")
    cps = conf.get("chunks_per_shard")
    if (not isinstance(cps, list) or len(cps) != ndim
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in cps)):
        raise Unpresentable(f"chunks_per_shard {cps!r} is not {ndim} positive integers")
    try:
        return IndexFormat(tuple(cps), big_endian=False, checksum=False, at_start=False)
    except ValueError as e:
        raise Unpresentable(str(e)) from e
