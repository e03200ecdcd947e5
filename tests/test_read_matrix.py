"""Every v2 client reads through the mount exactly what zarr 3 reads natively.

One mount of the whole matrix (see sources.py) per source kind (tests/source_kinds.py: the
directory itself, and a copy in an s3:// bucket); zarr 2.18 reads every array in one subprocess.
The oracle reads the local directory (the bucket holds the same bytes).
"""

from __future__ import annotations

import pytest

from conftest import (
    case_params,
    assert_same_array,
    read_native,
    read_tensorstore,
    read_zarr2_many,
    read_zarr3_v2,
    zarr2,
)
from source_kinds import SOURCE_KINDS, make_source
from sources import CASES, GROUP_ATTRS, ROOT_ATTRS


@pytest.fixture(scope="module", params=SOURCE_KINDS)
def view(request, matrix, module_mount):
    return make_source(request.param, request)(matrix.root).mount(module_mount)


@pytest.fixture(scope="module")
def native(matrix):
    return {c.id: read_native(matrix.root / c.relpath) for c in CASES}


@pytest.fixture(scope="module")
def zarr2_results(view):
    return read_zarr2_many([view / c.relpath for c in CASES])


@pytest.mark.parametrize("case", case_params(CASES))
def test_oracle_reads_what_was_written(case, matrix, native):
    # Sanity of the builders: the native oracle returns the data we wrote.
    assert_same_array(native[case.id], matrix.data[case.id], case.id)


@pytest.mark.parametrize("case", case_params(CASES))
def test_zarr2_reads_native_data(case, view, native, zarr2_results):
    got = zarr2_results[str(view / case.relpath)]
    assert not isinstance(got, str), got
    assert_same_array(got, native[case.id], f"zarr 2.18 {case.id}")


@pytest.mark.parametrize("case", case_params(CASES))
def test_zarr3_v2_reads_native_data(case, view, native):
    assert_same_array(read_zarr3_v2(view / case.relpath), native[case.id], f"zarr 3 (v2) {case.id}")


@pytest.mark.parametrize("case", case_params(CASES))
def test_tensorstore_reads_native_data(case, view, native):
    assert_same_array(read_tensorstore(view / case.relpath), native[case.id], f"tensorstore zarr {case.id}")


def _expected_members():
    root_arrays = sorted(c.relpath for c in CASES if "/" not in c.relpath)
    return root_arrays, ["grp"], ["empty", "sub"], ["deep"]


def _assert_arrays(got, expected):
    # Transcoded arrays have their own read tests above; here only the hierarchy.
    optional = {c.relpath for c in CASES if not c.passthrough}
    assert set(got) <= set(expected)
    assert set(expected) - optional <= set(got)


def test_hierarchy_zarr2(view):
    got = zarr2(
        """
        g = zarr.open_group(root, mode='r')
        result = {
            'root_attrs': dict(g.attrs),
            'root_arrays': sorted(g.array_keys()),
            'root_groups': sorted(g.group_keys()),
            'grp_groups': sorted(g['grp'].group_keys()),
            'grp_attrs': dict(g['grp'].attrs),
            'sub_attrs': dict(g['grp/sub'].attrs),
            'sub_arrays': sorted(g['grp/sub'].array_keys()),
            'deep_attrs': dict(g['grp/sub/deep'].attrs),
        }
        """,
        root=str(view),
    )
    arrays, groups, grp_groups, sub_arrays = _expected_members()
    assert got["root_attrs"] == ROOT_ATTRS
    _assert_arrays(got["root_arrays"], arrays)
    assert got["root_groups"] == groups
    assert got["grp_groups"] == grp_groups
    assert got["grp_attrs"] == GROUP_ATTRS["grp"]
    assert got["sub_attrs"] == GROUP_ATTRS["grp/sub"]
    assert got["sub_arrays"] == sub_arrays
    assert got["deep_attrs"] == {"units": "m"}


def test_hierarchy_zarr3_v2(view):
    import zarr

    g = zarr.open_group(str(view), mode="r", zarr_format=2)
    arrays, groups, grp_groups, sub_arrays = _expected_members()
    assert dict(g.attrs) == ROOT_ATTRS
    _assert_arrays(sorted(g.array_keys()), arrays)
    assert sorted(g.group_keys()) == groups
    assert sorted(g["grp"].group_keys()) == grp_groups
    assert dict(g["grp/sub"].attrs) == GROUP_ATTRS["grp/sub"]
    assert sorted(g["grp/sub"].array_keys()) == sub_arrays
    assert dict(g["raw"].attrs) == {"description": "raw", "scale": [1.0, 0.5, 0.25]}
