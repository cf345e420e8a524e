"""The campaigns' background tasks (deadline timers, disk watches, prompts, queue notes), kept so
that the runner's shutdown can cancel every one of them and none is collected while it runs."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class TaskSet:
    """Tasks started with `spawn`, each held until it is done."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def cancel_all(self) -> None:
        for task in self._tasks:
            task.cancel()
