"""``shardfs inspect``: what is inside an array or one shard, for people and scripts."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from shardfs.index import EMPTY, CorruptIndex
from shardfs.layout import Unpresentable
from shardfs.v2 import describe_array

SOURCE_XATTR = "user.shardfs.source"


def source_of(path: str) -> str:
    """The source path behind ``path`` if it lies in a shardfs mount, else ``path`` itself."""
    try:
        return os.getxattr(path, SOURCE_XATTR).decode()
    except OSError:
        return os.path.abspath(path)


def _array_dir(path: str) -> str | None:
    """The nearest directory at or above ``path`` holding an array's ``zarr.json``."""
    current = path if os.path.isdir(path) else os.path.dirname(path)
    while True:
        meta = os.path.join(current, "zarr.json")
        if os.path.isfile(meta):
            with open(meta, "rb") as f:
                if json.loads(f.read()).get("node_type") == "array":
                    return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def inspect(path: str) -> dict[str, Any]:
    """A description of the array or shard at ``path`` (source or mount path).

    Raises ``ValueError`` with a one-line reason if ``path`` is neither.
    """
    src = source_of(path)
    array = _array_dir(src)
    if array is None:
        raise ValueError(f"{path}: not inside a Zarr v3 array")
    with open(os.path.join(array, "zarr.json"), "rb") as f:
        doc = json.loads(f.read())
    out: dict[str, Any] = {"array": array, "codecs": doc.get("codecs"), "shape": doc.get("shape"),
                           "data_type": doc.get("data_type")}
    try:
        info = describe_array(doc)
    except Unpresentable as e:
        out["presentable"] = False
        out["reason"] = str(e)
        return out
    layout = info.layout
    out.update(presentable=True, shard_shape=list(layout.shard_shape), chunk_shape=list(layout.chunk_shape),
               chunks_per_shard=list(layout.chunks_per_shard),
               v2_compressor=info.chunk.compressor, transcoded=info.chunk.transcoder is not None)
    if layout.index is not None:
        out["index"] = {"location": "start" if layout.index.at_start else "end",
                        "endian": "big" if layout.index.big_endian else "little",
                        "crc32c": layout.index.checksum, "nbytes": layout.index.nbytes}
    if src == array or layout.index is None:
        return out
    rel = os.path.relpath(src, array)
    shard = layout.keys.parse(rel.replace(os.sep, "/"))
    if shard is None or not os.path.isfile(os.path.join(array, rel)):
        raise ValueError(f"{path}: not a shard of {array}")
    with open(os.path.join(array, rel), "rb") as f:
        data = f.read()
    fmt = layout.index
    offset, length = fmt.index_range(len(data))
    entry: dict[str, Any] = {"key": rel, "coords": list(shard), "size": len(data)}
    try:
        table = fmt.decode(data[offset: offset + length], len(data))
        entry["index_status"] = "ok (checksum verified)" if fmt.checksum else "ok (no checksum)"
    except CorruptIndex as e:
        entry["index_status"] = f"corrupt: {e}"
        out["shard"] = entry
        return out
    rows, used = [], 0
    for pos in range(len(table)):
        coords = layout.chunk_at(shard, pos)
        empty = table[pos, 0] == EMPTY
        row = {"pos": pos, "chunk": None if coords is None else ".".join(map(str, coords)),
               "offset": None if empty else int(table[pos, 0]),
               "nbytes": None if empty else int(table[pos, 1]), "empty": bool(empty)}
        used += 0 if empty else int(table[pos, 1])
        rows.append(row)
    entry.update(stored_chunks=int(np.sum(table[:, 0] != EMPTY)), index=rows,
                 unused_bytes=len(data) - fmt.nbytes - used)
    out["shard"] = entry
    return out


def format_text(report: dict[str, Any]) -> str:
    """A human-readable rendering of ``inspect``'s result."""
    lines = [f"array      {report['array']}", f"shape      {report['shape']}  {report['data_type']}",
             f"codecs     {json.dumps(report['codecs'])}"]
    if not report["presentable"]:
        lines.append(f"v2 view    not shown: {report['reason']}")
        return "\n".join(lines)
    lines += [f"shards     {report['shard_shape']}  inner chunks {report['chunk_shape']}"
              f"  ({report['chunks_per_shard']} per shard)",
              f"v2 view    compressor {json.dumps(report['v2_compressor'])}"
              f"{'  (transcoded)' if report['transcoded'] else ''}"]
    if "index" in report:
        ix = report["index"]
        lines.append(f"index      at {ix['location']}, {ix['endian']} endian, crc32c {ix['crc32c']}, "
                     f"{ix['nbytes']} bytes")
    shard = report.get("shard")
    if shard:
        lines.append(f"shard      {shard['key']}  {shard['size']} bytes  index {shard['index_status']}")
        if "index" in shard:
            lines.append(f"           {shard['stored_chunks']} stored chunks, {shard['unused_bytes']} unused bytes")
            lines.append(f"{'pos':>6} {'chunk':>14} {'offset':>12} {'nbytes':>10}")
            for row in shard["index"]:
                where = ("empty", "") if row["empty"] else (row["offset"], row["nbytes"])
                lines.append(f"{row['pos']:>6} {row['chunk'] or '(past edge)':>14} {where[0]:>12} {where[1]:>10}")
    return "\n".join(lines)
