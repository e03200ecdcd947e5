"""Blocking calls made from the trio thread."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import trio

T = TypeVar("T")


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking call off the trio thread."""
    return await trio.to_thread.run_sync(fn, *args)
