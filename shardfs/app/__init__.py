"""The app room: the command line and what a mount needs around the filesystem.

- ``cli``: the ``shardfs`` command (``mount``, ``umount``, ``status``, ``inspect``), the
  ``mount.fuse3`` form, the composition root of a mount, journal replay, daemonizing;
- ``options``: the ``-o`` option table (``doc/CONFIGURATION.md`` is generated from it);
- ``state``, ``mounts``: the per-source state directory and the live mounts;
- ``status``, ``status_client``, ``progress``: the status socket, its client, umount progress;
- ``report``, ``survey``, ``targets``: ``shardfs inspect``.
"""

__all__ = ["cli", "mounts", "options", "progress", "report", "state", "status", "status_client", "survey", "targets"]
