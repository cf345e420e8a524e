"""What the tests share that is not a fixture: waiting on a condition (`eventually`), shell-script
agents, goals submitted and followed to their report, approvals as a thread shows them, and how the
runner records an operator. Imported as `from helpers import …` (pytest puts tests/ on the path);
conftest.py holds the fixtures.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
from fake_slack import FakeSlack

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.storage.records import Approval, ApprovalRequested, Event, FinalReport

BIN = str(Path(sys.executable).parent)


async def bot_check(fake: FakeSlack, runner_socket: Path, home: Path, **env: str) -> tuple[int, str]:
    """The real `goaltender bot --check` against the fake Slack and one runner named box: its exit
    code and its output. `env` adds to or overrides its environment (SLACK_BOT_TOKEN=…)."""
    full = {
        **os.environ,
        "SLACK_BOT_TOKEN": fake.bot_token,
        "SLACK_APP_TOKEN": fake.app_token,
        "GOALTENDER_SLACK_API_URL": fake.api_url,
        "GOALTENDER_HOME": str(home),
        "GOALTENDER_RUNNERS": json.dumps([{"name": "box", "socket": str(runner_socket)}]),
        **env,
    }
    full.pop("GOALTENDER_CONFIG", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "goaltender.cli", "bot", "--check",
        env=full, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, out.decode()


async def eventually(predicate, timeout: float = 20.0, interval: float = 0.05):
    """Poll `predicate()` (plain or async) until it is truthy and return that value.

    The one way tests wait for something to happen: on a signal (a row stored, an event recorded,
    a post made), never after a fixed sleep. A hang becomes a TimeoutError naming the predicate."""

    async def check():
        result = predicate()
        return await result if inspect.isawaitable(result) else result

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (result := await check()):
        if loop.time() > deadline:
            raise TimeoutError(
                f"timed out after {timeout}s waiting for {getattr(predicate, '__qualname__', predicate)}"
            )
        await asyncio.sleep(interval)
    return result


async def closing(done, what: str, timeout: float = 60.0) -> None:
    """Await a teardown; a hang becomes a failure that shows where every task is stuck."""
    task = asyncio.ensure_future(done)
    finished, _ = await asyncio.wait({task}, timeout=timeout)
    if finished:
        return task.result()
    for each in asyncio.all_tasks():
        each.print_stack(file=sys.stderr)
    task.cancel()
    raise AssertionError(f"closing the {what} hung for {timeout}s (task stacks on stderr)")


def vouched(name: str, client: str = "test") -> str:
    """How the runner records `name` given by an operator client (this test's user) named `client`."""
    return f"{name} via {client} (uid {os.getuid()})"


def host_pid(sandboxed_pid: int, sandbox: int) -> int | None:
    """The pid, as this test sees it, of the process that is `sandboxed_pid` inside the sandbox led
    by `sandbox` (an agent's pid as the runner records it): the sandbox has a pid namespace."""
    for line_of in _descendants_status(sandbox):
        ns_pids = next((line.split()[1:] for line in line_of[1] if line.startswith("NSpid:")), [])
        if ns_pids and int(ns_pids[-1]) == sandboxed_pid:
            return line_of[0]
    return None


def _descendants_status(leader: int) -> list[tuple[int, list[str]]]:
    found = []
    try:
        children = psutil.Process(leader).children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            found.append((child.pid, Path(f"/proc/{child.pid}/status").read_text().splitlines()))
        except OSError:
            continue
    return found


def write_agent(directory: Path, name: str, script: str) -> list[str]:
    """A shell-script agent; returns its command."""
    path = directory / name
    path.write_text("#!/bin/bash\nset -u\n" + script)
    path.chmod(0o755)
    return [str(path)]


async def events_until_report(client: RunnerClient, goal_id: int, timeout: float = 60) -> list[Event]:
    """Subscribe to a goal and collect its events until the final report arrives."""
    events: list[Event] = []

    async def collect():
        await client.subscribe(since=0, goal_id=goal_id)
        async for event in client.events():
            events.append(event)
            if isinstance(event.data, FinalReport):
                return

    await asyncio.wait_for(collect(), timeout)
    return events


async def approval_prompts(client: RunnerClient, goal_id: int) -> AsyncIterator[Approval]:
    """The goal's approval prompts as a person watching its thread sees them, oldest first."""
    await client.subscribe(goal_id=goal_id)
    async for event in client.events():
        if isinstance(event.data, ApprovalRequested):
            yield event.data.approval


async def pending_approval(client: RunnerClient, goal_id: int, kind: str | None = None) -> Approval | None:
    """The goal's oldest pending approval (of `kind`), as its status shows it; None when there is
    none (a predicate for `eventually`)."""
    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    return next((a for a in status.pending_approvals if kind is None or a.kind == kind), None)


async def submit(client: RunnerClient, text: str, **fields) -> int:
    reply = await client.request(p.SubmitGoal(text=text, **fields))
    return reply.status.goal.id


def blocks_text(msg) -> str:
    return msg.text + json.dumps(msg.blocks or [])
