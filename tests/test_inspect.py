"""`shardfs inspect` on shards, shard directories in a mount, and arrays."""

from __future__ import annotations

import json
import os

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

from conftest import run_shardfs


def _make(src):
    arr = zarr.create_array(str(src / "raw"), shape=(40, 50), chunks=(10, 10), shards=(20, 20),
                            dtype="int32", compressors=[ZstdCodec(level=1)], fill_value=0)
    data = np.zeros((40, 50), dtype="int32")
    data[0:10, 0:10] = 1  # one inner chunk of shard (0, 0)
    data[20:40, 40:50] = 2  # edge shard (1, 2): two inner chunks, two past the edge
    arr[:] = data
    zarr.open_group(str(src), mode="a")
    return arr


def test_inspect_shard_dir_in_mount_matches_listing(tmp_path, mount):
    src = tmp_path / "src"
    _make(src)
    mnt = mount(src)
    out = run_shardfs("inspect", "--json", str(mnt / "raw" / "c" / "1" / "2"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    shard = report["shard"]
    assert shard["key"] == "c/1/2"
    assert shard["index_status"].startswith("ok")
    stored = {row["chunk"] for row in shard["index"] if not row["empty"]}
    assert stored == set(os.listdir(mnt / "raw" / "c" / "1" / "2")) == {"2.4", "3.4"}
    past_edge = [row for row in shard["index"] if row["chunk"] is None]
    assert len(past_edge) == 2 and all(row["empty"] for row in past_edge)
    sizes = {row["chunk"]: row["nbytes"] for row in shard["index"] if not row["empty"]}
    assert sizes["2.4"] == os.stat(mnt / "raw" / "2.4").st_size
    assert shard["unused_bytes"] == 0
    assert report["v2_compressor"] == {"id": "zstd", "level": 1}


def test_inspect_text_and_corrupt_shard(tmp_path):
    src = tmp_path / "src"
    _make(src)
    shard_file = src / "raw" / "c" / "0" / "0"
    text = run_shardfs("inspect", str(shard_file))
    assert text.returncode == 0 and "checksum verified" in text.stdout and "0.0" in text.stdout
    raw = bytearray(shard_file.read_bytes())
    raw[-1] ^= 0xFF
    shard_file.write_bytes(bytes(raw))
    report = json.loads(run_shardfs("inspect", "--json", str(shard_file)).stdout)
    assert report["shard"]["index_status"].startswith("corrupt: index checksum mismatch")


def test_inspect_unpresentable_array_and_bad_path(tmp_path):
    src = tmp_path / "src"
    _make(src)
    meta = json.loads((src / "raw" / "zarr.json").read_text())
    meta["codecs"][0]["configuration"]["chunk_shape"] = [3, 10]  # does not divide the shard
    (src / "raw" / "zarr.json").write_text(json.dumps(meta))
    report = json.loads(run_shardfs("inspect", "--json", str(src / "raw")).stdout)
    assert report["presentable"] is False and report["reason"]
    bad = run_shardfs("inspect", str(tmp_path))
    assert bad.returncode == 1 and "not inside a Zarr v3 array" in bad.stderr


# ------------------------------------------------------------------ which chunks exist (issue 26)


def _expected(src, name: str = "raw") -> dict:
    """What ``inspect`` must count, from zarr-python 3 reading the source: an inner chunk is
    stored iff it holds a value other than the fill (zarr writes no empty inner chunk)."""
    import zarr

    arr = zarr.open_array(str(src / name), mode="r")
    data = np.asarray(arr[...])
    chunks, shards = arr.chunks, arr.shards
    assert shards is not None
    per = [s // c for s, c in zip(shards, chunks)]
    counts: dict[tuple, int] = {}
    for idx in np.ndindex(*(-(-n // c) for n, c in zip(arr.shape, chunks))):
        region = tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunks))
        if np.any(data[region] != arr.fill_value):
            shard = tuple(i // p for i, p in zip(idx, per))
            counts[shard] = counts.get(shard, 0) + 1
    files = [p for p in (src / name / "c").rglob("*") if p.is_file()]
    return {"shards_stored": len(counts), "shards_total": arr._nshards, "chunks_stored": sum(counts.values()),
            "chunks_total": arr.nchunks, "bytes_stored": sum(p.stat().st_size for p in files),
            "corrupt_shards": 0, "per_shard": counts, "nshards_initialized": arr._nshards_initialized}


def _stored(report: dict) -> dict:
    st = report["stored"]
    out = {k: st[k] for k in ("shards_stored", "shards_total", "chunks_stored", "chunks_total", "bytes_stored",
                              "corrupt_shards")}
    out["per_shard"] = {tuple(r["coords"]): r["chunks"] for r in st["shards"]}
    return out


def _make_sparse(src):
    arr = _make(src)  # shards (0, 0): 1 chunk; (1, 2): 2 chunks (an edge shard)
    arr[20:40, 0:20] = 7  # shard (1, 0): all 4 chunks
    arr[0:10, 20:30] = 3  # shard (0, 1): 1 chunk
    return arr


def test_inspect_array_counts_what_zarr_reads(tmp_path, source, mount):
    local = tmp_path / "src"
    _make_sparse(local)
    expected = _expected(local)
    assert expected["shards_stored"] == expected["nshards_initialized"] == 4
    del expected["nshards_initialized"]
    src = source(local)
    mnt = src.mount(mount)
    env = {**os.environ, **(src.env or {})}
    targets = [str(mnt / "raw")] + ([str(local / "raw")] if src.kind == "local" else
                                     [f"{src.url}/raw", "-o", f"endpoint={src.endpoint}"])
    for target in (targets[:1], targets[1:]):
        r = run_shardfs("inspect", "--json", *target, env=env)
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert _stored(report) == expected, target
        assert report["stored"]["compression_ratio"] > 0 and report["stored"]["corrupt"] == []
    # a shard directory and a chunk file in the mount: the shard's report, as of the local file
    local_shard = json.loads(run_shardfs("inspect", "--json", str(local / "raw" / "c" / "1" / "2")).stdout)
    for path in (mnt / "raw" / "c" / "1" / "2", mnt / "raw" / "c" / "1" / "2" / "2.4"):
        r = run_shardfs("inspect", "--json", str(path), env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["shard"] == local_shard["shard"], path
    text = run_shardfs("inspect", *targets[1:], env=env)
    assert text.returncode == 0, text.stderr
    assert "stored     4 of 6 shards, 8 of 20 inner chunks (40.0%), " in text.stdout
    # the map: shard rows 0 and 1 (array rows 0 and 20), columns: 1/4, 1/4, none / all, none, 2 of 2
    assert text.stdout.splitlines()[-2:] == ["         0 ░░·", "        20 █·█"], text.stdout


def test_inspect_map_png(tmp_path):
    from PIL import Image

    src = tmp_path / "src"
    _make_sparse(src)
    png = tmp_path / "map.png"
    r = run_shardfs("inspect", str(src / "raw"), "--map", str(png))
    assert r.returncode == 0, r.stderr
    with Image.open(png) as im:
        assert im.size == (800, 600)
        colours = im.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is not None and len(colours) > 20  # axes, labels, the shards in several shades, the bar
    assert sorted(colours)[-1][0] < 800 * 600 * 0.8  # not one colour (blank)


def _pixel_of_shard(report: dict, row: int, col: int) -> tuple[float, float]:
    """The PNG pixel (x, y from the top) at the middle of the part of shard (row, col) inside the
    array, for the default slice of a 2-D array (``gridmap.AXES`` places the plot)."""
    from shardfs.format.gridmap import AXES, SIZE

    (rows, cols), (sr, sc) = report["shape"], report["shard_shape"]
    x = (col * sc + min((col + 1) * sc, cols)) / 2 / cols
    y = (row * sr + min((row + 1) * sr, rows)) / 2 / rows
    left, bottom, width, height = AXES
    return SIZE[0] * (left + x * width), SIZE[1] * (1 - bottom - height + y * height)


def test_inspect_names_what_a_path_is_and_maps_a_shards_array_as_the_text_does(tmp_path, mount):
    """A missing path is "no such file or directory"; a group names its arrays; ``--map`` of a
    shard file (or of a chunk file in a mount) draws its array and says what it wrote; the PNG
    colours each shard as the text map shades it (an edge shard whose in-bounds chunks are all
    stored is "all stored" in both)."""
    import matplotlib
    from PIL import Image

    src = tmp_path / "src"
    _make_sparse(src)
    zarr.open_group(str(src), mode="a").create_group("labels").create_array("seg", shape=(4,), chunks=(2,),
                                                                            dtype="int8")
    r = run_shardfs("inspect", str(src / "missing"))
    assert (r.returncode, r.stderr) == (1, f"shardfs: error: {src / 'missing'}: no such file or directory\n")
    r = run_shardfs("inspect", str(src))
    assert (r.returncode, r.stderr) == (1, f"shardfs: error: {src}: a Zarr v3 group, not an array: it holds "
                                           "labels/seg, raw (inspect one of them)\n")
    png = tmp_path / "map.png"
    r = run_shardfs("inspect", str(src / "raw" / "c" / "1" / "2"), "--map", str(png), "--json")
    assert r.returncode == 0 and r.stderr == f"shardfs: wrote {png}, 800x600\n", r
    report = json.loads(r.stdout)
    assert report["shard"]["key"] == "c/1/2"
    text = run_shardfs("inspect", str(src / "raw")).stdout.splitlines()[-2:]
    assert text == ["         0 ░░·", "        20 █·█"]  # (1, 2) is an edge shard: 2 of 2 in-bounds chunks
    viridis = matplotlib.colormaps["viridis"]
    want = {"░": viridis(0.25), "█": viridis(1.0), "·": viridis(0.0)}
    with Image.open(png) as im:
        assert im.size == (800, 600)
        rgb = im.convert("RGB")
        for row, line in enumerate(text):
            for col, char in enumerate(line.split()[1]):
                got = rgb.getpixel(tuple(round(v) for v in _pixel_of_shard(report, row, col)))
                assert all(abs(g - 255 * w) <= 2 for g, w in zip(got, want[char])), (row, col, char, got)

    mnt = mount(src)
    png.unlink()
    r = run_shardfs("inspect", str(mnt / "raw" / "2.4"), "--map", str(png))
    assert r.returncode == 0 and r.stderr == f"shardfs: wrote {png}, 800x600\n", r
    assert "\n".join(text) + "\n" in r.stdout and png.stat().st_size > 0  # the array's map, then the shard


def test_inspect_counts_corrupt_shards_and_slices(tmp_path):
    src = tmp_path / "src"
    _make_sparse(src)
    shard_file = src / "raw" / "c" / "1" / "0"
    raw = bytearray(shard_file.read_bytes())
    raw[-1] ^= 0xFF
    shard_file.write_bytes(bytes(raw))
    report = json.loads(run_shardfs("inspect", "--json", str(src / "raw")).stdout)["stored"]
    assert (report["shards_stored"], report["chunks_stored"], report["corrupt_shards"]) == (3, 4, 1)
    (corrupt,) = report["corrupt"]
    assert corrupt["coords"] == [1, 0] and corrupt["reason"].startswith("corrupt: index checksum mismatch")
    text = run_shardfs("inspect", str(src / "raw"), "--slice", "25,:").stdout
    assert text.splitlines()[-1] == "         0 X·█"  # one row: the shards holding array row 25
    assert "corrupt    1 shards" in text
    bad = run_shardfs("inspect", str(src / "raw"), "--slice", "99,:")
    assert bad.returncode == 1 and "--slice 99,:: index 99 is outside dimension 0 (size 40)" in bad.stderr


def test_inspect_on_object_storage_says_what_it_says_locally(tmp_path, s3, request):
    from source_kinds import BucketSource, unique_prefix

    local = tmp_path / "src"
    _make(local)
    (local / "bad").mkdir()
    meta = json.loads((local / "raw" / "zarr.json").read_text())
    meta["codecs"][0]["configuration"]["chunk_shape"] = [3, 10]  # does not divide the shard
    (local / "bad" / "zarr.json").write_text(json.dumps(meta))
    src = BucketSource(local, s3, unique_prefix(request))
    env = {**os.environ, **src.env, "AWS_ENDPOINT_URL": src.endpoint}
    for rel in ("raw/c/1/2", "bad"):
        here = json.loads(run_shardfs("inspect", "--json", str(local / rel)).stdout)
        r = run_shardfs("inspect", "--json", f"{src.url}/{rel}", env=env)
        assert r.returncode == 0, r.stderr
        there = json.loads(r.stdout)
        assert there["array"] == f"{src.url}/{rel.split('/')[0]}"
        here.pop("array"), there.pop("array")
        assert there == here, rel
    assert "v2 view    not shown: " in run_shardfs("inspect", f"{src.url}/bad", env=env).stdout
    r = run_shardfs("inspect", f"{src.url}/nothing", env=env)
    assert r.returncode == 1 and r.stderr == f"shardfs: error: {src.url}/nothing: no such file or directory\n", r


def test_inspect_of_many_shards_shows_progress_on_a_terminal(tmp_path):
    import pty
    import subprocess

    import zarr

    from conftest import SHARDFS

    arr = zarr.create_array(str(tmp_path / "many"), shape=(12, 20), chunks=(1, 1), shards=(1, 2), dtype="uint8",
                            fill_value=0)
    arr[:] = 1  # 120 shards
    master, slave = pty.openpty()
    import fcntl
    import struct
    import termios

    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal's size
    proc = subprocess.Popen([SHARDFS, "inspect", str(tmp_path / "many")], stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL, text=True)
    os.close(slave)
    out = proc.communicate(timeout=60)[0]
    seen = b""
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        seen += data
    os.close(master)
    assert proc.returncode == 0
    assert b"reading shard indexes" in seen and b"/120" in seen, seen
    assert "stored     120 of 120 shards, 240 of 240 inner chunks" in out
    quiet = run_shardfs("inspect", str(tmp_path / "many"))  # stderr not a terminal: no progress
    assert quiet.returncode == 0 and quiet.stderr == ""
