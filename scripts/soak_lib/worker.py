"""Entry point of one client process of the soak: ``python -m soak_lib.worker CONFIG.json``.

Run under zarr 2.18's venv (lib ``zarr2``) or the main venv (``zarr3``, ``tensorstore``, raw
POSIX writers); imports numpy, numcodecs, the chosen library, and ``grid``/``readers``/``writers``
next to it, never shardfs. The config (written by the controller) names the ``role`` (reader,
writer, structure), ``lib``, ``worker`` (its name), ``index`` (its heartbeat slot and token
base), ``seed``, ``deadline`` (a ``time.monotonic()`` value), ``log`` (its JSONL op log),
``heartbeat`` (a file of 8-byte slots) and the role's parameters.

Contract: every operation is logged as one JSON line, flushed at once (a write also logs a
``begin`` line *before* it starts, so the controller knows every write in flight); while an
operation runs, the worker's heartbeat slot holds its start time (0 when idle), so the controller
can name one that hangs. An operation's failure never ends the worker (it pauses ``ERROR_PAUSE``): it is logged with
``err`` = the errno's name (``EIO``...) when the error carries one, else ``X:<type>: <message>``,
and ``msg`` = the exception in one line (``Worker.detail``: which file, for the report).
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import struct
import sys
import time
from typing import Any, Callable


ERROR_PAUSE = 0.2


class Worker:
    """What every role shares: the config, the op log, the heartbeat and error naming."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.name: str = config["worker"]
        self.rng = random.Random(config["seed"])
        self.deadline: float = config["deadline"]
        self._log = open(config["log"], "a", buffering=1)
        self._hb = os.open(config["heartbeat"], os.O_RDWR)
        self._slot = 8 * config["index"]
        self.seq = 0
        self.detail = ""  # the last failed operation's exception, one line (its file name, for the report)

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    def log(self, record: dict[str, Any]) -> None:
        self._log.write(json.dumps(record, separators=(",", ":")) + "\n")

    def beat(self, start: float) -> None:
        os.pwrite(self._hb, struct.pack("d", start), self._slot)

    def timed(self, fn: Callable[[], Any]) -> tuple[float, float, Any, str | None]:
        """Run ``fn`` under the heartbeat: (start, end, result or None, error name or None)."""
        t0 = time.monotonic()
        self.beat(t0)
        self.detail = ""
        try:
            result, err = fn(), None
        except Exception as e:  # any client failure is data for the controller, never fatal
            result, err = None, error_name(e)
            self.detail = f"{type(e).__name__}: {e}"[:300]
        t1 = time.monotonic()
        self.beat(0.0)
        if err is not None:
            time.sleep(ERROR_PAUSE)  # a dead mount fails at once: no busy loop
        return t0, t1, result, err


_OS_ERROR = re.compile(r"(?:OS error|errno|error code)[ :=]*(\d+)", re.I)
_STRERROR = {os.strerror(n): errno.errorcode[n] for n in errno.errorcode}


def error_name(e: BaseException) -> str:
    """The errno name an exception (or one in its chain) carries, else ``X:<type>: <message>``."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None and seen.errno in errno.errorcode:
            return errno.errorcode[seen.errno]
        seen = seen.__cause__ or seen.__context__
    text = str(e)
    m = _OS_ERROR.search(text)
    if m and int(m.group(1)) in errno.errorcode:
        return errno.errorcode[int(m.group(1))]
    for message, name in _STRERROR.items():
        if message and message in text:
            return name
    return f"X:{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"


def main() -> None:
    with open(sys.argv[1]) as f:
        config = json.load(f)
    worker = Worker(config)
    if config["role"] == "reader":
        from soak_lib.readers import run_reader as run
    elif config["role"] == "writer":
        from soak_lib.writers import run_writer as run
    else:
        from soak_lib.writers import run_structure as run
    run(worker)


if __name__ == "__main__":
    main()
