"""The Codex agent end to end: the real runner, the real `codex app-server` (0.171.0, installed by
`make test`), and FakeOpenAI as the model behind it (a Responses API endpoint).

The fake model is scripted by request content rather than by order: Codex aborts an in-flight model
request when it is steered or interrupted (which consumes a scripted item), so each answer looks at
what the request already contains (tool outputs, steering text) and answers idempotently.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import textwrap
import time
import tomllib
from pathlib import Path

import psutil
import pytest
from agent_settings import settings_from
from fake_openai import Fail, FakeOpenAI, ToolCall, Turn
from helpers import approval_prompts, events_until_report, eventually, host_pid, submit, vouched

from goaltender.agents.bootstrap import Misconfigured
from goaltender.agents.briefing import list_skills
from goaltender.agents.codex_config import CodexSettings, write_codex_home
from goaltender.agents.codex_prompts import report_text, says_done
from goaltender.protocol import messages as p
from goaltender.runner.supervisor import group_members
from goaltender.storage.records import MilestoneReported

REPO = Path(__file__).resolve().parent.parent
CODEX_BIN = REPO / ".codex-cli" / "node_modules" / ".bin" / "codex"
AGENT = [sys.executable, "-m", "goaltender.agents.codex_agent"]


@pytest.fixture
async def fake(monkeypatch):
    """FakeOpenAI, and the environment that points the Codex agent at it."""
    async for server in _endpoint(monkeypatch, FakeOpenAI()):
        yield server


@pytest.fixture
async def chat_only(monkeypatch):
    """A fake endpoint without the Responses API (Chat Completions only), for the Codex agent."""
    async for server in _endpoint(monkeypatch, FakeOpenAI(responses=False)):
        yield server


async def _endpoint(monkeypatch, server: FakeOpenAI):
    if not CODEX_BIN.exists():
        pytest.fail(
            f"the Codex CLI is not installed at {CODEX_BIN}: run `make test`, which installs it "
            "(npm install @openai/codex into .codex-cli/)"
        )
    await server.start()
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    monkeypatch.setenv("GOALTENDER_MODEL", "fake-model")
    monkeypatch.setenv("GOALTENDER_CODEX_BIN", str(CODEX_BIN))
    monkeypatch.setenv("GOALTENDER_CODEX_RETRIES", "0")  # fail fast on injected errors
    monkeypatch.delenv("GOALTENDER_CODEX_APPROVAL", raising=False)  # the default: untrusted
    yield server
    await server.close()


# ---- helpers ----


def outputs(body: dict) -> dict[str, str]:
    """call_id -> the tool output Codex sent back for it."""
    return {
        item["call_id"]: str(item.get("output"))
        for item in body.get("input", [])
        if item.get("type") == "function_call_output"
    }


def shell(cmd: str, call_id: str) -> Turn:
    """Codex's shell tool (0.171.0, fallback model metadata) is `exec_command` with `cmd`."""
    return Turn(tool_calls=[ToolCall("exec_command", {"cmd": cmd}, id=call_id)])


def requests_text(fake: FakeOpenAI) -> list[str]:
    return [json.dumps(seen.body) for seen in fake.requests]


async def decide(client, goal_id: int, decisions: list[tuple[bool, str | None]], then=None) -> list:
    """Answer the goal's approval prompts in order; returns the approvals as asked."""
    asked = []
    async for approval in approval_prompts(client, goal_id):
        approve, comment = decisions[len(asked)]
        asked.append(approval)
        await client.request(p.Decide(approval_id=approval.id, approve=approve, by="ana", comment=comment))
        if then is not None:
            await then(len(asked))
        if len(asked) == len(decisions):
            return asked
    return asked


async def approval_asked(runner, connect, goal_id: int) -> None:
    async for _ in approval_prompts(await connect(runner, "watch"), goal_id):
        return


def workspace(runner, goal_id: int = 1) -> Path:
    return runner.settings.workspaces / f"goal-{goal_id}"


def processes_with(needle: str, cwd: Path) -> list[psutil.Process]:
    """Live processes running in `cwd` (this test's workspace, not another test's) whose command
    line holds `needle`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if (
                needle in " ".join(proc.info["cmdline"] or [])
                and proc.info["status"] != psutil.STATUS_ZOMBIE
                and proc.cwd() == str(cwd)
            ):
                found.append(proc)
        except psutil.Error:
            pass
    return found


# ---- tests ----


async def test_approved_and_rejected_commands_brief_skills_metrics_report(
    start_runner, connect, fake, monkeypatch
):
    monkeypatch.setenv("GOALTENDER_CONTEXT_TOKENS", "32768")
    runner = await start_runner(agents={"codex": AGENT})
    ws = workspace(runner)
    skill = ws / ".agents" / "skills" / "star-helper" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text(
        "---\nname: star-helper\ndescription: SKILLMARK-93 tips for counting stars\n---\nUse the verifier.\n"
    )

    def model(body: dict) -> Turn:
        done = outputs(body)
        if "call_ms" not in done:  # a reporting verb: allowed by the agent's rules, reaches the runner
            return shell('goaltender milestone "Baseline planned" "posted from inside Codex"', "call_ms")
        if "call_ok" not in done:
            return shell("touch approved-marker", "call_ok")
        if "call_no" not in done:
            return shell("touch rejected-marker", "call_no")
        return Turn(
            text="Counted the stars: exact accuracy 0.91 with train_size=8000.\nNext: more data.\nGOAL COMPLETE"
        )

    fake.default = model
    client = await connect(runner)
    goal_id = await submit(client, "count the stars STARGOAL-7781, max 5 experiments", agent="codex")
    deciding = asyncio.ensure_future(
        decide(await connect(runner, "ana"), goal_id, [(True, None), (False, "too risky")])
    )
    events = await events_until_report(client, goal_id, timeout=30)
    approvals = await asyncio.wait_for(deciding, 5)

    # The shell command Codex wanted became a runner prompt; approved ran, rejected did not.
    assert [a.kind for a in approvals] == ["command", "command"]
    assert "touch approved-marker" in approvals[0].question and str(ws) in approvals[0].detail
    assert "touch rejected-marker" in approvals[1].question
    assert (ws / "approved-marker").exists()
    assert not (ws / "rejected-marker").exists()
    texts = requests_text(fake)
    declined = [t for t in texts if "call_no" in outputs(json.loads(t))]
    assert declined and "rejected by user" in outputs(json.loads(declined[0]))["call_no"]
    assert any("too risky" in t for t in texts)  # the rejection's comment reached Codex too

    # Codex read AGENTS.md (the brief) from the workspace, and listed the workspace's skills.
    first = fake.requests[0].body
    agents_md = [
        part["text"]
        for item in first["input"]
        for part in item.get("content") or []
        if isinstance(part, dict) and part.get("text", "").startswith("# AGENTS.md instructions for")
    ]
    assert agents_md and "STARGOAL-7781" in agents_md[0] and "Stop rule and budgets" in agents_md[0]
    # ... and only there: the first prompt does not carry the brief a second time (issue 36).
    sent = json.dumps(first)
    assert sent.count("STARGOAL-7781") == 1 and sent.count("## Stop rule and budgets") == 1
    assert "Work toward the goal in AGENTS.md" in sent
    assert "<skills_instructions>" in json.dumps(first) and "SKILLMARK-93" in json.dumps(first)
    assert "star-helper" in json.dumps(first)
    for name in list_skills():  # the project's skills, copied to .agents/skills by the agent
        assert f"- {name}:" in json.dumps(first), name
    assert {t["name"] for t in first["tools"] if t.get("type") == "function"} >= {"exec_command"}

    # The thread id is persisted in the workspace and in the diary; the goal finished with the report.
    thread_id = (ws / ".codex-thread").read_text().strip()
    diary = await client.request(p.ReadDiary(goal_id=goal_id, kind="note"))
    assert any(f"codex thread: {thread_id}" in e.text for e in diary.entries)
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert summary.status.goal.state == "finished"
    titles = [e.data.title for e in events if isinstance(e.data, MilestoneReported)]
    assert "Codex started" in titles and any(t.startswith("Codex: Counted the stars") for t in titles)
    assert "Baseline planned" in titles, outputs(fake.requests[-1].body).get("call_ms")
    report = events[-1].data
    assert report.end_reason == "the agent finished"
    assert "exact accuracy 0.91" in report.text and "GOAL COMPLETE" not in report.text

    # Token usage became metric series, cumulative.
    for name in ("agent/input_tokens", "agent/output_tokens"):
        series = await client.request(p.GetSeries(goal_id=goal_id, name=name))
        values = [v for _, v in series.points]
        assert values and values == sorted(values) and values[-1] > 0
    log = (ws / "codex.log").read_text()
    window = int(re.search(r"model context window: (\d+) tokens", log).group(1))
    assert 30_000 < window <= 32_768  # GOALTENDER_CONTEXT_TOKENS reached Codex (it keeps a 5% margin)
    assert "command completed (exit 0" in log and "touch approved-marker" in log
    assert "command declined" in log


async def test_a_brief_past_32_kib_reaches_codex_whole(start_runner, connect, fake):
    """The brief reaches Codex only as AGENTS.md, which Codex cuts at 32 KiB unless told otherwise:
    a long one (here a skill with 40 KB of description; a long diary handoff in practice) is sent
    whole."""
    runner = await start_runner(agents={"codex": AGENT})
    skill = runner.settings.home / "skills" / "aaa-long-notes" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text(f"---\nname: aaa-long-notes\ndescription: {'notes ' * 7000}END-OF-NOTES\n---\nx\n")
    fake.default = Turn(text="Read it all.\nGOAL COMPLETE")
    client = await connect(runner)
    goal_id = await submit(client, "read a long brief, max 1 experiments", agent="codex")
    await events_until_report(client, goal_id, timeout=30)
    brief = (workspace(runner, goal_id) / "AGENTS.md").read_text()
    assert len(brief.encode()) > 40_000 and "END-OF-NOTES" in brief
    sent = json.dumps(fake.requests[0].body)
    assert "END-OF-NOTES" in sent and json.dumps(brief.rstrip()[-300:])[1:-1] in sent  # its very end


async def test_steer_reaches_codex_mid_turn(start_runner, connect, fake):
    runner = await start_runner(agents={"codex": AGENT})

    def model(body: dict) -> Turn:
        if "STEER-LR-ONLY" in json.dumps(body):
            return Turn(text="Understood: only lr from now on.\nGOAL COMPLETE")
        # Holds the turn open until the test has seen the steer go in.
        return shell("for i in $(seq 600); do [ -f steered ] && break; sleep 0.05; done", "call_wait")

    fake.default = model
    client = await connect(runner)
    goal_id = await submit(client, "tune the model, max 3 experiments", agent="codex")
    ana = await connect(runner, "ana")

    async def steer_after_approving(_):
        await ana.request(p.Steer(goal_id=goal_id, text="STEER-LR-ONLY please", author="bob"))

    async def release_the_turn_once_steered():
        log = workspace(runner) / "codex.log"
        await eventually(lambda: log.exists() and "steered turn 1 (turn/steer)" in log.read_text(), 30)
        (workspace(runner) / "steered").touch()

    deciding = asyncio.ensure_future(decide(ana, goal_id, [(True, None)], then=steer_after_approving))
    releasing = asyncio.ensure_future(release_the_turn_once_steered())
    events = await events_until_report(client, goal_id, timeout=40)
    await asyncio.wait_for(deciding, 5)
    await asyncio.wait_for(releasing, 5)

    steered = [t for t in requests_text(fake) if "STEER-LR-ONLY" in t]
    assert steered and "bob" in steered[0]
    log = (workspace(runner) / "codex.log").read_text()
    assert "steered turn 1 (turn/steer)" in log  # into the running turn, not a new one
    titles = [e.data.title for e in events if isinstance(e.data, MilestoneReported)]
    assert "Steering passed to Codex" in titles
    assert events[-1].data.end_reason == "the agent finished"


async def test_codex_commands_find_the_runners_python_and_verbs_on_a_bare_path(
    start_runner, connect, fake, monkeypatch
):
    """The runner started from a venv not activated (PATH=/usr/bin:/bin, as a service has): Codex's
    shell still finds the venv's `goaltender` and a `python` that imports goaltender."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    probe = (
        "command -v goaltender python; python -c 'import goaltender; print(\"IMPORTED\")'; "
        "goaltender milestone 'PATH probe' 'from the Codex shell'"
    )

    def model(body: dict) -> Turn:
        if "call_path" not in outputs(body):
            return shell(probe, "call_path")
        return Turn(text="Found the install.\nGOAL COMPLETE")

    fake.default = model
    runner = await start_runner(agents={"codex": AGENT})
    client = await connect(runner)
    goal_id = await submit(client, "find the install, max 2 experiments", agent="codex")
    approving = asyncio.ensure_future(decide(await connect(runner, "ana"), goal_id, [(True, None)] * 3))
    try:
        events = await events_until_report(client, goal_id, timeout=40)
    finally:
        approving.cancel()
    assert events[-1].data.end_reason == "the agent finished"
    said = next(outputs(r.body)["call_path"] for r in fake.requests if "call_path" in outputs(r.body))
    bin_dir = Path(sys.executable).parent
    assert f"{bin_dir}/goaltender\n{bin_dir}/python\nIMPORTED" in said, said
    titles = [e.data.title for e in events if isinstance(e.data, MilestoneReported)]
    assert "PATH probe" in titles


async def test_stop_mid_turn_interrupts_and_leaves_no_process(start_runner, connect, fake):
    runner = await start_runner(agents={"codex": AGENT}, stop_grace_s=4.0)
    fake.default = lambda body: shell("sleep 31", "call_long")
    client = await connect(runner)
    goal_id = await submit(client, "a long one, max 3 experiments", agent="codex")
    await asyncio.wait_for(decide(await connect(runner, "ana"), goal_id, [(True, None)]), 20)
    ws = workspace(runner)
    # The command itself, not just the sandbox that is starting it (a stop in between is Codex's
    # own race: what its interrupted sandbox starts later is in no group known yet).
    await eventually(
        lambda: [p for p in processes_with("sleep 31", ws) if p.info["cmdline"] == ["sleep", "31"]]
    )
    agent_pid = (await runner.store.get_goal(goal_id)).agent_pid
    server_pid = host_pid(int((ws / ".codex-app-server.pid").read_text()), agent_pid)
    assert server_pid is not None

    started = time.monotonic()
    done = await client.request(p.Stop(goal_id=goal_id, by="ana", reason="enough"))
    assert time.monotonic() - started < 4.0  # the agent went on SIGTERM, not at SIGKILL
    assert f"stopped by {vouched('ana')}: enough" in done.message

    summary = await client.request(p.Summary(goal_id=goal_id))
    assert summary.status.goal.state == "stopped"
    events = await events_until_report(client, goal_id, timeout=5)
    assert "Stopped during turn 1 of the Codex session" in events[-1].data.text
    assert group_members(agent_pid) == []
    await eventually(lambda: group_members(server_pid) == [], timeout=5)
    assert not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE
    assert processes_with("sleep 31", ws) == []
    log = (ws / "codex.log").read_text()
    assert "turn 1 interrupted" in log and "stopped" in log


async def test_runner_restart_resumes_the_codex_thread(start_runner, connect, fake):
    def model(body: dict) -> Turn:
        text = json.dumps(body)
        if "runner restarted and interrupted this session" in text:
            return Turn(text="Back again, history intact.\nGOAL COMPLETE")
        if "call_hold" in text:  # the approval prompt is pending when the runner goes down
            return Turn(text="still waiting")
        if "Continue toward the goal" in text:
            return shell("touch held-marker", "call_hold")
        return Turn(text="FIRSTTURN-4242 baseline planned, more to do")

    fake.default = model
    first = await start_runner(agents={"codex": AGENT})
    client = await connect(first)
    goal_id = await submit(client, "resumable goal, max 3 experiments", agent="codex")
    await asyncio.wait_for(approval_asked(first, connect, goal_id), 30)
    ws = workspace(first)
    thread_id = (ws / ".codex-thread").read_text().strip()
    old_server = int((ws / ".codex-app-server.pid").read_text())
    await first.close()  # SIGTERM to the agent: it interrupts the turn and ends its app-server
    await eventually(lambda: group_members(old_server) == [], timeout=5)
    before = len(fake.requests)

    second = await start_runner(agents={"codex": AGENT})  # same home: recovers the goal, resumed=1
    client = await connect(second)
    events = await events_until_report(client, goal_id, timeout=30)
    assert events[-1].data.end_reason == "the agent finished"
    assert "Back again, history intact" in events[-1].data.text

    # Same thread: the id did not change, the agent said it resumed it, and the model's first
    # request after the restart carries the first session's history.
    assert (ws / ".codex-thread").read_text().strip() == thread_id
    titles = [e.data.title for e in events if isinstance(e.data, MilestoneReported)]
    assert "Codex resumed its thread after a restart" in titles
    assert f"resumed thread {thread_id}" in (ws / "codex.log").read_text()
    after = requests_text(fake)[before:]
    assert after and "FIRSTTURN-4242" in after[0] and "runner restarted" in after[0]
    notes = await client.request(p.ReadDiary(goal_id=goal_id, kind="note"))
    assert sum(f"codex thread: {thread_id}" in e.text for e in notes.entries) == 1  # not a new thread


async def test_a_killed_agent_takes_its_app_server_along(start_runner, connect, fake):
    fake.default = lambda body: shell("touch never-decided", "call_pending")
    runner = await start_runner(agents={"codex": AGENT})
    client = await connect(runner)
    goal_id = await submit(client, "crash me, max 2 experiments", agent="codex")
    await asyncio.wait_for(approval_asked(runner, connect, goal_id), 20)
    agent_pid = (await runner.store.get_goal(goal_id)).agent_pid
    server_pid = host_pid(int((workspace(runner) / ".codex-app-server.pid").read_text()), agent_pid)
    assert server_pid is not None
    assert group_members(server_pid)  # its own process group, so a SIGKILL of the agent's misses it
    os.killpg(agent_pid, signal.SIGKILL)
    # PR_SET_PDEATHSIG and the end of its stdin take the app-server down without the agent.
    await eventually(lambda: group_members(server_pid) == [], timeout=10)
    events = await events_until_report(client, goal_id, timeout=10)
    assert "the agent exited with code -9" in events[-1].data.end_reason


async def test_endpoint_failure_fails_the_goal_with_the_reason(start_runner, connect, fake):
    fake.add(Fail(400, message="model exploded XYZ-55"))
    runner = await start_runner(agents={"codex": AGENT})
    client = await connect(runner)
    goal_id = await submit(client, "doomed, max 2 experiments", agent="codex")
    events = await events_until_report(client, goal_id, timeout=30)
    failed = [e.data for e in events if isinstance(e.data, MilestoneReported) and "failed" in e.data.title]
    assert failed and "XYZ-55" in failed[0].text and "turn failed" in failed[0].title
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert summary.status.goal.state == "failed"
    assert "the agent exited with code 1" in events[-1].data.end_reason
    server_pid = int((workspace(runner) / ".codex-app-server.pid").read_text())
    assert group_members(server_pid) == []


async def test_an_endpoint_without_the_responses_api_says_what_to_do(start_runner, connect, chat_only):
    """Issue 36: Codex on a server that serves Chat Completions only failed with a 404 and no word
    of what to do."""
    runner = await start_runner(agents={"codex": AGENT})
    client = await connect(runner)
    goal_id = await submit(client, "no responses here, max 2 experiments", agent="codex")
    events = await events_until_report(client, goal_id, timeout=60)
    [failed] = [e.data for e in events if isinstance(e.data, MilestoneReported) and "failed" in e.data.title]
    advice = (
        f"this endpoint has no Responses API ({chat_only.base_url}/responses answered 404), which Codex "
        "needs: use the built-in agent, which speaks Chat Completions (`with openai` in the goal, "
        "`--agent openai` on the command line)."
    )
    assert failed.title.startswith("Codex agent failed: this endpoint has no Responses API (")
    assert failed.text.startswith(advice) and "unexpected status 404" in failed.text  # Codex's words too
    assert advice in events[-1].data.text  # the report
    assert (await client.request(p.Summary(goal_id=goal_id))).status.goal.state == "failed"
    assert [seen.path for seen in chat_only.requests] == []  # /responses is no route there: never served


async def test_a_model_the_endpoint_does_not_serve_is_not_called_a_missing_api(start_runner, connect, fake):
    """vLLM answers 404 on /v1/responses for a model it does not serve: that is the model's name."""
    fake.add(Fail(404, message="The model `fake-model` does not exist."))
    runner = await start_runner(agents={"codex": AGENT})
    client = await connect(runner)
    goal_id = await submit(client, "wrong model, max 2 experiments", agent="codex")
    events = await events_until_report(client, goal_id, timeout=60)
    [failed] = [e.data for e in events if isinstance(e.data, MilestoneReported) and "failed" in e.data.title]
    assert failed.text.startswith(
        "the endpoint does not serve that model: set GOALTENDER_MODEL to one it lists."
    )
    assert "Responses API" not in failed.text and "does not exist" in failed.text


FAKE_APP_SERVER = textwrap.dedent(
    """
    import json, sys
    out = open(sys.argv[1], "a")
    def send(msg):
        sys.stdout.write(json.dumps(msg) + "\\n"); sys.stdout.flush()
    answers = {}
    for line in sys.stdin:
        msg = json.loads(line)
        method = msg.get("method")
        if method == "initialize":
            send({"id": msg["id"], "result": {"userAgent": "fake-app-server"}})
        elif method == "thread/start":
            send({"id": msg["id"], "result": {"thread": {"id": "thr-fake"}}})
        elif method == "turn/start":
            send({"id": msg["id"], "result": {"turn": {"id": "turn-1", "status": "inProgress"}}})
            wanted = {"network": {"enabled": True}, "fileSystem": {"write": ["/data/shared"]}}
            send({"id": 100, "method": "item/permissions/requestApproval", "params": {
                "threadId": "thr-fake", "turnId": "turn-1", "itemId": "i1", "cwd": "/w", "startedAtMs": 0,
                "reason": "download the dataset", "permissions": wanted}})
            send({"id": 101, "method": "item/tool/call", "params": {"tool": "mystery"}})
        elif "id" in msg and method is None:
            answers[msg["id"]] = msg
            if len(answers) == 2:
                out.write(json.dumps(answers)); out.close()
                sys.stderr.write("fake app-server: crashing on purpose\\n")
                sys.exit(3)
    """
)


async def test_permissions_unknown_requests_and_a_crashing_app_server(
    start_runner, connect, monkeypatch, request
):
    runner = await start_runner(agents={"codex": AGENT})
    # Under /var/tmp, which the agent's sandbox shows it read-only (tmp_path is under /tmp: the
    # sandbox's /tmp is the goal's own; the runner's cache is the goals' own caches).
    fakes = Path(tempfile.mkdtemp(prefix="gt-fake-codex-", dir="/var/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(fakes, ignore_errors=True))
    script = fakes / "fake_app_server.py"
    script.write_text(FAKE_APP_SERVER)
    binary = fakes / "codex"  # its answers go to the goal's workspace, where it runs
    binary.write_text(f"#!/bin/sh\nexec {sys.executable} {script} codex-answers.json\n")
    binary.chmod(0o755)
    monkeypatch.setenv("GOALTENDER_CODEX_BIN", str(binary))
    client = await connect(runner)
    goal_id = await submit(client, "permissions please, max 2 experiments", agent="codex")
    [approval] = await asyncio.wait_for(decide(await connect(runner, "ana"), goal_id, [(True, None)]), 20)
    events = await events_until_report(client, goal_id, timeout=20)

    assert approval.kind == "permissions"
    assert "network access" in approval.question and "/data/shared" in approval.question
    assert "download the dataset" in approval.detail
    replies = json.loads((workspace(runner, goal_id) / "codex-answers.json").read_text())
    assert replies["100"]["result"] == {
        "permissions": {"network": {"enabled": True}, "fileSystem": {"write": ["/data/shared"]}},
        "scope": "turn",
    }
    assert replies["101"]["error"]["code"] == -32601  # unknown server requests get an error, not silence
    failed = [e.data for e in events if isinstance(e.data, MilestoneReported) and "failed" in e.data.title]
    assert failed and "exited with code 3" in failed[0].title and "crashing on purpose" in failed[0].text
    assert (await client.request(p.Summary(goal_id=goal_id))).status.goal.state == "failed"


async def test_missing_codex_binary_fails_the_goal_clearly(start_runner, connect, tmp_path, monkeypatch):
    monkeypatch.setenv("GOALTENDER_CODEX_BIN", str(tmp_path / "no-such-codex"))
    runner = await start_runner(agents={"codex": AGENT})
    client = await connect(runner)
    goal_id = await submit(client, "no codex here", agent="codex")
    events = await events_until_report(client, goal_id, timeout=20)
    failed = [e.data for e in events if isinstance(e.data, MilestoneReported) and "failed" in e.data.title]
    assert failed and "no Codex CLI at" in failed[0].title
    assert (await client.request(p.Summary(goal_id=goal_id))).status.goal.state == "failed"


def codex_settings(monkeypatch, **env) -> CodexSettings:
    return settings_from(monkeypatch, CodexSettings, **env)


def test_settings_codex_home_and_done_detection(tmp_path, monkeypatch):
    env = {
        "PATH": str(tmp_path / "empty"),
        "OPENAI_BASE_URL": "http://127.0.0.1:8000/v1",
        "GOALTENDER_MODEL": "Qwen/Qwen3-8B",
        "GOALTENDER_CONTEXT_TOKENS": "65536",
    }
    settings = codex_settings(monkeypatch, **env)
    assert settings.binary == str(CODEX_BIN)  # not on PATH: the copy `make test` installs
    assert (settings.sandbox, settings.approval, settings.network) == ("workspace-write", "untrusted", True)
    assert (settings.max_turns, settings.idle_timeout_s, settings.retries) == (20, 3600, None)
    on_path = tmp_path / "bin" / "codex"
    on_path.parent.mkdir()
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    assert codex_settings(monkeypatch, **{**env, "PATH": str(on_path.parent)}).binary == str(on_path)
    assert codex_settings(monkeypatch, **env, GOALTENDER_CODEX_BIN="/opt/codex").binary == "/opt/codex"
    assert codex_settings(monkeypatch, **env, GOALTENDER_CODEX_NETWORK="0").network is False
    with pytest.raises(Misconfigured, match="GOALTENDER_CODEX_MAX_TURNS='lots' is not a int"):
        codex_settings(monkeypatch, **env, GOALTENDER_CODEX_MAX_TURNS="lots")
    with pytest.raises(Misconfigured, match="GOALTENDER_CODEX_IDLE_TIMEOUT_S='0' must be more than 0"):
        codex_settings(monkeypatch, **env, GOALTENDER_CODEX_IDLE_TIMEOUT_S="0")

    write_codex_home(tmp_path / "home", settings)
    config = tomllib.loads((tmp_path / "home" / "config.toml").read_text())
    assert config["model"] == "Qwen/Qwen3-8B" and config["model_context_window"] == 65536
    assert config["model_provider"] == "goaltender"
    assert config["model_providers"]["goaltender"] == {
        "name": "goaltender endpoint",
        "base_url": "http://127.0.0.1:8000/v1",
        "wire_api": "responses",
        "env_key": "OPENAI_API_KEY",
    }
    assert (
        config["allow_login_shell"] is False and config["sandbox_workspace_write"]["network_access"] is True
    )
    assert config["project_doc_max_bytes"] == 256 * 1024  # the whole brief: Codex cuts AGENTS.md at 32 KiB
    assert "approval_policy" not in config  # Codex 0.171 refuses "untrusted" there; it goes in thread/start
    write_codex_home(tmp_path / "home", codex_settings(monkeypatch, **env, GOALTENDER_CODEX_RETRIES="2"))
    provider = tomllib.loads((tmp_path / "home" / "config.toml").read_text())["model_providers"]["goaltender"]
    assert (provider["request_max_retries"], provider["stream_max_retries"]) == (2, 2)
    rules = (tmp_path / "home" / "rules" / "goaltender.rules").read_text()
    assert 'pattern = ["goaltender", "milestone"]' in rules and '"experiment"' not in rules
    assert 'pattern = ["goaltender", "skills", "edit"]' in rules and '"revert"' not in rules

    assert says_done("Best 0.91 with lr=3e-4.\n\n**GOAL COMPLETE**")
    assert says_done("Nothing more to do.")
    assert not says_done(
        "When it is met I will write GOAL COMPLETE.\nFirst: the baseline.\nThen lr.\nThen more."
    )
    assert report_text("Best 0.91.\nNext: more data.\n`GOAL COMPLETE`") == "Best 0.91.\nNext: more data."
