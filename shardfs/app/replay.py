"""Journal replay at mount: what killed daemons left in the source's journal root (and an
earlier version in ``SRC/.shardfs/journal``) folded into the shards before the mount goes live,
and the mount's own ``Writeback`` journalling into a directory it claims."""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

from shardfs.app import state
from shardfs.app.usage import UsageError
from shardfs.storage import private
from shardfs.storage.source import Source

log = logging.getLogger("shardfs")


def open_writeback(source: Source, storage: Any, journal_dir: str | None, cleanup: contextlib.ExitStack,
                   faults: Any = None) -> Any:
    """The mount's ``Writeback``, journalling into a directory of its own under the source's
    journal root (removed at exit if empty), after replaying into the shards what killed
    daemons left there and what an earlier version left in ``SRC/.shardfs/journal``; bugs met
    meanwhile are recorded in ``faults`` (``shardfs.base.faults.Faults``)."""
    from shardfs.writes import journal
    from shardfs.writes.writeback import Writeback

    root = state.journal_dir(source.name, journal_dir, source.endpoint)
    top = state.private_top(root)
    try:  # a -o journal_dir the user named may be sticky, as /tmp (doc/SECURITY.md#state)
        claim = journal.claim(root, top, shared_top=journal_dir is not None and top == root)
    except private.Refused as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"{root}: cannot create the write journal: {e.strerror} "
                         "(-o journal_dir=DIR puts it elsewhere)") from None
    cleanup.callback(claim.release)
    writeback = Writeback(storage, claim.directory, faults=faults)
    legacy = state.legacy_journal(source.name)
    replayed = writeback.replay_sync(functools.partial(replay_target, storage),
                                     older=((legacy,) if legacy else ()) + tuple(claim.orphans))
    claim.drop_orphans()
    if legacy:
        state.remove_legacy(source.name)
        log.info("moved the write journal out of the source: %s replayed and removed", legacy)
    if replayed:
        log.info("replayed %d journalled chunk changes into their shards", replayed)
    return writeback


def replay_target(source: Any, array_path: str, shard: tuple[int, ...]) -> Any:
    """Resolve a journalled shard to its rewrite target from the array's current metadata: None
    if the array is gone or its metadata is bad; ``Unusable`` if its ``zarr.json`` is there but
    cannot be read now (not a regular file, behind a symlink out of the source)."""
    from shardfs.tree.metadata import BadMetadata, parse
    from shardfs.storage import Unusable
    from shardfs.format.v2 import describe_array
    from shardfs.tree.commits import shard_target

    try:
        data, _version = source.read_all(f"{array_path}/zarr.json" if array_path else "zarr.json")
        doc = parse(data)
        return shard_target(array_path, describe_array(doc).layout, shard)
    except Unusable:
        raise
    except (OSError, ValueError, BadMetadata):
        return None
