"""Directories and files only the mounting user can change: the state, journal, spill, log,
socket and cache of a mount (doc/SECURITY.md).

Contracts:
- ``open_dir(path, top)`` makes ``path`` a directory of this user's own and returns a
  descriptor of it. Every component from ``top`` (an ancestor of ``path``, or ``path``
  itself) down to ``path`` is made with mode 0700 if missing; one that exists must be a
  directory (looked at through its parent's descriptor with ``O_NOFOLLOW``: a symlink is
  never followed) owned by this process's effective uid and writable by no one else (no
  group or other write bit), else ``Refused`` names it, as ssh refuses a ``~/.ssh`` others
  can write. Directories above ``top`` are the user's choice (their home, ``/tmp``): missing
  ones are made 0700, existing ones are not checked. So what shardfs keeps below ``top``
  cannot have been planted, nor replaced by a symlink, by another user. With ``shared_top``
  (a directory the user named for shardfs to make its own directories in: ``-o
  journal_dir``), ``top`` itself may also be a sticky directory others can write, owned by
  this user or root (a fresh tmpfs, ``/tmp``): as ssh and systemd use ``/tmp``, nobody else
  can remove or rename what shardfs makes in it, and what it makes there is checked as above.
- ``open_file(dir_fd, name, flags, path)`` (``open_path(path, flags)``) opens ``name`` in that directory with
  ``O_NOFOLLOW`` (created 0600); it must be a regular file owned by this user, else ``Refused``.
- ``Refused`` is one line: the path and why.
"""

from __future__ import annotations

import errno
import os
import stat

DIR_MODE = 0o700
FILE_MODE = 0o600
_HINT = "not used: it must be this user's own, not a symlink, writable by no one else"


class Refused(Exception):
    """A directory or file another user made or can change; ``str()`` is one line naming it."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}: {_HINT}")
        self.path = path


def problem(st: os.stat_result, directory: bool = True) -> str | None:
    """Why a file or directory of status ``st`` is not this user's own; None if it is."""
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if directory and not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if not directory and not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if directory and st.st_mode & 0o022:
        return f"writable by its group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def shared(st: os.stat_result) -> bool:
    """True if ``st`` is a sticky directory (others may write it, but remove or rename only what
    they own) of this user's or root's, and not a symlink."""
    return (stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX)
            and st.st_uid in (os.geteuid(), 0))


def open_dir(path: str, top: str | None = None, create: bool = True, shared_top: bool = False) -> int:
    """A descriptor of directory ``path``, made and checked from ``top`` down (see the module
    docstring; ``shared_top``: ``top`` may be a sticky directory others write, see ``shared``);
    ``Refused`` or ``OSError`` (it cannot be made; with ``create`` False,
    ``FileNotFoundError`` if it is missing: nothing is made)."""
    path = os.path.abspath(path)
    top = os.path.abspath(top) if top else path
    if path != top and not path.startswith(top.rstrip("/") + "/"):
        raise ValueError(f"{top} is not above {path}")
    if create:
        _make_missing(os.path.dirname(top))
    names = [n for n in os.path.relpath(path, os.path.dirname(top)).split("/") if n not in ("", ".")]
    fd = os.open(os.path.dirname(top), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    where = os.path.dirname(top)
    try:
        for depth, name in enumerate(names):
            where = os.path.join(where, name)
            if create:
                try:
                    os.mkdir(name, DIR_MODE, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    why = problem(os.stat(name, dir_fd=fd, follow_symlinks=False))
                    raise Refused(where, why or "unusable") from None
                raise
            os.close(fd)
            fd = child
            st = os.fstat(fd)
            why = problem(st)
            if why and not (shared_top and depth == 0 and shared(st)):
                raise Refused(where, why)
    except BaseException:
        os.close(fd)
        raise
    return fd


def ensure(path: str, top: str | None = None) -> None:
    """``open_dir`` without the descriptor: ``path`` exists and is this user's own."""
    os.close(open_dir(path, top))


def open_file(dir_fd: int | None, name: str, flags: int, path: str) -> int:
    """Open ``name`` in directory ``dir_fd`` (None: ``name`` is a path in a directory already
    checked) without following a symlink (created mode 0600); ``Refused`` (``path`` names it)
    if it is not a regular file of this user's own."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, FILE_MODE, dir_fd=dir_fd)
    except OSError:
        try:  # ELOOP for a symlink; EACCES with O_CREAT; ENXIO for a FIFO: say which it is
            why = problem(os.stat(name, dir_fd=dir_fd, follow_symlinks=False), directory=False)
        except OSError:
            why = None
        if why:
            raise Refused(path, why) from None
        raise
    why = problem(os.fstat(fd), directory=False)
    if why:
        os.close(fd)
        raise Refused(path, why)
    return fd


def open_path(path: str, flags: int) -> int:
    """``open_file`` of ``path`` relative to its parent directory (which is not checked: a
    ``--log-file`` the user names may be in ``/tmp``)."""
    dfd = os.open(os.path.dirname(os.path.abspath(path)) or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return open_file(dfd, os.path.basename(path), flags, path)
    finally:
        os.close(dfd)


def _make_missing(path: str) -> None:
    """Make ``path`` and its missing ancestors, each mode 0700 (existing ones untouched)."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            pass
