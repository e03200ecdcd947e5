"""Two hosts folding into one shard of an ``s3://`` source at once: a fold that leaves the shard
empty loses nothing the other host folded into it meanwhile.

The soak's S3 failure on main 1e60a8f (CI, seed 1: forbidden 131): readers of mount B read the
fill for a chunk B had written and folded, 15-20 s before, while mount A's delayed folds ran
after a fault. A's fold of that shard removed A's own chunks, the last ones it had read in
it, and deleted the shard after a HEAD check (S3 has no conditional DELETE): B's fold had
replaced the shard between A's read and A's DELETE, and A deleted B's chunk with it.

Here A (mounted through a recording proxy: its own endpoint, so its own state directory and
journal, another host) removes the only chunk of a shard; the proxy holds A's write of the
shard (``DelayProxy.hold``) while B (mounted directly) writes another chunk of it and folds.
Then A's write goes on. A fold that empties a shard on an object store replaces it with an
empty shard, If-Match the version it read: that PUT is refused (412), A reads B's shard again
and removes its chunk from it, and B's chunk stays, for B's readers and natively.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import zarr

from conftest import wait_for
from shardfs.app import state
from shardfs.writes.journal import segments_under
from sources import Spec, build
from testkit.delayproxy import DelayProxy, Request
from writers import umount

H = Spec("h", (8, 10), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False, index_location="end",
         index_crc=True, initial=((slice(0, 4), slice(0, 5)),), write=(slice(0, 8), slice(0, 10)))
# one shard of 2 x 2 chunks, only chunk (0, 0) stored
TTL = 1.0  # -o attr_timeout of mount B: how long it uses a version of the shard it saw


def deletes(r: Request) -> bool:
    """A DELETE, or a DeleteObjects (``POST /BUCKET?delete``: how obstore deletes a key)."""
    return r.method == "DELETE" or (r.method == "POST" and "delete" in [p.split("=")[0] for p in r.query.split("&")])


def journal(url: str, endpoint: str) -> Path:
    return Path(state.journal_dir(url, endpoint=endpoint))


def test_a_fold_emptying_a_shard_keeps_another_hosts_chunk_folded_meanwhile(tmp_path, s3, s3_upload, mount):
    exp = build(tmp_path / "src", [H])["h"]
    up = s3_upload(tmp_path / "src")
    shard = f"/{s3.bucket}/{up.prefix}/{H.shard_key((0, 0))}"
    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0, record=True) as proxy:
        via_proxy = f"http://127.0.0.1:{proxy.port}"
        mnt_a = mount(up.url, "-o", f"endpoint={via_proxy}", env=up.env)
        mnt_b = mount(up.url, "-o", f"attr_timeout={TTL:g},entry_timeout={TTL:g}", env=up.env)
        journal_a, journal_b = journal(up.url, via_proxy), journal(up.url, s3.endpoint)
        assert journal_a != journal_b
        proxy.hold(lambda r: r.method == "PUT" and r.path == shard or deletes(r))
        os.unlink(mnt_a / "h" / H.chunk_name((0, 0)))  # A: the shard's only chunk removed
        exp[H.chunk_region((0, 0))] = 0
        wait_for(lambda: proxy.held, 60, "mount A's fold to send its write of the shard")
        ours = H.values(H.chunk, 7)
        (mnt_b / "h" / H.chunk_name((1, 1))).write_bytes(H.encode(ours))  # B: another chunk of it
        exp[H.chunk_region((1, 1))] = ours
        wait_for(lambda: segments_under(str(journal_b)) == [], 60, "mount B's fold of chunk (1, 1)")
        assert journal_a.exists() and segments_under(str(journal_a)) != [], "A's fold went past the proxy"
        proxy.release()
        wait_for(lambda: segments_under(str(journal_a)) == [], 60, "mount A's fold after its write was let go")
        time.sleep(TTL + 0.5)  # B asks the shard's version again
        assert H.decode((mnt_b / "h" / H.chunk_name((1, 1))).read_bytes()).tolist() == ours.tolist()
        assert not (mnt_b / "h" / H.chunk_name((0, 0))).exists()
        umount(mount, mnt_a)
        umount(mount, mnt_b)
        assert [r for r in proxy.log if deletes(r)] == []  # (an empty shard is never deleted: see above)
    np.testing.assert_array_equal(np.asarray(zarr.open_array(up.zarr_store(), path="h", mode="r")[...]), exp)
