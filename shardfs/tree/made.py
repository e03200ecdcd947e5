"""``Made``: the structure made through the mount that the source does not hold (yet).

The one owner of that state: the ``Writer`` changes it through the methods below (``mkdir``,
``created``, ``hide``, ``deleted``...), the view and the listings ask it. No I/O; runs on the
trio thread.

- new directories (``mkdir`` in a group), until a ``.zarray``/``.zgroup`` makes them a node;
- key directories made in an array: shard directories (``c``, ``c/0``: ``(array, rel)``) and,
  with ``dimension_separator`` "/", key prefixes (``(array, prefix)``);
- arrays created through the mount, whose key directories resolve only once made or once a
  chunk below them was written (``key_dir_shown``);
- metadata files unlinked (``rm -r``), no longer shown.
"""

from __future__ import annotations


class Made:
    """Directories made, arrays created and metadata files unlinked through one mount."""

    def __init__(self) -> None:
        self._new_dirs: set[str] = set()  # directories made by mkdir, until a .zarray/.zgroup lands
        self._shard_dirs: set[tuple[str, str]] = set()  # (array, rel): key directories made by mkdir
        self._hidden: set[tuple[str, str]] = set()  # (node, name): metadata files unlinked (rm -r)
        self._created: set[str] = set()  # arrays created through the mount (see key_dir_shown)
        self._key_dirs: set[tuple[str, tuple[int, ...]]] = set()  # (array, prefix): key dirs made there

    # ----- asked by the view and the listings --------------------------------------------

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

    def mkdir(self, path: str) -> None:
        """A directory made in a group (or in a directory made here)."""
        self._new_dirs.add(path)

    def mkdir_shard_dir(self, path: str, rel: str) -> None:
        """Key directory ``rel`` (a shard's or a prefix of shard keys) made in array ``path``."""
        self._shard_dirs.add((path, rel))

    def mkdir_key_dir(self, path: str, prefix: tuple[int, ...]) -> None:
        """Key directory ``prefix`` (dimension_separator "/") made in array ``path``."""
        self._key_dirs.add((path, prefix))

    def rmdir_shard_dir(self, path: str, rel: str) -> None:
        self._shard_dirs.discard((path, rel))

    def rmdir_key_dir(self, path: str, prefix: tuple[int, ...]) -> None:
        self._key_dirs.discard((path, prefix))

    def adopted(self, made: str) -> None:
        """Directory ``made`` below a new array became one of its key directories."""
        self._new_dirs.discard(made)

    def chunk_written(self, path: str, coords: tuple[int, ...]) -> None:
        """A chunk was written at ``coords`` of array ``path``: in an array created through the
        mount, the key directories above it now resolve."""
        if path in self._created:
            self._key_dirs.update((path, coords[:k]) for k in range(1, len(coords)))

    def created(self, path: str, array: bool) -> None:
        """A ``.zarray`` (``array``) or ``.zgroup`` made new directory ``path`` a node."""
        self._new_dirs.discard(path)
        if array:
            self._created.add(path)

    def hide(self, path: str, name: str) -> None:
        """Metadata file ``name`` of node ``path`` is not shown (unlinked, or not written yet)."""
        self._hidden.add((path, name))

    def unhide(self, path: str, name: str) -> None:
        """Metadata file ``name`` of node ``path`` was written: shown again."""
        self._hidden.discard((path, name))

    def replaced(self, path: str) -> None:
        """The array at ``path`` was deleted for a new one made from a new ``.zarray``: nothing
        of it is hidden, and its directory is a new one until that ``.zarray`` lands."""
        self._hidden = {h for h in self._hidden if h[0] != path}
        self._new_dirs.add(path)

    def moved(self, old: str, new: str) -> None:
        """The directory at ``old`` and all below it were renamed to ``new``."""
        def renamed(path: str) -> str:
            return new + path[len(old):] if path == old or path.startswith(old + "/") else path

        self._new_dirs = {renamed(p) for p in self._new_dirs}
        self._created = {renamed(p) for p in self._created}
        self._shard_dirs = {(renamed(p), r) for p, r in self._shard_dirs}
        self._hidden = {(renamed(p), n) for p, n in self._hidden}
        self._key_dirs = {(renamed(p), k) for p, k in self._key_dirs}

    def deleted(self, path: str) -> None:
        """The node (or new directory) at ``path`` was removed (``rmdir``)."""
        self._new_dirs.discard(path)
        self._created.discard(path)
        self._hidden = {h for h in self._hidden if h[0] != path}
