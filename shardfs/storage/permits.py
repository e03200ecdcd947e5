"""Would another user be allowed to read a file of the source? (doc/SECURITY.md#allow-other)

``may_read(path, uid, gids)``: True if a process of ``uid`` with groups ``gids`` could read
the file at ``path`` itself: search permission on every directory from ``/`` down to the
file's real directory (symlinks resolved: the file a symlink leads to is the one checked,
``-o follow_symlinks`` included) and read permission on the file, by its mode bits (owner,
else group, else others, as the kernel decides; root may always; ACLs are not looked at, so
an ACL that grants more is not honoured, one that takes away is). A path that cannot be
looked at (gone meanwhile) is True: the read that follows fails as it would anyway.
"""

from __future__ import annotations

import os
import stat

READ, SEARCH = 4, 1


def permits(st: os.stat_result, uid: int, gids: frozenset[int], want: int) -> bool:
    """True if ``uid`` (groups ``gids``) has the ``want`` bits (``READ``, ``SEARCH``) on a file of ``st``."""
    if uid == 0:
        return want != SEARCH or stat.S_ISDIR(st.st_mode) or bool(st.st_mode & 0o111)
    shift = 6 if st.st_uid == uid else 3 if st.st_gid in gids else 0
    return (st.st_mode >> shift) & want == want


def may_read(path: str, uid: int, gids: frozenset[int]) -> bool:
    """See the module docstring."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
        parents = []
        d = os.path.dirname(real)
        while True:
            parents.append(os.stat(d))
            if d == "/":
                break
            d = os.path.dirname(d)
    except OSError:
        return True
    return permits(st, uid, gids, READ) and all(permits(p, uid, gids, SEARCH) for p in parents)
