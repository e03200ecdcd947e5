"""The zygote of a daemon ``shardfs mount`` spawned, started before anything else is imported.

A mount goes live once a worker serves it, and the first worker is forked by the zygote
(``shardfs.app.zygote``) once it has imported everything a worker runs: most of the time from
``shardfs mount`` to the live mount. The zygote used to be started by the supervisor after its
own imports (the command line's, ``importlib.metadata``, its own: about a quarter of a second, a
second on a loaded machine) and its checks; now ``shardfs mount`` names the zygote's command
line in the daemon's environment (``ENV``: the worker command line, JSON) and ``python -m
shardfs`` starts it first thing (``start``), so the zygote imports while the daemon imports and
checks. The supervisor takes it (``take``) if it was started for the command line it would give
its own zygote; anything else (another command line, no supervision, a failure before) stops it.
It is a fresh process like any zygote: nothing of the daemon but its environment.
"""

from __future__ import annotations

import json
import os

from shardfs.app.zygote import Zygote

ENV = "SHARDFS_EARLY_ZYGOTE"
OOM_SCORE_ADJ = "/proc/self/oom_score_adj"
_zygote: Zygote | None = None


def start() -> None:
    """Start the zygote ``ENV`` names (and take ``ENV`` out of this process's environment)."""
    global _zygote
    given = os.environ.pop(ENV, None)
    if not given:
        return
    try:
        argv = json.loads(given)
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            return
        with open(OOM_SCORE_ADJ) as f:  # (before the supervisor protects itself: the zygote's own)
            before = f.read().strip()
        _zygote = Zygote(argv, {**os.environ, "SHARDFS_OOM_SCORE_ADJ": before})
    except (OSError, ValueError):
        _zygote = None


def take(argv: list[str]) -> Zygote | None:
    """The zygote started for worker command line ``argv``, now the caller's; None if none was
    (one started for another command line is stopped)."""
    global _zygote
    z, _zygote = _zygote, None
    if z is not None and z.argv != argv:
        z.close()
        return None
    return z


def discard() -> None:
    """Stop the zygote started early, if any (the daemon will not supervise)."""
    global _zygote
    z, _zygote = _zygote, None
    if z is not None:
        z.close()
