"""`goaltender bot` and `goaltender runner` as real subprocesses, configured through their
environment, each start's output in its own log file (tests and the soak kill and restart them)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from helpers import eventually


class Daemon:
    """`goaltender <verb>`: start, SIGKILL, stop (SIGTERM, then SIGKILL), and read its log.
    `program`: what runs the verb (default: this interpreter's `-m goaltender.cli`; a console
    script, as a service starts it); `cwd`: where (default: this process's)."""

    def __init__(
        self,
        verb: str,
        env: dict[str, str],
        logs: Path,
        *,
        program: list[str] | None = None,
        cwd: Path | None = None,
    ):
        self.verb = verb
        self.env = env
        self.logs = logs
        self.program = program or [sys.executable, "-m", "goaltender.cli"]
        self.cwd = cwd
        self.starts = 0
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def log(self) -> Path:
        """This start's log: <logs>/<verb>-<start>.log."""
        return self.logs / f"{self.verb}-{self.starts}.log"

    async def start(self) -> None:
        self.starts += 1
        with self.log.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.program, self.verb, env=self.env, cwd=self.cwd, stdout=out, stderr=out
            )

    def kill(self) -> None:
        """SIGKILL (from anywhere, a fake's handler included); `killed()` waits for the end."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)

    async def killed(self) -> None:
        assert self.proc is not None
        assert await asyncio.wait_for(self.proc.wait(), 30) == -signal.SIGKILL

    async def stop(self, grace: float = 10) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    async def logged(self, *words: str, timeout: float = 30) -> str:
        """The first line of this start's log holding all `words` (waiting for it)."""

        def line() -> str | None:
            return next((each for each in self.lines() if all(w in each for w in words)), None)

        try:
            return await eventually(line, timeout)
        except TimeoutError:
            raise AssertionError(f"no log line with {words}:\n{self.log.read_text()[-4000:]}") from None

    async def wait_linked(self) -> None:
        """A bot: until this start's link to the runner has subscribed (it logs that)."""
        await self.logged("subscribed since seq", timeout=60)
