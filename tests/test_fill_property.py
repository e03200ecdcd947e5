"""Property test of the v2 ``fill_value`` mapping (README "OME-Zarr and xarray"), through a
real mount, with zarr-python 3 and current xarray reading the v3 source as the oracles.

Each example writes one small 1-D array with zarr 3 into the mounted source: a dtype among
ints, uints, bool, floats (NaN and +-inf fills), datetime64 and timedelta64, 0-D or 1-D; values drawn from a pool
that holds the fill value (so whole chunks are empty and not stored); optionally
dimension names and an xarray ``_FillValue`` attribute (encoded by xarray's own coder).
Then, through the mount:

- zarr 3 with ``zarr_format=2`` and, for all examples at once, zarr 2.18 read exactly
  the values zarr 3 reads natively (never uninitialised memory, never a wrong fill);
- ``.zarray`` ``fill_value`` is the mask: the decoded ``_FillValue``, else null for an
  array with dimension names (but NaN for a NaN-filled float array), else the v3 fill;

- current xarray opens the array with the same values and dtype as natively.
"""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import assert_same_array, budget, read_zarr2_many

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "datetime64[ns]", "datetime64[s]", "timedelta64[ms]"]


def pool(dtype: np.dtype) -> list:
    """Values of ``dtype`` that examples draw from: extremes, zero, NaN/inf, NaT."""
    if dtype.kind == "b":
        return [np.False_, np.True_]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return [dtype.type(v) for v in {int(info.min), int(info.max), 0, 1, *([-1] if dtype.kind == "i" else [])}]
    if dtype.kind == "f":
        return [dtype.type(v) for v in (0.0, 1.5, -2.0, np.nan, np.inf, -np.inf)]
    counts = np.array([np.iinfo("i8").min, 0, 86400, -5, 10 ** 9], dtype="i8")
    return list(counts.view(dtype))


@st.composite
def examples(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    values = pool(dtype)
    fill = draw(st.sampled_from(values))
    n = draw(st.integers(0, 14))  # 0: a 0-D array
    chunk = draw(st.integers(1, 4))
    data = np.array(draw(st.lists(st.sampled_from(values + [fill] * 3), min_size=max(n, 1), max_size=max(n, 1))),
                    dtype=dtype)
    if n == 0:
        data = data.reshape(())
    dims = draw(st.booleans())
    # xarray cannot decode a _FillValue attribute of a datetime64/timedelta64 array natively
    mask = draw(st.none() | st.sampled_from(values)) if dtype.kind not in "mM" else None
    sharded = n > 0 and draw(st.booleans())
    return dtype, fill, data, chunk, dims, mask, sharded


def encoded_mask(mask, dtype: np.dtype):
    """The ``_FillValue`` attribute as xarray writes it for zarr_format=3 (its own coder)."""
    from xarray.backends.zarr import FillValueCoder

    return FillValueCoder.encode(mask.item() if dtype.kind != "f" else float(mask), dtype)


def same_scalar(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "mM":
        return bool(a.view("i8") == b.view("i8"))
    if a.dtype.kind == "f" and np.isnan(a):
        return bool(np.isnan(b))
    return bool(a == b)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    import zarr

    root = tmp_path_factory.mktemp("fills") / "src"
    zarr.open_group(str(root), mode="w", zarr_format=3)
    return root


def test_fill_mapping_reads_as_native(source, module_mount):
    import xarray as xr
    import zarr

    mnt = module_mount(source, "-o", "ro")
    counter = itertools.count()
    written: list[tuple[str, np.ndarray]] = []

    @settings(max_examples=budget(60))
    @given(examples())
    def check(example):
        dtype, fill, data, chunk, dims, mask, sharded = example
        name = f"ex{next(counter)}"
        attrs = {} if mask is None else {"_FillValue": encoded_mask(mask, dtype)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = zarr.open_group(str(source / name), mode="w", zarr_format=3)
            a = g.create_array("v", shape=data.shape, dtype=dtype, chunks=(chunk,) * data.ndim,
                               shards=(2 * chunk,) if sharded else None, fill_value=fill,
                               dimension_names=["x"] * data.ndim if dims else None, attributes=attrs)
            a[...] = data
        native = zarr.open_array(str(source / name / "v"), mode="r")[...]
        assert_same_array(native, data, "oracle")
        got = zarr.open_array(str(mnt / name / "v"), mode="r", zarr_format=2)[...]
        assert_same_array(got, native, f"zarr 3 (v2) read of {example}")
        written.append((str(mnt / name / "v"), native))

        v2_fill = json.loads((mnt / name / "v" / ".zarray").read_text())["fill_value"]
        shown = json.loads((mnt / name / "v" / ".zattrs").read_text())
        assert "_FillValue" not in shown
        if mask is not None:
            decoded = zarr.open_array(str(mnt / name / "v"), mode="r", zarr_format=2).metadata.fill_value
            assert same_scalar(decoded, mask), (v2_fill, mask)
        elif (dims or data.ndim == 0) and dtype.kind == "f" and np.isnan(fill):  # NaN masks no value
            assert v2_fill == "NaN"
        elif dims or data.ndim == 0:  # xarray opens 0-D arrays without dimension names
            assert v2_fill is None
        else:
            assert same_scalar(zarr.open_array(str(mnt / name / "v"), mode="r", zarr_format=2).metadata.fill_value,
                               fill), (v2_fill, fill)

        if dims or data.ndim == 0:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = xr.open_zarr(str(source / name), zarr_format=3, consolidated=False)["v"].values
                have = xr.open_zarr(str(mnt / name), zarr_format=2, consolidated=False)["v"].values
            assert have.dtype == want.dtype, example
            if want.dtype == object:  # a masked bool: True/False/NaN objects (NaN != NaN there)
                assert [x if x == x else "nan" for x in have.ravel().tolist()] == \
                    [x if x == x else "nan" for x in want.ravel().tolist()], example
            else:
                np.testing.assert_array_equal(have, want, err_msg=str(example))

    check()
    assert len(written) >= 60  # every example ran to its end (shrinking may add some)
    z2 = read_zarr2_many([p for p, _ in written])
    for path, native in written:
        assert_same_array(z2[path], native, f"zarr 2.18 read of {path}")
