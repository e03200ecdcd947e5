"""``shardfs mount SRC MNT [-o ...]`` on a live supervised mount of the same source: the mount
is handed to a new worker running the package installed now, with the new options.

The running supervisor is found through its status socket (``mounts.daemon_of``: the kernel
names the process that listens); the request is a file in the source's state directory
(``state.takeover_file``, mode 0600, holding the new worker's command line) and SIGUSR1 to
that supervisor, which asks its worker to fold what is pending and stop, then starts the new
one on the same connection (``shardfs.app.supervisor``). Options fixed when the kernel
connection was made (``fusedev.FIXED``: ro/rw, allow_other, default_permissions, the mount
flags...) cannot change this way: refused, naming the option, before anything is asked.
"""

from __future__ import annotations

import json
import os
import signal
import time

from shardfs.app import fusedev, state
from shardfs.app.mounts import daemon_of, device, mounts, pidfd_of
from shardfs.app.usage import UsageError
from shardfs.storage.source import Source

TAKEOVER_TIMEOUT = 120.0  # seconds for the old worker to fold and the new one to serve


def hand_over(given: str, mnt: str, source: Source, fuse_opts: list[str], read_only: bool, argv: list[str]) -> bool:
    """Hand live mount ``mnt`` (``given`` as the user wrote it) of ``source`` to a new worker
    running ``argv``; False if ``mnt`` is not a live supervised shardfs mount of ``source``
    (the caller refuses the mount as before). ``UsageError`` if an option fixed at connection
    time would change (``fuse_opts``, ``read_only``) or the handover does not complete."""
    if mounts().get(mnt) != device(source.name):
        return False
    daemon = daemon_of(mnt)
    if daemon is None or "worker" not in daemon.doc:
        return False
    doc = daemon.doc
    before = [f"{k}={v}" if v else k for k, v in doc.get("options", {}).items()]
    changed = fusedev.fixed_changes(before, fuse_opts, bool(doc.get("read_only")), read_only)
    if changed:
        raise UsageError(f"{given}: -o {changed[0]} cannot change on a live mount (fixed when the kernel "
                         f"connection was made): unmount it first (shardfs umount {given})")
    path = state.takeover_file(source.name, source.endpoint, daemon.pid)
    state.private_dir(os.path.dirname(path))
    tmp = f"{path}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"argv": argv}, f)
    os.replace(tmp, path)
    takeovers = doc["worker"]["takeovers"]
    try:
        pidfd = pidfd_of(daemon)
    except OSError as e:
        raise UsageError(f"{given}: its daemon cannot be reached: {e.strerror}") from None
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGUSR1)
    except ProcessLookupError:
        raise UsageError(f"{given}: its daemon ended") from None
    finally:
        os.close(pidfd)
    deadline = time.monotonic() + TAKEOVER_TIMEOUT
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = daemon_of(mnt)
        if now is None and mnt not in mounts():
            raise UsageError(f"{given}: the mount ended during the handover (its log says why)")
        if now is not None and now.pid == daemon.pid and now.doc["worker"]["takeovers"] > takeovers:
            return True
    raise UsageError(f"{given}: no new worker serves the mount after {TAKEOVER_TIMEOUT:g} s (its log says why)")
