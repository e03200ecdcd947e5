"""Every Zarr v3 data type that v2 can express reaches v2 clients (doc: SEMANTICS "Data types").

zarr-python 3 reading the v3 source is the oracle. Property tests (hypothesis) draw random
strings (empty ones, NUL, astral characters, random lengths) and bytes for the string and
bytes types, chunk and shard shapes, compressors and dimension names:

- reads: zarr 3 writes the array natively into a mounted source; zarr 3 in v2 mode and
  zarr 2.18 read exactly what zarr 3 reads natively, and ``.zarray`` spells the type as v2
  does (``|O`` + ``vlen-utf8``/``vlen-bytes`` filter, ``<U n``, ``|S n``);
- writes: zarr 2.18 creates and writes the arrays through the mount; zarr 3 reads the v3
  source back exactly, and the arrays are v3 ``string``/``variable_length_bytes``/... ones.

xarray's string coordinates and variables round-trip between xarray 2025.6 (zarr 2.18)
through the mount and current xarray on the v3 source (``assert_identical``), both ways.
The fill rules: NaN stays the v2 ``fill_value`` of a float array with dimension names; a
``.zarray`` written with ``fill_value: null`` shows null after a remount, with nothing added
to the attributes that v3 readers see. What only checks the view (the NaN fill, an unknown
type hidden, a string chunk file refused, structured and raw bytes types) runs in-process
(``tests/inproc.py``), its clients reading a copy of the files shown.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import budget, folded, run_shardfs, zarr2
from inproc import InProcess

# numpy's unicode and zarr's fixed_length_utf32 strip trailing NULs; elsewhere NUL is kept
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]) | st.sampled_from(["\x00", "😀", "𝔘"]),
               max_size=12)
BINARY = st.binary(max_size=10)
KINDS = ["string", "variable_length_bytes", "fixed_length_utf32", "null_terminated_bytes"]
COMPRESSORS = [None, {"name": "zstd", "configuration": {"level": 1, "checksum": False}},
               {"name": "gzip", "configuration": {"level": 1}}]
V2_COMPRESSORS = {None: None, "zstd": {"id": "zstd", "level": 1}, "gzip": {"id": "gzip", "level": 1}}


def as_json(values: list) -> list:
    """Element values as JSON (bytes as base64)."""
    return [base64.b64encode(v).decode() if isinstance(v, bytes) else v for v in values]


def native_values(kind: str, values: list) -> np.ndarray:
    """``values`` as the numpy array zarr 3 writes for ``kind``."""
    if kind in ("string", "variable_length_bytes"):
        return np.array(values, dtype=object)
    if kind == "fixed_length_utf32":
        return np.array(values, dtype=f"<U{max(1, max(len(v) for v in values))}")
    return np.array(values, dtype=f"S{max(1, max(len(v) for v in values))}")


def v2_dtype(kind: str, data: np.ndarray) -> str:
    return "|O" if kind in ("string", "variable_length_bytes") else data.dtype.str


def expected_filters(kind: str) -> list | None:
    return {"string": [{"id": "vlen-utf8"}], "variable_length_bytes": [{"id": "vlen-bytes"}]}.get(kind)


@st.composite
def read_examples(draw):
    kind = draw(st.sampled_from(KINDS))
    elements = TEXT if kind in ("string", "fixed_length_utf32") else BINARY
    if kind == "fixed_length_utf32":  # trailing NULs are not part of a numpy str
        elements = elements.map(lambda s: s.rstrip("\x00"))
    if kind == "null_terminated_bytes":
        elements = elements.map(lambda b: b.rstrip(b"\x00"))
    n = draw(st.integers(1, 11))
    values = draw(st.lists(elements, min_size=n, max_size=n))
    chunk = draw(st.integers(1, 3))
    sharded = draw(st.booleans())
    written = draw(st.integers(0, n))  # elements past it stay the fill: whole chunks are absent
    return kind, values, chunk, sharded, written, draw(st.sampled_from(COMPRESSORS)), draw(st.booleans())


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    import zarr

    root = tmp_path_factory.mktemp("dtypes") / "src"
    zarr.open_group(str(root), mode="w", zarr_format=3)
    return root


def _create(group, kind: str, data: np.ndarray, chunk: int, sharded: bool, compressor, dims: bool):
    dtype = {"string": str, "variable_length_bytes": "variable_length_bytes"}.get(kind, data.dtype)
    return group.create_array("v", shape=data.shape, dtype=dtype, chunks=(chunk,),
                              shards=(2 * chunk,) if sharded else None,
                              compressors=[compressor] if compressor else None,
                              dimension_names=["x"] if dims else None)


def test_string_and_bytes_types_read_as_native(source, module_mount):
    import zarr

    mnt = module_mount(source, "-o", "ro")
    counter = itertools.count()
    written: list[tuple[str, list]] = []

    @settings(max_examples=budget(40))
    @given(read_examples())
    def check(example):
        kind, values, chunk, sharded, count, compressor, dims = example
        name = f"ex{next(counter)}"
        data = native_values(kind, values)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = zarr.open_group(str(source / name), mode="w", zarr_format=3)
            a = _create(g, kind, data, chunk, sharded, compressor, dims)
            a[:count] = data[:count]
            native = zarr.open_array(str(source / name / "v"), mode="r")[...]
        assert json.loads((source / name / "v" / "zarr.json").read_text())["data_type"] == kind or \
            json.loads((source / name / "v" / "zarr.json").read_text())["data_type"]["name"] == kind
        zarray = json.loads((mnt / name / "v" / ".zarray").read_text())
        assert zarray["dtype"] == v2_dtype(kind, data)
        assert zarray["filters"] == expected_filters(kind)
        assert zarray["compressor"] == V2_COMPRESSORS[compressor and compressor["name"]]
        got = zarr.open_array(str(mnt / name / "v"), mode="r", zarr_format=2)[...]
        assert got.tolist() == native.tolist(), f"zarr 3 (v2) read of {example}"
        written.append((str(mnt / name / "v"), as_json(native.tolist())))

    check()
    assert len(written) >= budget(40)
    z2 = zarr2("""
        result = {}
        import base64
        for p in paths:
            vals = zarr.open(p, mode='r')[...].tolist()
            result[p] = [base64.b64encode(v).decode() if isinstance(v, bytes) else v for v in vals]
        """, paths=[p for p, _ in written])
    for path, native in written:
        assert z2[path] == native, f"zarr 2.18 read of {path}"


@st.composite
def write_examples(draw):
    arrays = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["vlen-utf8", "vlen-bytes", "U", "S"]))
        elements = TEXT if kind in ("vlen-utf8", "U") else BINARY
        if kind == "U":
            elements = elements.map(lambda s: s.rstrip("\x00"))
        if kind == "S":
            elements = elements.map(lambda b: b.rstrip(b"\x00"))
        n = draw(st.integers(1, 9))
        values = draw(st.lists(elements, min_size=n, max_size=n))
        arrays.append({"kind": kind, "values": as_json(values), "chunk": draw(st.integers(1, 4)),
                       "compressor": draw(st.sampled_from([None, "zlib", "blosc"]))})
    return arrays


_ZARR2_WRITE = """
import base64, numcodecs
g = zarr.open_group(root, mode='a')
for i, spec in enumerate(arrays):
    vals = spec['values']
    kind = spec['kind']
    if kind in ('vlen-bytes', 'S'):
        vals = [base64.b64decode(v) for v in vals]
    compressor = {None: None, 'zlib': numcodecs.Zlib(1), 'blosc': numcodecs.Blosc('lz4', 3)}[spec['compressor']]
    if kind.startswith('vlen'):
        codec = numcodecs.VLenUTF8() if kind == 'vlen-utf8' else numcodecs.VLenBytes()
        a = g.create_dataset('a%d' % i, shape=(len(vals),), chunks=(spec['chunk'],), dtype=object,
                             object_codec=codec, compressor=compressor)
        a[:] = np.array(vals, dtype=object)
    else:
        data = np.array(vals, dtype='U' if kind == 'U' else 'S')
        if data.dtype.itemsize == 0:
            data = data.astype(kind + '1')
        a = g.create_dataset('a%d' % i, shape=data.shape, chunks=(spec['chunk'],), dtype=data.dtype,
                             compressor=compressor)
        a[:] = data
result = {}
"""


def test_zarr2_writes_string_and_bytes_types(tmp_path, mount):
    import zarr

    src = tmp_path / "src"
    zarr.open_group(str(src), mode="w", zarr_format=3)
    mnt = mount(src)
    counter = itertools.count()
    checked = []

    @settings(max_examples=budget(6), deadline=None)
    @given(write_examples())
    def check(arrays):
        name = f"w{next(counter)}"
        (mnt / name).mkdir()
        (mnt / name / ".zgroup").write_text('{"zarr_format": 2}')
        zarr2(_ZARR2_WRITE, root=str(mnt / name), arrays=arrays)
        folded(mnt)
        for i, spec in enumerate(arrays):
            doc = json.loads((src / name / f"a{i}" / "zarr.json").read_text())
            kind = doc["data_type"] if isinstance(doc["data_type"], str) else doc["data_type"]["name"]
            assert kind == {"vlen-utf8": "string", "vlen-bytes": "variable_length_bytes",
                            "U": "fixed_length_utf32", "S": "null_terminated_bytes"}[spec["kind"]]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = zarr.open_array(str(src / name / f"a{i}"), mode="r")[...].tolist()
            assert as_json(got) == spec["values"], (spec, got)
            checked.append(spec["kind"])

    check()
    assert set(checked) == {"vlen-utf8", "vlen-bytes", "U", "S"}


# --------------------------------------------------------------------------- xarray

def _dataset():
    import xarray as xr

    return xr.Dataset(
        {"temp": (("station", "time"), np.arange(8.0).reshape(4, 2)),
         "label": (("station",), np.array(["north", "", "x\x00y", "😀 south"], dtype=object)),
         "code": (("station",), np.array(["AB", "C", "", "DEF"], dtype="U3"))},
        coords={"station": ["Rome", "Oslo", "Lima", "Kyiv"], "time": [0, 1]},
        attrs={"title": "stations"})


_XR_READ = """
import xarray as xr
ds = xr.open_zarr(path, consolidated=False).load()
result = {"ds": json.loads(json.dumps(ds.to_dict(data="list"), default=str))}
"""

_XR_WRITE = """
import xarray as xr
ds = xr.Dataset.from_dict(ds)
ds["label"] = ds["label"].astype(object)  # from_dict makes "<U"; a str object array is "string" in v3
ds.to_zarr(path, mode="w", consolidated=True)

result = {}
"""


def _from_zarr2(d: dict):
    import xarray as xr

    return xr.Dataset.from_dict(d)


def _as_object(ds):
    """Strings as numpy object arrays: current xarray reads v3 ``string`` as numpy's StringDType."""
    return ds.map(lambda v: v.astype(object) if v.dtype.kind in "OT" else v).assign_coords(
        {k: c.astype(object) if c.dtype.kind in "OT" else c for k, c in ds.coords.items()})


def test_xarray_string_coordinates_round_trip(tmp_path, mount):
    import xarray as xr

    src = tmp_path / "src"
    ds = _dataset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(src, zarr_format=3, mode="w", consolidated=False,
                   encoding={"label": {"shards": (4,), "chunks": (2,)}, "code": {"shards": (4,), "chunks": (2,)}})
        native = xr.open_zarr(src, zarr_format=3, consolidated=False).load()
    mnt = mount(src)
    assert json.loads((mnt / "station" / ".zarray").read_text())["dtype"] == "<U4"
    assert json.loads((mnt / "label" / ".zarray").read_text())["filters"] == [{"id": "vlen-utf8"}]
    # xarray 2025.6 on zarr 2.18 through the mount: the string coordinate is there
    old = _from_zarr2(zarr2(_XR_READ, path=str(mnt))["ds"])
    xr.testing.assert_identical(_as_object(old), _as_object(native))
    assert list(old["station"].values) == ["Rome", "Oslo", "Lima", "Kyiv"]
    # current xarray with zarr 3 in v2 mode through the mount
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v2 = xr.open_zarr(mnt, zarr_format=2, consolidated=False).load()
    xr.testing.assert_identical(_as_object(v2), _as_object(native))
    # xarray 2025.6 writes through the mount; current xarray reads the v3 source
    zarr2(_XR_WRITE, path=str(mnt / "copy"), ds=json.loads(json.dumps(ds.to_dict(data="list"))))
    folded(mnt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = xr.open_zarr(src / "copy", zarr_format=3, consolidated=False).load()
    assert json.loads((src / "copy" / "label" / "zarr.json").read_text())["data_type"] == "string"
    xr.testing.assert_identical(_as_object(back), _as_object(ds))


# --------------------------------------------------------------------------- fill rules

def test_nan_stays_the_fill_of_float_arrays_with_dimension_names(tmp_path):
    """In-process (``tests/inproc.py``); xarray reads a copy of the files shown."""
    import xarray as xr
    import zarr

    src = tmp_path / "src"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = zarr.open_group(str(src), mode="w", zarr_format=3)
        a = g.create_array("f", shape=(6,), chunks=(2,), shards=(4,), dtype="f4", fill_value=np.nan,
                           dimension_names=["x"])
        a[:2] = [1.5, 0.0]
        i = g.create_array("i", shape=(6,), chunks=(2,), shards=(4,), dtype="i2", fill_value=0,
                           dimension_names=["x"])
        i[:2] = [3, 0]
    with InProcess(src) as fs:
        assert json.loads((fs / "f" / ".zarray").read_text())["fill_value"] == "NaN"
        assert json.loads((fs / "i" / ".zarray").read_text())["fill_value"] is None  # 0 would mask zeros
        assert sorted((fs / "f").iterdir()) == [".zarray", ".zattrs", "0"]  # absent: NaN
        mnt = (fs / "").copy_to(tmp_path / "shown")  # what the mount shows, for xarray
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xr.testing.assert_identical(xr.open_zarr(mnt, zarr_format=2, consolidated=False).load(),
                                    xr.open_zarr(src, zarr_format=3, consolidated=False).load())


# a 4x4 <u2 array of 2x2 chunks, fill_value null, as zarr 2.18 writes its .zarray (no dimension_separator)
NULL_FILL_ZARRAY = {"chunks": [2, 2], "compressor": None, "dtype": "<u2", "fill_value": None, "filters": None,
                    "order": "C", "shape": [4, 4], "zarr_format": 2}


def test_null_fill_value_survives_a_remount(tmp_path):
    """In-process (``tests/inproc.py``: closing the tree and opening another is the remount); the
    ``.zarray`` as zarr 2.18 writes it (no ``dimension_separator``); zarr 2.18 reads a copy of the
    files shown."""
    import tensorstore as ts
    import zarr

    src = tmp_path / "src"
    zarr.open_group(str(src), mode="w", zarr_format=3)
    with InProcess(src, read_only=False) as fs:
        (fs / "nodata").mkdir()
        (fs / "nodata" / ".zarray").write_text(json.dumps(NULL_FILL_ZARRAY))
        (fs / "nodata" / "0.0").write_bytes(np.array([[0, 1], [2, 0]], "<u2").tobytes())
    with InProcess(src) as fs:
        assert json.loads((fs / "nodata" / ".zarray").read_text())["fill_value"] is None
        shown = (fs / "nodata").copy_to(tmp_path / "shown" / "nodata")
    doc = json.loads((src / "nodata" / "zarr.json").read_text())
    assert doc["attributes"] == {}
    # (zarr 2's DirectoryStore wrote no dimension_separator: remembered too, tests/test_zarr2_suite.py)
    assert doc["shardfs"] == {"must_understand": False, "v2_fill_value": None, "v2_dimension_separator": None}
    want = np.array([[0, 1, 0, 0], [2, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype="u2")
    np.testing.assert_array_equal(zarr.open_array(str(src / "nodata"), mode="r")[...], want)
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(src / "nodata")}}
    np.testing.assert_array_equal(ts.open(spec, read=True).result().read().result(), want)
    got = zarr2("result = zarr.open(path, mode='r')[...]", path=str(shown))
    np.testing.assert_array_equal(got, want)  # every in-bounds chunk served: no uninitialised memory


def test_a_null_fill_array_of_nested_keys_resolves_every_key_directory_it_lists(tmp_path):
    """In-process (``tests/inproc.py``): a ``fill_value`` null array serves every chunk in bounds,
    so with ``dimension_separator`` "/" it lists every key directory (zarr 2.18's
    ``NestedDirectoryStore`` walks them): each resolves, never made by a writer, and the chunk
    files under it are the v3 fill's."""
    import zarr

    src = tmp_path / "src"
    zarr.open_group(str(src), mode="w", zarr_format=3)
    with InProcess(src, read_only=False) as fs:
        (fs / "n").mkdir()
        (fs / "n" / ".zarray").write_text(json.dumps(dict(NULL_FILL_ZARRAY, dimension_separator="/")))
        assert (fs / "n" / "0").stat().st_mode & 0o170000 == 0o040000  # (a directory already: no mkdir)
        (fs / "n" / "0" / "0").write_bytes(np.array([[0, 1], [2, 0]], "<u2").tobytes())
    with InProcess(src) as fs:
        assert sorted((fs / "n").iterdir()) == [".zarray", ".zattrs", "0", "1"]
        assert (fs / "n" / "1").iterdir() == ["0", "1"]  # (a key directory no writer made)
        assert (fs / "n" / "1" / "1").read_bytes() == bytes(8)


def test_unknown_data_type_is_hidden_with_its_reason(tmp_path, caplog):
    """In-process (``tests/inproc.py``); ``inspect`` of the source."""
    src = tmp_path / "src"
    (src / "odd").mkdir(parents=True)
    (src / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    doc = {"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "float8_e4m3fn",
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
           "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
           "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}}
    (src / "odd" / "zarr.json").write_text(json.dumps(doc))
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(src, read_only=False) as fs:
        assert (fs / "odd").iterdir() == []
    log = caplog.text
    assert len([line for line in log.splitlines() if "odd" in line and "float8_e4m3fn" in line]) == 1, log[-3000:]
    out = run_shardfs("inspect", str(src / "odd")).stdout
    assert "not shown: invalid array metadata: No Zarr data type found that matches 'float8_e4m3fn'" in out



# --------------------------------------------------------------------------- chunk files

def test_the_mapping_of_every_type(tmp_path):
    """In-process (no mount): each v3 type's ``.zarray`` dtype, filters, fill and size bound."""
    import zarr
    from zarr.codecs import BytesCodec

    from shardfs.format.dtypes import MAX_VLEN_CHUNK

    from shardfs.format.v2 import describe_array

    cases = {"string": (str, "|O", [{"id": "vlen-utf8"}], None),
             "variable_length_bytes": ("variable_length_bytes", "|O", [{"id": "vlen-bytes"}], None),
             "fixed_length_utf32": ("<U3", "<U3", None, ""),
             "big_utf32": (">U3", ">U3", None, ""),
             "null_terminated_bytes": ("S2", "|S2", None, ""),  # zarr 2 spells b"\0\0" so
             "int": ("<i4", "<i4", None, 0)}
    for name, (dtype, v2, filters, fill) in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zarr.create_array(str(tmp_path / name), shape=(4,), chunks=(2,), shards=(4,), dtype=dtype,
                              compressors=None, **({"serializer": BytesCodec(endian="big")} if v2[0] == ">" else {}))
        info = describe_array(json.loads((tmp_path / name / "zarr.json").read_text()))
        zarray = json.loads(info.zarray)
        assert (zarray["dtype"], zarray["filters"], zarray["fill_value"]) == (v2, filters, fill), name
        itemsize = np.dtype(v2).itemsize
        assert info.chunk.max_file_size == (MAX_VLEN_CHUNK if v2 == "|O" else 2 * itemsize), name
        assert info.serve_missing == (v2 == "|O"), name


def test_a_gzip_fill_chunk_file_is_the_same_bytes_whenever_it_is_made(tmp_path):
    """In-process: the chunk file of an empty inner chunk of a string array (served, since its v2
    fill is not the v3 one) with gzip is made by each worker that serves it, on first use: its
    header's time stamp is 0, so every worker, and a remount, shows the same bytes; it decodes to
    the fill."""
    import time

    import numcodecs
    import zarr
    from zarr.codecs import GzipCodec

    from shardfs.format.v2 import describe_array

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.create_array(str(tmp_path / "s"), shape=(4,), chunks=(2,), shards=(4,), dtype=str,
                          compressors=GzipCodec(level=5))
    doc = json.loads((tmp_path / "s" / "zarr.json").read_text())
    first = describe_array(doc).fill_file()
    time.sleep(1.1)  # (numcodecs stamps the second it encodes in)
    again = describe_array(doc).fill_file()
    assert first == again and first[:10] == bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 255])
    assert list(numcodecs.VLenUTF8().decode(numcodecs.GZip().decode(first))) == ["", ""]


def test_a_string_chunk_file_with_the_wrong_element_count_is_refused(tmp_path):
    """In-process (``tests/inproc.py``); zarr 3 (v2 mode) reads a copy of the files shown."""
    import errno

    import numcodecs
    import zarr

    src = tmp_path / "src"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = zarr.create_array(str(src), shape=(4,), chunks=(2,), shards=(4,), dtype=str, compressors=None)
        a[:] = np.array(["a", "b", "c", "d"], dtype=object)
    with InProcess(src, read_only=False) as fs:
        good = numcodecs.VLenUTF8().encode(np.array(["x", "😀"], dtype=object))
        assert (fs / "0").read_bytes() == numcodecs.VLenUTF8().encode(np.array(["a", "b"], dtype=object))
        f = (fs / "1").open("wb")  # O_WRONLY | O_TRUNC
        f.write(numcodecs.VLenUTF8().encode(np.array(["x", "y", "z"], dtype=object)))
        with pytest.raises(OSError) as e:
            f.close()
        assert e.value.errno == errno.EINVAL
        (fs / "1").write_bytes(good)
        mnt = (fs / "").copy_to(tmp_path / "shown")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert zarr.open_array(str(mnt), mode="r", zarr_format=2)[...].tolist() == ["a", "b", "x", "😀"]


def _hand_sharded(path: Path, data_type: dict, fill: str, chunks: list[bytes]) -> None:
    """A sharded 1-D v3 array of two inner chunks of 2 elements, written byte by byte (zarr
    3.1 cannot write these types): chunks, then the index and its crc32c."""
    import crc32c

    doc = {"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": data_type,
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
           "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
           "fill_value": fill, "attributes": {},
           "codecs": [{"name": "sharding_indexed", "configuration": {
               "chunk_shape": [2], "codecs": [{"name": "bytes"}], "index_location": "end",
               "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]}
    (path / "c").mkdir(parents=True)
    (path / "zarr.json").write_text(json.dumps(doc))
    offsets = np.cumsum([0] + [len(c) for c in chunks])
    index = np.array([[offsets[i], len(c)] for i, c in enumerate(chunks)], dtype="<u8").tobytes()
    (path / "c" / "0").write_bytes(b"".join(chunks) + index + crc32c.crc32c(index).to_bytes(4, "little"))


def test_structured_and_raw_bytes_arrays_read_as_written(tmp_path):
    """zarr-python 3.1 can neither write nor read sharded arrays of these types (its sharding
    codec hashes the fill value): the values written byte by byte are the oracle. In-process
    (``tests/inproc.py``); zarr 2.18 reads a copy of the files shown."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    st_dtype = np.dtype([("a", "<i4"), ("b", "<f8")])

    st = np.array([(1, 2.5), (-3, 4.5), (5, np.nan), (0, 0.0)], dtype=st_dtype)
    _hand_sharded(src / "st", {"name": "structured", "configuration": {"fields": [["a", "int32"], ["b", "float64"]]}},
                  "AAAAAAAAAAAAAAAA", [st[:2].tobytes(), st[2:].tobytes()])
    rb = np.array([b"ab", b"\x00\x01", b"zz", b"\xff\x00"], dtype="V2")
    _hand_sharded(src / "rb", {"name": "raw_bytes", "configuration": {"length_bytes": 2}}, "AAA=",
                  [rb[:2].tobytes(), rb[2:].tobytes()])
    with InProcess(src) as fs:
        assert json.loads((fs / "st" / ".zarray").read_text())["dtype"] == [["a", "<i4"], ["b", "<f8"]]
        assert json.loads((fs / "rb" / ".zarray").read_text())["dtype"] == "|V2"
        mnt = (fs / "").copy_to(tmp_path / "shown")  # what the mount shows, for zarr 2.18
    for name, want in (("st", st), ("rb", rb)):
        got = zarr2("result = np.frombuffer(zarr.open(path, mode='r')[...].tobytes(), 'u1')", path=str(mnt / name))
        assert got.tobytes() == want.tobytes(), name
