"""Text from the source or from other users made safe to print or log (doc/SECURITY.md#output).

``printable(text)`` is ``text`` with every character that could forge output escaped, so
that what shardfs prints or logs is one line per line it means, and a terminal shows it as
text: control characters (C0, DEL, C1: escape sequences, carriage returns, newlines), the
Unicode line and paragraph separators, the bidirectional overrides and isolates (text that
displays in another order than it reads) and lone surrogates (bytes of a name that are not
UTF-8, kept by ``surrogateescape``). ``\\n``, ``\\r`` and ``\\t`` become those two
characters; any other becomes ``\\xNN`` (``\\uNNNN`` above 0xff; a surrogate made of byte NN,
``\\xNN``). Everything else, backslashes included, is kept.

``printable_doc(doc)`` does the same to every string (keys included) of a JSON-like document
(dicts, lists and tuples are rebuilt as such; anything else is kept as it is).
"""

from __future__ import annotations

import re
from typing import Any

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    if c in _NAMED:
        return _NAMED[c]
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        n -= 0xDC00
    return f"\\x{n:02x}" if n <= 0xFF else f"\\u{n:04x}"


def printable(text: str) -> str:
    """``text`` with what could forge output escaped (see the module docstring)."""
    return _UNSAFE.sub(_escape, text)


def printable_doc(doc: Any) -> Any:
    """``doc`` (dicts, lists, strings, numbers) with every string, keys included, ``printable``."""
    if isinstance(doc, str):
        return printable(doc)
    if isinstance(doc, dict):
        return {printable_doc(k): printable_doc(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [printable_doc(v) for v in doc]
    if isinstance(doc, tuple):
        return tuple(printable_doc(v) for v in doc)
    return doc
