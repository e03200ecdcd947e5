"""``Made``: the structure made through the mount that the source does not hold (yet).

The one owner of that state: the ``Writer`` changes it through the methods below (``mkdir``,
``created``, ``hide``, ``deleted``...), ``Names`` and the listings ask it. No I/O; runs on the
trio thread.

- new directories (``mkdir`` in a group), until a ``.zarray``/``.zgroup`` makes them a node;
- key directories made in an array: shard directories (``c``, ``c/0``: ``(array, rel)``) and,
  with ``dimension_separator`` "/", key prefixes (``(array, prefix)``);
- arrays created through the mount, whose key directories resolve only once made or once a
  chunk below them was written (``key_dir_shown``);
- metadata files unlinked (``rm -r``), no longer shown;
- empty chunks unlinked in an array that serves its empty chunks as fill chunks
  (``shardfs.format.fill``), no longer shown until written again.

Each change is noted in the ``Ledger`` (``["M", method, *args]``), which a worker replacing a
dead one replays (``restore``): what was made through the mount stays made.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from shardfs.tree.ledger import Ledger

F = TypeVar("F", bound=Callable[..., None])
UNFILLED_KEPT = 65536  # chunk names unlinked that stay unshown (``Made.unfill``): about 10 MiB
CHANGES: list[str] = []  # the methods that change the state (``_noted``), which ``restore`` replays


def _noted(fn: F) -> F:
    """A change, noted in the ledger as it is made."""
    CHANGES.append(fn.__name__)

    @functools.wraps(fn)
    def wrapper(self: "Made", *args: Any) -> None:
        self.ledger.note("M", fn.__name__, *args)
        fn(self, *args)

    return wrapper  # type: ignore[return-value]  # functools.wraps: fn's signature


class Made:
    """Directories made, arrays created and metadata files unlinked through one mount."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        self.ledger = ledger or Ledger()
        self._new_dirs: set[str] = set()  # directories made by mkdir, until a .zarray/.zgroup lands
        self._shard_dirs: set[tuple[str, str]] = set()  # (array, rel): key directories made by mkdir
        self._hidden: set[tuple[str, str]] = set()  # (node, name): metadata files unlinked (rm -r)
        self._created: set[str] = set()  # arrays created through the mount (see key_dir_shown)
        self._key_dirs: set[tuple[str, tuple[int, ...]]] = set()  # (array, prefix): key dirs made there
        self._unfilled: dict[tuple[str, tuple[int, ...]], None] = {}  # (array, coords), oldest first: ``unfill``

    # ----- asked by ``Names`` and the listings -----------------------------------------

    def is_new_dir(self, path: str) -> bool:
        """True if ``path`` is a directory made by mkdir that is no node yet."""
        return path in self._new_dirs

    def new_children(self, path: str) -> list[str]:
        """Names of the directories made by mkdir directly below ``path``."""
        return sorted(d.rpartition("/")[2] for d in self._new_dirs if d.rpartition("/")[0] == path and d)

    def new_dirs_below(self, path: str) -> list[str]:
        """The directories made by mkdir anywhere below ``path``, sorted."""
        return sorted(d for d in self._new_dirs if d.startswith(path + "/"))

    def shown(self, path: str, names: tuple[str, ...]) -> tuple[str, ...]:
        """Those of metadata files ``names`` of node ``path`` not unlinked through the mount."""
        return tuple(n for n in names if (path, n) not in self._hidden) if self._hidden else names

    def is_hidden(self, path: str, name: str) -> bool:
        """True if metadata file ``name`` of node ``path`` was unlinked through the mount."""
        return (path, name) in self._hidden

    def is_unfilled(self, path: str, coords: tuple[int, ...]) -> bool:
        """True if the chunk at ``coords`` of array ``path`` was unlinked empty (``unfill``)."""
        return (path, coords) in self._unfilled

    def unfilled(self, path: str) -> list[tuple[int, ...]]:
        """The coordinates of the chunks of array ``path`` unlinked empty (``unfill``)."""
        return [c for p, c in self._unfilled if p == path]

    def shard_dir_made(self, path: str, rel: str) -> bool:
        """True if key directory ``rel`` of array ``path`` was made by mkdir."""
        return (path, rel) in self._shard_dirs

    def key_dir_shown(self, path: str, prefix: tuple[int, ...]) -> bool:
        """Whether key directory ``prefix`` (dimension_separator "/") of array ``path`` resolves.
        Every prefix in the grid does, except in arrays created through this mount, where one
        resolves once made (``mkdir``) or once a chunk below it was written (all of such an
        array's chunks were): ``cp -r`` makes them after the .zarray, and the kernel answers its
        mkdir with EEXIST if the lookup succeeds."""
        return path not in self._created or (path, prefix) in self._key_dirs

    # ----- changed by the writer ---------------------------------------------------------

    @_noted
    def mkdir(self, path: str) -> None:
        """A directory made in a group (or in a directory made here)."""
        self._new_dirs.add(path)

    @_noted
    def mkdir_shard_dir(self, path: str, rel: str) -> None:
        """Key directory ``rel`` (a shard's or a prefix of shard keys) made in array ``path``."""
        self._shard_dirs.add((path, rel))

    @_noted
    def mkdir_key_dir(self, path: str, prefix: tuple[int, ...]) -> None:
        """Key directory ``prefix`` (dimension_separator "/") made in array ``path``."""
        self._key_dirs.add((path, prefix))

    @_noted
    def rmdir_shard_dir(self, path: str, rel: str) -> None:
        self._shard_dirs.discard((path, rel))

    @_noted
    def rmdir_key_dir(self, path: str, prefix: tuple[int, ...]) -> None:
        self._key_dirs.discard((path, prefix))

    @_noted
    def adopted(self, made: str) -> None:
        """Directory ``made`` below a new array became one of its key directories."""
        self._new_dirs.discard(made)

    @_noted
    def unfill(self, path: str, coords: tuple[int, ...]) -> None:
        """The chunk at ``coords`` of array ``path``, which serves its empty chunks as fill
        chunks, was unlinked (and is empty now): its name is not shown until it is written or
        created again (``chunk_written``, ``chunk_created``), as a file unlinked is gone: a tool
        that unlinks a file before creating it anew (``cp -a`` over a chunk file of a sharded
        array, whose ``st_nlink`` is 2; ``tar``) must find the name free for its O_EXCL create.
        The last ``UNFILLED_KEPT`` are kept (an ``rm -r`` of a huge array does not grow the
        daemon): an older one is shown again as the fill chunk it is."""
        self._unfilled.pop((path, coords), None)
        self._unfilled[(path, coords)] = None
        if len(self._unfilled) > UNFILLED_KEPT:
            del self._unfilled[next(iter(self._unfilled))]

    def chunk_created(self, path: str, coords: tuple[int, ...]) -> None:
        """A chunk file was created at ``coords`` of array ``path``: shown again, if unfilled."""
        if self.is_unfilled(path, coords):
            self.chunk_written(path, coords)

    @_noted
    def chunk_written(self, path: str, coords: tuple[int, ...]) -> None:
        """A chunk was written at ``coords`` of array ``path``: shown again if it was unfilled;
        in an array created through the mount, the key directories above it now resolve."""
        self._unfilled.pop((path, coords), None)
        if path in self._created:
            self._key_dirs.update((path, coords[:k]) for k in range(1, len(coords)))

    @_noted
    def created(self, path: str, array: bool) -> None:
        """A ``.zarray`` (``array``) or ``.zgroup`` made new directory ``path`` a node."""
        self._new_dirs.discard(path)
        if array:
            self._created.add(path)

    @_noted
    def hide(self, path: str, name: str) -> None:
        """Metadata file ``name`` of node ``path`` is not shown (unlinked, or not written yet)."""
        self._hidden.add((path, name))

    @_noted
    def unhide(self, path: str, name: str) -> None:
        """Metadata file ``name`` of node ``path`` was written: shown again."""
        self._hidden.discard((path, name))

    @_noted
    def replaced(self, path: str) -> None:
        """The array at ``path`` was deleted for a new one made from a new ``.zarray``: nothing
        of it is hidden, and its directory is a new one until that ``.zarray`` lands."""
        self._hidden = {h for h in self._hidden if h[0] != path}
        self._unfilled = {u: None for u in self._unfilled if u[0] != path}
        self._new_dirs.add(path)

    @_noted
    def moved(self, old: str, new: str) -> None:
        """The directory at ``old`` and all below it were renamed to ``new``."""
        def renamed(path: str) -> str:
            return new + path[len(old):] if path == old or path.startswith(old + "/") else path

        self._new_dirs = {renamed(p) for p in self._new_dirs}
        self._created = {renamed(p) for p in self._created}
        self._shard_dirs = {(renamed(p), r) for p, r in self._shard_dirs}
        self._hidden = {(renamed(p), n) for p, n in self._hidden}
        self._key_dirs = {(renamed(p), k) for p, k in self._key_dirs}
        self._unfilled = {(renamed(p), c): None for p, c in self._unfilled}

    @_noted
    def deleted(self, path: str) -> None:
        """The node (or new directory) at ``path`` was removed (``rmdir``)."""
        self._new_dirs.discard(path)
        self._created.discard(path)
        self._hidden = {h for h in self._hidden if h[0] != path}
        self._unfilled = {u: None for u in self._unfilled if u[0] != path}

    def restore(self, records: list[list[Any]]) -> None:
        """Make again what a dead worker's ledger ``records`` say was made (lists back to tuples)."""
        for rec in records:
            if rec[0] == "M" and rec[1] in CHANGES:
                args = [tuple(a) if isinstance(a, list) else a for a in rec[2:]]
                getattr(Made, rec[1]).__wrapped__(self, *args)

    def records(self) -> list[list[Any]]:
        """What ``restore`` needs, as ledger records (rewriting the ledger)."""
        return ([["M", "mkdir", d] for d in sorted(self._new_dirs)]
                + [["M", "mkdir_shard_dir", *k] for k in sorted(self._shard_dirs)]
                + [["M", "mkdir_key_dir", p, list(k)] for p, k in sorted(self._key_dirs)]
                + [["M", "hide", *h] for h in sorted(self._hidden)]
                + [["M", "unfill", p, list(c)] for p, c in self._unfilled]
                + [["M", "created", c, True] for c in sorted(self._created)])
