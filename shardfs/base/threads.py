"""Blocking calls made from the trio thread."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import trio

T = TypeVar("T")


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking call off the trio thread (a cancelled caller waits for it to end)."""
    return await trio.to_thread.run_sync(fn, *args)


async def blocking_read(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking call that changes nothing (a read of the source) off the trio thread; a
    cancelled caller stops waiting for it at once (the call runs on in its thread, its outcome
    dropped). So the end of a mount never waits for a read nobody needs any more: a shard's
    index read ahead from a hung store held a worker up to ``-o timeout`` after its unmount."""
    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
