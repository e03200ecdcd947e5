"""The v2 ``fill_value`` of a presented array: the mask that xarray reads, not the v3 fill.

xarray reads a v2 ``fill_value`` as ``_FillValue`` (values equal to it become
NaN), while on v3 data it ignores ``fill_value`` and takes the mask from the
``_FillValue`` attribute (base64 of a little-endian float64 for floats). So a
v2 view that copied the v3 ``fill_value`` would turn every int or bool equal to
it into NaN. The mapping (``map_fill``):

- a decodable ``_FillValue`` attribute becomes the v2 ``fill_value`` and is
  dropped from ``.zattrs`` (xarray refuses to see it twice);
- otherwise an array that xarray can open (it has dimension names, shown as
  ``_ARRAY_DIMENSIONS``) gets ``fill_value: null``: no mask, as natively; except a
  NaN float fill, which stays "NaN": masking NaN as NaN changes no value, and GDAL
  reads it as the nodata value, as on a v2 copy written by zarr 2.18;
- otherwise (no xarray reader) the v3 ``fill_value`` is kept, but a variable-length
  type's is null (zarr 2 cannot decode a bytes fill of an object array);
- an array created through the mount from a ``.zarray`` with ``fill_value: null``
  shows null again: ``zarr.json`` remembers it in an extension member that v3
  readers skip (``{"shardfs": {"must_understand": false, "v2_fill_value": null}}``,
  ``remember_null_fill``), so nothing is added to the attributes they show (the same member
  remembers a ``.zarray`` written without ``dimension_separator``: ``remember``).

When the v2 ``fill_value`` is not the v3 one, a v2 reader would fill an absent
chunk with the wrong value (or, with null, leave it uninitialised: zarr 2.18
does), so every in-bounds chunk of such an array is served, an empty one as
the encoded fill chunk (``FillMapping.serve_missing``).
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

XARRAY_FILL = "_FillValue"
EXTENSION = "shardfs"  # zarr.json member (must_understand: false) of what v3 cannot say
_FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


@dataclass(frozen=True)
class FillMapping:
    """``fill_value`` (v2 JSON; None is null), the ``.zattrs`` to show, and whether empty
    inner chunks must be served as fill chunks (the v2 fill differs from the v3 fill)."""

    fill_value: Any
    attrs: dict[str, Any]
    serve_missing: bool


def map_fill(attrs: dict[str, Any], v3_fill: Any, dtype: np.dtype, xarray_visible: bool,
             null: bool = False) -> FillMapping:
    """The v2 fill of an array of ``dtype`` whose v3 ``fill_value`` is ``v3_fill`` and whose
    attributes are ``attrs`` (see the module docstring); ``null``: the array was created
    from a ``.zarray`` whose ``fill_value`` was null."""
    mask = decode_xarray_fill(attrs[XARRAY_FILL], dtype) if XARRAY_FILL in attrs else None
    if mask is not None:
        shown = {k: v for k, v in attrs.items() if k != XARRAY_FILL}
        return FillMapping(encode_fill_value(mask, dtype), shown, not same_fill(mask, v3_fill, dtype))
    nan = dtype.kind == "f" and bool(np.isnan(v3_fill))
    if null or dtype.hasobject or (xarray_visible and not nan):
        return FillMapping(None, attrs, True)
    return FillMapping(encode_fill_value(v3_fill, dtype), attrs, False)


def remembered(doc: dict[str, Any]) -> dict[str, Any]:
    """What the array ``zarr.json`` ``doc`` remembers of the ``.zarray`` it was created from
    (``remember``): ``{}`` if nothing."""
    ext = doc.get(EXTENSION)
    return ext if isinstance(ext, dict) else {}


def remembered_null_fill(doc: dict[str, Any]) -> bool:
    """True if the array ``zarr.json`` ``doc`` remembers a v2 ``fill_value`` of null."""
    ext = remembered(doc)
    return "v2_fill_value" in ext and ext["v2_fill_value"] is None


def remember(doc: dict[str, Any], **spelling: Any) -> dict[str, Any]:
    """``doc`` (an array ``zarr.json``) remembering how its ``.zarray`` spelled what v3 says
    otherwise or not at all: ``v2_fill_value=None`` (null), ``v2_dimension_separator`` (as
    written; None: the ``.zarray`` had none), ``v2_dimension_names=None`` (a 0-d array made without
    ``_ARRAY_DIMENSIONS``, which the view adds otherwise). Readers of v3 skip the member."""
    return {**doc, EXTENSION: {"must_understand": False, **remembered(doc), **spelling}}


def remember_null_fill(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (an array ``zarr.json``) remembering a v2 ``fill_value`` of null."""
    return remember(doc, v2_fill_value=None)


def decode_xarray_fill(value: Any, dtype: np.dtype) -> Any | None:
    """The scalar of ``dtype`` that a ``_FillValue`` attribute names, as xarray decodes it
    (floats: base64 of a little-endian float64; also accepted: a JSON number or
    "NaN"/"Infinity"/"-Infinity"); None if it names none (wrong type, out of range)."""
    try:
        if dtype.kind == "b":
            return np.bool_(value) if isinstance(value, (bool, int)) else None
        if dtype.kind in "iumM":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
                return None
            ints = np.dtype("i8") if dtype.kind in "mM" else dtype
            info = np.iinfo(ints)
            if not info.min <= int(value) <= info.max:
                return None
            return np.array(int(value), dtype=ints).view(dtype)[()]
        if dtype.kind == "f":
            return dtype.type(_decode_float(value))
        if dtype.kind == "c" and isinstance(value, list) and len(value) == 2:
            return dtype.type(complex(_decode_float(value[0]), _decode_float(value[1])))
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def encode_xarray_fill(value: Any, dtype: np.dtype) -> Any:
    """``value`` spelled as xarray writes a ``_FillValue`` attribute on v3 data (floats:
    base64 of a little-endian float64), or None if the dtype has no such spelling; the
    inverse of ``decode_xarray_fill``."""
    if dtype.kind == "b":
        return bool(value)
    if dtype.kind in "iu":
        return int(value)
    if dtype.kind == "f":
        return base64.standard_b64encode(struct.pack("<d", float(value))).decode()
    return None


def _decode_float(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError("a bool is not a float fill")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in _FLOAT_WORDS:
        return _FLOAT_WORDS[value]
    if isinstance(value, str):
        try:
            raw = base64.standard_b64decode(value.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError):
            raise ValueError(f"{value!r} is not base64") from None
        if len(raw) == 8:
            return struct.unpack("<d", raw)[0]
    raise ValueError(f"{value!r} is not a float fill")


def same_fill(a: Any, b: Any, dtype: np.dtype) -> bool:
    """True if fills ``a`` and ``b`` read the same as ``dtype`` (NaN equals NaN)."""
    x, y = np.array(a, dtype=dtype), np.array(b, dtype=dtype)
    if dtype.kind in "mM":
        return bool(x.view("i8") == y.view("i8"))
    if dtype.kind not in "fc":
        return bool(x == y)
    parts = ((x.real, y.real), (x.imag, y.imag)) if dtype.kind == "c" else ((x, y),)
    return all(bool(p == q or (np.isnan(p) and np.isnan(q))) for p, q in parts)


def encode_fill_value(value: Any, dtype: np.dtype) -> Any:
    """A fill value in v2 JSON: NaN/Infinity as strings, complex as ``[re, im]``,
    datetimes as their int64 count (NaT is the smallest int64), strings as JSON strings,
    fixed-size bytes (and structured values) as base64 of their bytes, as zarr 2 spells them
    (``|S n``: without trailing NULs, so an all-NUL fill is ``""``: netCDF-C takes the JSON
    string itself as the fill, not its base64 decoding)."""
    if dtype.kind == "U":
        return str(value)
    if dtype.kind == "S":
        return base64.standard_b64encode(bytes(np.array(value, dtype=dtype)[()])).decode()
    if dtype.kind == "V":
        return base64.standard_b64encode(np.array(value, dtype=dtype).tobytes()).decode()
    if dtype.kind == "b":
        return bool(value)
    if dtype.kind in "iu":
        return int(value)
    if dtype.kind in "mM":
        return int(np.array(value).astype(dtype).view("i8"))
    if dtype.kind == "c":
        c = complex(value)
        return [_float_json(c.real), _float_json(c.imag)]
    return _float_json(float(value))


def _float_json(x: float) -> Any:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x
