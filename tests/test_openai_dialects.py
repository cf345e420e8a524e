"""The built-in agent against servers as they are (issue 36): their dialects (null content, max_tokens
vs max_completion_tokens, the window they state or refuse with), their errors in their own words, and a
model that talks instead of calling tools, repeats itself, or goes on past a met stop rule. The real
runner and agent process; a fake OpenAI-compatible server (tests/fake_openai.py) that answers as
llama-cpp-python, vLLM and OpenAI do."""

from __future__ import annotations

import json

from fake_openai import Fail, ToolCall, Turn, finished
from helpers import events_until_report, submit
from test_openai_agent import AGENTS, system_text, tool_results, user_texts, within_window

from goaltender.protocol import messages as p

BASELINE = ToolCall(
    "run_experiment",
    {"command": ["python", "-c", "print('acc: 0.5')"], "description": "baseline", "metric": "acc"},
)


async def run_goal(start_runner, connect, text: str, timeout: float = 40):
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, text, agent="openai")
    events = await events_until_report(client, goal_id, timeout=timeout)
    summary = await client.request(p.Summary(goal_id=goal_id))
    return events, summary


def assistant_turns(body: dict) -> list[dict]:
    return [m for m in body["messages"] if m["role"] == "assistant"]


# ---- dialects ----


async def test_tool_call_turns_go_back_with_string_content(start_runner, connect, model_server):
    """llama-cpp-python refuses `"content": null` with HTTP 500 (turn 2 used to fail the goal)."""
    model_server.refuse_null_content = True
    model_server.add(Turn(tool_calls=[ToolCall("list_files", {})]), finished("listed FILES-MARK"))
    events, summary = await run_goal(start_runner, connect, "list the files, max 1 experiments")
    assert summary.status.goal.state == "finished" and "FILES-MARK" in events[-1].data.text
    [turn] = assistant_turns(model_server.requests[1].body)
    assert turn["content"] == "" and turn["tool_calls"][0]["function"]["name"] == "list_files"


async def test_sampling_settings_and_max_tokens_reach_the_server(
    start_runner, connect, model_server, monkeypatch
):
    monkeypatch.setenv("GOALTENDER_MAX_OUTPUT_TOKENS", "300")
    monkeypatch.setenv("GOALTENDER_TEMPERATURE", "0")
    monkeypatch.setenv("GOALTENDER_SEED", "7")
    model_server.add(finished("done"))
    await run_goal(start_runner, connect, "sample, max 1 experiments")
    body = model_server.requests[0].body
    assert (body["max_tokens"], body["temperature"], body["seed"]) == (300, 0, 7)
    assert "top_p" not in body  # unset: the server's default


async def test_max_completion_tokens_when_the_server_asks_for_it(start_runner, connect, model_server):
    """OpenAI's newer models refuse max_tokens and name max_completion_tokens."""
    words = "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
    model_server.add(
        lambda body: Fail(400, message=words) if "max_tokens" in body else Turn(text="unexpected"),
        finished("switched SWITCH-MARK"),
    )
    events, summary = await run_goal(start_runner, connect, "new model, max 1 experiments")
    assert summary.status.goal.state == "finished" and "SWITCH-MARK" in events[-1].data.text
    second = model_server.requests[1].body
    assert second["max_completion_tokens"] == 4096 and "max_tokens" not in second


async def test_a_deterministic_500_is_said_in_the_servers_words_not_retried(
    start_runner, connect, model_server
):
    words = (
        "Input validation failed: messages[3].content must be a string. " + "context " * 100 + "END-OF-WORDS"
    )
    model_server.add(*[Fail(500, message=words) for _ in range(5)])
    events, summary = await run_goal(start_runner, connect, "a picky server, max 1 experiments")
    assert summary.status.goal.state == "failed"
    assert len(model_server.requests) == 2  # the same answer twice: retrying cannot help
    [failure] = [e.data for e in events if e.data.kind == "milestone" and "refused" in e.data.title]
    assert failure.title.startswith("Model endpoint refused the request (HTTP 500, the same answer twice)")
    assert "Input validation failed: messages[3].content must be a string" in failure.title
    assert "unreachable" not in failure.title
    assert "END-OF-WORDS" in failure.text  # the whole of what the server said, past 500 characters


async def test_a_4xx_is_not_retried_and_says_what_to_check(start_runner, connect, model_server):
    model_server.add(*[Fail(404, message="The model `nope` does not exist") for _ in range(3)])
    events, summary = await run_goal(start_runner, connect, "a wrong model, max 1 experiments")
    assert summary.status.goal.state == "failed" and len(model_server.requests) == 1
    reason = events[-1].data.end_reason
    assert (
        "HTTP 404" in reason and "The model `nope` does not exist" in reason and "GOALTENDER_MODEL" in reason
    )


async def test_a_passing_500_is_retried(start_runner, connect, model_server):
    model_server.add(
        Fail(500, message="overloaded, try again"), Fail(500, message="worker restarted"), finished("OK-MARK")
    )
    events, summary = await run_goal(start_runner, connect, "a flaky server, max 1 experiments")
    assert summary.status.goal.state == "finished" and "OK-MARK" in events[-1].data.text
    assert len(model_server.requests) == 3


# ---- windows ----


async def test_a_window_too_small_for_the_brief_is_refused_with_the_numbers(
    start_runner, connect, model_server
):
    model_server.model_fields = {"max_model_len": 4096}  # as vLLM says it
    events, summary = await run_goal(start_runner, connect, "a tiny window, max 1 experiments")
    assert summary.status.goal.state == "failed" and model_server.requests == []  # refused before asking
    [failure] = [e.data for e in events if e.data.kind == "milestone" and "window" in e.data.title]
    assert failure.title.startswith("The model's window (4,096 tokens) is too small for this goal")
    for part in ("the brief ~", "the tools ~", "the `autoresearch` skill ~", "room for a reply ~"):
        assert part in failure.text
    assert "--max-model-len" in failure.text and "GOALTENDER_CONTEXT_TOKENS" in failure.text


async def test_the_window_llama_cpp_states_sets_the_reply_size(start_runner, connect, model_server):
    model_server.props = {"default_generation_settings": {"n_ctx": 16384}}  # llama.cpp's server
    model_server.add(finished("done"))
    await run_goal(start_runner, connect, "a 16k window, max 1 experiments")
    assert model_server.requests[0].body["max_tokens"] == 16384 // 8


async def test_a_refusal_as_too_long_shrinks_below_what_was_refused(start_runner, connect, model_server):
    """No window stated (128k assumed): the first refusal names 16k, and the agent compacts below it
    and goes on (it used to compact to 16k, an eighth of 128k, and fail the goal)."""
    window = 16000
    big = ToolCall("shell", {"command": "python -c \"print('x' * 12000)\""})
    model_server.add(*[within_window(window, Turn(text=f"step {i}", tool_calls=[big])) for i in range(6)])
    model_server.default = within_window(window, finished("Done SHRUNK-MARK."))
    events, summary = await run_goal(start_runner, connect, "outgrow a window, max 1 experiments", timeout=60)
    assert summary.status.goal.state == "finished" and "SHRUNK-MARK" in events[-1].data.text
    sizes = [len(json.dumps(r.body["messages"])) // 4 for r in model_server.requests]
    refused = [i for i, size in enumerate(sizes) if size > window]
    assert refused, "the conversation never outgrew the window: the test proves nothing"
    assert all(sizes[i + 1] <= window for i in refused)  # each refusal is followed by a request that fits
    assert model_server.requests[refused[0] + 1].body["max_tokens"] == window // 8


# ---- no early "finished" ----


async def test_a_reply_without_a_tool_call_is_nudged_not_finished(start_runner, connect, model_server):
    model_server.add(
        Turn(text="I will start by running the baseline."),
        Turn(tool_calls=[BASELINE]),
        finished("baseline acc 0.5 NUDGED-MARK"),
    )
    events, summary = await run_goal(start_runner, connect, "improve acc, max 3 experiments")
    assert summary.status.goal.state == "finished" and "NUDGED-MARK" in events[-1].data.text
    assert len(summary.ledger) == 1
    nudge = user_texts(model_server.requests[1].body)[-1]
    assert nudge.startswith("You replied without calling a tool, so nothing happened")
    assert "stop condition not yet met: 0/3 attempted" in nudge


async def test_a_model_that_keeps_talking_fails_as_stopped_without_finishing(
    start_runner, connect, model_server
):
    model_server.add(*[Turn(text=f"Thinking, take {i}. LAST-WORDS-{i}") for i in range(6)])
    events, summary = await run_goal(start_runner, connect, "talk only, max 2 experiments")
    assert summary.status.goal.state == "failed"
    assert len(model_server.requests) == 4  # the first reply and three nudges
    assert "The agent stopped without finishing" in events[-1].data.end_reason
    report = events[-1].data.text
    assert "replied 4 times in a row without calling a tool" in report and "LAST-WORDS-3" in report
    assert "stop condition not yet met: 0/2 attempted" in report


async def test_an_empty_reply_is_nudged_too(start_runner, connect, model_server):
    model_server.add(Turn(text=""), finished("after an empty reply EMPTY-MARK"))
    events, summary = await run_goal(start_runner, connect, "say nothing first, max 1 experiments")
    assert summary.status.goal.state == "finished" and "EMPTY-MARK" in events[-1].data.text
    assert user_texts(model_server.requests[1].body)[-1].startswith("You replied without calling a tool")


async def test_the_same_call_again_and_again_is_pointed_out(start_runner, connect, model_server):
    same = ToolCall("read_file", {"path": "AGENTS.md", "limit": 3})
    model_server.add(*[Turn(tool_calls=[same]) for _ in range(3)], finished("done"))
    await run_goal(start_runner, connect, "read in circles, max 1 experiments")
    first, third = (
        tool_results(model_server.requests[1].body)[0],
        tool_results(model_server.requests[3].body)[0],
    )
    assert "note: this is the same" not in first
    assert "note: this is the same read_file call, with the same arguments, 3 times" in third


async def test_a_model_stuck_on_one_call_fails_the_goal(start_runner, connect, model_server):
    """SmolLM2 on llama.cpp wrote the same diary entry 44 times until the deadline."""
    same = ToolCall("write_diary", {"text": "The plan is to run the baseline.", "handoff": True})
    model_server.add(*[Turn(tool_calls=[same]) for _ in range(12)])
    events, summary = await run_goal(start_runner, connect, "write in circles, max 1 experiments")
    assert summary.status.goal.state == "failed" and len(model_server.requests) == 8
    assert "stuck, making the same write_diary call 8 times in a row" in events[-1].data.text


async def test_a_met_stop_rule_ends_the_loop_one_turn_later(start_runner, connect, model_server):
    """After `1/1 attempted` a model that does not call finish used to go on until the deadline."""
    model_server.add(*[Turn(tool_calls=[BASELINE]) for _ in range(6)])
    events, summary = await run_goal(start_runner, connect, "one run only, max 1 experiments")
    assert len(summary.ledger) == 1 and summary.status.goal.state == "finished"
    assert len(model_server.requests) == 2  # told once, then the loop ends
    assert user_texts(model_server.requests[1].body)[-1].startswith(
        "The stop rule is met (stop condition met"
    )
    assert "stop condition met (experiment count)" in events[-1].data.end_reason + events[-1].data.text


async def test_the_token_budget_is_never_passed_by_a_turn(start_runner, connect, model_server):
    """The next request is not sent when it would pass the goal's token budget (it used to
    overshoot by up to a turn)."""
    model_server.default = Turn(tool_calls=[ToolCall("shell", {"command": "printf 'z%.0s' $(seq 3000)"})])
    events, summary = await run_goal(start_runner, connect, "spend tokens, max 1 experiments, max 30k tokens")
    assert 0 < summary.status.tokens_used <= 30_000
    assert "Stopped at the token budget" in events[-1].data.text
    assert len(model_server.requests) >= 3


# ---- one vocabulary ----


async def test_the_brief_speaks_in_tools_and_names_the_environment(start_runner, connect, model_server):
    model_server.add(finished("done"))
    await run_goal(start_runner, connect, "improve star count exact accuracy, max 2 experiments")
    brief = system_text(model_server.requests[0].body)
    how = brief.split("## How to work")[1].split("## Skills")[0]
    assert "goaltender experiment" not in how and "goaltender milestone" not in how
    assert "run_experiment" in brief and "## This environment: star count (CPU)" in brief
    assert "python -m goaltender.environments.star_count.workload --train-size 1000" in brief
    assert "`python -m goaltender.environments.star_count.evaluate`" in brief
    assert "## Training runs" not in brief  # a CPU goal


async def test_a_cli_line_as_an_experiments_command_is_refused_clearly(start_runner, connect, model_server):
    wrapped = ToolCall(
        "run_experiment",
        {"command": "goaltender experiment -d baseline --metric acc -- python train.py", "description": "b"},
    )
    model_server.add(Turn(tool_calls=[wrapped]), finished("done"))
    _, summary = await run_goal(start_runner, connect, "wrap a run, max 1 experiments")
    [said] = tool_results(model_server.requests[1].body)
    assert said.startswith("error: `command` is the run itself") and summary.ledger == []
