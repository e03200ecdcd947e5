"""The app room: the command line and what a mount needs around the filesystem.

- ``cli``: the ``shardfs`` command (``mount``, ``umount``, ``status``, ``inspect``: argparse and
  each command), the ``mount.fuse3`` form; ``usage``: the one-line ``UsageError``;
- ``compose``: the composition root, a mount's layers built from its ``Config`` (for the daemon
  and the tests' in-process harness alike); ``run``: the daemon (started in its own session), its
  logging, the mount going live, the FUSE loop and its signals; ``replay``: the journal replayed
  at mount;
- ``supervisor``, ``fusedev``: the supervisor that holds the mount and its kernel connection
  while workers serve it, and the connection's kernel side (mount, RESEND, clone, unmount);
  ``handover``: ``shardfs mount`` on a live mount, handed to a new worker;
- ``options``: the ``-o`` option table (``doc/CONFIGURATION.md`` is generated from it);
- ``state``, ``mounts``: the per-source state directory and the live mounts;
- ``status``, ``status_client``, ``progress``: the status socket, its client, umount progress;
- ``report``, ``survey``, ``targets``: ``shardfs inspect``.
"""

__all__ = ["cli", "compose", "mounts", "options", "progress", "replay", "report", "run", "state", "status",
           "status_client", "supervisor", "fusedev", "handover", "survey", "targets", "usage"]
