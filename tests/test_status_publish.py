"""A worker of N writes its status document for the others (``Status._publish``) until the
supervisor's list of the workers is there: written before it, the document has no entry of its
own, so no ``parked``, and a parked worker gets no request that would have it written again
(``shardfs status`` then never showed the worker parked: a CI run of test_elastic). In process,
on trio's mock clock."""

from __future__ import annotations

import json
import os

import trio
import trio.testing

from shardfs.app import peers
from shardfs.app.status import Status

from test_idle import counters


def test_a_parked_workers_document_is_written_again_once_the_workers_are_listed(tmp_path):
    listed = str(tmp_path / "workers.json")
    c = counters()
    c.parked = lambda: True
    status = Status(c, "/mnt", "/src", None, True, {}, None)
    status.supervised(None, {"supervisor_pid": 1, "worker_pid": os.getpid(), "worker_started": 0.0,
                             "restarts": 0, "takeovers": 0, "last_reason": None, "workers_file": listed,
                             "worker_slot": 1, "worker_count": 2})
    published = peers.slot_file(listed, 1)

    def mine() -> list[dict]:
        with open(published) as f:
            return [w for w in json.load(f).get("workers", []) if w["this"]]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(status._publish)
            await trio.sleep(2.5)
            assert mine() == []  # written, with no list of the workers yet
            peers.write_json(listed, [{"index": 0, "pid": 1, "started": 0.0},
                                      {"index": 1, "pid": os.getpid(), "started": 0.0}])
            await trio.sleep(1.5)
            assert [w["parked"] for w in mine()] == [True]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
