"""The science tools on top of zarr 2 read through the mount what native v3 readers read.

- ome-zarr-py 0.9 (zarr 2.18, its own venv) reads every level and label of an
  OME-Zarr 0.5 image written by zarr 3, equal to zarr 3 reading the source;
- xarray 2025.6.1 on zarr 2.18, and current xarray on zarr 3 with
  ``zarr_format=2``, open datasets written by xarray (``to_zarr(zarr_format=3)``)
  and by plain zarr 3 (with ``dimension_names``) with the same values, dtypes
  and attributes as current xarray reading the v3 source natively;
- copies out (``cp -r``) read back equal, and shard directories list only stored chunks.

Every read goes through a real mount, except what only checks the view (the metadata
mapping, the chunk files listed and served), in-process (``tests/inproc.py``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from conftest import assert_same_array, read_native, read_tensorstore, read_zarr2_many, read_zarr3_v2, zarr2
from inproc import InPath, InProcess
from sources import create_array

# ------------------------------------------------------------------ OME-Zarr 0.5 image


def _multiscales(name: str, levels: int) -> list[dict]:
    axes = [{"name": "c", "type": "channel"}, {"name": "y", "type": "space", "unit": "micrometer"},
            {"name": "x", "type": "space", "unit": "micrometer"}]
    datasets = [{"path": str(i), "coordinateTransformations": [{"type": "scale", "scale": [1.0, 2.0 ** i, 2.0 ** i]}]}
                for i in range(levels)]
    return [{"name": name, "axes": axes, "datasets": datasets}]


OMERO = {"channels": [
    {"label": "DAPI", "color": "0000FF", "active": True, "window": {"start": 0, "end": 900, "min": 0, "max": 65535}},
    {"label": "GFP", "color": "00FF00", "active": True, "window": {"start": 0, "end": 900, "min": 0, "max": 65535}},
]}
IMAGE_ATTRS = {"ome": {"version": "0.5", "multiscales": _multiscales("image", 3), "omero": OMERO}}
LABELS_ATTRS = {"ome": {"version": "0.5", "labels": ["cells"]}}
IMAGE_LABEL = {"colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]}, {"label-value": 7, "rgba": [0, 0, 255, 255]}],
               "properties": [{"label-value": 1, "area": 200}], "source": {"image": "../../"}}
CELLS_ATTRS = {"ome": {"version": "0.5", "multiscales": _multiscales("cells", 3), "image-label": IMAGE_LABEL}}
IMAGE_ARRAYS = ["img/0", "img/1", "img/2"]
# Chunk key encodings of the shards; the view's dimension_separator for an OME array with each.
ENCODINGS = [{"name": "default", "configuration": {"separator": "."}},
             {"name": "v2", "configuration": {"separator": "."}},
             {"name": "default", "configuration": {"separator": "/"}},
             {"name": "v2", "configuration": {"separator": "/"}}]
LABEL_ARRAYS = ["img/labels/cells/0", "img/labels/cells/1", "img/labels/cells/2"]





@pytest.fixture(scope="module")
def ome_src(tmp_path_factory) -> Path:
    """An OME-Zarr 0.5 image (3 levels, zarr 3 sharded arrays with dimension names, some empty
    chunks) with one label image of 3 levels, and a plain array beside it."""
    import zarr

    root = tmp_path_factory.mktemp("ome") / "src"
    g = zarr.open_group(str(root), mode="w", zarr_format=3)
    img = g.create_group("img", attributes=IMAGE_ATTRS)
    data = np.random.default_rng(1).integers(1, 4000, (2, 60, 50)).astype("uint16")
    data[:, :16, :16] = 0  # empty inner chunks (not stored)
    for i in range(3):
        create_array(img, str(i), data[:, :: 2 ** i, :: 2 ** i], (1, 8, 8), (1, 16, 16), 0,
                dimension_names=["c", "y", "x"])
    labels = img.create_group("labels", attributes=LABELS_ATTRS)
    cells = labels.create_group("cells", attributes=CELLS_ATTRS)
    lab = np.zeros((1, 60, 50), dtype="uint32")
    lab[0, 20:30, 20:40] = 1
    lab[0, 40:50, 5:15] = 7
    for i in range(3):
        create_array(cells, str(i), lab[:, :: 2 ** i, :: 2 ** i], (1, 8, 8), (1, 16, 16), 0,
                dimension_names=["c", "y", "x"])
    create_array(g, "plain", np.arange(60, dtype="int16").reshape(6, 10), (2, 5), (4, 10), 3)
    # The same levels stored with each other chunk key encoding of the shards.
    enc = g.create_group("enc", attributes=IMAGE_ATTRS)
    for i, encoding in enumerate(ENCODINGS[:3]):
        create_array(enc, str(i), data[:, :: 2 ** i, :: 2 ** i], (1, 8, 8), (1, 16, 16), 0,
                dimension_names=["c", "y", "x"], chunk_key_encoding=encoding)
    v2slash = g.create_group("v2slash", attributes={"ome": {**IMAGE_ATTRS["ome"],
                                                            "multiscales": _multiscales("image", 1)}})
    create_array(v2slash, "0", data, (1, 8, 8), (1, 16, 16), 0, dimension_names=["c", "y", "x"],
            chunk_key_encoding=ENCODINGS[3])
    return root


@pytest.fixture(scope="module")
def ome_mnt(module_mount, ome_src) -> Path:
    return module_mount(ome_src)


@pytest.fixture(scope="module")
def ome_tree(ome_src) -> Iterator[InProcess]:
    """The OME source as the mount shows it, in-process (``tests/inproc.py``)."""
    with InProcess(ome_src) as fs:
        yield fs


def test_ome_arrays_use_slash_keys_and_others_dot(ome_tree):
    for p in IMAGE_ARRAYS + LABEL_ARRAYS:
        assert json.loads((ome_tree / p / ".zarray").read_text())["dimension_separator"] == "/", p
    assert json.loads((ome_tree / "plain" / ".zarray").read_text())["dimension_separator"] == "."
    # The key the OME-Zarr 0.4 store asks for exists; the "."-joined one does not.
    assert (ome_tree / "img/0/1/2/3").is_file()
    assert not (ome_tree / "img/0/1.2.3").exists()
    assert (ome_tree / "plain/1.1").is_file()


ENCODED = {"enc/0": "/", "enc/1": "/", "enc/2": "/", "v2slash/0": "."}  # array -> the separator shown


def test_ome_arrays_in_every_key_encoding_are_named_apart(ome_src, caplog):
    """"/" for OME arrays in every key encoding but v2 "/" (whose shard tree holds the digit
    directories: "." and one warning); names never collide, and every name resolves.
    In-process (``tests/inproc.py``)."""
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(ome_src) as fs:
        for p, sep in ENCODED.items():
            assert json.loads((fs / p / ".zarray").read_text())["dimension_separator"] == sep, p
            names = (fs / p).iterdir()
            assert len(names) == len(set(names)), p
            for n in names:
                (fs / p / n).stat()
        assert (fs / "enc/1/0.1.1").is_dir()  # a v2 "." shard directory beside the "/" keys
        assert (fs / "enc/1/0/1/2").is_file()
        assert (fs / "v2slash/0/0.1.2").is_file()
    assert caplog.text.count("OME-Zarr array with v2 \"/\" chunk keys") == 1
    assert f"{ome_src / 'v2slash/0/zarr.json'}: OME-Zarr array" in caplog.text


def test_ome_arrays_in_every_key_encoding(ome_mnt, ome_src):
    """ome-zarr-py and zarr 2.18 read the OME arrays of every key encoding through the mount."""
    expected = ENCODED
    got = zarr2(
        """
        import os
        from ome_zarr.io import parse_url
        from ome_zarr.reader import Reader
        (node,) = list(Reader(parse_url(path))())
        result = {str(i): np.asarray(level.compute()) for i, level in enumerate(node.data)}
        """,
        path=str(ome_mnt / "enc"),
    )
    for i in range(3):
        assert_same_array(got[str(i)], read_native(ome_src / f"enc/{i}"), f"ome-zarr-py read of enc/{i}")
    z2 = read_zarr2_many([ome_mnt / p for p in expected])
    for p in expected:
        assert_same_array(z2[str(ome_mnt / p)], read_native(ome_src / p), f"zarr 2.18 read of {p}")


def test_ome_attributes_are_ome_04(ome_tree):
    img = json.loads((ome_tree / "img/.zattrs").read_text())
    assert img == {"multiscales": [{**m, "version": "0.4"} for m in IMAGE_ATTRS["ome"]["multiscales"]],
                   "omero": OMERO}
    assert json.loads((ome_tree / "img/labels/.zattrs").read_text()) == {"labels": ["cells"]}
    cells = json.loads((ome_tree / "img/labels/cells/.zattrs").read_text())
    assert cells == {"multiscales": [{**m, "version": "0.4"} for m in CELLS_ATTRS["ome"]["multiscales"]],
                     "image-label": {**IMAGE_LABEL, "version": "0.4"}}


def test_ome_zarr_py_reads_every_level_and_label(ome_mnt, ome_src):
    got = zarr2(
        """
        import os
        from ome_zarr.io import parse_url
        from ome_zarr.reader import Reader
        result = {'nodes': []}
        for node in Reader(parse_url(path))():
            where = os.path.relpath(str(node.zarr.path if hasattr(node.zarr, 'path') else node.zarr), root)
            specs = sorted(type(s).__name__ for s in node.specs)
            result['nodes'].append([where.rstrip('/'), specs, len(node.data)])
            for i, level in enumerate(node.data):
                result['%s/%d' % (where.rstrip('/'), i)] = np.asarray(level.compute())
        """,
        path=str(ome_mnt / "img"), root=str(ome_mnt),
    )
    assert got["nodes"] == [["img", ["Multiscales", "OMERO"], 3], ["img/labels", ["Labels"], 0],
                            ["img/labels/cells", ["Label", "Multiscales"], 3]]
    for p in IMAGE_ARRAYS + LABEL_ARRAYS:
        native = read_native(ome_src / p)
        assert_same_array(got[p], native, f"ome-zarr-py read of {p}")
    assert not got["img/0"][:, :16, :16].any() and got["img/0"][:, 16:, 16:].all()
    assert set(np.unique(got["img/labels/cells/0"]).tolist()) == {0, 1, 7}


def test_ome_arrays_read_exactly_by_v2_clients(ome_mnt, ome_src):
    paths = IMAGE_ARRAYS + LABEL_ARRAYS + ["plain"]
    z2 = read_zarr2_many([ome_mnt / p for p in paths])
    for p in paths:
        native = read_native(ome_src / p)
        assert_same_array(z2[str(ome_mnt / p)], native, f"zarr 2.18 read of {p}")
        assert_same_array(read_zarr3_v2(ome_mnt / p), native, f"zarr 3 (v2) read of {p}")
        assert_same_array(read_tensorstore(ome_mnt / p), native, f"tensorstore read of {p}")


def test_no_ome_translation_option_keeps_attributes_and_slash_keys(ome_src):
    """In-process (``tests/inproc.py``): the view of ``-o no_ome_translation``."""
    with InProcess(ome_src, ome=False) as fs:
        assert json.loads((fs / "img/.zattrs").read_text()) == IMAGE_ATTRS
        assert json.loads((fs / "img/labels/cells/.zattrs").read_text()) == CELLS_ATTRS
        assert json.loads((fs / "img/0/.zarray").read_text())["dimension_separator"] == "/"


# ------------------------------------------------------------------ xarray


def _xarray_datasets(root: Path) -> None:
    """``byxr`` and ``byxr_sharded`` written by xarray (zarr_format=3), ``byzarr`` by plain zarr 3."""
    import pandas as pd
    import xarray as xr
    import zarr

    zarr.open_group(str(root), mode="w", zarr_format=3)
    temp = np.arange(12.0).reshape(3, 4)
    temp[0, 0] = temp[2, 2] = np.nan
    ds = xr.Dataset(
        {"temp": (("time", "x"), temp, {"units": "K"}),
         "flag": (("x",), np.array([False, True, False, False])),
         "count": (("time", "x"), np.arange(12, dtype="int32").reshape(3, 4) % 3),
         "cold": (("x",), np.zeros(4, dtype="uint8")),
         "zero": ((), np.int64(0))},  # 0-D, equal to the fill value: not stored
        coords={"x": np.arange(4), "time": pd.date_range("2000-01-01", periods=3)},
        attrs={"title": "xr"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(root / "byxr", zarr_format=3, mode="w", consolidated=False)
        ds.to_zarr(root / "byxr_sharded", zarr_format=3, mode="w", consolidated=False,
                   encoding={"temp": {"chunks": (1, 2), "shards": (2, 4)},
                             "count": {"chunks": (1, 2), "shards": (2, 4)}})
    g = zarr.open_group(str(root / "byzarr"), mode="w", zarr_format=3, attributes={"title": "plain zarr"})
    create_array(g, "x", np.arange(5, dtype="int64"), (2,), (4,), 0, dimension_names=["x"])
    create_array(g, "ok", np.array([False, False, True, False, False]), (2,), (4,), False, dimension_names=["x"])
    v = np.full((5, 6), np.nan, dtype="float32")
    v[0] = np.arange(6)
    create_array(g, "v", v, (2, 3), (4, 6), np.nan, dimension_names=["x", "y"])
    create_array(g, "t", np.array(["2000-01-01", "NaT", "1970-01-01", "NaT", "2001-01-01"], dtype="M8[ns]"), (2,), (4,),
            np.datetime64("NaT"), dimension_names=["x"])
    create_array(g, "n", np.array([[0, 7, 0], [0, 0, 0], [0, 0, 9], [0, 0, 0], [0, 0, 0]], dtype="uint16"),
                 (2, 3), (4, 3), 0, dimension_names=["x", "z"], attributes={"long_name": "counts"})
    create_array(g, "s", np.array(0, dtype="int32"), (), None, 0, dimension_names=[])  # 0-D, not stored
    big = zarr.open_group(str(root / "big"), mode="w", zarr_format=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = big.create_array("huge", shape=(2049, 2049), dtype="uint8", chunks=(1, 1), shards=(64, 64),
                             fill_value=0, compressors=None, dimension_names=["y", "x"])
        a[0, 1] = 5  # one stored chunk among 2049 * 2049 (more than the 4M that are listed)


DATASETS = ["byxr", "byxr_sharded", "byzarr"]


@pytest.fixture(scope="module")
def xr_src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("xr") / "src"
    _xarray_datasets(root)
    return root


@pytest.fixture(scope="module")
def xr_mnt(module_mount, xr_src) -> Path:
    return module_mount(xr_src)


@pytest.fixture(scope="module")
def xr_tree(xr_src) -> Iterator[InProcess]:
    """The xarray source as the mount shows it, in-process (``tests/inproc.py``)."""
    with InProcess(xr_src) as fs:
        yield fs


def _open_xarray(path: Path, **kw):
    import xarray as xr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_zarr(str(path), consolidated=False, **kw).load()


def _variables(ds) -> dict:
    return {k: (v.dtype.str, v.dims, dict(v.attrs), v.values) for k, v in ds.variables.items()}


def _assert_same_variables(got: dict, expected: dict, what: str) -> None:
    assert sorted(got) == sorted(expected), what
    for k, (dtype, dims, attrs, values) in expected.items():
        gdtype, gdims, gattrs, gvalues = got[k]
        assert (gdtype, tuple(gdims)) == (dtype, tuple(dims)), f"{what}: {k}"
        assert _plain(gattrs) == _plain(attrs), f"{what}: attributes of {k}"
        np.testing.assert_array_equal(gvalues, values, err_msg=f"{what}: {k}", strict=True)


def _plain(attrs: dict) -> dict:
    """Attributes compared as JSON (NaN spelled the same, numpy scalars as Python ones)."""
    return json.loads(json.dumps({k: np.asarray(v).tolist() for k, v in attrs.items()}, default=str))


@pytest.mark.parametrize("mask_and_scale", [True, False], ids=["masked", "raw"])
@pytest.mark.parametrize("name", DATASETS)
def test_current_xarray_zarr3_v2_equals_native(xr_mnt, xr_src, name, mask_and_scale):
    native = _open_xarray(xr_src / name, zarr_format=3, mask_and_scale=mask_and_scale)
    got = _open_xarray(xr_mnt / name, zarr_format=2, mask_and_scale=mask_and_scale)
    assert got.attrs == native.attrs
    _assert_same_variables(_variables(got), _raw_nan_fills(_variables(native), xr_mnt / name, mask_and_scale),
                           f"xarray {name} mask_and_scale={mask_and_scale}")


@pytest.mark.parametrize("mask_and_scale", [True, False], ids=["masked", "raw"])
@pytest.mark.parametrize("name", DATASETS)
def test_xarray_2025_on_zarr2_equals_native(xr_mnt, xr_src, name, mask_and_scale):
    native = _raw_nan_fills(_variables(_open_xarray(xr_src / name, zarr_format=3, mask_and_scale=mask_and_scale)),
                            xr_mnt / name, mask_and_scale)
    got = zarr2(
        """
        import warnings
        import xarray as xr
        assert xr.__version__ == '2025.6.1' and zarr.__version__.startswith('2.18'), (xr.__version__, zarr.__version__)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            ds = xr.open_zarr(path, consolidated=False, mask_and_scale=mask_and_scale).load()
        result = {'__meta': {k: [v.dtype.str, list(v.dims), json.loads(json.dumps(
            {a: np.asarray(x).tolist() for a, x in v.attrs.items()}, default=str))] for k, v in ds.variables.items()}}
        result.update({k: v.values for k, v in ds.variables.items()})
        """,
        path=str(xr_mnt / name), mask_and_scale=mask_and_scale,
    )
    meta = got.pop("__meta")
    _assert_same_variables({k: (d, dims, attrs, got[k]) for k, (d, dims, attrs) in meta.items()}, native,
                           f"xarray 2025.6.1 on zarr 2.18: {name} mask_and_scale={mask_and_scale}")


def _raw_nan_fills(variables: dict, root: Path, mask_and_scale: bool) -> dict:
    """``variables`` as xarray reads them from a v2 view undecoded: a float array whose v2
    ``fill_value`` is NaN (no ``_FillValue`` natively) shows ``_FillValue: nan`` in its
    attributes then (decoded, it is the mask, which changes no value)."""
    if mask_and_scale:
        return variables
    out = dict(variables)
    for k, (dtype, dims, attrs, values) in variables.items():
        if "_FillValue" not in attrs and _zarray(root, k).get("fill_value") == "NaN":
            out[k] = (dtype, dims, {**attrs, "_FillValue": np.nan}, values)
    return out


def _zarray(mnt: Path | InPath, path: str) -> dict:

    return json.loads((mnt / path / ".zarray").read_text())


def test_fill_value_is_the_xarray_mask(xr_tree, xr_src):
    # xarray's _FillValue attribute (base64 for floats) becomes fill_value and leaves .zattrs.
    assert json.loads((xr_src / "byxr/temp/zarr.json").read_text())["attributes"]["_FillValue"] == "AAAAAAAA+H8="
    assert _zarray(xr_tree, "byxr/temp")["fill_value"] == "NaN"
    assert json.loads((xr_tree / "byxr/temp/.zattrs").read_text()) == {"_ARRAY_DIMENSIONS": ["time", "x"], "units": "K"}
    # No mask: null (the v3 fill_value is not a mask), but NaN stays NaN (it masks no value).
    for p in ("byxr/x", "byxr/flag", "byxr/count", "byxr/zero", "byzarr/x", "byzarr/ok", "byzarr/t",
              "byzarr/n", "byzarr/s"):
        assert _zarray(xr_tree, p)["fill_value"] is None, p
    assert _zarray(xr_tree, "byzarr/v")["fill_value"] == "NaN"

    assert _zarray(xr_tree, "byzarr/t")["dtype"] == "<M8[ns]"


def test_zarr_clients_read_fill_null_arrays_exactly(xr_mnt, xr_src):
    paths = [f"byzarr/{n}" for n in ("x", "ok", "v", "t", "n", "s")] + ["byxr_sharded/temp", "byxr_sharded/count"]
    z2 = read_zarr2_many([xr_mnt / p for p in paths])
    for p in paths:
        native = read_native(xr_src / p)
        assert_same_array(z2[str(xr_mnt / p)], native, f"zarr 2.18 read of {p}")
        assert_same_array(read_zarr3_v2(xr_mnt / p), native, f"zarr 3 (v2) read of {p}")
        if native.dtype.kind != "M":
            assert_same_array(read_tensorstore(xr_mnt / p), native, f"tensorstore read of {p}")


def _chunk_names(directory: InPath) -> set[str]:
    return {n for n in directory.iterdir() if n[0].isdigit()}


def test_every_chunk_listed_at_the_root_only_stored_ones_in_shards(xr_tree, xr_src):
    # byzarr/n: shape (5, 3), chunks (2, 3), shards (4, 3): chunks 0.0 and 1.0 hold data, 2.0 is empty.
    root = xr_tree / "byzarr/n"
    assert _chunk_names(root) == {"0.0", "1.0", "2.0"}
    assert (root / "c/0/0").iterdir() == ["0.0", "1.0"]
    assert not (root / "c/1/0").exists()
    fill = (root / "2.0").read_bytes()
    import numcodecs

    zarray = _zarray(xr_tree, "byzarr/n")
    raw = numcodecs.get_codec(zarray["compressor"]).decode(fill)
    assert np.frombuffer(raw, dtype="<u2").tolist() == [0] * 6
    assert (root / "2.0").stat().st_size == len(fill)
    # byzarr/v: only the first row of chunks holds data; its fill NaN is the v2 fill (it masks
    # no value), so only stored chunks are listed: an absent one reads as NaN in every client.
    assert _chunk_names(xr_tree / "byzarr/v") == {"0.0", "0.1"}
    assert (xr_tree / "byzarr/v/c/0/0").iterdir() == ["0.0", "0.1"]
    # 0-D: the single chunk "0" is served though not stored.
    assert not (xr_src / "byzarr/s/c").exists()
    assert _chunk_names(xr_tree / "byzarr/s") == {"0"}


def test_huge_array_lists_stored_chunks_and_serves_the_rest(xr_src, caplog):
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(xr_src) as fs:
        root = fs / "big/huge"
        assert _chunk_names(root) == {"0.1"}
        assert (root / "0.1").read_bytes() == b"\x05"
        assert (root / "2048.2048").read_bytes() == b"\x00"
        assert (root / "c/0/0").iterdir() == ["0.1"]
    assert caplog.text.count("inner chunks: empty ones are served but not listed") == 1


@pytest.mark.parametrize("tool", ["cp", "rsync"])
def test_copy_out_reads_back_equal(xr_mnt, xr_src, tmp_path, tool):
    for p in ("byzarr/v", "byzarr/n", "byzarr/x"):
        dest = tmp_path / p.replace("/", "_")
        if tool == "cp":
            subprocess.run(["cp", "-r", str(xr_mnt / p), str(dest)], check=True)
        else:
            if shutil.which("rsync") is None:
                pytest.skip("rsync is not installed")
            subprocess.run(["rsync", "-a", f"{xr_mnt / p}/", f"{dest}/"], check=True)
        native = read_native(xr_src / p)
        assert_same_array(read_zarr2_many([dest])[str(dest)], native, f"zarr 2.18 read of a {tool} copy of {p}")
        assert_same_array(read_zarr3_v2(dest), native, f"zarr 3 read of a {tool} copy of {p}")


def test_partial_writes_into_empty_chunks_keep_the_fill(xr_src, mount, tmp_path):
    """A writer that updates part of an empty chunk of a fill-null array reads the served fill
    chunk first: the rest of the chunk stays the v3 fill, not garbage; in a NaN-filled array
    (NaN is its v2 fill) the rest stays NaN."""
    from writers import umount

    src = tmp_path / "src"
    shutil.copytree(xr_src, src)
    mnt = mount(src)
    got = zarr2(
        """
        a = zarr.open(path + '/v', mode='r+')
        assert np.isnan(a.fill_value)
        a[4, 0] = 42.0
        result = zarr.open(path + '/v', mode='r')[...]
        """,
        path=str(mnt / "byzarr"),
    )
    expected = np.full((5, 6), np.nan, dtype="float32")
    expected[0] = np.arange(6)
    expected[4, 0] = 42.0
    assert_same_array(got, expected, "zarr 2.18 read through the mount after the write")

    # an empty chunk served as the fill chunk exists: an exclusive create (link) fails
    import numcodecs

    codec = numcodecs.get_codec(_zarray(mnt, "byzarr/n")["compressor"])
    (mnt / "byzarr/n/tmp").write_bytes(codec.encode(np.array([1, 2, 3, 4, 5, 6], dtype="<u2")))
    with pytest.raises(FileExistsError):
        os.link(mnt / "byzarr/n/tmp", mnt / "byzarr/n/2.0")
    # rm of it succeeds and changes nothing (it was empty), and the name is gone until written again
    os.unlink(mnt / "byzarr/n/2.0")
    assert not os.path.exists(mnt / "byzarr/n/2.0") and "2.0" not in os.listdir(mnt / "byzarr/n")
    with pytest.raises(FileNotFoundError):
        os.unlink(mnt / "byzarr/n/2.0")
    # made again by an exclusive create (cp -a, tar: unlink, then O_EXCL), shown from then on
    fd = os.open(mnt / "byzarr/n/2.0", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        assert "2.0" in os.listdir(mnt / "byzarr/n")
        os.write(fd, codec.encode(np.zeros(6, dtype="<u2")))
    finally:
        os.close(fd)
    os.rename(mnt / "byzarr/n/tmp", mnt / "byzarr/n/2.0")  # a rename replaces it, as any chunk
    umount(mount, mnt)
    n = read_native(src / "byzarr/n")
    assert n[4].tolist() == [1, 2, 3] and n[:4].tolist() == [[0, 7, 0], [0, 0, 0], [0, 0, 9], [0, 0, 0]]
    assert_same_array(read_native(src / "byzarr/v"), expected, "zarr 3 read of the source after the write")
    # a fill-null array: the partial write reads the served fill chunk of the empty chunk first
    shutil.rmtree(src)
    shutil.copytree(xr_src, src)
    mnt = mount(src)
    got = zarr2(
        """
        n = zarr.open(path, mode='r+')
        assert n.fill_value is None
        n[4, 1] = 3
        result = zarr.open(path, mode='r')[...]
        """,
        path=str(mnt / "byzarr/n"),
    )
    n = np.array([[0, 7, 0], [0, 0, 0], [0, 0, 9], [0, 0, 0], [0, 3, 0]], dtype="uint16")
    assert_same_array(got, n, "zarr 2.18 read of the fill-null array after the write")
    umount(mount, mnt)
    assert_same_array(read_native(src / "byzarr/n"), n, "zarr 3 read of the source after the write")



def test_group_becoming_an_image_switches_its_arrays_to_slash(tmp_path):
    """Attributes written after the arrays (as OME writers do): once the view has read the
    group's new attributes, its arrays show "/" keys (a new .zarray mtime, so no stale page).
    In-process (``tests/inproc.py``, listings not kept: ``-o entry_timeout=0``); ome-zarr-py reads a
    copy of the files shown."""
    import zarr

    src = tmp_path / "src"
    g = zarr.open_group(str(src), mode="w", zarr_format=3)
    late = g.create_group("late")
    data = np.random.default_rng(3).integers(1, 100, (2, 20, 20)).astype("uint8")
    create_array(late, "0", data, (1, 8, 8), (1, 16, 16), 0, dimension_names=["c", "y", "x"])
    with InProcess(src, list_ttl=0) as mnt:
        assert json.loads((mnt / "late/0/.zarray").read_text())["dimension_separator"] == "."
        before = (mnt / "late/0/.zarray").stat().st_mtime_ns
        doc = json.loads((src / "late/zarr.json").read_text())
        doc["attributes"] = {"ome": {"version": "0.5", "multiscales": _multiscales("late", 1)}}
        (src / "late/zarr.json").write_text(json.dumps(doc))
        os.utime(src / "late/zarr.json", ns=(before + 10 ** 9, before + 10 ** 9))
        time.sleep(1.5)  # the view remembers stat results for 1 s
        assert json.loads((mnt / "late/.zattrs").read_text())["multiscales"][0]["version"] == "0.4"
        assert json.loads((mnt / "late/0/.zarray").read_text())["dimension_separator"] == "/"
        assert (mnt / "late/0/.zarray").stat().st_mtime_ns == before + 10 ** 9
        shown = (mnt / "late").copy_to(tmp_path / "shown" / "late")
    got = zarr2(
        """
        from ome_zarr.io import parse_url
        from ome_zarr.reader import Reader
        (node,) = list(Reader(parse_url(path))())
        result = np.asarray(node.data[0].compute())
        """,
        path=str(shown),
    )
    assert_same_array(got, data, "ome-zarr-py read of late/0")
