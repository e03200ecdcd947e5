"""The real v2 writers the write tests drive (zarr-python 2.18, zarr-python 3 in v2 mode,
tensorstore's ``zarr`` driver), ``shardfs umount`` with its checks, and the daemon's
chunk-cache log lines."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from conftest import is_mounted, run_shardfs, zarr2


def umount(mount, mnt: Path) -> None:
    """``shardfs umount``: must fold everything, end the daemon with status 0 and unmount."""
    m = mount.info(mnt)
    r = run_shardfs("umount", str(mnt), timeout=120)
    assert r.returncode == 0, f"shardfs umount failed ({r.returncode}): {r.stderr}\n{m.output()[-3000:]}"
    rc = m.proc.wait(timeout=30)
    assert rc == 0, f"daemon exited with {rc}:\n{m.output()[-3000:]}"
    assert not is_mounted(mnt), f"{mnt} still mounted after shardfs umount"


def region_json(region) -> list[list[int]]:
    return [[r.start, r.stop] for r in region]


def write_zarr2(path: Path, region, values: np.ndarray, tmp: Path) -> None:
    np.save(tmp / "values.npy", values)
    zarr2("""
        z = zarr.open(path, mode='r+')
        z[tuple(slice(a, b) for a, b in region)] = np.load(vpath)
        result = np.zeros(0)
        """, path=str(path), region=region_json(region), vpath=str(tmp / "values.npy"))


def write_zarr3(path: Path, region, values: np.ndarray, tmp: Path) -> None:
    import zarr

    zarr.open_array(str(path), mode="r+", zarr_format=2)[region] = values


def write_tensorstore(path: Path, region, values: np.ndarray, tmp: Path) -> None:
    import tensorstore as ts

    t = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)}},
                open=True, context=ts.Context()).result()
    t[region].write(values).result()


WRITERS = {"zarr2": write_zarr2, "zarr3": write_zarr3, "tensorstore": write_tensorstore}


def cache_stats(mount, mnt: Path) -> dict:
    """Decodes and cache hits so far, counted from the daemon's debug log."""
    text = mount.info(mnt).log_text()
    return {"decodes": text.count(" decoded (chunk cache: "), "hits": text.count(" served from the chunk cache")}
