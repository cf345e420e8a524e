"""The fake OpenAI server speaks the wire protocol the real `openai` client expects."""

from __future__ import annotations

import json

import openai
import pytest
from fake_openai import Fail, FakeOpenAI, ToolCall, Turn

TOOLS = [
    {
        "type": "function",
        "function": {"name": "milestone", "parameters": {"type": "object", "properties": {}}},
    }
]


@pytest.fixture
async def fake():
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.close()


async def test_chat_tool_call_round_trip(fake):
    fake.add(Turn(tool_calls=[ToolCall("milestone", {"title": "baseline 25%"})]), Turn(text="done"))
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k")
    first = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}], tools=TOOLS
    )
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "milestone" and json.loads(call.function.arguments) == {
        "title": "baseline 25%"
    }
    assert first.choices[0].finish_reason == "tool_calls" and first.usage.total_tokens > 0
    second = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
    assert second.choices[0].message.content == "done"
    assert [r.path for r in fake.requests] == ["chat", "chat"]


async def test_chat_streaming_accumulates_tool_call_fragments(fake):
    fake.add(
        Turn(text="thinking about it", tool_calls=[ToolCall("milestone", {"title": "a long title here"})])
    )
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k")
    stream = await client.chat.completions.create(
        model="m", messages=[], tools=TOOLS, stream=True, stream_options={"include_usage": True}
    )
    text, args, name, usage = "", "", None, None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                name = name or call.function.name
                args += call.function.arguments or ""
    assert text == "thinking about it" and name == "milestone"
    assert json.loads(args) == {"title": "a long title here"} and usage.total_tokens > 0


async def test_responses_api_streaming_and_not(fake):
    fake.add(Turn(tool_calls=[ToolCall("milestone", {"title": "t"}, id="call_x")]), Turn(text="all done"))
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k")
    response = await client.responses.create(model="m", input="go")
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.call_id == "call_x" and json.loads(call.arguments) == {"title": "t"}
    events = [event async for event in await client.responses.create(model="m", input="go", stream=True)]
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "all done"


async def test_429_with_retry_after_is_retried_by_the_client(fake):
    fake.add(Fail(429, retry_after=0.05), Fail(503), Turn(text="finally"))
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=3)
    reply = await client.chat.completions.create(model="m", messages=[])
    assert reply.choices[0].message.content == "finally" and len(fake.requests) == 3
    fake.add(Fail(500), Fail(500))
    with pytest.raises(openai.InternalServerError):
        await client.with_options(max_retries=1).chat.completions.create(model="m", messages=[])
