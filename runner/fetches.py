"""Goals' fetches from the hub, downloaded by the runner itself, outside every sandbox.

The hub cache (RunnerSettings.hub_cache) is shared by every goal and read-only in their sandboxes:
a goal that could write it could plant weights or a pickle that another goal's runs then load,
and run its code as that goal. So a goal's `goaltender fetch` asks the runner (the `fetch`
request), and the runner downloads with the download code operators use (runner/hub.py) in a
process of its own: `python -P -m goaltender.cli fetch --json …`, which reads the hub settings when
it imports huggingface_hub. That process gets the runner's own hub environment, never the
agent's: HF_HUB_CACHE is the shared cache, HF_ENDPOINT, HF_HUB_OFFLINE, HF_HUB_DISABLE_XET and
the timeouts are the box's, and a token only when HF_TOKEN is granted to goals: the runner's
HF_TOKEN, else the token file of its own HF_HOME (`hf auth login`), never one in the cache
directory goals share; without the grant, none at all. The spec was checked
(fetch_spec.spec_problem) and goes as arguments, never through a shell; no code a goal chose runs.

The process tells its milestones and its outcome on stdout, one JSON object a line:
{"milestone": {"title": …, "text": …}}, then {"fetched": HubFetch} or {"failed": "one line"}.

One download of a (type, repo, revision) at a time, across goals: a second waits for the first and
then finds the files cached. A goal downloads MAX_GOAL_DOWNLOADS things at once, and has at most
MAX_GOAL_FETCHES fetches under way (a fetch whose client hung up goes on, so these bound what a
goal can pile up). A fetch runs until it is done, or its goal ends (`stop`, the deadline, …:
`cancel` kills its process), or the runner shuts down.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from goaltender.protocol.fetch_spec import FetchFailed, FetchSpec
from goaltender.runner.config import RunnerSettings
from goaltender.runner.secrets import agent_safe
from goaltender.storage.records import HubFetch

log = logging.getLogger("goaltender.runner")

Report = Callable[[str, str], Awaitable[None]]  # (title, details): a milestone of the goal
Key = tuple[str, str, str]  # (type, repo, revision)
MAX_GOAL_DOWNLOADS = 4  # a goal's downloads at once (a process each); its other fetches wait
MAX_GOAL_FETCHES = 32  # a goal's fetches under way, waiting ones included; more are refused
STDERR_LINES = 20  # the download's last lines of stderr, kept to say why it ended without a result
OUTCOME_LINE = 1024 * 1024  # bytes a line of the download's stdout may hold
TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE")
_CREDENTIALS_IN_URL = re.compile(r"(?<=//)[^/\s@]+@")


def fetch_environment(settings: RunnerSettings, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The download's environment: the runner's, less what goals are not granted, with the shared
    hub cache. Without HF_TOKEN among the grants it has no token at all (huggingface_hub would read
    one from a token file), so a goal gets no access through the runner it would not have had."""
    env = agent_safe(environ, settings)
    env["HF_HUB_CACHE"] = str(settings.hub_cache)
    if "HF_TOKEN" in settings.grants:  # a login's token file: the runner's own, not HF_HOME's below
        env.setdefault("HF_TOKEN_PATH", str(_own_token_file(environ)))
    else:
        for name in TOKEN_VARIABLES:
            env.pop(name, None)
        env["HF_TOKEN_PATH"] = os.devnull
    env.setdefault("HF_HOME", str(settings.cache_dir / "huggingface"))  # its other caches (xet)
    return env


def _own_token_file(environ: Mapping[str, str]) -> Path:
    """Where huggingface_hub in the runner itself would find a login's token: $HF_HOME/token, by
    default under ~/.cache (the cache directory that goals' HF_HOME once was is no place to trust)."""
    cache = environ.get("XDG_CACHE_HOME", "~/.cache")
    home = environ.get("HF_HOME", os.path.join(cache, "huggingface"))
    return Path(os.path.expandvars(os.path.expanduser(home))) / "token"


def download_command(spec: FetchSpec, keep_free: int) -> list[str]:
    """The download process's argv. `-P`: its working directory is not on its import path, where a
    goal could have planted a package named goaltender (its cache directory, say). Every value
    rides in its option's own word (`--revision=…`), and the repo after `--`: none can be read as
    another option."""
    argv = [sys.executable, "-P", "-m", "goaltender.cli", "fetch", "--json", f"--keep-free={keep_free}"]
    argv.append(f"--type={spec.repo_type}")
    if spec.revision is not None:
        argv.append(f"--revision={spec.revision}")
    argv += [f"--include={pattern}" for pattern in spec.include]
    return [*argv, "--", spec.repo]


@dataclass
class _Turn:
    """The fetches of one (type, repo, revision): one downloads, the rest wait."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    fetches: int = 0


@dataclass
class _GoalFetches:
    """One goal's fetches: under way (downloading, or waiting their turn), a few downloading."""

    jobs: set[asyncio.Task[HubFetch]] = field(default_factory=set)
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_GOAL_DOWNLOADS))
    downloading: int = 0


class HubFetches:
    """The downloads goals asked for: one process each, killed when its goal ends."""

    def __init__(self, settings: RunnerSettings):
        self.settings = settings
        self._turns: dict[Key, _Turn] = {}
        self._goals: dict[int, _GoalFetches] = {}
        self._why_cancelled: dict[asyncio.Task[HubFetch], str] = {}

    async def fetch(self, goal_id: int, spec: FetchSpec, report: Report) -> HubFetch:
        """Download what `spec` names into the shared cache (or find it there); FetchFailed says
        why not, in one line."""
        goal = self._goals.setdefault(goal_id, _GoalFetches())
        if len(goal.jobs) >= MAX_GOAL_FETCHES:
            raise FetchFailed(
                f"goal #{goal_id} has {MAX_GOAL_FETCHES} fetches under way, its most: fetch {spec.what} "
                "once some of them have ended"
            )
        job = asyncio.ensure_future(self._in_turn(goal, spec, report))
        goal.jobs.add(job)
        try:
            return await job  # cancelling this request cancels the job too
        except asyncio.CancelledError:
            why = self._why_cancelled.pop(job, None)
            current = asyncio.current_task()
            if why is None or (current is not None and current.cancelling()):
                raise
            raise FetchFailed(f"the fetch of {spec.what} was cancelled: {why}") from None
        finally:
            goal.jobs.discard(job)
            if not goal.jobs:
                self._goals.pop(goal_id, None)

    def under_way(self, goal_id: int) -> tuple[int, int]:
        """The goal's fetches (downloading, waiting: for one of its download slots, or for
        another fetch's download of the same repo)."""
        goal = self._goals.get(goal_id)
        return (0, 0) if goal is None else (goal.downloading, len(goal.jobs) - goal.downloading)

    async def cancel(self, goal_id: int, why: str) -> None:
        """The goal ends: its fetches stop (their processes killed) and answer `why`."""
        goal = self._goals.get(goal_id)
        jobs = list(goal.jobs) if goal is not None else []
        for job in jobs:
            self._why_cancelled[job] = why
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)

    async def close(self) -> None:
        """The runner shuts down: every download stops."""
        for goal_id in list(self._goals):
            await self.cancel(goal_id, "the runner is shutting down; fetch again once it is back")

    async def _in_turn(self, goal: _GoalFetches, spec: FetchSpec, report: Report) -> HubFetch:
        async with goal.slots, self._turn(_key(spec)):
            goal.downloading += 1
            try:
                return await self._download(spec, report)
            finally:
                goal.downloading -= 1

    @contextlib.asynccontextmanager
    async def _turn(self, key: Key) -> AsyncIterator[None]:
        turn = self._turns.setdefault(key, _Turn())
        turn.fetches += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.fetches -= 1
            if not turn.fetches:
                del self._turns[key]

    async def _download(self, spec: FetchSpec, report: Report) -> HubFetch:
        keep_free = int(self.settings.min_free_mb * 1e6)
        proc = await asyncio.create_subprocess_exec(
            *download_command(spec, keep_free),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=fetch_environment(self.settings),
            start_new_session=True,  # its own process group, killed whole
            limit=OUTCOME_LINE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        errors: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        reading_errors = asyncio.ensure_future(_collect(proc.stderr, errors))
        try:
            outcome = await self._outcome(proc.stdout, report)
            code = await proc.wait()
            await reading_errors
        finally:
            if proc.returncode is None:  # cancelled: the goal ended, or the runner stops
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
            reading_errors.cancel()
        if isinstance(outcome, HubFetch):
            return outcome
        if outcome is not None:
            raise FetchFailed(_without_credentials(outcome))
        last = errors[-1] if errors else "it said nothing"
        log.warning("the download of %s ended with code %s: %s", spec.what, code, "\n".join(errors))
        raise FetchFailed(
            f"the download of {spec.what} ended without a result (exit code {code}): "
            f"{_without_credentials(last)[:300]}"
        )

    async def _outcome(self, stdout: asyncio.StreamReader, report: Report) -> HubFetch | str | None:
        """Milestones reported as they come; then what was fetched, or why not (None: neither)."""
        outcome: HubFetch | str | None = None
        while line := await _line(stdout):
            try:
                said = json.loads(line)
                if "milestone" in said:
                    await _report(report, said["milestone"]["title"], said["milestone"]["text"])
                elif "fetched" in said:
                    outcome = HubFetch.model_validate(said["fetched"])
                elif "failed" in said:
                    outcome = str(said["failed"])
            except (ValueError, TypeError, KeyError, ValidationError) as exc:  # ours: a bug, said once
                log.warning("a line from a download was not understood (%s): %.200r", exc, line)
        return outcome


def _without_credentials(text: str) -> str:
    """`text` without the user:password@ of any URL in it (a mirror's address may carry them, and
    huggingface_hub's errors quote it)."""
    return _CREDENTIALS_IN_URL.sub("", text)


def _key(spec: FetchSpec) -> Key:
    return (spec.repo_type, spec.repo, spec.revision or "main")


async def _report(report: Report, title: str, text: str) -> None:
    try:
        await report(title, text)
    except Exception:  # progress is a courtesy: the download goes on, its record says what counts
        log.exception("a fetch's milestone %r was not recorded", title)


async def _collect(stream: asyncio.StreamReader, lines: collections.deque[str]) -> None:
    while chunk := await _line(stream):
        if text := chunk.decode(errors="replace").strip():
            lines.append(text)


async def _line(stream: asyncio.StreamReader) -> bytes:
    """The next line (b"" at the end); one over OUTCOME_LINE is skipped, as none of ours is."""
    while True:
        try:
            return await stream.readline()
        except ValueError:  # over the limit: asyncio dropped what it had read of it
            continue
