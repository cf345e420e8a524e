"""What the built-in agent's first request costs, part by part: the system brief, each tool's
schema and all of them, the first user message.

`goaltender demo --yes --agent openai` (the real runner and agent) runs against the project's fake
OpenAI server (tests/fake_openai.py), which keeps the request and answers that there is nothing
more to do. Bytes are the JSON each part takes in the request. Tokens are SmolLM2's, counted by
llama-cpp-python's server (`/extras/tokenize`) when its venv is built (`make llama-venv`), else
estimated as bytes / 4. With the server, the whole request is also sent to it twice with
`max_tokens` 1, once as it is and once without its tools: `usage.prompt_tokens` of each is the
prompt as that server's chat template renders it (chatml-function-calling shows a tool as its
name and parameters, without its description, so tools cost less there than on the wire).

    python benchmarks/bench_prompt.py [--goal TEXT] [--no-model]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))  # the fake OpenAI server and the llama.cpp server's helpers

from fake_openai import FakeOpenAI  # noqa: E402
from llama_server import MODEL_ALIAS, RealModel, find_llama_venv  # noqa: E402

from goaltender.demo import LLM_GOAL  # noqa: E402


async def first_request(goal: str, directory: Path) -> dict[str, Any]:
    """The body of the agent's first chat completion request for `goal`."""
    fake = FakeOpenAI()
    await fake.start()
    try:
        env = {
            **os.environ,
            "NO_COLOR": "1",
            "OPENAI_BASE_URL": fake.base_url,
            "GOALTENDER_MODEL": MODEL_ALIAS,
        }
        env.pop("GOALTENDER_HOME", None)
        command = [sys.executable, "-m", "goaltender.cli", "demo", "--yes", "--agent", "openai"]
        done = await asyncio.to_thread(
            subprocess.run,
            [*command, "--dir", str(directory / "demo"), goal],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        chats = [seen.body for seen in fake.requests if seen.path == "chat"]
        if done.returncode != 0 or not chats:
            raise SystemExit(
                f"the demo asked the model nothing:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
        return chats[0]
    finally:
        await fake.close()


def parts(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, JSON text) of each part of a request, in the order it is sent."""
    found = []
    for message in body["messages"]:
        name = "system brief" if message["role"] == "system" else f"{message['role']} message"
        found.append((name, json.dumps(message["content"], ensure_ascii=False)))
    for tool in body.get("tools", []):
        found.append((f"tool {tool['function']['name']}", json.dumps(tool, ensure_ascii=False)))
    return found


class Tokens:
    """Token counts from the llama.cpp server, or estimates (bytes / 4) without one."""

    def __init__(self, session: aiohttp.ClientSession | None, upstream: str = ""):
        self.session = session
        self.upstream = upstream
        self.empty = 0

    @property
    def measured(self) -> bool:
        return self.session is not None

    async def start(self) -> None:
        if self.session is not None:  # what tokenizing nothing yields (a BOS token) is not the text's
            self.empty = await self._tokenize("")

    async def count(self, text: str) -> int:
        if self.session is None:
            return round(len(text.encode()) / 4)
        return await self._tokenize(text) - self.empty

    async def _tokenize(self, text: str) -> int:
        assert self.session is not None
        async with self.session.post(f"{self.upstream}/extras/tokenize/count", json={"input": text}) as r:
            return int((await r.json())["count"])

    async def prompt_tokens(self, body: dict[str, Any]) -> int:
        """The request's prompt as the server renders it (`usage.prompt_tokens`, max_tokens 1)."""
        assert self.session is not None
        request = {**body, "max_tokens": 1, "temperature": 0}
        if body.get("tools"):  # a named tool: the auto choice ignores max_tokens
            request["tool_choice"] = {
                "type": "function",
                "function": {"name": body["tools"][-1]["function"]["name"]},
            }
        async with self.session.post(f"{self.upstream}/v1/chat/completions", json=request) as r:
            answer = await r.json()
            if r.status != 200:
                raise SystemExit(f"the server refused the request: {r.status} {answer}")
            return int(answer["usage"]["prompt_tokens"])


async def report(body: dict[str, Any], tokens: Tokens) -> None:
    what = "SmolLM2 tokens" if tokens.measured else "~tokens (bytes/4)"
    rows = [(name, len(text.encode()), await tokens.count(text)) for name, text in parts(body)]
    tools = [row for row in rows if row[0].startswith("tool ")]
    others = [row for row in rows if not row[0].startswith("tool ")]
    total_bytes = len(json.dumps(body, ensure_ascii=False).encode())
    print(f"The built-in agent's first request: {total_bytes:,} bytes of JSON, {len(tools)} tools")
    print()
    print(f"| part | bytes | {what} |")
    print("|---|---:|---:|")
    for name, size, count in others:
        print(f"| {name} | {size:,} | {count:,} |")
    print(f"| all {len(tools)} tool schemas | {sum(r[1] for r in tools):,} | {sum(r[2] for r in tools):,} |")
    for name, size, count in sorted(tools, key=lambda row: -row[1]):
        print(f"| &nbsp;&nbsp;{name} | {size:,} | {count:,} |")
    print(f"| sum of the parts | {sum(r[1] for r in rows):,} | {sum(r[2] for r in rows):,} |")
    if tokens.measured:
        whole = await tokens.prompt_tokens(body)
        bare = await tokens.prompt_tokens(
            {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
        )
        print()
        print(f"prompt_tokens of the whole request, as the server renders it: {whole:,}")
        print(f"prompt_tokens without its tools: {bare:,} (the tools as rendered: {whole - bare:,})")


async def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--goal", default=LLM_GOAL, help="the goal's text (default: the LLM demo's goal)")
    parser.add_argument("--no-model", action="store_true", help="estimate tokens; start no llama.cpp server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-prompt-") as scratch:
        body = await first_request(args.goal, Path(scratch))
        venv = None if args.no_model else find_llama_venv()
        if venv is None:
            await report(body, Tokens(None))
            if not args.no_model:
                print("\n(no llama.cpp venv: tokens estimated; `make llama-venv` builds it)")
            return 0
        model = RealModel(venv, Path(scratch) / "llama")
        try:
            await model.start()
            async with aiohttp.ClientSession() as session:
                tokens = Tokens(session, model.upstream)
                await tokens.start()
                await report(body, tokens)
        finally:
            await model.stop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
