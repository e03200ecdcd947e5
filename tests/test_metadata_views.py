"""Metadata views of the mount: consolidated metadata, OME-Zarr 0.5 -> 0.4,
transcoded inner chains, and metadata writes.

Through a real mount, except what only checks the metadata mapping (consolidated metadata,
attributes as stored), which runs in-process on the same source (``tests/inproc.py``).
Sources are written with zarr-python 3;
the oracles are zarr-python 3 reading the v3 source natively, and the v2
clients (zarr 2.18, zarr 3 with ``zarr_format=2``, tensorstore's ``zarr``
driver, xarray) reading the mount.
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import (
    daemon_pids,
    assert_same_array,
    lazy_unmount,
    read_native,
    read_tensorstore,
    read_zarr2,
    read_zarr3_v2,
    run_shardfs,
    zarr2,
)
from inproc import InProcess, copy_chunk_file
from sources import create_array

# ------------------------------------------------------------------ source writers


def _zarr3():
    import zarr

    return zarr





def rng_data(seed, shape, dtype):
    r = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return r.standard_normal(shape).astype(dt)
    return r.integers(1, 1000, size=shape).astype(dt)


# Arrays of the hierarchy: path -> (shape, dtype, inner chunks, shards, dimension names)
HIERARCHY = {
    "temp": ((20, 30), "float32", (5, 10), (10, 20), ["y", "x"]),
    "series": ((40,), "float64", (8,), (16,), ["t"]),
    "g1/cube": ((6, 20, 30), "float32", (3, 5, 10), (6, 10, 20), ["z", "y", "x"]),
    "g1/g2/deep": ((9, 40), "float64", (3, 8), (9, 16), ["w", "t"]),
}
GROUP_ATTRS = {"": {"title": "hierarchy root"}, "g1": {"level": 1}, "g1/g2": {"level": 2}}

OME_05 = {
    "ome": {
        "version": "0.5",
        "multiscales": [{
            "name": "image",
            "axes": [
                {"name": "c", "type": "channel"},
                {"name": "y", "type": "space", "unit": "micrometer"},
                {"name": "x", "type": "space", "unit": "micrometer"},
            ],
            "datasets": [
                {"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1.0, 0.5, 0.5]}]},
                {"path": "1", "coordinateTransformations": [{"type": "scale", "scale": [1.0, 1.0, 1.0]}]},
            ],
            "type": "mean",
        }],
        "omero": {
            "version": "0.5",
            "channels": [
                {"label": "DAPI", "color": "0000FF", "active": True,
                 "window": {"start": 0, "end": 1000, "min": 0, "max": 65535}},
                {"label": "GFP", "color": "00FF00", "active": True,
                 "window": {"start": 0, "end": 1000, "min": 0, "max": 65535}},
            ],
        },
    },
    "acquired_by": "test",
}

# Transcoded arrays: inner chains that v2 cannot spell.
TRANSCODED: dict[str, dict[str, Any]] = {
    # transpose (1,0,2) is not the reversed order: no "order" spelling in v2
    "tr_transpose": dict(filters=[{"name": "transpose", "configuration": {"order": [1, 0, 2]}}],
                         compressors=[]),
    # two bytes->bytes codecs: v2 has one compressor
    "tr_gzip_zstd": dict(filters=[], compressors=[{"name": "gzip", "configuration": {"level": 3}},
                                                  {"name": "zstd", "configuration": {"level": 1,
                                                                                     "checksum": False}}]),
    # the same with big-endian chunks: served in the little-endian dtype of .zarray
    "tr_be_gzip_zstd": dict(filters=[], serializer={"name": "bytes", "configuration": {"endian": "big"}},
                            compressors=[{"name": "gzip", "configuration": {"level": 3}},
                                         {"name": "zstd", "configuration": {"level": 1, "checksum": False}}]),
}
TR_SHAPE, TR_CHUNKS, TR_SHARDS, TR_DTYPE = (7, 10, 11), (3, 5, 4), (6, 10, 8), "int16"


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """One v3 hierarchy: nested groups with arrays, an OME-Zarr 0.5 image, transcoded arrays."""
    zarr = _zarr3()
    root = tmp_path_factory.mktemp("views") / "src"
    groups = {"": zarr.open_group(str(root), mode="w", zarr_format=3, attributes=GROUP_ATTRS[""])}
    for g in ("g1", "g1/g2"):
        groups[g] = groups[g.rpartition("/")[0]].create_group(g.rpartition("/")[2], attributes=GROUP_ATTRS[g])
    for i, (path, (shape, dtype, chunks, shards, dims)) in enumerate(HIERARCHY.items()):
        parent, _, name = path.rpartition("/")
        create_array(groups[parent], name, rng_data(i, shape, dtype), chunks, shards, float("nan"),
                     dimension_names=dims, attributes={"long_name": name})

    img = groups[""].create_group("img", attributes=OME_05)
    level0 = rng_data(10, (2, 64, 48), "uint16")
    level1 = level0[:, ::2, ::2].copy()
    create_array(img, "0", level0, (1, 16, 16), (1, 32, 32), 0, dimension_names=["c", "y", "x"])
    create_array(img, "1", level1, (1, 16, 16), (1, 32, 32), 0, dimension_names=["c", "y", "x"])

    tr = groups[""].create_group("tr")  # no dimension names: kept out of the xarray groups
    for i, (name, codecs) in enumerate(TRANSCODED.items()):
        data = rng_data(20 + i, TR_SHAPE, TR_DTYPE)
        data[:3, :5, :4] = 0  # one fill-only inner chunk: not stored
        create_array(tr, name, data, TR_CHUNKS, TR_SHARDS, 0, **codecs)
    return root


def native_arrays(root: Path) -> dict[str, np.ndarray]:
    return {p: read_native(root / p) for p in HIERARCHY}


def zjson(path: Path) -> dict:
    return json.loads((path / "zarr.json").read_text())


# ------------------------------------------------------------------ consolidated metadata


def test_zmetadata_matches_the_individual_files(tree):
    """In-process: each group's .zmetadata holds exactly the v2 metadata files below it, as served."""
    mnt = tree
    for group in ("", "g1", "g1/g2"):
        gdir = mnt / group
        doc = json.loads((gdir / ".zmetadata").read_text())
        assert doc["zarr_consolidated_format"] == 1
        meta = doc["metadata"]
        below = [p[len(group) + 1:] if group else p for p in HIERARCHY if p.startswith(group)]
        subgroups = [g[len(group) + 1:] if group else g
                     for g in GROUP_ATTRS if g and g.startswith(group) and g != group]
        if group == "":
            below += ["img/0", "img/1", *(f"tr/{n}" for n in TRANSCODED)]
            subgroups += ["img", "tr"]
        expected = {".zgroup", ".zattrs"}
        expected |= {f"{a}/{f}" for a in below for f in (".zarray", ".zattrs")}
        expected |= {f"{g}/{f}" for g in subgroups for f in (".zgroup", ".zattrs")}
        assert set(meta) == expected, f"{group or '/'}: .zmetadata keys"
        for key, value in meta.items():
            assert value == json.loads((gdir / key).read_text()), f"{group or '/'}: .zmetadata[{key!r}]"
        assert meta[".zattrs"] == GROUP_ATTRS[group]


def test_zarr2_open_consolidated_lists_and_reads_the_hierarchy(mnt, src):
    res = zarr2(
        """
        g = zarr.open_consolidated(path, mode='r')
        assert isinstance(g.store, zarr.storage.ConsolidatedMetadataStore) or \
            type(g.store).__name__ == 'ConsolidatedMetadataStore', type(g.store)
        names = []
        g.visititems(lambda name, obj: names.append(name) if isinstance(obj, zarr.Array) else None)
        result = {p: g[p][...] for p in names}
        result['__names'] = sorted(names)
        result['__attrs'] = {p: dict(g[p].attrs) for p in names}
        result['__groups'] = {k: dict(g[k].attrs) for k in ('g1', 'g1/g2')}
        """,
        path=str(mnt),
    )
    expected_names = sorted([*HIERARCHY, "img/0", "img/1", *(f"tr/{n}" for n in TRANSCODED)])
    assert res["__names"] == expected_names
    assert res["__groups"] == {"g1": GROUP_ATTRS["g1"], "g1/g2": GROUP_ATTRS["g1/g2"]}
    for p, (_, _, _, _, dims) in HIERARCHY.items():
        assert res["__attrs"][p] == {"long_name": p.rpartition("/")[2], "_ARRAY_DIMENSIONS": dims}
    for p in expected_names:
        assert_same_array(res[p], read_native(src / p), f"zarr 2.18 consolidated read of {p}")


def test_xarray_open_zarr_consolidated(mnt, src):
    import xarray as xr

    native = native_arrays(src)
    for group, names in (("", ["temp", "series"]), ("g1", ["cube"]), ("g1/g2", ["deep"])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = xr.open_zarr(str(mnt), group=group or None, consolidated=True)
        with ds:
            assert sorted(ds.data_vars) == sorted(names), f"group {group or '/'}"
            for name in names:
                path = f"{group}/{name}" if group else name
                var = ds[name]
                assert list(var.dims) == HIERARCHY[path][4], f"{path}: dims"
                assert var.attrs.get("long_name") == name
                assert_same_array(var.values, native[path], f"xarray read of {path}")
            if group == "":
                assert ds.attrs == GROUP_ATTRS[""]


# ------------------------------------------------------------------ OME-Zarr

# The part of the OME-Zarr 0.4 image schema (ngff 0.4 schemas/image.schema) that a
# 0.5 -> 0.4 translation must satisfy: multiscales, axes, datasets, transformations.
OME_04_IMAGE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://ngff.openmicroscopy.org/0.4/schemas/image.schema",
    "title": "NGFF Image",
    "type": "object",
    "properties": {
        "multiscales": {
            "type": "array",
            "minItems": 1,
            "uniqueItems": True,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "datasets": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "properties": {
                                "path": {"type": "string"},
                                "coordinateTransformations": {"$ref": "#/$defs/coordinateTransformations"},
                            },
                            "required": ["path", "coordinateTransformations"],
                        },
                    },
                    "version": {"type": "string", "enum": ["0.4"]},
                    "axes": {"$ref": "#/$defs/axes"},
                    "coordinateTransformations": {"$ref": "#/$defs/coordinateTransformations"},
                },
                "required": ["datasets", "axes", "version"],
            },
        },
        "omero": {
            "type": "object",
            "properties": {
                "channels": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "window": {
                                "type": "object",
                                "properties": {k: {"type": "number"} for k in ("end", "max", "min", "start")},
                                "required": ["start", "min", "end", "max"],
                            },
                            "label": {"type": "string"},
                            "family": {"type": "string"},
                            "color": {"type": "string"},
                            "active": {"type": "boolean"},
                        },
                        "required": ["window", "color"],
                    },
                },
            },
            "required": ["channels"],
        },
    },
    "required": ["multiscales"],
    "$defs": {
        "axes": {
            "type": "array",
            "uniqueItems": True,
            "minItems": 2,
            "maxItems": 5,
            "contains": {"type": "object", "properties": {"type": {"type": "string", "enum": ["space"]}}},
            "maxContains": 3,
            "minContains": 2,
            "items": {
                "oneOf": [
                    {"type": "object", "properties": {"name": {"type": "string"},
                                                      "type": {"type": "string", "enum": ["space"]},
                                                      "unit": {"type": "string"}},
                     "required": ["name", "type"]},
                    {"type": "object", "properties": {"name": {"type": "string"},
                                                      "type": {"type": "string", "enum": ["time"]},
                                                      "unit": {"type": "string"}},
                     "required": ["name", "type"]},
                    {"type": "object", "properties": {"name": {"type": "string"},
                                                      "type": {"type": "string", "enum": ["channel"]}},
                     "required": ["name", "type"]},
                    {"type": "object", "properties": {"name": {"type": "string"},
                                                      "type": {"not": {"enum": ["space", "time", "channel"]}}},
                     "required": ["name"]},
                ],
            },
        },
        "coordinateTransformations": {
            "type": "array",
            "minItems": 1,
            "contains": {"type": "object", "properties": {"type": {"type": "string", "enum": ["scale"]}}},
            "maxContains": 1,
            "items": {
                "oneOf": [
                    {"type": "object", "properties": {"type": {"type": "string", "enum": ["scale"]},
                                                      "scale": {"type": "array", "minItems": 2,
                                                                "items": {"type": "number"}}},
                     "required": ["type", "scale"]},
                    {"type": "object", "properties": {"type": {"type": "string", "enum": ["translation"]},
                                                      "translation": {"type": "array", "minItems": 2,
                                                                      "items": {"type": "number"}}},
                     "required": ["type", "translation"]},
                ],
            },
        },
    },
}


def test_ome_05_is_shown_as_ome_04(tree):
    """In-process: the attributes shown validate against the OME-Zarr 0.4 schema."""
    import jsonschema

    mnt = tree
    validator = jsonschema.Draft202012Validator(OME_04_IMAGE_SCHEMA)
    validator.check_schema(OME_04_IMAGE_SCHEMA)
    # The schema does discriminate: the untranslated 0.5 attributes fail it.
    assert not validator.is_valid(OME_05)
    assert not validator.is_valid({"multiscales": OME_05["ome"]["multiscales"]})  # no "version"

    attrs = json.loads((mnt / "img" / ".zattrs").read_text())
    errors = sorted(validator.iter_errors(attrs), key=str)
    assert not errors, "OME-Zarr 0.4 schema: " + "; ".join(e.message for e in errors)
    assert "ome" not in attrs
    ome = OME_05["ome"]
    assert attrs["multiscales"] == [{**m, "version": "0.4"} for m in ome["multiscales"]]
    assert attrs["omero"] == ome["omero"]
    assert attrs["acquired_by"] == "test"
    # The consolidated view carries the same translated attributes.
    cons = json.loads((mnt / ".zmetadata").read_text())["metadata"]
    assert cons["img/.zattrs"] == attrs


def test_zarr2_reads_every_level_of_the_ome_04_image(mnt, src):
    res = zarr2(
        """
        g = zarr.open(path, mode='r')
        ms = g.attrs['multiscales'][0]
        result = {'paths': [d['path'] for d in ms['datasets']], 'version': ms['version']}
        for d in ms['datasets']:
            result[d['path']] = g[d['path']][...]
        """,
        path=str(mnt / "img"),
    )
    assert res["version"] == "0.4" and res["paths"] == ["0", "1"]
    for level in ("0", "1"):
        assert_same_array(res[level], read_native(src / "img" / level), f"zarr 2.18 read of OME level {level}")


def test_no_ome_translation_shows_attributes_unchanged(src):
    """In-process (``tests/inproc.py``): the view of ``--no-ome-translation``."""
    with InProcess(src, ome=False) as fs:
        attrs = json.loads((fs / "img" / ".zattrs").read_text())
        assert attrs == OME_05
        assert "multiscales" not in attrs
        assert json.loads((fs / ".zmetadata").read_text())["metadata"]["img/.zattrs"] == OME_05


# ------------------------------------------------------------------ transcoding


def interior_chunks():
    """Inner chunks wholly inside the array (their file is exactly the array region)."""
    import itertools

    full = [s // c for s, c in zip(TR_SHAPE, TR_CHUNKS)]
    return list(itertools.product(*map(range, full)))


@pytest.mark.parametrize("name", [f"tr/{n}" for n in TRANSCODED], ids=list(TRANSCODED))
def test_transcoded_array_is_served_raw(tree, src, name):
    """In-process: ``.zarray`` and the chunk files of a transcoded array."""
    mnt = tree
    zarray = json.loads((mnt / name / ".zarray").read_text())
    assert zarray["compressor"] is None
    assert zarray["order"] == "C"
    assert zarray["filters"] is None
    assert zarray["dtype"] == "<i2"
    assert zarray["chunks"] == list(TR_CHUNKS) and zarray["shape"] == list(TR_SHAPE)

    native = read_native(src / name)
    sep = zarray["dimension_separator"]
    itemsize = np.dtype(TR_DTYPE).itemsize
    grid = [math.ceil(s / c) for s, c in zip(TR_SHAPE, TR_CHUNKS)]
    seen = 0
    for idx in np.ndindex(*grid):
        f = mnt / name / sep.join(map(str, idx))
        region = tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, TR_CHUNKS))
        if not np.any(native[region]):
            assert not f.exists(), f"{f.name}: fill-only chunk must not exist"
            continue
        assert f.stat().st_size == math.prod(TR_CHUNKS) * itemsize, f.name
        seen += 1
        if idx in interior_chunks():
            expect = np.ascontiguousarray(native[region]).astype("<i2").tobytes(order="C")
            assert f.read_bytes() == expect, f"{f.name}: not the raw little-endian C-order chunk"
    assert seen == math.prod(grid) - 1


@pytest.mark.parametrize("name", [f"tr/{n}" for n in TRANSCODED], ids=list(TRANSCODED))
def test_transcoded_array_reads_with_every_v2_client(mnt, src, name):
    native = read_native(src / name)
    assert_same_array(read_zarr2(mnt / name), native, f"zarr 2.18 read of {name}")
    assert_same_array(read_zarr3_v2(mnt / name), native, f"zarr 3 v2 read of {name}")
    assert_same_array(read_tensorstore(mnt / name), native, f"tensorstore read of {name}")


# ------------------------------------------------------------------ writes (daemonized mount)


class Daemon:
    """``shardfs mount SRC MNT`` (daemonizing) and ``shardfs umount MNT``."""

    def __init__(self, src: Path, base: Path):
        self.src, self.mnt, self.log = src, base / "mnt", base / "daemon.log"
        r = run_shardfs("mount", str(src), str(self.mnt), "--log-file", str(self.log))
        assert r.returncode == 0, f"shardfs mount failed: {r.stderr}"
        assert os.path.ismount(self.mnt)

    def umount(self) -> None:
        r = run_shardfs("umount", str(self.mnt), timeout=120)
        assert r.returncode == 0, f"shardfs umount failed: {r.stderr}\n{self.log_text()[-3000:]}"
        assert not os.path.ismount(self.mnt)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def teardown(self) -> None:
        lazy_unmount(self.mnt)
        deadline = time.monotonic() + 5
        while daemon_pids(self.mnt) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in daemon_pids(self.mnt):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def daemon(tmp_path):
    started = []

    def start(src: Path) -> Daemon:
        d = Daemon(src, tmp_path / f"d{len(started)}")
        started.append(d)
        return d

    yield start
    for d in started:
        d.teardown()
    for d in started:
        assert "Traceback" not in d.log_text(), d.log_text()[-5000:]


def copy_source(src: Path, names, dst: Path) -> Path:
    """A private copy of the root group and ``names`` (tests that write must not share)."""
    import shutil

    dst.mkdir()
    shutil.copy(src / "zarr.json", dst / "zarr.json")
    for n in names:
        parts = Path(n).parts
        for i in range(1, len(parts)):  # the groups above the array
            (dst / Path(*parts[:i])).mkdir(exist_ok=True)
            shutil.copy(src / Path(*parts[:i]) / "zarr.json", dst / Path(*parts[:i]) / "zarr.json")
        shutil.copytree(src / n, dst / n)
    return dst


@pytest.mark.parametrize("name", [f"tr/{n}" for n in TRANSCODED], ids=list(TRANSCODED))
def test_write_through_transcoded_array(daemon, src, tmp_path, name):
    own = copy_source(src, [name], tmp_path / "src")
    before_meta = zjson(own / name)
    expected = read_native(own / name)
    region = (slice(1, 6), slice(2, 9), slice(3, 10))  # partial inner chunks in several shards
    patch = (np.arange(5 * 7 * 7, dtype="int16").reshape(5, 7, 7) * 3 - 200)
    expected[region] = patch

    d = daemon(own)
    zarr2(
        """
        z = zarr.open(path, mode='r+')
        z[1:6, 2:9, 3:10] = np.array(patch, dtype='int16')
        result = z[...]
        """,
        path=str(d.mnt / name), patch=patch.tolist(),
    )
    # Visible through the mount at once, to another client.
    assert_same_array(read_zarr3_v2(d.mnt / name), expected, f"zarr 3 v2 read-back of {name}")
    d.umount()

    assert zjson(own / name) == before_meta, "the v3 metadata must not change"
    assert_same_array(read_native(own / name), expected, f"native read of {name} after umount")
    assert not [p for p in (own / name).rglob("*") if p.is_file() and p.name != "zarr.json"
                and not p.relative_to(own / name).parts[0] == "c"], "stray files in the array"


@pytest.mark.parametrize("name", [f"tr/{n}" for n in TRANSCODED], ids=list(TRANSCODED))
def test_a_transcoded_chunk_file_rewritten_is_encoded_with_the_arrays_codecs_in_process(src, tmp_path, name):
    """The daemon's part of ``write_through_transcoded_array``, in-process (``tests/inproc.py``):
    a raw chunk file of a transcoded array written with another chunk's bytes is encoded with
    the array's own codecs, its v3 metadata unchanged and nothing stray left in the array (the
    mounted test writes with zarr 2.18)."""
    own = copy_source(src, [name], tmp_path / "src")
    before_meta = zjson(own / name)
    expected = read_native(own / name)
    with InProcess(own, read_only=False) as fs:
        copy_chunk_file(fs / name, expected)
    assert zjson(own / name) == before_meta, "the v3 metadata must not change"
    assert_same_array(read_native(own / name), expected, f"native read of {name} after the write")
    assert not [p for p in (own / name).rglob("*") if p.is_file() and p.name != "zarr.json"
                and not p.relative_to(own / name).parts[0] == "c"], "stray files in the array"


def test_zattrs_write_updates_v3_attributes_and_zarray_dtype_change_is_refused(src, tmp_path):
    """In-process (``tests/inproc.py``): the metadata files written as zarr 2.18 writes them (a
    temporary renamed over the file) and in place."""
    own = copy_source(src, ["temp"], tmp_path / "src")
    before = zjson(own / "temp")
    native = read_native(own / "temp")

    with InProcess(own, read_only=False) as fs:
        arr = fs / "temp"
        attrs = json.loads((arr / ".zattrs").read_text())
        tmp = arr / ".zattrs.1a2b.partial"
        tmp.write_text(json.dumps({**attrs, "k": "v"}))
        tmp.replace(arr / ".zattrs")
        zarray = json.loads((arr / ".zarray").read_text())
        tmp = arr / ".zarray.3c4d.partial"
        tmp.write_text(json.dumps(dict(zarray, dtype="<i4")))
        with pytest.raises(OSError) as e:
            tmp.replace(arr / ".zarray")
        assert e.value.errno == errno.EPERM, f"dtype change through the mount: {e.value}, want EPERM"
        tmp.unlink()
        assert json.loads((arr / ".zarray").read_text())["shape"] == [20, 30]
        shown = json.loads((arr / ".zattrs").read_text())
        assert shown == {"long_name": "temp", "k": "v", "_ARRAY_DIMENSIONS": ["y", "x"]}
        # .zarray rewritten with other chunks directly: EPERM as well.
        with pytest.raises(OSError) as e:
            (arr / ".zarray").write_text(json.dumps({**zarray, "chunks": [3, 3]}))
        assert e.value.errno == errno.EPERM
        assert json.loads((arr / ".zarray").read_text()) == zarray, "refused write changed .zarray"

    after = zjson(own / "temp")
    assert after["attributes"] == {"long_name": "temp", "k": "v"}
    assert after["dimension_names"] == ["y", "x"]
    assert {k: v for k, v in after.items() if k != "attributes"} == \
        {k: v for k, v in before.items() if k != "attributes"}
    assert_same_array(read_native(own / "temp"), native, "data after the metadata writes")
