"""The built-in OpenAI agent end to end: the real runner, the real agent process, the real `openai`
client against a fake OpenAI-compatible server that scripts the model's turns. The agent's parts on
their own are tested in test_command_policy.py and test_agent_parts.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from aiohttp import web
from fake_openai import Fail, FakeOpenAI, Seen, ToolCall, Turn, finished
from helpers import approval_prompts, events_until_report, eventually, submit, vouched

from goaltender.protocol import messages as p
from goaltender.runner.supervisor import group_members

AGENTS = {"openai": [sys.executable, "-m", "goaltender.agents.openai_agent"]}


# ---- helpers ----


@pytest.fixture
def fake(model_server):
    return model_server


async def file_appears(path: Path, timeout=20.0):
    return await eventually(path.exists, timeout)


def tool_results(body: dict) -> list[str]:
    """The tool results at the end of a request: what the model saw of its last calls."""
    results = []
    for message in reversed(body["messages"]):
        if message["role"] == "tool":
            results.insert(0, message["content"])
        elif message["role"] == "assistant":
            break
    return results


def user_texts(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def system_text(body: dict) -> str:
    return body["messages"][0]["content"]


def answer_approvals(connect, runner, goal_id, decide):
    """A person watching the goal's thread: decides each approval prompt with `decide`."""
    seen = []

    async def watch():
        watcher = await connect(runner, "watcher")
        async for approval in approval_prompts(watcher, goal_id):
            seen.append(approval)
            approve, comment = decide(approval)
            await watcher.request(
                p.Decide(approval_id=approval.id, approve=approve, by="ana", comment=comment)
            )

    return asyncio.ensure_future(watch()), seen


async def workspace_of(client, goal_id) -> Path:
    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    return Path(status.goal.workspace)


# ---- end to end ----


async def test_campaign_tools_experiment_metrics_and_steer(start_runner, connect, fake):
    fake.add(
        Turn(
            text="Plan: write the training script, check it, then the baseline.",
            tool_calls=[
                ToolCall("write_file", {"path": "train.py", "content": "print('acc: 0.5')\n"}),
                ToolCall("shell", {"command": "ls && python train.py && echo key=$OPENAI_API_KEY"}),
            ],
        ),
        Turn(
            tool_calls=[
                ToolCall("milestone", {"title": "Plan: baseline first", "text": "then tune lr"}),
                ToolCall(
                    "run_experiment",
                    {
                        "command": ["python", "train.py"],
                        "description": "baseline",
                        "params": {"lr": 0.1},
                        "metric": "acc",
                    },
                ),
            ]
        ),
        # Holds the turn open until the test has steered: the steer must enter at the next boundary.
        Turn(
            tool_calls=[
                ToolCall(
                    "shell",
                    {
                        "command": "touch waiting; for i in $(seq 400); do [ -f go ] && break; sleep 0.05; done; echo waited"
                    },
                )
            ]
        ),
        lambda body: Turn(
            tool_calls=[
                ToolCall(
                    "finish",
                    {
                        "summary": "baseline acc 0.5 FINAL-MARK"
                        + (" (steered)" if "focus on lr" in str(body) else "")
                    },
                )
            ]
        ),
    )
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "get acc to 0.9 on the toy task, max 3 experiments", agent="openai")
    ws = await workspace_of(client, goal_id)
    await file_appears(ws / "waiting")
    await client.request(p.Steer(goal_id=goal_id, text="focus on lr only", author="ana"))
    (ws / "go").touch()
    events = await events_until_report(client, goal_id, timeout=40)

    bodies = [r.body for r in fake.requests]
    assert len(bodies) == 4
    first = bodies[0]
    assert first["model"] == "fake-model" and first["tool_choice"] == "auto"
    names = {t["function"]["name"] for t in first["tools"]}
    assert {"shell", "read_file", "write_file", "edit_file", "list_files", "load_skill", "finish"} <= names
    assert {"milestone", "log_metrics", "run_experiment", "ask_approval", "read_inbox"} <= names
    assert {"write_diary", "read_diary", "submit_report"} <= names
    assert "get acc to 0.9 on the toy task" in system_text(first)
    # write_file + shell: the model saw the file written and the command's output.
    wrote, ran = tool_results(bodies[1])
    assert wrote.startswith("wrote 18 bytes") and ran.startswith("exit code 0")
    assert "train.py" in ran and "acc: 0.5" in ran
    assert "key=[redacted]" in ran  # secrets from the environment never reach the model
    assert (ws / "train.py").read_text() == "print('acc: 0.5')\n"
    # milestone + run_experiment: the ledger row is back in the tool result and in the runner.
    posted, experiment = tool_results(bodies[2])
    assert posted == "milestone posted"
    assert "Experiment #1: keep (new best)" in experiment and "acc: 0.5" in experiment
    summary = await client.request(p.Summary(goal_id=goal_id))
    [row] = summary.ledger
    assert (row.status, row.metric_name, row.metric_value, row.params) == ("keep", "acc", 0.5, {"lr": 0.1})
    # The steer entered as a user message at the next turn boundary, after the tool result.
    steer = f"Message from {vouched('ana')}: focus on lr only"
    assert steer not in str(bodies[2])
    assert bodies[3]["messages"][-1] == {"role": "user", "content": steer}
    assert "waited" in bodies[3]["messages"][-2]["content"]
    # Milestone, final report, state; token accounting as metric series.
    assert "Plan: baseline first" in [e.data.title for e in events if e.data.kind == "milestone"]
    assert summary.status.goal.state == "finished"
    report = events[-1].data
    assert report.end_reason == "the agent finished"
    assert "## From the agent" in report.text and "FINAL-MARK (steered)" in report.text
    series = await client.request(p.GetSeries(goal_id=goal_id, name="agent/input_tokens"))
    assert [step for step, _ in series.points] == [1, 2, 3, 4]
    values = [value for _, value in series.points]
    assert values == sorted(values) and values[0] > 0
    output = await client.request(p.GetSeries(goal_id=goal_id, name="agent/output_tokens"))
    assert len(output.points) == 4
    assert "get acc to 0.9" in (ws / "AGENTS.md").read_text()


async def test_approvals_and_the_command_policy(start_runner, connect, fake, monkeypatch):
    monkeypatch.setenv("GOALTENDER_COMMAND_POLICY", json.dumps({"deny": ["forbidden_tool"]}))
    fake.add(
        Turn(
            tool_calls=[ToolCall("ask_approval", {"question": "Use the big GPU?", "detail": "~2 GPU-hours"})]
        ),
        Turn(tool_calls=[ToolCall("ask_approval", {"question": "Delete the cache?"})]),
        Turn(tool_calls=[ToolCall("shell", {"command": "pip install nonexistent-pkg-xyz; touch pip_ran"})]),
        Turn(tool_calls=[ToolCall("shell", {"command": "wget --version > /dev/null 2>&1; touch net_ok"})]),
        Turn(tool_calls=[ToolCall("shell", {"command": "forbidden_tool --now; touch denied_ran"})]),
        Turn(tool_calls=[ToolCall("read_file", {"path": "/etc/hostname"})]),
        finished("All decisions noted."),
    )

    def decide(approval):
        if "big GPU" in approval.question:
            return True, "go ahead, GPU is free"
        if "cache" in approval.question:
            return False, "keep the cache"
        if "pip install" in approval.question:
            return False, "no installs please"
        if "wget" in approval.question:
            return True, "fine, a version check"
        return False, "stay in the workspace"

    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "approval drill, max 2 experiments", agent="openai")
    watching, seen = answer_approvals(connect, runner, goal_id, decide)
    try:
        await events_until_report(client, goal_id, timeout=40)
    finally:
        watching.cancel()

    assert [a.kind for a in seen] == ["generic", "generic", "command", "command", "command"]
    pip_prompt = seen[2]
    assert "pip install nonexistent-pkg-xyz" in pip_prompt.question
    assert "installs or removes packages" in pip_prompt.detail
    assert "uses the network (wget)" in seen[3].detail
    assert "/etc/hostname" in seen[4].question
    bodies = [r.body for r in fake.requests]
    [approved] = tool_results(bodies[1])
    assert f"approved by {vouched('ana', 'watcher')}: go ahead, GPU is free" in approved
    [rejected] = tool_results(bodies[2])
    assert f"rejected by {vouched('ana', 'watcher')}: keep the cache" in rejected
    [pip] = tool_results(bodies[3])
    assert pip.startswith("Not run") and f"rejected by {vouched('ana', 'watcher')}: no installs please" in pip
    [wget] = tool_results(bodies[4])
    assert f"approved by {vouched('ana', 'watcher')}: fine, a version check" in wget and "exit code 0" in wget
    [denied] = tool_results(bodies[5])
    assert denied.startswith("Denied by the command policy") and "forbidden_tool" in denied
    [outside] = tool_results(bodies[6])
    assert outside.startswith("Refused") and "stay in the workspace" in outside
    ws = await workspace_of(client, goal_id)
    assert not (ws / "pip_ran").exists()  # rejected: never ran
    assert (ws / "net_ok").exists()  # approved: ran
    assert not (ws / "denied_ran").exists()  # denied: never ran, nobody asked
    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    assert status.goal.state == "finished" and status.pending_approvals == []


async def test_no_piece_of_the_key_reaches_the_model_at_a_cut(start_runner, connect, fake):
    # Output of keys back to back, longer than a tool result may be, so it is cut in the middle;
    # two offsets so that whatever the cut positions, a key straddles each cut in one of them.
    key = os.environ["OPENAI_API_KEY"]
    keys = "import os, sys; sys.stdout.write('-' * {pad} + os.environ['OPENAI_API_KEY'] * 3000)"
    fake.add(
        Turn(
            tool_calls=[
                *(ToolCall("shell", {"command": f'python3 -c "{keys.format(pad=pad)}"'}) for pad in (0, 1)),
                *(
                    ToolCall("shell", {"command": f'python3 -c "{keys.format(pad=pad)}" > keys{pad}.txt'})
                    for pad in (0, 1)
                ),
            ]
        ),
        Turn(tool_calls=[ToolCall("read_file", {"path": f"keys{pad}.txt"}) for pad in (0, 1)]),
        finished("done"),
    )
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "print the key a lot, max 1 experiments", agent="openai")
    await events_until_report(client, goal_id, timeout=30)
    results = tool_results(fake.requests[1].body)[:2] + tool_results(fake.requests[2].body)
    assert len(results) == 4 and all("bytes cut from the middle" in r for r in results)
    assert all(r.count("[redacted]") > 100 for r in results)
    sent = json.dumps([r.body for r in fake.requests])
    pieces = [key[:n] for n in range(6, len(key))] + [key[-n:] for n in range(6, len(key))]
    assert [piece for piece in pieces if piece in sent] == []


async def test_read_file_refuses_pipes_and_reads_only_what_it_returns(start_runner, connect, fake):
    # A named pipe nobody writes to, and a 1 TB (sparse) file whose first lines are text.
    make = "f = open('huge.log', 'wb'); f.write(b'first\\nsecond\\n' + b'text ' * 2000); f.truncate(1 << 40)"
    fake.add(
        Turn(tool_calls=[ToolCall("shell", {"command": f'mkfifo progress.pipe && python3 -c "{make}"'})]),
        Turn(
            tool_calls=[
                ToolCall("read_file", {"path": "progress.pipe"}),
                ToolCall("read_file", {"path": "."}),
                ToolCall("read_file", {"path": "huge.log", "limit": 2}),
            ]
        ),
        finished("Done."),
    )
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "read odd files, max 1 experiments", agent="openai")
    await eventually(lambda: len(fake.requests) >= 3, 20)
    pipe, directory, huge = tool_results(fake.requests[2].body)
    assert pipe.startswith("error: ") and "progress.pipe is a named pipe, not a regular file" in pipe
    assert directory.startswith("error: ") and "is a directory, not a regular file" in directory
    assert huge == "[lines 1-2; the file goes on: offset=3 reads on]\nfirst\nsecond\n"
    await events_until_report(client, goal_id, timeout=20)


def process_groups(needle: str) -> set[int]:
    """The process groups of the live processes whose command line holds `needle`."""
    groups = set()
    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if needle in " ".join(proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE:
                groups.add(os.getpgid(proc.pid))
    return groups


async def test_stop_mid_campaign_hands_in_a_report(start_runner, connect, fake):
    fake.add(
        Turn(tool_calls=[ToolCall("submit_report", {"text": "Interim: baseline pending."})]),
        # Durations no other test uses: the check below finds the processes by their command line.
        Turn(tool_calls=[ToolCall("shell", {"command": "sleep 61.25 & echo left behind"})]),
        Turn(tool_calls=[ToolCall("shell", {"command": "touch started; sleep 60.75"})]),
    )
    runner = await start_runner(agents=AGENTS, stop_grace_s=4.0)
    client = await connect(runner)
    goal_id = await submit(client, "a long campaign, max 5 experiments", agent="openai")
    ws = await workspace_of(client, goal_id)
    await file_appears(ws / "started")
    agent_pid = (await runner.store.get_goal(goal_id)).agent_pid
    # Each shell command leads its own process group: the running one, and the background job
    # an earlier one left behind.
    shells = await eventually(lambda: process_groups("sleep 61.25") | process_groups("sleep 60.75"))
    assert len(shells) == 2 and agent_pid not in shells

    started = time.monotonic()
    done = await client.request(p.Stop(goal_id=goal_id, by="ana", reason="enough"))
    assert time.monotonic() - started < 4.0  # the agent went on SIGTERM, not at SIGKILL
    assert f"stopped by {vouched('ana')}: enough" in done.message
    events = await events_until_report(client, goal_id, timeout=5)
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert summary.status.goal.state == "stopped"
    report = events[-1].data
    assert report.end_reason == f"stopped by {vouched('ana')}: enough"
    assert "**Stopped** by the runner after 3 model turns" in report.text
    assert "Last step:** shell" in report.text and "Interim: baseline pending." in report.text
    # The agent ended both groups before it exited (the runner waited for that).
    assert group_members(agent_pid) == []
    assert all(group_members(pgid) == [] for pgid in shells)


async def test_compaction_keeps_goal_and_handoff(start_runner, connect, fake, monkeypatch):
    monkeypatch.setenv("GOALTENDER_CONTEXT_TOKENS", "12000")

    def big(i: int) -> dict:  # a step of its own each time (the same call again and again is a loop)
        return {"command": f"python -c \"print('x' * 7000)\"  # step {i}"}

    fake.add(
        Turn(
            tool_calls=[
                ToolCall("load_skill", {"name": "autoresearch"}),
                ToolCall(
                    "write_diary", {"text": "HANDOFF-MARK-42: best lr=0.1; next: warmup", "handoff": True}
                ),
            ]
        ),
        *[Turn(text=f"step {i}", tool_calls=[ToolCall("shell", big(i))]) for i in range(10)],
        finished("Compacted and done."),
    )
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "GOAL-TEXT-MARK: squeeze the context, max 2 experiments", agent="openai")
    await events_until_report(client, goal_id, timeout=40)

    bodies = [r.body for r in fake.requests]
    assert len(bodies) == 12
    # Tool output was truncated to fit the small window, with a marker saying how much was cut.
    shell_result = tool_results(bodies[2])[0]
    assert "bytes cut from the middle of 7,001 bytes" in shell_result and len(shell_result) < 5000
    compacted = [
        i for i in range(1, len(bodies)) if len(bodies[i]["messages"]) < len(bodies[i - 1]["messages"])
    ]
    assert compacted, "the conversation was never compacted"
    body = bodies[compacted[0]]
    assert "HANDOFF-MARK-42" not in system_text(bodies[0])
    assert "GOAL-TEXT-MARK" in system_text(body) and "HANDOFF-MARK-42" in system_text(body)
    assert "`autoresearch`" in system_text(body).split("## Skills you loaded")[1]
    assert any(text.startswith("[Context compacted") for text in user_texts(body))
    calls = [c["function"]["name"] for m in body["messages"] for c in m.get("tool_calls", [])]
    assert "write_diary" not in calls  # the handoff is there because the brief was re-injected
    assert len(json.dumps(body["messages"])) < len(json.dumps(bodies[compacted[0] - 1]["messages"]))
    # Every later request still carries the goal and the handoff; the campaign ends normally.
    for later in bodies[compacted[0] :]:
        assert "GOAL-TEXT-MARK" in system_text(later) and "HANDOFF-MARK-42" in system_text(later)
    compactions = await client.request(p.GetSeries(goal_id=goal_id, name="agent/compactions"))
    assert len(compactions.points) >= 1
    assert (await client.request(p.Summary(goal_id=goal_id))).status.goal.state == "finished"


def within_window(window: int, answer):
    """Answer like vLLM: HTTP 400 'maximum context length' for a request longer than the window."""

    def check(body):
        size = len(json.dumps(body["messages"])) // 4
        if size > window:
            return Fail(400, message=f"This model's maximum context length is {window} tokens. However, "
                        f"your messages resulted in {size} tokens.")  # fmt: skip
        return answer

    return check


@pytest.mark.parametrize("turn", ["one huge call", "hundreds of calls"])
async def test_compaction_bounds_huge_tool_calls(turn, start_runner, connect, fake, monkeypatch):
    window = 12000
    monkeypatch.setenv("GOALTENDER_CONTEXT_TOKENS", str(window))
    if turn == "one huge call":
        calls = [ToolCall("write_file", {"path": "big.txt", "content": "x" * 200_000})]
    else:
        calls = [
            ToolCall("shell", {"command": f"echo call{i}; printf 'y%.0s' $(seq 3000)"}) for i in range(300)
        ]
    fake.add(within_window(window, Turn(tool_calls=calls)), within_window(window, Turn(tool_calls=[ToolCall("list_files", {})])))  # fmt: skip
    fake.default = within_window(window, finished("Done BOUNDED-MARK."))
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "huge tool calls, max 1 experiments", agent="openai")
    events = await events_until_report(client, goal_id, timeout=120)
    assert events[-1].data.end_reason == "the agent finished" and "BOUNDED-MARK" in events[-1].data.text
    later = [r.body for r in fake.requests[1:]]
    assert all(len(json.dumps(body["messages"])) // 4 <= window for body in later)
    for body in later:  # every call sent back still has JSON arguments
        for message in body["messages"]:
            for call in message.get("tool_calls") or []:
                assert isinstance(json.loads(call["function"]["arguments"]), dict)


async def test_resume_after_runner_restart_reinjects_the_brief(start_runner, connect, fake):
    fake.add(
        Turn(
            tool_calls=[
                ToolCall(
                    "write_diary", {"text": "HANDOFF-RESUME-7: best lr=0.1, next try wd", "handoff": True}
                ),
                ToolCall("shell", {"command": "touch started; sleep 60"}),
            ]
        ),
        finished("Resumed and finished RESUME-DONE."),
    )
    first = await start_runner(agents=AGENTS)
    client = await connect(first)
    goal_id = await submit(
        client, "GOAL-RESUME: keep going across restarts, max 3 experiments", agent="openai"
    )
    ws = await workspace_of(client, goal_id)
    await file_appears(ws / "started")
    await client.request(p.Steer(goal_id=goal_id, text="prefer small models", author="bob"))
    await client.close()
    await first.close()  # the agent is stopped; the goal stays active

    second = await start_runner(agents=AGENTS)
    client = await connect(second)
    events = await events_until_report(client, goal_id, timeout=40)

    bodies = [r.body for r in fake.requests]
    assert len(bodies) == 2
    resumed = bodies[1]
    assert "GOAL-RESUME" in system_text(resumed) and "HANDOFF-RESUME-7" in system_text(resumed)
    assert any("You were restarted" in text for text in user_texts(resumed))
    # The steer was unread at the restart: it arrives as a message, and is kept in the brief after.
    assert f"Message from {vouched('bob')}: prefer small models" in user_texts(resumed)
    titles = [e.data.title for e in events if e.data.kind == "milestone"]
    assert "Runner restarted" in titles and "Resumed after a restart" in titles
    assert events[-1].data.end_reason == "the agent finished"
    assert "RESUME-DONE" in events[-1].data.text


async def test_rate_limit_then_success(start_runner, connect, fake):
    fake.add(Fail(429, retry_after=0.1), Fail(503), finished("All good after retries RETRY-MARK."))
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "survive a flaky endpoint, max 1 experiments", agent="openai")
    events = await events_until_report(client, goal_id, timeout=30)
    assert len(fake.requests) == 3
    assert events[-1].data.end_reason == "the agent finished"
    assert "RETRY-MARK" in events[-1].data.text


async def test_the_turn_cap_ends_the_campaign_as_stopped_without_finishing(
    start_runner, connect, fake, monkeypatch
):
    monkeypatch.setenv("GOALTENDER_MAX_TURNS", "2")
    fake.add(*[Turn(text=f"step {i}", tool_calls=[ToolCall("list_files", {})]) for i in range(5)])
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "loop forever, max 1 experiments", agent="openai")
    events = await events_until_report(client, goal_id, timeout=30)
    assert len(fake.requests) == 2
    assert "AGENTS.md" in tool_results(fake.requests[1].body)[0]
    assert (await client.request(p.Summary(goal_id=goal_id))).status.goal.state == "failed"
    assert "The agent stopped without finishing" in events[-1].data.end_reason
    assert "turn cap (2, GOALTENDER_MAX_TURNS)" in events[-1].data.text
    assert "step 1" in events[-1].data.text


async def test_dead_endpoint_fails_the_goal_clearly(start_runner, connect, fake, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    dead = f"http://127.0.0.1:{port}/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", dead)
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    started = time.monotonic()
    goal_id = await submit(client, "talk to nobody, max 1 experiments", agent="openai")
    events = await events_until_report(client, goal_id, timeout=30)
    assert time.monotonic() - started < 15
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert summary.status.goal.state == "failed"
    title = f"Model endpoint unreachable: {dead}: Connection error."
    assert any(e.data.kind == "milestone" and e.data.title.startswith(title) for e in events)
    assert "exited with code 1" in events[-1].data.end_reason and title in events[-1].data.end_reason
    assert "sk-test-not-a-real-key" not in events[-1].data.text


def reply(body: str):
    """A scripted answer of exactly this body, with status 200: what a broken server may send."""
    return lambda request: web.Response(text=body, content_type="application/json")


def completion(message: dict | None, finish: str = "stop") -> str:
    choice = {"index": 0, "finish_reason": finish} | ({"message": message} if message is not None else {})
    return json.dumps(
        {"id": "c1", "object": "chat.completion", "created": 1, "model": "fake-model", "choices": [choice]}
    )


def calls_without_function() -> str:
    return completion(
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "type": "function"}]}
    )


ODD_REPLIES = {
    "truncated": (
        '{"id": "c1", "object": "chat.completion", "choices": [{"index": 0, "mess',
        "a reply that is not valid JSON",
    ),
    "no choices": (
        json.dumps({"id": "c", "object": "chat.completion", "choices": []}),
        "a reply without choices",
    ),
    "no message": (completion(None), "a choice without a message"),
    "no function": (calls_without_function(), "a tool call without a function name"),
}


@pytest.mark.parametrize("case", list(ODD_REPLIES))
async def test_a_malformed_reply_is_retried_then_fails_the_goal(
    case, start_runner, connect, fake, monkeypatch
):
    monkeypatch.setenv("GOALTENDER_OPENAI_MAX_RETRIES", "1")
    body, what = ODD_REPLIES[case]
    fake.add(reply(body), reply(body), Turn(text="never asked for"))
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "odd endpoint, max 1 experiments", agent="openai")
    events = await events_until_report(client, goal_id, timeout=30)
    assert len(fake.requests) == 2  # the first try and one retry
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert summary.status.goal.state == "failed"
    title = f"Model endpoint returned {what}"
    assert any(e.data.kind == "milestone" and e.data.title.startswith(title) for e in events)
    assert title in events[-1].data.end_reason and "Traceback" not in events[-1].data.end_reason


async def test_a_malformed_reply_then_a_good_one_goes_on(start_runner, connect, fake):
    arguments_as_object = completion(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "list_files", "arguments": {"path": "."}},
                }
            ],
        },
        "tool_calls",
    )
    fake.add(reply(ODD_REPLIES["truncated"][0]), reply(arguments_as_object), finished("Recovered."))
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "flaky endpoint, max 1 experiments", agent="openai")
    events = await events_until_report(client, goal_id, timeout=30)
    assert len(fake.requests) == 3
    [listing] = tool_results(fake.requests[2].body)
    assert "AGENTS.md" in listing  # arguments sent as a JSON object still ran the tool
    assert events[-1].data.end_reason == "the agent finished" and "Recovered." in events[-1].data.text


async def test_a_content_filter_refusal_fails_the_goal(start_runner, connect, fake):
    fake.add(reply(completion({"role": "assistant", "content": None}, "content_filter")))
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "filtered, max 1 experiments", agent="openai")
    events = await events_until_report(client, goal_id, timeout=30)
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert summary.status.goal.state == "failed"
    title = f"Model endpoint's content filter refused the reply: {fake.base_url}"
    assert any(e.data.kind == "milestone" and e.data.title == title for e in events)
    assert title in events[-1].data.end_reason


class TricklingOpenAI(FakeOpenAI):
    """Answers 200 at once, then a byte a second: the per-read timeout never fires."""

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(Seen("chat", await request.json()))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(120):
                await response.write(b" ")
                await asyncio.sleep(1)
        return response


async def test_a_trickling_endpoint_times_out(start_runner, connect, monkeypatch):
    server = TricklingOpenAI()
    await server.start()
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    monkeypatch.setenv("GOALTENDER_MODEL", "fake-model")
    monkeypatch.setenv("GOALTENDER_OPENAI_TIMEOUT_S", "2")
    monkeypatch.setenv("GOALTENDER_OPENAI_MAX_RETRIES", "1")
    try:
        runner = await start_runner(agents=AGENTS)
        client = await connect(runner)
        goal_id = await submit(client, "slow endpoint, max 1 experiments", agent="openai")
        events = await events_until_report(client, goal_id, timeout=30)
        title = f"Model endpoint unreachable: {server.base_url}: no complete answer within 2s"
        assert any(e.data.kind == "milestone" and e.data.title.startswith(title) for e in events)
        assert len(server.requests) == 2
        summary = await client.request(p.Summary(goal_id=goal_id))
        assert summary.status.goal.state == "failed"
    finally:
        await server.close()


async def test_missing_model_fails_clearly(start_runner, connect, fake, monkeypatch):
    monkeypatch.delenv("GOALTENDER_MODEL")
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "no model configured, max 1 experiments", agent="openai")
    events = await events_until_report(client, goal_id, timeout=20)
    assert "GOALTENDER_MODEL is not set" in events[-1].data.end_reason
    assert "The built-in agent is misconfigured" in [
        e.data.title for e in events if e.data.kind == "milestone"
    ]
    assert fake.requests == []


def test_entry_point_without_a_goal_says_so():
    env = {k: v for k, v in os.environ.items() if k != "GOALTENDER_GOAL_ID"}
    out = subprocess.run(
        [sys.executable, "-m", "goaltender.agents.openai_agent"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 2 and "GOALTENDER_GOAL_ID is not set" in out.stderr


# ---- the tool specs ----

# Tool -> (its arguments, the required ones): what prompts and models rely on.
TOOL_ARGUMENTS = {
    "shell": ({"command", "timeout_s"}, {"command"}),
    "read_file": ({"path", "offset", "limit"}, {"path"}),
    "write_file": ({"path", "content"}, {"path", "content"}),
    "edit_file": ({"path", "old_string", "new_string"}, {"path", "old_string", "new_string"}),
    "list_files": ({"path", "depth"}, set()),
    "load_skill": ({"name"}, {"name"}),
    "run_experiment": (
        {"command", "description", "params", "metric", "direction", "timeout_s", "eval_command"},
        {"command", "description"},
    ),
    "nemo_rl": (
        {"recipe", "config", "overrides", "description", "metric", "direction", "timeout_s"}
        | {"eval_command", "eval_metric"},
        {"recipe", "config"},
    ),
    "milestone": ({"title", "text"}, {"title"}),
    "log_metrics": ({"metrics", "step", "experiment_id"}, {"metrics"}),
    "ask_approval": ({"question", "detail", "kind"}, {"question"}),
    "read_inbox": (set(), set()),
    "write_diary": ({"text", "handoff"}, {"text"}),
    "read_diary": ({"last", "handoff_only"}, set()),
    "submit_report": ({"text"}, {"text"}),
    "fetch_from_hub": ({"repo", "repo_type", "revision", "include"}, {"repo"}),
    "finish": ({"summary"}, {"summary"}),
}


async def test_tool_specs_keep_their_names_and_arguments(start_runner, connect, fake):
    fake.add(finished("Nothing to do."), finished("Nothing to do either."))
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    training = await submit(client, "SFT Qwen3-VL-2B on star count, max 1 experiments", agent="openai")
    await events_until_report(client, training, timeout=20)
    cpu = await submit(client, "improve star count on the CPU, max 1 experiments", agent="openai")
    await events_until_report(client, cpu, timeout=20)
    specs = {t["function"]["name"]: t["function"] for t in fake.requests[0].body["tools"]}
    assert set(specs) == set(TOOL_ARGUMENTS)
    # A goal that neither trains with NeMo RL nor fetches from the hub is not sent their tools.
    cpu_tools = {t["function"]["name"] for t in fake.requests[1].body["tools"]}
    assert cpu_tools == set(TOOL_ARGUMENTS) - {"nemo_rl", "fetch_from_hub"}
    for name, (arguments, required) in TOOL_ARGUMENTS.items():
        parameters = specs[name]["parameters"]
        assert parameters["type"] == "object" and parameters["additionalProperties"] is False, name
        assert set(parameters["properties"]) == arguments, name
        assert set(parameters.get("required", [])) == required, name
        assert specs[name]["description"] and "\n" not in specs[name]["description"], name
    shell = specs["shell"]["parameters"]["properties"]
    assert shell["timeout_s"] == {"type": "number", "description": "seconds before it is killed"}
    command = specs["run_experiment"]["parameters"]["properties"]["command"]
    assert {"type": "string"} in command["anyOf"] and {
        "type": "array",
        "items": {"type": "string"},
    } in command["anyOf"]


async def test_bad_tool_arguments_go_back_to_the_model(start_runner, connect, fake):
    fake.add(
        Turn(tool_calls=[ToolCall("shell", {"timeout_s": "soon"})]),
        Turn(tool_calls=[ToolCall("no_such_tool", {})]),
        finished("Understood."),
    )
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "call tools badly, max 1 experiments", agent="openai")
    await events_until_report(client, goal_id, timeout=20)
    [bad] = tool_results(fake.requests[1].body)
    assert bad.startswith("error: bad arguments for shell:")
    assert "command: Field required" in bad and "timeout_s: Input should be a valid number" in bad
    [unknown] = tool_results(fake.requests[2].body)
    assert unknown.startswith("error: there is no tool 'no_such_tool'") and "shell" in unknown


async def test_a_request_the_runner_would_refuse_is_said_in_one_line(start_runner, connect, fake):
    """Issue 36: run_experiment with an empty description came back to the model as pydantic's
    multi-line dump with its documentation URL; it is the runner's one-line refusal now."""
    fake.add(
        Turn(tool_calls=[ToolCall("run_experiment", {"command": "true", "description": ""})]),
        Turn(text="Understood."),
    )
    runner = await start_runner(agents=AGENTS)
    client = await connect(runner)
    goal_id = await submit(client, "run nothing, max 1 experiments", agent="openai")
    await events_until_report(client, goal_id, timeout=20)
    [said] = tool_results(fake.requests[1].body)
    assert said == (
        "error: the runner refused run_experiment: bad_request: invalid run_experiment: "
        "description: is empty: give the hypothesis this run tests"
    )


async def test_the_model_is_told_when_its_milestone_is_folded(start_runner, connect, fake):
    """Past the goal's rate (runner/folding.py) the milestone tool says the milestone was folded,
    in the runner's words, so the model posts less often; within it, "milestone posted"."""
    fake.add(
        Turn(tool_calls=[ToolCall("milestone", {"title": f"step {i}"}) for i in range(3)]),
        Turn(tool_calls=[ToolCall("finish", {"summary": "done"})]),
    )
    runner = await start_runner(agents=AGENTS, milestone_burst=2, milestones_per_minute=0.001)
    client = await connect(runner)
    goal_id = await submit(client, "post three milestones, max 1 experiments", agent="openai")
    await events_until_report(client, goal_id, timeout=40)

    first, second, third = tool_results(fake.requests[1].body)
    assert first == second == "milestone posted"
    assert (
        third.startswith("milestone logged (event ") and f"; folded: goal #{goal_id} posts 2 at once" in third
    )
