"""The shards the N workers of a read-only mount of a remote source keep where each finds them
(``shardfs.storage.sharedshards``), in process: two views of one memfd stand for two workers (a
view maps the table and locks it through an open file of its own, as each worker does)."""

from __future__ import annotations

import os

import pytest

from shardfs.storage import Version
from shardfs.storage import sharedshards as ss

RING = 1 << 20
QUARTER = RING // 4


@pytest.fixture
def table():
    """The memfd of a table, as the supervisor keeps it."""
    fd = ss.memory(RING)
    yield fd
    os.close(fd)


@pytest.fixture
def shards(table):
    views = [ss.SharedShards(table), ss.SharedShards(table)]
    yield views
    for v in views:
        v.close()


def test_a_shard_one_worker_put_the_other_reads_and_no_other_version(shards):
    a, b = shards
    data = bytes(range(256)) * 4
    v = Version('"9b2cf535f27731c974343645a3985328"', len(data), 1_700_000_000_000_000_123)
    assert a.put("s3://bucket/arr/c/0/0", v, memoryview(data))
    assert b.holds("s3://bucket/arr/c/0/0", v)
    assert b.get("s3://bucket/arr/c/0/0", v, 100, 164) == data[100:164]
    assert b.get("s3://bucket/arr/c/0/0", v, 1000, 2000) == data[1000:]  # (the object ends there)
    assert b.whole("s3://bucket/arr/c/0/0", lambda found, view: (found, bytes(view))) == (v, data)
    for other in (v._replace(tag='"9b2cf535f27731c974343645a3985329"'), v._replace(mtime_ns=v.mtime_ns + 1),
                  v._replace(size=v.size + 1)):
        assert not b.holds("s3://bucket/arr/c/0/0", other)
        assert b.get("s3://bucket/arr/c/0/0", other, 0, 10) is None
    assert not b.holds("s3://bucket/arr/c/0/1", v) and b.get("s3://bucket/arr/c/0/1", v, 0, 10) is None
    assert b.whole("s3://bucket/arr/c/0/1", lambda found, view: found) is None


def test_a_new_version_replaces_the_old_one(shards):
    a, b = shards
    old, new = Version('"a"', 4, 1), Version('"b"', 4, 2)
    a.put("k", old, b"old!")
    b.put("k", new, b"new!")
    assert not a.holds("k", old) and a.get("k", new, 0, 4) == b"new!"


def test_the_ring_keeps_the_latest_shards_first_in_first_out(table, shards):
    a, b = shards
    size = os.fstat(table).st_size
    v = Version('"z"', QUARTER - 1000, 0)
    for i in range(4):  # (the fifth crosses the ring's end: written at its start, over the first)
        assert a.put(f"k{i}", v, bytes([i]) * v.size)
    assert all(b.holds(f"k{i}", v) for i in range(4))
    assert a.put("k4", v, b"\x04" * v.size)
    assert not b.holds("k0", v) and b.get("k0", v, 0, 1) is None
    assert [b.holds(f"k{i}", v) for i in range(1, 5)] == [True] * 4
    assert b.get("k4", v, 0, v.size) == b"\x04" * v.size  # (never split across the ring's end)
    assert b.get("k1", v, v.size - 3, v.size) == b"\x01" * 3
    assert os.fstat(table).st_size == size  # (nothing written past the ring's end)


def test_a_shard_read_in_the_oldest_quarter_is_renewed(shards):
    a, b = shards
    v = Version('"z"', QUARTER - 1000, 0)
    for i in range(4):
        a.put(f"k{i}", v, bytes([i]) * v.size)
    assert b.get("k0", v, 5, 8) == b"\x00" * 3  # (k0 alone is in the oldest quarter: moved to the head)
    a.put("k4", v, b"\x04" * v.size)  # (over k1, the oldest now)
    assert [b.holds(f"k{i}", v) for i in range(5)] == [True, False, True, True, True]
    assert [b.get(f"k{i}", v, 0, v.size) for i in (0, 2, 4)] == [bytes([i]) * v.size for i in (0, 2, 4)]


def test_what_is_not_held(shards):
    a, b = shards
    too_big = Version('"big"', QUARTER + 1, 0)
    assert not a.put("big", too_big, bytes(too_big.size)) and not b.holds("big", too_big)
    for v in (Version("", 4, 0), Version(1234, 4, 0), Version('"' + "e" * 60 + '"', 4, 0)):
        assert not a.put("k", v, b"abcd") and not b.holds("k", v)
    assert not a.put("short", Version('"s"', 5, 0), b"abcd")  # (not all of the version)


def test_the_ring_holds_cache_size_but_a_thirty_second_for_the_workers_own_range_caches():
    mib = 1 << 20
    assert ss.split(96 * mib) == (93 * mib, 3 * mib)
    assert sum(ss.split(1000)) == 1000


def _during_the_copy(view, act):
    """``view`` (a reader) runs ``act`` (another worker's writes) after it found an entry and
    before it copies its bytes, once: the moment a reader takes no lock through."""
    find, acts = view._find, [act]

    def found_then_act(where, version):
        found = find(where, version)
        while acts:
            acts.pop()()
        return found

    view._find = found_then_act


def test_a_copy_torn_by_a_writer_meanwhile_is_a_miss_never_other_bytes(shards):
    a, b = shards
    v = Version('"z"', QUARTER - 1000, 0)
    a.put("k0", v, b"\x00" * v.size)
    _during_the_copy(b, lambda: [a.put(f"k{i}", v, bytes([i]) * v.size) for i in range(1, 5)])  # (over k0)
    assert b.get("k0", v, 0, v.size) is None
    a.put("k5", v, b"\x05" * v.size)
    new = Version('"y"', 4, 0)
    _during_the_copy(b, lambda: a.put("k5", new, b"new!"))  # (its entry rewritten: another version)
    assert b.get("k5", v, 0, 4) is None
    assert b.get("k5", new, 0, 4) == b"new!"


def test_an_entry_being_written_is_not_read_and_the_next_write_mends_it(table, shards):
    a, b = shards
    v = Version('"z"', 4, 0)
    a.put("k", v, b"abcd")
    off = ss.HEADER + (ss.key_hash("k") & (ss.CAPACITY - 1)) * ss.ENTRY
    seq = ss._SEQ.unpack_from(b._map, off)[0]
    assert seq % 2 == 0
    ss._SEQ.pack_into(a._map, off, seq + 1)  # (a writer killed while it wrote the entry)
    assert not b.holds("k", v) and b.get("k", v, 0, 4) is None
    a.put("k", v, b"abcd")
    assert b.get("k", v, 0, 4) == b"abcd" and ss._SEQ.unpack_from(b._map, off)[0] % 2 == 0


def _sharing_one_entry(n: int) -> list[str]:
    """``n`` locations whose hashes name the same entry of their own."""
    by_entry: dict[int, list[str]] = {}
    for i in range(1 << 20):
        where = f"s3://bucket/arr/c/{i}"
        found = by_entry.setdefault(ss.key_hash(where) & (ss.CAPACITY - 1), [])
        found.append(where)
        if len(found) == n:
            return found
    raise AssertionError(f"no {n} locations share an entry")


def test_two_shards_of_one_entry_are_both_held_a_third_evicts_the_one_put_first(shards):
    """Each location has two entries (its own and the other of its pair): two shards whose hashes
    name the same entry are both held; a third takes the entry of the one put first."""
    a, b = shards
    first, second, third = _sharing_one_entry(3)
    v = Version('"z"', 4, 0)
    a.put(first, v, b"one!")
    a.put(second, v, b"two!")
    assert b.get(first, v, 0, 4) == b"one!" and b.get(second, v, 0, 4) == b"two!"
    assert b.whole(second, lambda found, view: bytes(view)) == b"two!"
    a.put(third, v, b"3rd!")
    assert not b.holds(first, v) and b.get(first, v, 0, 4) is None
    assert b.get(second, v, 0, 4) == b"two!" and b.get(third, v, 0, 4) == b"3rd!"
    a.put(first, v, b"one!")  # (over the second, now the one put first)
    assert [b.holds(where, v) for where in (first, second, third)] == [True, False, True]
