"""The base room: small things any room may use, none of them storage and none a layer's own
job. It imports no other room of the package (only the standard library and trio).

- ``attrs``: ``Attr`` (what ``stat`` shows for a node) and ``fail`` (the ``OSError`` a FUSE
  handler answers with);
- ``threads``: ``blocking``, a blocking call run off the trio thread;
- ``lru``: ``SizedLRU``, a least-recently-used map bounded by the size of its values;
- ``eviction``: ``Eviction``, which value a size-bounded cache evicts first (least recently
  used, or a random old one while a shadow of that choice would have kept more);
- ``files``: ``fsync_dir`` (a rename or unlink made durable) and ``not_regular`` (why a
  file is never opened for I/O, for log lines);
- ``faults``: ``Faults``, the mount's internal errors (bugs) counted and logged, never fatal;
- ``budget``: ``Budget``, the bytes blocking calls in worker threads hold at once;
- ``libc``: the C library's calls Python's ``os`` lacks;
- ``private``: the directories and files only the mounting user can change (``open_dir``,
  ``open_file``, ``Refused``: doc/SECURITY.md);
- ``memtables``: the memfd tables a supervisor makes and its workers map (``make``, ``attach``);
- ``cores``: the CPUs this process may use (its affinity, and its cgroup's CPU quota).
"""

__all__ = ["attrs", "budget", "cores", "eviction", "faults", "files", "libc", "lru", "memtables", "private", "threads"]
