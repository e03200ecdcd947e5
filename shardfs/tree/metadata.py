"""Parsing a node's ``zarr.json`` defensively: every way it can be bad becomes one reason.

A ``zarr.json`` is refused (``BadMetadata``, whose message is the reason) when
it is not a regular file (a directory, FIFO, socket or device: never opened),
is larger than ``METADATA_MAX`` (16 MiB, never read), is not UTF-8, is not
JSON, nests arrays/objects deeper than ``MAX_DEPTH`` (100: deeper documents make
recursive code, zarr's included, fail), or is not a Zarr v3 group or array
object. The tree hides such a node (see ``Names``) and logs the reason
once per version of the file; ``shardfs inspect`` shows it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from itertools import accumulate
from typing import Any

from shardfs.base import files

METADATA_MAX = 16 << 20
MAX_DEPTH = 100
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))  # deleted by translate: brackets are left
_STEP = [1 if c in b"[{" else -1 for c in range(256)]  # the nesting step of each bracket


class BadMetadata(Exception):
    """A ``zarr.json`` that does not describe a node; the message says why."""


def not_regular(mode: int) -> str | None:
    """Why a file of ``mode`` cannot be a ``zarr.json`` (None if it is a regular file)."""
    return None if stat.S_ISREG(mode) else f"zarr.json: {files.not_regular(mode)}"


def too_large(size: int) -> str | None:
    if size > METADATA_MAX:
        return f"zarr.json is {size} bytes, more than the {METADATA_MAX >> 20} MiB allowed"
    return None


def depth(data: bytes) -> int:
    """How deeply arrays and objects nest in valid JSON ``data`` (strings skipped).

    Only for text that parsed: there every string ends, so the string pattern is linear.
    Plain Python (no numpy): ``shardfs mount`` checks the source's ``zarr.json`` with it before
    starting the daemon, and importing numpy would be most of that command's own time."""
    brackets = _STRING.sub(b"", data).translate(None, _BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def parse(data: bytes) -> dict[str, Any]:
    """The document of a Zarr v3 ``zarr.json`` (group or array); ``BadMetadata`` otherwise."""
    reason = too_large(len(data))
    if reason:
        raise BadMetadata(reason)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadMetadata(f"zarr.json is not UTF-8 (byte {e.start})") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise BadMetadata(f"zarr.json nests deeper than the {MAX_DEPTH} levels allowed") from None
    except ValueError as e:
        raise BadMetadata(f"zarr.json is not JSON: {e}") from None
    nesting = depth(data)
    if nesting > MAX_DEPTH:
        raise BadMetadata(f"zarr.json nests {nesting} levels deep, more than the {MAX_DEPTH} allowed")
    if not isinstance(doc, dict):
        raise BadMetadata("zarr.json is not a JSON object")
    if doc.get("zarr_format") != 3:
        raise BadMetadata(f"zarr.json has zarr_format {doc.get('zarr_format')!r}, not 3")
    if doc.get("node_type") not in ("group", "array"):
        raise BadMetadata(f"zarr.json has node_type {doc.get('node_type')!r}, not group or array")
    return doc


def read_file(path: str) -> dict[str, Any]:
    """``parse`` of the local file ``path``: checked to be a regular file of at most
    ``METADATA_MAX`` bytes before it is opened (a FIFO is never opened), and again after
    (opened non-blocking, in case it was swapped). ``FileNotFoundError`` if it is missing."""
    st = os.stat(path)
    reason = not_regular(st.st_mode) or too_large(st.st_size)
    if reason:
        raise BadMetadata(reason)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        reason = not_regular(st.st_mode) or too_large(st.st_size)
        if reason:
            raise BadMetadata(reason)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(METADATA_MAX + 1)
    finally:
        os.close(fd)
    return parse(data)
