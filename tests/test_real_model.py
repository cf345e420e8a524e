"""The built-in agent against a real model: llama-cpp-python's server with SmolLM2-135M-Instruct
(tests/llama_server.py; `make llama-venv` builds it), the real runner, the real agent process and
the real `openai` client, with no fake between the agent and the model's weights.

A 135M model chooses poorly, so the test judges the product's handling, not the research: the
goal names the exact tool call to make (the star-count workload through run_experiment), and the
test checks that the goal starts, that what the model returns becomes real tool calls, that the
experiment lands in the ledger, and that the goal ends, saying why, within its budget (one
experiment; the loop ends one turn after it meets the stop rule, well inside a cap of four turns).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from helpers import events_until_report, submit
from llama_server import CONTEXT_TOKENS, MODEL_ALIAS, RealModel

from goaltender.protocol import messages as p
from goaltender.storage.records import AGENT_LOG, FinalReport

AGENTS = {"openai": [sys.executable, "-m", "goaltender.agents.openai_agent"]}
WORKLOAD = "python -m goaltender.environments.star_count.workload"
GOAL = (
    f"Call run_experiment with command `{WORKLOAD}`, description `baseline` and metric "
    "`exact_accuracy`. Max 1 experiments"
)
MAX_TURNS = 4  # a guard: the goal ends one turn after its experiment meets the stop rule
REQUEST_TIMEOUT_S = 150  # a turn whose arguments run on until the window is full takes ~2 min


@pytest.fixture
async def real_model(tmp_path, monkeypatch):
    """The real server and its tap; the built-in agent pointed at it, its window the server's."""
    async with RealModel.running(tmp_path / "llama") as model:
        for var in ("GOALTENDER_OPENAI_BASE_URL", "GOALTENDER_OPENAI_API_KEY", "GOALTENDER_COMMAND_POLICY"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")
        monkeypatch.setenv("GOALTENDER_MODEL", MODEL_ALIAS)
        monkeypatch.setenv("GOALTENDER_CONTEXT_TOKENS", str(CONTEXT_TOKENS))
        monkeypatch.setenv("GOALTENDER_MAX_TURNS", str(MAX_TURNS))
        monkeypatch.setenv("GOALTENDER_OPENAI_TIMEOUT_S", str(REQUEST_TIMEOUT_S))
        monkeypatch.setenv("GOALTENDER_OPENAI_MAX_RETRIES", "0")
        monkeypatch.setenv("GOALTENDER_TEMPERATURE", "0")  # the server's own default is 0.8
        # The brief, the tools and the autoresearch skill fill most of SmolLM2's 8k: replies get 512.
        monkeypatch.setenv("GOALTENDER_MAX_OUTPUT_TOKENS", "512")
        monkeypatch.setenv("GOALTENDER_SEED", "1234")
        yield model


async def test_a_goal_runs_on_a_real_model(start_runner, connect, real_model):
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    started = time.monotonic()
    goal_id = await submit(client, GOAL, agent="openai")
    events = await events_until_report(client, goal_id, timeout=MAX_TURNS * REQUEST_TIMEOUT_S + 60)
    took = time.monotonic() - started
    summary = await client.request(p.Summary(goal_id=goal_id))
    goal = summary.status.goal
    log = (Path(goal.workspace) / AGENT_LOG).read_text()
    seen = f"agent.log:\n{log[-3000:]}\nthe model's turns:\n{real_model.transcript()}"

    # The goal started and its agent asked the real model, with the tools, for a turn.
    assert events[0].data.kind == "goal_accepted"
    first = real_model.chats[0]
    assert first.request is not None and first.request["model"] == MODEL_ALIAS
    assert {t["function"]["name"] for t in first.request["tools"]} >= {"run_experiment", "finish"}
    assert first.status == 200 and first.tool_calls, seen
    # What the model returned became real tool calls: the agent ran and logged each.
    [call] = first.tool_calls[:1]
    assert f"turn 1: {call['function']['name']}(" in log, seen
    # The experiment landed in the ledger, run and judged by the runner (whatever the model
    # made of the command: a 135M model copies a command line from the brief, not the goal's).
    assert len(summary.ledger) == 1, seen
    [row] = summary.ledger
    assert row.status in ("keep", "discard", "crash") and row.command, row
    # The turn after the experiment carried its call and result back ("content": "", which the
    # server requires), and the server took it.
    ran = next(i for i, chat in enumerate(real_model.chats) if _called(chat, "run_experiment"))
    after = real_model.chats[ran + 1]
    assert after.request is not None and after.status == 200, seen
    turns = [m for m in after.request["messages"] if m["role"] == "assistant"]
    assert turns and all(m["content"] == "" for m in turns if m.get("tool_calls")), seen
    results = [m["content"] for m in after.request["messages"] if m["role"] == "tool"]
    assert any(r.startswith(f"Experiment #{row.index}: {row.status}") for r in results), seen
    # The goal ended, saying why, within its budget: the experiment met the stop rule (1/1), and
    # the loop ended one turn later or when the model called finish; never at the turn cap.
    report = events[-1].data
    assert isinstance(report, FinalReport)
    assert (goal.state, report.end_reason) == ("finished", "the agent finished"), f"{goal.end_reason}\n{seen}"
    assert len(real_model.chats) <= MAX_TURNS, seen
    assert "done after" in log and ("the stop rule was met" in log or "the model called finish" in log), seen
    print(
        f"{len(real_model.chats)} model turns in {took:.0f} s; experiment #{row.index}: {row.status} {row.command}"
    )


def _called(chat, name: str) -> bool:
    return any(call["function"]["name"] == name for call in chat.tool_calls)
