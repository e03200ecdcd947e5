"""Journal replay at mount: what killed daemons left in the source's journal root (and an
earlier version in ``SRC/.shardfs/journal``) folded into the shards before the mount goes live,
and the mount's own ``Writeback`` journalling into a directory it claims."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable

from shardfs.app import state
from shardfs.app.usage import UsageError
from shardfs.base import private
from shardfs.storage.source import Source

log = logging.getLogger("shardfs")


def open_writeback(source: Source, storage: Any, journal_dir: str | None, cleanup: contextlib.ExitStack,
                   faults: Any = None, adopt: bool = False) -> Any:
    """The mount's ``Writeback``, journalling into a directory of its own under the source's
    journal root (removed at exit if empty), after replaying into the shards what killed
    daemons left there and what an earlier version left in ``SRC/.shardfs/journal``; bugs met
    meanwhile are recorded in ``faults`` (``shardfs.base.faults.Faults``). ``adopt``: a worker
    replacing a dead one of the same mount takes what killed daemons left over as pending
    instead (``Writeback.adopt``: served at once, folded in the background), so it serves
    without waiting for those folds."""
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
    resolve = targets(storage)
    older = ((legacy,) if legacy else ()) + tuple(() if adopt else claim.orphans)
    replayed = writeback.replay_sync(resolve, older=older)
    if adopt:
        adopted = writeback.adopt(resolve, claim.adopt_orphans(), emptied=claim.drop_adopted)
        if adopted:
            log.info("took over %d journalled chunk changes of a dead worker, pending", adopted)
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
    return targets(source)(array_path, shard)


def targets(source: Any) -> Callable[[str, tuple[int, ...]], Any]:
    """``replay_target`` that reads each array's metadata once (a replay or an adoption of
    many shards of one array: one read, not one per shard, of an object store)."""
    from shardfs.tree.commits import shard_target

    layouts: dict[str, Any] = {}

    def resolve(array_path: str, shard: tuple[int, ...]) -> Any:
        if array_path not in layouts:
            try:
                layouts[array_path] = _layout(source, array_path)
            except Exception as e:  # noqa: BLE001 - raised again for each shard of the array
                layouts[array_path] = e
        layout = layouts[array_path]
        if isinstance(layout, Exception):
            raise layout
        return None if layout is None else shard_target(array_path, layout, shard)

    return resolve


def _layout(source: Any, array_path: str) -> Any:
    from shardfs.tree.metadata import BadMetadata, parse
    from shardfs.storage import Unusable
    from shardfs.format.v2 import describe_array

    try:
        data, _version = source.read_all(f"{array_path}/zarr.json" if array_path else "zarr.json")
        return describe_array(parse(data)).layout
    except Unusable:
        raise
    except (OSError, ValueError, BadMetadata):
        return None
