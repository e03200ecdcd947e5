"""A credential provider that outlives a failed refresh: what every cloud's provider is wrapped in.

``Kept(fetch, why, what)`` is an obstore credential provider (a callable returning the
credential dict, with its ``expires_at``) around ``fetch`` (the vendor library's provider).
obstore calls it again when the credential it holds nears its expiry; a ``fetch`` that then
fails is logged once (``what``, ``why(error)``: one line, no secret), the credential held is
returned again, and ``fetch`` is retried every ``RETRY_AFTER`` seconds (the server, not the
clock, decides when the old credential stops working: until then reads go on); the first
success after failures is logged too. A failure of the very first ``fetch`` is raised.
Thread-safe. ``quiet`` holds the vendors' loggers back.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

log = logging.getLogger("shardfs")
RETRY_AFTER = 5.0  # seconds between attempts after a failed refresh


def quiet(*loggers: str) -> None:
    """Hold a vendor library's loggers at ERROR, whatever the root level: at DEBUG they print
    requests and answers, where token services return secrets."""
    for name in loggers:
        logging.getLogger(name).setLevel(logging.ERROR)


class Kept:
    def __init__(self, fetch: Callable[[], dict[str, Any]], why: Callable[[Exception], str], what: str):
        self._fetch, self._why, self.what = fetch, why, what
        self._lock = threading.Lock()
        self._last: dict[str, Any] | None = None
        self._next_try = 0.0
        self._failing = False

    def __call__(self) -> dict[str, Any]:
        with self._lock:
            if self._last is not None and time.monotonic() < self._next_try:
                return self._last
            try:
                got = self._fetch()
            except Exception as e:
                if self._last is None:
                    raise
                self._next_try = time.monotonic() + RETRY_AFTER
                if not self._failing:
                    self._failing = True
                    log.warning("%s: refresh failed (%s): retrying every %.0f s; the current ones expire at %s",
                                self.what, self._why(e), RETRY_AFTER, self._last.get("expires_at"))
                return self._last
            if self._failing:
                self._failing = False
                log.info("%s: refreshed again", self.what)
            self._last = got
            return got
