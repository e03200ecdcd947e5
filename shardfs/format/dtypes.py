"""Zarr v3 data types -> the numpy dtype of the v2 view (no I/O).

zarr-python's own data type classes give each v3 type its v2 spelling
(``ZDType.to_json(zarr_format=2)``): fixed-size types are numpy dtypes (``<U n``,
``|S n``, ``|V n``, structured lists, numbers, datetimes), and the variable-length
ones are ``|O`` with an object codec (``vlen-utf8``, ``vlen-bytes``) that v2 lists
as its first filter. Their v3 array→bytes codec writes numcodecs' own format, so
their stored chunks are v2 chunks as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from zarr.codecs.vlen_utf8 import VLenBytesCodec, VLenUTF8Codec

from shardfs.format.layout import Unpresentable

VLEN_CODECS: dict[str, type] = {"vlen-utf8": VLenUTF8Codec, "vlen-bytes": VLenBytesCodec}
MAX_VLEN_CHUNK = 256 << 20  # the largest chunk file of a variable-length type (EFBIG past it)
_FIXED_KINDS = "biufcmMUSV"


def view_dtype(data_type: Any) -> tuple[np.dtype, str | None]:
    """``(dtype, object codec id)`` of a zarr ``ZDType`` as the v2 view shows it: the object
    codec id (``vlen-utf8``/``vlen-bytes``) for a variable-length type, whose dtype is
    ``object``, else None. Raises ``Unpresentable`` naming a type that v2 cannot express."""
    name = _v3_name(data_type)
    try:
        v2 = data_type.to_json(zarr_format=2)
    except Exception as e:  # zarr raises many types for a type with no v2 form
        raise Unpresentable(f"data type {name} has no v2 form: {e}") from None
    codec = v2.get("object_codec_id") if isinstance(v2, dict) else None
    if codec is not None:
        if codec not in VLEN_CODECS:
            raise Unpresentable(f"data type {name} has no v2 form (object codec {codec!r})")
        return np.dtype(object), codec
    try:
        dtype = np.dtype(data_type.to_native_dtype())
    except Exception as e:
        raise Unpresentable(f"data type {name} has no v2 form: {e}") from None
    if dtype.kind not in _FIXED_KINDS:
        raise Unpresentable(f"data type {name} has no v2 form")
    return dtype, None


def vlen_codec_id(codec: Any) -> str | None:
    """The v2 object codec id of zarr's array→bytes codec ``codec``, or None if it is not a
    variable-length one."""
    for name, cls in VLEN_CODECS.items():
        if isinstance(codec, cls):
            return name
    return None


def _v3_name(data_type: Any) -> str:
    try:
        spelled = data_type.to_json(zarr_format=3)
    except Exception:  # a type zarr cannot spell back is named by its class
        return type(data_type).__name__
    return repr(spelled.get("name") if isinstance(spelled, dict) else spelled)
