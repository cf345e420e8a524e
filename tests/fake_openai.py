"""A fake OpenAI-compatible server for tests: Chat Completions and Responses, streaming or not.

It speaks the wire protocol, so the real `openai` client and the real Codex CLI run against it
unmodified. Each test scripts the model's turns:

    fake = FakeOpenAI()
    fake.add(Turn(tool_calls=[ToolCall("milestone", {"title": "baseline done"})]),
             Fail(429, retry_after=0.1),
             lambda request: Turn(text="done" if "ok" in str(request) else "again"))
    base_url = await fake.start()          # http://127.0.0.1:PORT/v1
    ...
    fake.requests                           # every request body, in order

A scripted item is a Turn (text and/or tool calls), a Fail (HTTP error, e.g. 429 with
Retry-After, 500), or a function of the request body returning one. When the script runs out,
`default` answers: by default a call of the `finish` tool when the request offers one (the built-in
agent's way to end), else a plain text turn (which ends a Codex turn); or any scripted item, e.g. a
function that answers each request from its body.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

_ids = itertools.count(1)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: f"call_{next(_ids)}")


@dataclass
class Turn:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


@pytest.fixture
async def model_server(monkeypatch):
    """A FakeOpenAI for the built-in agent: the agent's variables point at it (registered for every
    test module by conftest's pytest_plugins)."""
    server = FakeOpenAI()
    await server.start()
    for var in ("GOALTENDER_OPENAI_BASE_URL", "GOALTENDER_OPENAI_API_KEY", "GOALTENDER_COMMAND_POLICY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    monkeypatch.setenv("GOALTENDER_MODEL", "fake-model")
    monkeypatch.setenv("GOALTENDER_OPENAI_TIMEOUT_S", "20")
    yield server
    await server.close()


def finished(summary: str) -> Turn:
    """The built-in agent's last turn: a call of its `finish` tool with the summary."""
    return Turn(tool_calls=[ToolCall("finish", {"summary": summary})])


@dataclass
class Fail:
    status: int
    retry_after: float | None = None
    message: str = "injected failure"


Scripted = Turn | Fail | Callable[[dict], "Turn | Fail"]


@dataclass
class Seen:
    path: str
    body: dict


class FakeOpenAI:
    """`responses=False` is a server without the Responses API (Chat Completions only, as many
    local servers are): /v1/responses is no route, answered 404 as any unknown path."""

    def __init__(self, default: Scripted | None = None, *, responses: bool = True):
        self.script: deque[Scripted] = deque()
        self.default: Scripted = default or _finish_or_text
        self.requests: list[Seen] = []
        self.delay_s = 0.0  # added before every answer (to test timeouts)
        self.models_delay_s = 0.0  # before the list of models (a server slow to answer at all)
        self.responses = responses
        # Dialects of real servers: what /v1/models says of the model (vLLM: {"max_model_len": N}),
        # a llama.cpp-style /props when set, and llama-cpp-python's HTTP 500 for an assistant turn
        # whose content is null.
        self.model_fields: dict[str, Any] = {}
        self.props: dict[str, Any] | None = None
        self.refuse_null_content = False
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def add(self, *items: Scripted) -> None:
        self.script.extend(items)

    async def start(self, port: int = 0) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        if self.responses:
            app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/props", self._props)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self.base_url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- plumbing ----

    async def _next(self, request: web.Request, path: str) -> tuple[dict, Turn | web.Response]:
        body = await request.json()
        self.requests.append(Seen(path, body))
        if self.refuse_null_content and (refused := self._null_content(body)):
            return body, refused
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        item = self.script.popleft() if self.script else self.default
        if callable(item) and not isinstance(item, Turn | Fail):
            item = item(body)
        if isinstance(item, Fail):
            headers = {}
            if item.retry_after is not None:
                headers["retry-after-ms"] = str(int(item.retry_after * 1000))
                headers["retry-after"] = str(max(1, round(item.retry_after)))
            kind = "rate_limit_error" if item.status == 429 else "server_error"
            error = {"error": {"message": item.message, "type": kind, "code": None, "param": None}}
            return body, web.json_response(error, status=item.status, headers=headers)
        return body, item

    async def _models(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.models_delay_s)
        model = {"id": "fake-model", "object": "model", "owned_by": "fake", **self.model_fields}
        return web.json_response({"object": "list", "data": [model]})

    async def _props(self, request: web.Request) -> web.Response:
        if self.props is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        return web.json_response(self.props)

    @staticmethod
    def _null_content(body: dict) -> web.Response | None:
        """llama-cpp-python's answer to an assistant turn with `"content": null` (its request
        model wants a string): HTTP 500 with pydantic's validation errors as the body."""
        for index, message in enumerate(body.get("messages") or []):
            if message.get("role") == "assistant" and message.get("content", "") is None:
                text = (
                    f"1 validation error:\n  {{'type': 'string_type', 'loc': ('body', 'messages', {index}, "
                    "'ChatCompletionRequestAssistantMessage', 'content'), 'msg': 'Input should be a valid "
                    "string', 'input': None}"
                )
                return web.Response(text=text, status=500)
        return None

    @staticmethod
    def _usage_tokens(body: dict, turn: Turn) -> tuple[int, int]:
        prompt = len(json.dumps(body.get("messages") or body.get("input") or "")) // 4 + 1
        completion = (len(turn.text) + sum(len(json.dumps(c.arguments)) for c in turn.tool_calls)) // 4 + 1
        return prompt, completion

    # ---- Chat Completions ----

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body, turn = await self._next(request, "chat")
        if isinstance(turn, web.Response):
            return turn
        model, created, cid = body.get("model", "fake-model"), int(time.time()), f"chatcmpl-{next(_ids)}"
        prompt, completion = self._usage_tokens(body, turn)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        finish = "tool_calls" if turn.tool_calls else "stop"
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in turn.tool_calls
        ]
        if not body.get("stream"):
            message = {"role": "assistant", "content": turn.text or None}
            if calls:
                message["tool_calls"] = calls
            return web.json_response(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    "usage": usage,
                }
            )

        def chunk(delta: dict, finish_reason: str | None = None) -> dict:
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
            }

        chunks = [chunk({"role": "assistant", "content": ""})]
        for piece in _pieces(turn.text):
            chunks.append(chunk({"content": piece}))
        for index, call in enumerate(calls):
            head = {
                "index": index,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            chunks.append(chunk({"tool_calls": [head]}))
            for piece in _pieces(call["function"]["arguments"]):
                chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        chunks.append(chunk({}, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
            )
        return await _sse(request, [(None, c) for c in chunks], done=True)

    # ---- Responses ----

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body, turn = await self._next(request, "responses")
        if isinstance(turn, web.Response):
            return turn
        rid = f"resp_{next(_ids)}"
        prompt, completion = self._usage_tokens(body, turn)
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }
        items: list[dict] = []
        if turn.text:
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{next(_ids)}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": turn.text, "annotations": []}],
                }
            )
        for call in turn.tool_calls:
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{next(_ids)}",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": json.dumps(call.arguments),
                    "status": "completed",
                }
            )

        def response(status: str, output: list[dict], with_usage: bool) -> dict:
            return {
                "id": rid,
                "object": "response",
                "created_at": int(time.time()),
                "status": status,
                "model": body.get("model", "fake-model"),
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": body.get("tool_choice", "auto"),
                "tools": body.get("tools", []),
                "usage": usage if with_usage else None,
                "error": None,
                "incomplete_details": None,
                "instructions": body.get("instructions"),
                "metadata": {},
                "temperature": None,
                "top_p": None,
            }

        if not body.get("stream"):
            return web.json_response(response("completed", items, True))

        events: list[tuple[str, dict]] = [
            ("response.created", {"response": response("in_progress", [], False)})
        ]
        for index, item in enumerate(items):
            if item["type"] == "message":
                events.append(
                    (
                        "response.output_item.added",
                        {"output_index": index, "item": {**item, "status": "in_progress", "content": []}},
                    )
                )
                part = {"type": "output_text", "text": "", "annotations": []}
                events.append(
                    (
                        "response.content_part.added",
                        {"item_id": item["id"], "output_index": index, "content_index": 0, "part": part},
                    )
                )
                for piece in _pieces(turn.text):
                    events.append(
                        (
                            "response.output_text.delta",
                            {
                                "item_id": item["id"],
                                "output_index": index,
                                "content_index": 0,
                                "delta": piece,
                            },
                        )
                    )
                events.append(
                    (
                        "response.output_text.done",
                        {"item_id": item["id"], "output_index": index, "content_index": 0, "text": turn.text},
                    )
                )
                events.append(
                    (
                        "response.content_part.done",
                        {
                            "item_id": item["id"],
                            "output_index": index,
                            "content_index": 0,
                            "part": item["content"][0],
                        },
                    )
                )
            else:
                events.append(
                    (
                        "response.output_item.added",
                        {"output_index": index, "item": {**item, "arguments": "", "status": "in_progress"}},
                    )
                )
                for piece in _pieces(item["arguments"]):
                    events.append(
                        (
                            "response.function_call_arguments.delta",
                            {"item_id": item["id"], "output_index": index, "delta": piece},
                        )
                    )
                events.append(
                    (
                        "response.function_call_arguments.done",
                        {"item_id": item["id"], "output_index": index, "arguments": item["arguments"]},
                    )
                )
            events.append(("response.output_item.done", {"output_index": index, "item": item}))
        events.append(("response.completed", {"response": response("completed", items, True)}))
        return await _sse(request, events, done=False)


def _finish_or_text(body: dict) -> Turn:
    names = {(tool.get("function") or tool).get("name") for tool in body.get("tools") or []}
    if "finish" in names:
        return Turn(tool_calls=[ToolCall("finish", {"summary": "Nothing more to do."})])
    return Turn(text="Nothing more to do.")


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


async def _sse(request: web.Request, events: list[tuple[str | None, dict]], done: bool) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for sequence, (name, data) in enumerate(events):
        if name is not None:
            data = {"type": name, "sequence_number": sequence, **data}
            await response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        else:
            await response.write(f"data: {json.dumps(data)}\n\n".encode())
    if done:
        await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
