"""The sweep's blocking path (agents/blocking.py over quick_client.Session; issue 13): a real
runner answers it; a stop while the sweep waits on a person still gets its report; a call cut
short leaves the session usable; any line a runner could send is an answer or a clear error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import events_until_report, eventually, submit
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli_quick import agent_goal, stored  # noqa: F401 - agent_goal is a fixture

from goaltender.protocol import messages as p
from goaltender.protocol.quick_client import RunnerRefused, RunnerUnavailable, Session
from goaltender.protocol.wire import MAX_LINE

ASKING_SWEEP = [
    sys.executable,
    "-m",
    "goaltender.agents.sweep",
    "--task",
    "toy_task:TASK",
    "--approve-above",
    "0.5",
]


async def test_stopped_while_it_waits_on_a_person_the_sweep_hands_in_its_report(
    start_runner, connect, monkeypatch
):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # toy_task, for the agent
    runner = await start_runner(agents={"sweep": ASKING_SWEEP})
    client = await connect(runner)
    goal_id = await submit(client, "toy sweep, max 3 experiments", agent="sweep")

    async def pending():  # the baseline's estimate (1 s) is above 0.5 s: it asks first, and waits
        status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
        return status.pending_approvals

    [approval] = await eventually(pending, timeout=30)
    assert approval.question.startswith("Run a costly experiment (~1s")
    await client.request(p.Stop(goal_id=goal_id, by="ana", reason="enough"))
    events = await events_until_report(client, goal_id, timeout=30)
    assert "**Why it ended:** stopped by a person." in events[-1].data.text
    goal = await runner.store.get_goal(goal_id)
    agent_log = (Path(goal.workspace) / "agent.log").read_text()
    assert "sweep-agent: stopped by a signal: handing in the report" in agent_log
    assert "Traceback" not in agent_log


async def test_a_call_cut_short_leaves_the_session_usable(agent_goal):  # noqa: F811
    runner, client, goal_id, sock = agent_goal
    session = Session(Path(sock), f"agent:test:{goal_id}")

    def cut_short() -> None:
        session.deadline = time.monotonic() + 0.3  # an approval nobody answers in time
        with pytest.raises(TimeoutError):
            session.call("ask", "decision", goal_id=goal_id, kind="cost", question="Run it?")
        session.deadline = None

    await asyncio.to_thread(cut_short)
    # Answered late: the decision goes to the call that asked, which is no more.
    status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
    [approval] = status.pending_approvals
    await client.request(p.Decide(approval_id=approval.id, approve=True, by="ana"))

    def go_on() -> tuple[dict, str, dict]:
        after = session.call("milestone", "done", goal_id=goal_id, title="after the cut")
        with pytest.raises(RunnerRefused) as refused:  # another goal's: the runner's own words
            session.call("milestone", "done", goal_id=goal_id + 1, title="not mine")
        again = session.call("milestone", "done", goal_id=goal_id, title="still here")
        session.close()
        return after, refused.value.code, again

    after, code, again = await asyncio.to_thread(go_on)
    assert after["type"] == again["type"] == "done" and code == "forbidden"
    assert [m.title for m in await stored(runner, goal_id, "milestone")] == ["after the cut", "still here"]


def test_without_a_runner_a_session_says_how_to_start_one(tmp_path):
    with pytest.raises(
        RunnerUnavailable, match=r"no runner is listening on .*start one with `goaltender runner`"
    ):
        Session(tmp_path / "nothing.sock", "agent:test:1").call("milestone", "done", goal_id=1, title="x")


class LineServer:
    """A Unix socket that welcomes a hello, then answers the next request with `answer` and hangs
    up: what a broken or hostile runner could send."""

    def __init__(self, path: Path):
        self.path = path
        self.answer = b""
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError), conn.makefile("rb") as lines:
                hello = json.loads(lines.readline())
                conn.sendall(p.encode(p.Welcome(id=hello["id"], runner="fake")))
                lines.readline()
                conn.sendall(self.answer)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def line_server(tmp_path_factory):
    server = LineServer(tmp_path_factory.mktemp("line") / "runner.sock")
    yield server
    server.close()


@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(
    answer=st.one_of(
        st.binary(max_size=300),
        st.binary(max_size=300).map(lambda data: data + b"\n"),
        st.sampled_from(
            [b'{"id": 2, "type": "done"}\n', b'{"type": "error", "code": "x", "message": "y"}\n']
        ),
        st.sampled_from([b"[]\n", b"null\n", b'{"id": 2}\n', b'{"id": 2, "type": "inbox"}\n', b"\xff\n"]),
    )
)
def test_any_answer_is_a_reply_or_a_clear_error(line_server, answer):
    line_server.answer = answer
    session = Session(line_server.path, "agent:test:1")
    try:
        reply = session.call("milestone", "done", goal_id=1, title="x")
    except (RunnerRefused, RunnerUnavailable) as exc:
        assert str(exc)
    else:
        assert reply["type"] == "done" and reply["id"] == 2
    finally:
        session.close()


def test_a_line_longer_than_the_protocol_allows_ends_the_call(line_server):
    line_server.answer = b"x" * (MAX_LINE + 1)
    with pytest.raises(RunnerUnavailable, match=f"a line over {MAX_LINE} bytes"):
        Session(line_server.path, "agent:test:1").call("milestone", "done", goal_id=1, title="x")
