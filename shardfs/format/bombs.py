"""How many bytes a compressed inner chunk decodes to, found before it is decoded, in bounded
memory: so a small shard cannot make the daemon decode gigabytes (a decompression bomb,
doc/SECURITY.md#bounds).

Contracts:
- ``decoded_size(kind, data, limit)``: for ``data`` in compressed format ``kind`` (``zstd``,
  ``gzip``, ``zlib``, ``blosc``), the number of bytes it decodes to when that is ``<= limit``,
  or some number ``> limit`` when it is more; None when it cannot be told (not that format,
  damaged: the decoder itself reports it). What a frame's header says (zstd's Frame Content
  Size, blosc's ``nbytes``) is taken as said: the decoder allocates that much and fails on a
  frame that says less than it holds. Frames that do not say (a zstd frame from a streaming
  compressor, gzip, zlib) are decoded into a buffer of ``STEP`` bytes, reused, and counted
  until ``limit`` is passed: memory ``STEP``, time one decode.
- ``said_size`` tells which of the two it was (for the log line).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import zlib

STEP = 1 << 20  # bytes decoded at a time when counting
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def zstd_content_size(data: bytes) -> int | None:
    """The decoded size a zstd frame at the start of ``data`` declares (its header's Frame
    Content Size, RFC 8878 3.1.1.1), or None if ``data`` is not such a frame or it declares none."""
    if len(data) < 6 or data[:4] != ZSTD_MAGIC:
        return None
    fhd = data[4]
    single = (fhd >> 5) & 1
    fcs_bytes = (0 if not single else 1, 2, 4, 8)[fhd >> 6]
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    if not fcs_bytes or len(data) < at + fcs_bytes:
        return None
    size = int.from_bytes(data[at: at + fcs_bytes], "little")
    return size + 256 if fcs_bytes == 2 else size


def said_size(kind: str, data: bytes) -> int | None:
    """The decoded size ``data``'s header says (zstd with a content size, blosc), else None."""
    if kind == "zstd":
        return zstd_content_size(data)
    if kind == "blosc" and len(data) >= 16:
        return int.from_bytes(data[4:8], "little")
    return None


def decoded_size(kind: str, data: bytes, limit: int) -> int | None:
    """See the module docstring."""
    said = said_size(kind, data)
    if said is not None:
        return said
    if kind in ("gzip", "zlib"):
        return _count_zlib(data, limit, 47 if kind == "gzip" else 15)
    if kind == "zstd" and data[:4] == ZSTD_MAGIC:
        return _count_zstd(data, limit)
    return None


def _count_zlib(data: bytes, limit: int, wbits: int) -> int | None:
    d = zlib.decompressobj(wbits)
    total, rest = 0, data
    try:
        while rest and not d.eof and total <= limit:
            out = d.decompress(rest, STEP)
            total += len(out)
            if not out and len(d.unconsumed_tail) == len(rest):
                break  # no progress: damaged (the decoder says so)
            rest = d.unconsumed_tail
        while not d.eof and total <= limit:  # what zlib still holds
            out = d.decompress(b"", STEP)
            if not out:
                break
            total += len(out)
    except zlib.error:
        return None
    return total


class _InBuffer(ctypes.Structure):
    _fields_ = [("src", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t)]


class _OutBuffer(ctypes.Structure):
    _fields_ = [("dst", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t)]


@functools.cache
def _libzstd() -> ctypes.CDLL | None:
    """The system's libzstd (the streaming decoder: numcodecs has no bounded one), or None."""
    try:  # the soname first: ``find_library`` runs ``ldconfig -p`` in a subprocess
        lib = ctypes.CDLL("libzstd.so.1")
    except OSError:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so")
        except OSError:
            return None
    lib.ZSTD_createDCtx.restype = ctypes.c_void_p
    lib.ZSTD_freeDCtx.argtypes = [ctypes.c_void_p]
    lib.ZSTD_decompressStream.restype = ctypes.c_size_t
    lib.ZSTD_decompressStream.argtypes = [ctypes.c_void_p, ctypes.POINTER(_OutBuffer), ctypes.POINTER(_InBuffer)]
    lib.ZSTD_isError.restype = ctypes.c_uint
    lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
    return lib


def _count_zstd(data: bytes, limit: int) -> int | None:
    """Bytes the zstd frames in ``data`` decode to (stopping past ``limit``); None without
    libzstd or when they are damaged."""
    lib = _libzstd()
    if lib is None:
        return None
    dctx = lib.ZSTD_createDCtx()
    if not dctx:
        return None
    src = ctypes.c_char_p(data)  # (no copy: it points into ``data``, which it keeps)
    dst = ctypes.create_string_buffer(STEP)
    inp = _InBuffer(ctypes.cast(src, ctypes.c_void_p), len(data), 0)
    total = 0
    try:
        while total <= limit:
            out = _OutBuffer(ctypes.cast(dst, ctypes.c_void_p), STEP, 0)
            before = inp.pos
            ret = lib.ZSTD_decompressStream(dctx, ctypes.byref(out), ctypes.byref(inp))
            if lib.ZSTD_isError(ret):
                return None
            total += out.pos
            if ret == 0 and inp.pos == inp.size:
                break  # the last frame is decoded and flushed
            if out.pos == 0 and inp.pos == before:
                return None  # no progress: truncated
    finally:
        lib.ZSTD_freeDCtx(dctx)
    return total
