"""What ``stat`` shows (``Attr``) and the ``OSError`` a FUSE handler answers with (``fail``),
shared by the kernel adapter, the tree and the reads."""

from __future__ import annotations

import os
from typing import NamedTuple


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
