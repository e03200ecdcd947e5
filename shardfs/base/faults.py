"""Internal errors (bugs) of a mount: counted, logged with their traceback, never fatal.

A bug met while serving a request, or in a background task, must not end the mount (every
other client would lose it) nor flood the log. ``Faults.record`` counts an exception by where
it happened (``"readdir"``, ``"fold callback"``...) and logs it at ERROR level with its
traceback the first time that place raises that kind of exception from that line; repeats are
one line at most every ``LOG_EVERY`` seconds, saying how many there were. ``Faults.keep`` runs
a background task that way: it is restarted after a failure, with backoff
(``BACKOFF_FIRST`` doubling up to ``BACKOFF_MAX`` seconds), forever. ``shardfs status`` shows
``Faults.snapshot`` as ``internal_errors``.
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypedDict

import trio

log = logging.getLogger("shardfs")
LOG_EVERY = 60.0  # seconds between one-line reports of a bug already logged with its traceback
BACKOFF_FIRST = 1.0  # seconds before a failed background task runs again; doubles per failure
BACKOFF_MAX = 300.0
SITES_KEPT = 256  # distinct (where, type, line) kept; more are counted under where only


@dataclass
class _Site:
    """One place a kind of exception came from: how often, and when it was last logged."""

    count: int = 0
    logged_at: float = field(default=-float("inf"))
    unlogged: int = 0
    last: str = ""
    last_at: float = 0.0


def _origin(e: BaseException) -> str:
    """``file:line`` of the innermost frame of ``e``'s traceback ("" without one)."""
    frames = traceback.extract_tb(e.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


class Place(TypedDict):
    where: str
    error: str
    count: int
    seconds_ago: float


class FaultCounts(TypedDict):
    """The mount's internal errors (``Faults.snapshot``; ``internal_errors`` of the status document)."""

    total: int
    by_place: list[Place]


class Faults:
    """The internal errors of one mount (see the module docstring)."""

    def __init__(self) -> None:
        self._sites: dict[tuple[str, str, str], _Site] = {}
        self.total = 0

    def record(self, where: str, e: BaseException, detail: str = "") -> None:
        """Count ``e`` raised at ``where`` (``detail``: what it was doing, e.g. the request's
        arguments) and log it: with its traceback the first time, then at most once per
        ``LOG_EVERY`` seconds per place."""
        self.total += 1
        key = (where, type(e).__name__, _origin(e))
        site = self._sites.get(key)
        if site is None:
            if len(self._sites) >= SITES_KEPT:
                key = (where, "", "")
            site = self._sites.setdefault(key, _Site())
        now = time.monotonic()
        site.count += 1
        site.last, site.last_at = f"{type(e).__name__}: {e}", now
        what = f"internal error in {where}{detail}"
        if site.count == 1:
            log.error("%s: %s: %s", what, type(e).__name__, e, exc_info=(type(e), e, e.__traceback__))
            site.logged_at = now
        elif now - site.logged_at >= LOG_EVERY:
            log.error("%s: %s: %s (%d times since it was last logged; traceback logged at its first time)",
                      what, type(e).__name__, e, site.unlogged + 1)
            site.logged_at, site.unlogged = now, 0
        else:
            site.unlogged += 1

    async def keep(self, where: str, task: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run background task ``task(*args)`` until it returns; after an exception (recorded)
        run it again, ``BACKOFF_FIRST`` seconds later, doubling up to ``BACKOFF_MAX``."""
        delay = BACKOFF_FIRST
        while True:
            try:
                await task(*args)
                return
            except Exception as e:  # noqa: BLE001 - a bug in a background task never ends the mount
                self.record(where, e, f"; it runs again in {delay:g} s")
            await trio.sleep(delay)
            delay = min(BACKOFF_MAX, delay * 2)

    def snapshot(self) -> FaultCounts:
        """``{"total": n, "by_place": [{"where", "error", "count", "seconds_ago"}, ...]}``."""
        now = time.monotonic()
        return {"total": self.total,
                "by_place": [{"where": where, "error": site.last, "count": site.count,
                              "seconds_ago": round(now - site.last_at, 1)}
                             for (where, _, _), site in sorted(self._sites.items(), key=lambda kv: -kv[1].last_at)]}
