"""Array→array codecs placed before the sharding codec (``codecs: [a2a..., sharding_indexed]``).

They code a whole shard before it is cut into inner chunks, so an inner chunk
can be shown on its own only if each of them commutes with that cut:
``transpose`` (it permutes the index grid; the geometry lives in ``layout``)
and the elementwise numcodecs filters listed in ``ELEMENTWISE``. Anything else
(``numcodecs.delta`` runs along the whole flattened shard, an unknown codec)
is ``Unpresentable``. The codecs themselves are zarr-python's objects; this
module only checks them and derives what the view needs from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from zarr.abc.codec import ArrayArrayCodec
from zarr.codecs import ShardingCodec, TransposeCodec
from zarr.codecs.numcodecs import AsType, BitRound, FixedScaleOffset, Quantize
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync as zarr_sync

from shardfs.format.layout import Unpresentable, composed

ELEMENTWISE = (AsType, BitRound, FixedScaleOffset, Quantize)


def split_sharding(codecs: tuple[Any, ...]) -> tuple[tuple[Any, ...], ShardingCodec]:
    """``(codecs before the sharding codec, the sharding codec)`` of an array's chain.

    Raises ``Unpresentable`` unless the sharding codec is last and everything
    before it is a ``transpose`` or an elementwise codec.
    """
    if not isinstance(codecs[-1], ShardingCodec):
        raise Unpresentable("codecs after the sharding codec are not supported")
    before = codecs[:-1]
    for codec in before:
        if not isinstance(codec, ArrayArrayCodec):
            raise Unpresentable(f"codec {_name(codec)} before the sharding codec is not an array→array codec")
        if not isinstance(codec, (TransposeCodec, *ELEMENTWISE)):
            raise Unpresentable(f"array→array codec {_name(codec)} before the sharding codec is neither a "
                                "transpose nor elementwise: an inner chunk cannot be decoded on its own")
    return before, codecs[-1]


def index_order(before: tuple[Any, ...]) -> tuple[int, ...] | None:
    """The one transpose order equal to all ``transpose`` codecs in ``before``; None if there are none."""
    order = None
    for codec in before:
        if isinstance(codec, TransposeCodec):
            step = tuple(int(o) for o in codec.order)
            order = step if order is None else composed(order, step)
    return order


@dataclass(frozen=True)
class Filters:
    """The codecs before the sharding codec, applied to one inner chunk as zarr applies them to a shard.

    ``specs[i]`` is the spec ``codecs[i]`` receives when encoding; ``encoded``
    is what the sharding codec sees. Between these codecs and the inner chain
    an array is in native byte order (zarr assembles a shard in a native
    buffer), and a filter's output is reinterpreted as ``encoded``'s dtype, as
    numcodecs filters return buffers (``bitround`` returns an integer view).
    """

    codecs: tuple[Any, ...]
    specs: tuple[ArraySpec, ...]
    encoded: ArraySpec

    @classmethod
    def over(cls, codecs: tuple[Any, ...], spec: ArraySpec) -> Filters:
        """``codecs`` applied to inner chunks of ``spec`` (array space)."""
        specs = [spec]
        for codec in codecs:
            specs.append(codec.resolve_metadata(specs[-1]))
        return cls(codecs, tuple(specs[:-1]), specs[-1])

    @property
    def encoded_dtype(self) -> np.dtype:
        return np.dtype(self.encoded.dtype.to_native_dtype()).newbyteorder("=")

    def decode(self, array: np.ndarray) -> np.ndarray:
        """An inner chunk as the inner chain decoded it -> the array-space chunk."""
        nd = _nd(np.asarray(array, dtype=self.encoded_dtype))
        for codec, spec in zip(reversed(self.codecs), reversed(self.specs)):
            (nd,) = zarr_sync(codec.decode([(nd, spec)]))
        return nd.as_numpy_array()

    def encode(self, array: np.ndarray) -> np.ndarray:
        """An array-space chunk -> what the inner chain encodes (``encoded``'s shape and dtype)."""
        nd = _nd(array)
        for codec, spec in zip(self.codecs, self.specs):
            (nd,) = zarr_sync(codec.encode([(nd, spec)]))
        out = np.ascontiguousarray(nd.as_numpy_array())
        return out.view(self.encoded_dtype).reshape(self.encoded.shape)

    def check_empty_chunk(self) -> None:
        """Raise ``Unpresentable`` unless an empty inner chunk reads as the fill value.

        zarr-python fills an empty inner chunk with the fill value *after* these
        codecs and decodes it through them; v2 clients read a missing chunk file
        as the fill value itself. The two agree for most chains (a ``transpose``,
        ``astype``, a scale without offset) but not for e.g. a
        ``fixedscaleoffset`` with an offset, which no v2 view can express.
        """
        spec = self.specs[0] if self.specs else self.encoded
        try:
            decoded = self.decode(np.full(self.encoded.shape, self.encoded.fill_value, dtype=self.encoded_dtype))
            fill = np.asarray(spec.fill_value, dtype=spec.dtype.to_native_dtype())
        except Exception as e:  # numpy and numcodecs raise many types for odd fill values
            raise Unpresentable(f"codecs before the sharding codec cannot decode an empty inner chunk: {e}") from e
        same = np.array_equal(decoded, np.broadcast_to(fill, decoded.shape), equal_nan=decoded.dtype.kind in "fc")
        if not same:
            raise Unpresentable(f"an empty inner chunk decodes to {decoded.flat[0].item()!r}, not the fill "
                                f"value {fill.item()!r}, through the codecs before the sharding codec")


def _nd(array: np.ndarray) -> Any:
    return default_buffer_prototype().nd_buffer.from_numpy_array(array)


def describe(before: tuple[Any, ...]) -> list[str]:
    """Short names of the codecs before the sharding codec, for logs and ``inspect``."""
    return [_name(c) for c in before]


def _name(codec: Any) -> str:
    try:
        return str(codec.to_dict().get("name"))
    except Exception:
        return type(codec).__name__
