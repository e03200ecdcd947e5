"""Where a mount keeps what is not Zarr data: its state directory outside the source.

A source's state directory is ``$XDG_STATE_HOME/shardfs/<id>`` (XDG_STATE_HOME
defaults to ``~/.local/state``; a relative value is ignored, as the XDG spec
says). ``<id>`` is readable and unique per source: the source's last path
component plus 12 hex digits of the SHA-256 of its canonical name (the real
path of a local directory; for a URL, the normalized URL and the endpoint it
is reached through, ``shardfs.storage.source``), so the next mount of the same source
finds the same directory. It holds the write journal (``journal/``, unless
``-o journal_dir=DIR`` puts it elsewhere), the spill files of large writes
(``spill/``, unlinked as soon as they are created) and the daemon's log file
when there is no syslog (``log``).

Every directory shardfs keeps there is the mounting user's own (``private``: made 0700, an
existing one owned by another user, writable by others or a symlink is refused, doc/SECURITY.md).

Earlier versions kept the journal in the source, ``SRC/.shardfs/journal``;
``LEGACY_JOURNAL`` names it so a mount can replay and remove it: only when it passes the
same check from SRC itself down (nobody else can have planted it or can swap it for a
symlink meanwhile), else it is left alone (``legacy_journal``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
import os
import re
import socket

from shardfs.base import files, private
from shardfs.storage.urls import is_url, normalize_url

log = logging.getLogger("shardfs")
LEGACY_DIR = ".shardfs"
LEGACY_JOURNAL = f"{LEGACY_DIR}/journal"


def canonical(source: str, endpoint: str | None = None) -> str:
    """The name that identifies ``source``: the real path of a directory; a URL normalized,
    followed by `` at ENDPOINT`` when it is reached through an explicit endpoint."""
    if not is_url(source):
        return os.path.realpath(source)
    url = normalize_url(source)
    return f"{url} at {endpoint.rstrip('/')}" if endpoint else url


def source_id(source: str, endpoint: str | None = None) -> str:
    """``<name>-<hash>``: a readable, file-name-safe key, unique per canonical source."""
    name = canonical(source)
    digest = hashlib.sha256(canonical(source, endpoint).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", name.rsplit("/", 1)[-1] or name.split("://", 1)[-1])
    base = base.strip("._")[:40] or "root"
    return f"{base}-{digest}"


def state_home() -> str:
    """``$XDG_STATE_HOME/shardfs`` (``~/.local/state/shardfs`` when unset or relative)."""
    home = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(home):
        home = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(home, "shardfs")


def state_dir(source: str, endpoint: str | None = None) -> str:
    """The state directory of ``source`` (reached through ``endpoint``; not created here)."""
    return os.path.join(state_home(), source_id(source, endpoint))


def journal_dir(source: str, override: str | None = None, endpoint: str | None = None) -> str:
    """The write journal of ``source``: ``override`` (``-o journal_dir``) or ``<state dir>/journal``."""
    return os.path.abspath(override) if override else os.path.join(state_dir(source, endpoint), "journal")


def spill_dir(source: str, endpoint: str | None = None) -> str:
    """Where contents being written spill beyond memory (unlinked files: see ``shardfs.writes.spill``)."""
    return os.path.join(state_dir(source, endpoint), "spill")


def status_socket(source: str, endpoint: str | None, pid: int) -> str:
    """The unix socket daemon ``pid`` of ``source`` answers ``shardfs status`` on."""
    return os.path.join(state_dir(source, endpoint), f"status-{pid}.sock")


def status_listener(path: str) -> socket.socket:
    """A unix socket listening at ``path`` (mode 0600, in this user's own directory: ``private``;
    one left there by a killed daemon of the same pid number is replaced); ``OSError`` or
    ``private.Refused`` if it cannot be made."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        private_dir(os.path.dirname(path))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        old = os.umask(0o177)
        try:
            with files.socket_address(path) as address:
                sock.bind(address)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(16)
    except BaseException:
        sock.close()
        raise
    return sock


def status_sockets() -> list[str]:
    """The status sockets in this user's own state directories: the state home and each
    directory holding one must pass ``private``'s check (nothing another user could have
    made or replaced); none if the state home does not."""
    home, found = state_home(), []
    for path in sorted(glob.glob(os.path.join(glob.escape(home), "*", "status-*.sock"))):
        try:
            os.close(private.open_dir(os.path.dirname(path), home, create=False))
        except (private.Refused, OSError):
            continue
        found.append(path)
    return found


def ledger_file(source: str, endpoint: str | None, pid: int) -> str:
    """Where the workers of supervisor ``pid`` note the numbers they give the kernel
    (``shardfs.tree.ledger``); the supervisor removes it when the mount ends."""
    return os.path.join(state_dir(source, endpoint), f"kernel-{pid}.ledger")


def marks_file(source: str, endpoint: str | None, pid: int) -> str:
    """What the owner worker of supervisor ``pid`` changed (``shardfs.kernel.owner.Marks``)."""
    return os.path.join(state_dir(source, endpoint), f"kernel-{pid}.marks")


def worker_socket(source: str, endpoint: str | None, pid: int, slot: int) -> str:
    """Where the worker of slot ``slot`` of supervisor ``pid`` answers the others
    (``shardfs.kernel.forward``)."""
    return os.path.join(state_dir(source, endpoint), f"worker-{pid}.{slot}.sock")


def takeover_file(source: str, endpoint: str | None, pid: int) -> str:
    """Where ``shardfs mount`` on a live mount leaves supervisor ``pid`` the command line of
    the worker to hand the mount to (``shardfs.app.handover``)."""
    return os.path.join(state_dir(source, endpoint), f"takeover-{pid}.json")


def log_file(source: str, endpoint: str | None = None) -> str:
    """The daemon's log file when it runs in the background and there is no syslog."""
    return os.path.join(state_dir(source, endpoint), "log")


def private_top(path: str) -> str:
    """Where the check of directory ``path`` (state, journal, spill, socket, cache) starts
    (``shardfs.base.private.open_dir``): the state home when ``path`` lies below it, else
    ``path`` itself (``-o journal_dir``, ``-o cache_dir``)."""
    home, path = state_home(), os.path.abspath(path)
    return home if path.startswith(home + "/") else path


def private_dir(path: str) -> None:
    """Make directory ``path`` this user's own, checked from ``private_top(path)`` down;
    ``private.Refused`` (one line) names what is not."""
    private.ensure(path, private_top(path))


def legacy_journal(source: str) -> str | None:
    """``SRC/.shardfs/journal`` of a local source if an earlier version left it there and it is
    this user's own (``private``, checked from SRC itself down), else None. One that is not
    is logged and left alone: never replayed, never removed."""
    if is_url(source) or not os.path.lexists(os.path.join(source, LEGACY_DIR)):
        return None
    path = os.path.join(os.path.realpath(source), LEGACY_JOURNAL)
    try:
        os.close(private.open_dir(path, os.path.realpath(source), create=False))
    except FileNotFoundError:
        return None
    except (private.Refused, OSError) as e:
        log.warning("%s: not replayed: %s", path, e)
        return None
    return path


def remove_legacy(source: str) -> None:
    """Remove the emptied ``SRC/.shardfs/journal`` and then ``SRC/.shardfs`` if nothing else is in it."""
    for rel in (LEGACY_JOURNAL, LEGACY_DIR):
        try:
            os.rmdir(os.path.join(source, rel))
        except FileNotFoundError:
            pass
        except OSError:
            return  # not empty: something that is not ours
