"""A pytest plugin for zarr-python 2.18's own test suite (run by ``.venv-zarr2``'s pytest,
``-p zarr2_stores``, from tests/test_zarr2_suite.py): the store directories its tests make with
``tempfile.mkdtemp()`` are made in ``$SHARDFS_ZARR2_STORES`` (a mount, or the plain directory of
the control run) instead of the system's temporary directory; nothing else of pytest's moves."""

import os
import tempfile

STORES = os.environ["SHARDFS_ZARR2_STORES"]
_mkdtemp = tempfile.mkdtemp


def mkdtemp(suffix=None, prefix=None, dir=None):
    return _mkdtemp(suffix, prefix, STORES if dir is None else dir)


tempfile.mkdtemp = mkdtemp  # zarr/tests/test_hierarchy.py calls tempfile.mkdtemp()


def pytest_collection_finish(session):
    import zarr.tests.test_core as core  # type: ignore[import-not-found]  # zarr 2.18 ships it; .venv-zarr2 runs this

    core.mkdtemp = mkdtemp  # test_core.py imported it by name
