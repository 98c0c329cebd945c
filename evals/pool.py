"""The suites' bounded worker pool: each item handled once, at most `concurrency` at a time.

The WER suite's transcriptions and the drift suite's prompt passes share it. Workers pull from one
iterator, so items start in order; the first failure (a `SuiteAborted` when the run is stopped)
cancels the other workers and is raised, and no task is left running when it returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def each(items: Sequence[T], concurrency: int, handle: Callable[[T], Awaitable[None]]) -> None:
    """`await handle(item)` for every item, at most `concurrency` at once."""
    pending = iter(items)  # shared by the workers; the event loop never runs two `next` at once

    async def worker() -> None:
        for item in pending:
            await handle(item)

    workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(items)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
