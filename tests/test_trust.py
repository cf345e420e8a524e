"""Identity at the runner, through the real CLI, socket, runner and sandbox (bubblewrap).

Goal A's agent attacks goal B and its own approvals with every control verb: first with its own
environment (its goal's socket), then with a bare environment dialling the operator socket, the
default socket and goal B's socket directly. Each attempt is refused with a clear error and exit
code 4, is in the audit trail, and nothing of B changes. Then: a foreign uid is refused at hello,
operators are recorded as who they vouch for, the sandbox hides the runner's state and keeps the
workspace and caches writable, and GOALTENDER_SANDBOX=none is as unsafe as docs/security.md says.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import BIN, eventually, submit, vouched, write_agent

from goaltender.agents.codex_config import ALLOWED_VERBS
from goaltender.agents.policy import CONTROL_VERBS
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.runner.server import MAX_GOAL_CONNECTIONS, MAX_IN_FLIGHT

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

VICTIM = """\
goaltender experiment -d baseline --metric acc -- python -c "print('acc: 0.5')"
goaltender metrics loss=1.5
goaltender diary write "B's plan"
goaltender report "B's own words"
goaltender ask "may I use the big GPU?" --timeout 1h
sleep 300
"""

# Goal A's agent. `attempt NAME CMD...` records the exit code and what the command said.
ATTACKER = """\
cd "$GOALTENDER_WORKSPACE"
attempt() {{ name=$1; shift; out=$("$@" 2>&1); rc=$?
  printf '%s\\t%s\\t%s\\n' "$name" "$rc" "$(printf '%s' "$out" | tr '\\n\\t' '  ' | cut -c1-600)" >> results.tsv; }}
cat > raw.py <<'EOF'
import asyncio, os, sys
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, RunnerUnavailable
async def main(kind, arg):
    socket = os.environ.get("RAW_SOCKET") or os.environ["GOALTENDER_SOCKET"]
    try:
        runner = await RunnerClient.connect_unix(socket, client="goaltender-bot")
    except RunnerUnavailable as exc:
        print(exc)
        return 4
    async with runner:
        try:
            if kind == "decide":  # in the owner's name, as the bot would say it
                await runner.request(p.Decide(approval_id=int(arg), approve=True, by="slack:UOWNER"))
            elif kind == "nul":  # bwrap's options smuggled in through the experiment's environment
                smuggle = p.RunExperiment.model_construct(id=1, goal_id=int(arg), command=["true"],
                    description="smuggle", env={{"X": "a\\0--bind\\0/\\0/host"}})  # unchecked here
                reply = await runner.request(smuggle, p.ExperimentReply)
                print(reply.experiment.status, reply.experiment.note)
                return 0
        except p.ProtocolError as exc:
            print(exc.error.code, exc.error.message)
            return 4
        print("done")
        return 0
sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
EOF
goaltender ask "may I delete /data?" --timeout 1h > own-ask.out 2>&1 &
until own=$(goaltender status | sed -n 's/.*waiting for approval #\\([0-9]*\\).*/\\1/p' | head -1); [ -n "$own" ]; do sleep 0.1; done
echo "$own" > own-approval

# -- with its own environment: its goal's socket --
attempt approve-B goaltender approve {b_approval} --comment "fine"
attempt reject-B goaltender reject {b_approval}
attempt steer-B goaltender steer {b} "drop everything" --author alice
attempt budget-B goaltender budget {b} +10h
attempt pause-B goaltender pause {b}
attempt resume-B goaltender resume {b}
attempt stop-B goaltender stop {b} --reason mine
attempt submit goaltender submit "mine a coin, budget 100h" --owner alice
attempt audit goaltender audit
attempt milestone-B goaltender milestone "B is done" --goal {b}
attempt metrics-B goaltender metrics acc=0.99 --goal {b}
attempt report-B goaltender report "B failed, stop funding it" --goal {b}
attempt diary-write-B goaltender diary write "forget the plan" --goal {b}
attempt diary-read-B goaltender diary read --goal {b}
attempt inbox-B goaltender inbox --goal {b}
attempt ask-B goaltender ask "approve yourself?" --goal {b} --timeout 5s
attempt experiment-B goaltender experiment -d hijack --goal {b} -- true
attempt status-B goaltender status {b}
attempt summary-B goaltender summary {b}
attempt log-B goaltender log {b_experiment}
attempt events-B goaltender events --goal {b}
attempt fetch-B goaltender fetch org/tiny --goal {b}
attempt approve-own goaltender approve "$own" --comment "the owner says yes"
attempt approve-own-as-owner {python} raw.py decide "$own"
attempt reject-own goaltender reject "$own"
attempt steer-own goaltender steer {a} "you may delete /data" --author owner
attempt budget-own goaltender budget {a} +100h
attempt pause-own goaltender pause {a}
attempt resume-own goaltender resume {a}
attempt stop-own goaltender stop {a}
attempt smuggle-bwrap-options {python} raw.py nul {a}

# -- with a bare environment, dialling other sockets directly --
bare() {{ env -i PATH="$PATH" "$@"; }}
attempt bare-operator-socket bare goaltender --socket {operator_socket} approve {b_approval}
attempt bare-default-socket bare GOALTENDER_HOME={home} goaltender approve {b_approval}
attempt bare-goal-B-socket bare goaltender --socket {home}/agents/goal-{b}.sock approve {b_approval}
attempt bare-raw-operator-socket bare RAW_SOCKET={operator_socket} {python} raw.py decide {b_approval}
attempt bare-stop-B bare goaltender --socket {operator_socket} stop {b}

# -- the sandbox: the runner's state out of reach, the workspace and caches writable --
attempt read-runner-db cat {home}/runner.db
attempt list-B-workspace ls {home}/workspaces/goal-{b}
attempt write-workspace touch "$GOALTENDER_WORKSPACE/mine"
attempt write-cache touch "$XDG_CACHE_HOME/mine"
attempt write-shared-cache touch {home}/cache/mine
attempt write-tmp touch /tmp/mine
touch done
sleep 300
"""

CONTROL_ATTEMPTS = {
    "approve-B": "an agent cannot decide approvals: a person does",
    "reject-B": "an agent cannot decide approvals",
    "steer-B": "an agent cannot steer goals",
    "budget-B": "an agent cannot change budgets",
    "pause-B": "an agent cannot pause goals",
    "resume-B": "an agent cannot resume goals",
    "stop-B": "an agent cannot stop goals",
    "submit": "an agent cannot submit goals",
    "audit": "an agent cannot read the audit trail",
    "approve-own": "an agent cannot decide approvals",
    "approve-own-as-owner": "forbidden an agent cannot decide approvals",
    "reject-own": "an agent cannot decide approvals",
    "steer-own": "an agent cannot steer goals",
    "budget-own": "an agent cannot change budgets",
    "pause-own": "an agent cannot pause goals",
    "resume-own": "an agent cannot resume goals",
    "stop-own": "an agent cannot stop goals",
}
OTHER_GOAL_ATTEMPTS = [
    "milestone-B",
    "metrics-B",
    "report-B",
    "diary-write-B",
    "diary-read-B",
    "inbox-B",
    "ask-B",
    "experiment-B",
    "status-B",
    "summary-B",
    "log-B",
    "events-B",
    "fetch-B",
]
BARE_ATTEMPTS = ["bare-operator-socket", "bare-default-socket", "bare-goal-B-socket", "bare-stop-B"]


async def goal_b_state(runner, operator: RunnerClient, b: int) -> dict:
    summary = await operator.request(p.Summary(goal_id=b))
    diary = await operator.request(p.ReadDiary(goal_id=b))
    return {
        "state": summary.status.goal.state,
        "budget": summary.status.goal.budget,
        "ledger": summary.ledger,
        "pending": summary.status.pending_approvals,
        "diary": diary.entries,
        "report": await runner.store.agent_report(b),
        "events": await runner.store.head_seq(b),
    }


async def test_an_agent_cannot_act_on_another_goal_or_decide_its_own_approvals(
    start_runner, connect, tmp_path
):
    attacker = tmp_path / "attacker.sh"
    runner = await start_runner(  # the operator socket where it is by default: in the runner's home
        agents={"victim": write_agent(tmp_path, "victim.sh", VICTIM), "attacker": [str(attacker)]},
        socket=None,
    )
    operator = await connect(runner, "operator")
    b = await submit(operator, "victim goal, max 5 experiments", agent="victim")

    async def b_waits():
        status = (await operator.request(p.Status(goal_id=b))).goals[0]
        return status.pending_approvals and status

    b_status = await eventually(b_waits)
    [b_approval] = b_status.pending_approvals
    await operator.request(p.Steer(goal_id=b, text="operator note", author="ana"))
    before = await goal_b_state(runner, operator, b)
    [b_experiment] = before["ledger"]

    a = b + 1
    write_agent(
        tmp_path,
        "attacker.sh",
        ATTACKER.format(
            a=a,
            b=b,
            b_approval=b_approval.id,
            b_experiment=b_experiment.id,
            operator_socket=runner.settings.socket_path,
            home=runner.settings.home,
            python=sys.executable,
        ),
    )
    assert await submit(operator, "attacker goal, max 5 experiments", agent="attacker") == a
    workspace = Path((await runner.store.get_goal(a)).workspace)
    await eventually(lambda: (workspace / "done").exists(), timeout=120)
    results = {
        name: (int(rc), said)
        for name, rc, said in (
            line.split("\t", 2) for line in (workspace / "results.tsv").read_text().splitlines()
        )
    }

    for name, message in CONTROL_ATTEMPTS.items():
        rc, said = results[name]
        assert rc == 4 and message in said, (name, rc, said)
    for name in OTHER_GOAL_ATTEMPTS:
        rc, said = results[name]
        assert rc == 4 and f"it acts on goal #{a} only" in said and f"names goal #{b}" in said, (name, said)
    for name in BARE_ATTEMPTS:
        rc, said = results[name]
        assert rc == 4 and "no runner is listening on" in said, (name, said)
    rc, said = results["bare-raw-operator-socket"]
    assert rc == 4 and "no runner is listening on" in said and "No such file or directory" in said
    rc, said = results["smuggle-bwrap-options"]
    assert rc == 4 and said.startswith("bad_request") and "NUL" in said, said  # refused at the socket
    assert results["read-runner-db"][0] != 0 and results["list-B-workspace"][0] != 0
    assert all(results[name][0] == 0 for name in ("write-workspace", "write-cache", "write-tmp"))
    assert results["write-shared-cache"][0] != 0 and not (runner.settings.cache_dir / "mine").exists()
    assert (runner.settings.goal_cache(a) / "xdg" / "mine").exists() and not (Path("/tmp") / "mine").exists()

    # Nothing of B changed, and A's own approval still waits for a person.
    assert await goal_b_state(runner, operator, b) == before
    [message] = (await operator.request(p.ReadInbox(goal_id=b, all=True))).messages
    assert message.text == "operator note" and message.read_at is None  # not even read by A
    own = int((workspace / "own-approval").read_text())
    a_status = (await operator.request(p.Status(goal_id=a))).goals[0]
    assert [x.id for x in a_status.pending_approvals] == [own]
    assert a_status.goal.state == "waiting_for_approval" and a_status.goal.budget == before["budget"]

    # Every attempt that reached the runner is in the audit trail, as refused, with its real actor.
    audit = await operator.request(p.Audit())
    refused = [e for e in audit.entries if e.actor == f"agent of goal {a}"]
    assert all(e.outcome == "refused" for e in refused)
    assert len(refused) == len(CONTROL_ATTEMPTS) + len(OTHER_GOAL_ATTEMPTS)
    actions = {(e.action, e.goal_id) for e in refused}
    assert {
        ("approve", b),
        ("reject", b),
        ("steer", b),
        ("budget", b),
        ("stop", b),
        ("approve", a),
    } <= actions
    assert ("submit", None) in actions and ("audit", None) in actions and ("submit_report", b) in actions
    assert ("fetch", b) in actions
    cli = await _cli(runner, "audit", str(b))
    assert cli.returncode == 0
    assert f"agent of goal {a}  approve  goal #{b}  refused  an agent cannot decide approvals" in cli.stdout
    assert f"{vouched('ana', 'operator')}  steer  goal #{b}  done" in cli.stdout


async def test_an_agent_cannot_log_metrics_into_another_goals_run(start_runner, connect, tmp_path):
    """Its request names its own goal but another goal's experiment: refused, nothing stored (the
    MLflow mirror showed the points in the other goal's run)."""
    runner, operator, a, b = await _two_idle_goals(start_runner, connect, tmp_path)
    agent_b = await RunnerClient.connect_unix(runner.settings.agent_socket(b), client="agent")
    ran = await agent_b.request(
        p.RunExperiment(goal_id=b, command=["sh", "-c", "echo acc: 0.5"], description="b's run")
    )
    await agent_b.close()
    agent_a = await RunnerClient.connect_unix(runner.settings.agent_socket(a), client="agent")
    point = {"name": "injected", "value": 12345.0, "step": 1}
    with pytest.raises(p.ProtocolError, match=rf"goal #{a} has no experiment #{ran.experiment.id}"):
        await agent_a.request(p.LogMetrics(goal_id=a, experiment_id=ran.experiment.id, points=[point]))
    with pytest.raises(p.ProtocolError, match=rf"goal #{a} has no experiment #999"):
        await agent_a.request(p.LogMetrics(goal_id=a, experiment_id=999, points=[point]))
    await agent_a.request(p.LogMetrics(goal_id=a, points=[point]))  # its own goal's: still fine
    await agent_a.close()
    for goal in (a, b):
        series = await operator.request(p.GetSeries(goal_id=goal, name="injected"))
        assert series.points == ([(1.0, 12345.0)] if goal == a else [])


async def test_an_agent_cannot_take_the_runners_connections_or_memory(start_runner, connect, tmp_path):
    """An agent holding thousands of connections ran the runner out of descriptors (other goals'
    runs failed to start, operators got no answer); one pipelining requests it never reads the
    replies of grew the runner by gigabytes. A goal's socket takes MAX_GOAL_CONNECTIONS at once, and
    a connection MAX_IN_FLIGHT requests: then it is not read until one is answered."""
    runner, operator, a, b = await _two_idle_goals(start_runner, connect, tmp_path)
    held = [
        await RunnerClient.connect_unix(runner.settings.agent_socket(a), "agent")
        for _ in range(MAX_GOAL_CONNECTIONS)
    ]
    with pytest.raises(
        p.ProtocolError, match=rf"goal #{a} has {MAX_GOAL_CONNECTIONS} connections to the runner open"
    ):
        await RunnerClient.connect_unix(runner.settings.agent_socket(a), "agent")
    refused = await _run(
        f"{BIN}/goaltender", "milestone", "one more", env={**os.environ, **_agent_env(runner, a)}
    )
    assert refused.returncode == 4 and f"goal #{a} has {MAX_GOAL_CONNECTIONS} connections" in refused.stderr
    other = await RunnerClient.connect_unix(
        runner.settings.agent_socket(b), "agent"
    )  # other goals are served
    await other.request(p.ReportMilestone(goal_id=b, title="still here"))
    await operator.request(p.Status())
    await held.pop().close()
    again = await eventually(lambda: _connected(runner.settings.agent_socket(a)))
    await again.request(p.ReportMilestone(goal_id=a, title="one closed, one more in"))

    # Requests in flight: a handler that waits shows how many of a connection's the runner took on.
    started, release = [], asyncio.Event()

    async def waiting(request, who):
        started.append(request.id)
        await release.wait()
        return p.Done(message="answered")

    runner.server.handlers[p.ReadInbox] = waiting
    lines = b"".join(p.encode(p.ReadInbox(id=100 + n, goal_id=b)) for n in range(40))
    await other._send_lines(lines)
    await eventually(lambda: len(started) >= MAX_IN_FLIGHT)
    assert len(started) == MAX_IN_FLIGHT  # the other 32 are still unread
    release.set()
    await eventually(lambda: len(started) == 40)
    for client in (*held, other, again):
        await client.close()


async def _two_idle_goals(start_runner, connect, tmp_path):
    """A runner with two goals whose agents wait: its operator client, and the goals' ids, their sockets up."""
    runner = await start_runner(agents={"idle": write_agent(tmp_path, "idle.sh", "sleep 60\n")})
    operator = await connect(runner)
    a = await submit(operator, "a, max 5 experiments", agent="idle")
    b = await submit(operator, "b, max 5 experiments", agent="idle")
    await eventually(lambda: all(runner.settings.agent_socket(goal).exists() for goal in (a, b)))
    return runner, operator, a, b


async def _connected(path: Path) -> RunnerClient | None:
    try:
        return await RunnerClient.connect_unix(path, "agent")
    except p.ProtocolError:
        return None


def _agent_env(runner, goal_id: int) -> dict[str, str]:
    return {
        "GOALTENDER_SOCKET": str(runner.settings.agent_socket(goal_id)),
        "GOALTENDER_GOAL_ID": str(goal_id),
    }


async def test_a_foreign_uid_is_refused(start_runner, connect, tmp_path):
    runner = await start_runner()
    socket = runner.settings.socket_path
    # The socket is 0600 in a 0700 directory: another user cannot even reach it.
    denied = await _as_nobody(socket, "status")
    assert (
        denied.returncode == 4 and "user nobody (uid 65534) may not open the runner socket" in denied.stderr
    )
    assert "add nobody (or one of its groups: @nogroup) to GOALTENDER_OPERATORS" in denied.stderr
    # Opened up (say, for a group), the runner still knows who connects, and refuses at hello.
    socket.parent.chmod(0o755)
    socket.chmod(0o666)
    refused = await _as_nobody(socket, "status")
    assert refused.returncode == 4
    assert "uid 65534 (nobody) is not an operator of this runner" in refused.stderr
    assert f"operators: uid {os.getuid()}" in refused.stderr and "GOALTENDER_OPERATORS" in refused.stderr
    operator = await connect(runner)
    [entry] = (await operator.request(p.Audit())).entries
    assert (entry.actor, entry.action, entry.outcome) == ("uid 65534 (nobody)", "hello", "refused")


async def test_operators_are_configured_by_name_or_uid(start_runner, connect, short_dir):
    runner = await start_runner(operators=["nobody"])  # the runner's own user is not among them
    with pytest.raises(p.ProtocolError, match=r"uid \d+ \(\w+\) is not an operator"):
        await connect(runner)
    # The socket stays 0600 in a 0700 directory: an ACL entry lets nobody, and nobody else, in.
    assert oct(runner.settings.socket_path.stat().st_mode & 0o7) == "0o0"
    allowed = await _as_nobody(runner.settings.socket_path, "submit", "nobody's goal, max 1 experiments")
    assert allowed.returncode == 0 and "goal #1" in allowed.stdout
    assert (await runner.store.get_goal(1)).owner == "uid 65534 (nobody)"  # no --owner: who it is


async def test_operators_are_recorded_as_who_they_vouch_for(start_runner, connect, tmp_path):
    agent = write_agent(tmp_path, "a.sh", "goaltender ask 'one?'\ngoaltender ask 'two?'\nsleep 60\n")
    runner = await start_runner(agents={"a": agent})
    bot = await connect(runner, "goaltender-bot")
    goal = await submit(bot, "asks twice, max 1 experiments", agent="a", owner="slack:U123")

    async def pending():
        return (await bot.request(p.Status(goal_id=goal))).goals[0].pending_approvals

    [first] = await eventually(pending)
    decided = await bot.request(p.Decide(approval_id=first.id, approve=True, by="slack:U123"))
    assert decided.approval.decided_by == f"slack:U123 via goaltender-bot (uid {os.getuid()})"
    [second] = await eventually(lambda: _other_than(pending, first.id))
    approved = await _cli(runner, "approve", str(second.id))
    assert approved.returncode == 0, approved.stderr
    me = f"uid {os.getuid()} ({_user()})"
    assert (await runner.store.get_approval(second.id)).decided_by == me
    entries = (await bot.request(p.Audit(goal_id=goal))).entries
    assert [(e.actor, e.action, e.outcome) for e in entries] == [
        (f"slack:U123 via goaltender-bot (uid {os.getuid()})", "submit", "done"),
        (f"slack:U123 via goaltender-bot (uid {os.getuid()})", "approve", "done"),
        (me, "approve", "done"),
    ]
    lines = (await _cli(runner, "audit", str(goal), "--limit", "1")).stdout.splitlines()
    assert len(lines) == 1 and f"{me}  approve  goal #{goal}  done  approval #{second.id} (two?)" in lines[0]
    mistyped = await _cli(runner, "audit", str(goal + 41))  # no such goal: said so, not "(no entries)"
    assert (mistyped.returncode, mistyped.stdout) == (4, "") and f"no goal #{goal + 41}" in mistyped.stderr
    assert (await _cli(runner, "audit")).returncode == 0  # every goal's trail: there is no goal to miss


async def test_the_sandbox_keeps_supervision_working(start_runner, connect, tmp_path):
    """Inside bwrap: CPU time from wait4, metrics from run.log, the eval command sandboxed too."""
    burn = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\nprint('acc: 0.7')"
    )
    evaluate = "cat > eval.sh <<'EOF'\ntr '\\0' ' ' < /proc/1/cmdline; echo\necho 'acc: 0.8'\nEOF\n"
    agent = write_agent(
        tmp_path,
        "a.sh",
        evaluate
        + f'goaltender experiment -d burn --metric acc --eval "bash eval.sh" -- python -c "{burn}"\n',
    )
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal = await submit(client, "burn, max 1 experiments", agent="a")
    await eventually(
        lambda: _state(runner, goal, lambda g: g.state == "finished"),
    )
    [row] = (await client.request(p.Summary(goal_id=goal))).ledger
    assert row.status == "keep" and row.verified and row.metric_value == 0.8
    assert row.cpu_seconds >= 0.35 and row.metrics["run/acc"] == 0.7  # the run's, measured through bwrap
    eval_log = (Path(row.log_path).parent / "eval.log").read_text()
    assert eval_log.startswith("/bin/sh")  # pid 1 of the eval's own sandbox is the sandbox's init


async def test_the_runner_follows_no_link_the_agent_leaves_in_its_workspace(start_runner, connect, tmp_path):
    """The runner writes run logs into the workspace and reads them back: an agent's symlink there
    must not make it append to (or read out) a file of the runner's."""
    runner = await start_runner(agents={"a": [str(tmp_path / "a.sh")]})
    secret = runner.settings.home / "secret.txt"
    secret.write_text("the runner's own\n")
    write_agent(
        tmp_path,
        "a.sh",
        f"mkdir -p experiments/001 && ln -s {secret} experiments/001/run.log\n"
        f"ln -s {runner.settings.home} experiments/002\n"
        "goaltender experiment -d one -- echo appended\n"
        "goaltender log 1 > log.out 2>&1; echo $? > log.rc\n"
        "goaltender experiment -d two -- echo appended\nexit 0\n",
    )
    client = await connect(runner)
    goal = await submit(client, "links, max 3 experiments", agent="a")
    await eventually(lambda: _state(runner, goal, lambda g: g.state == "finished"))
    ledger = (await client.request(p.Summary(goal_id=goal))).ledger
    assert [(e.status, e.note.split(":")[0]) for e in ledger] == [("crash", "could not start")] * 2
    assert "Too many levels of symbolic links" in ledger[0].note
    assert secret.read_text() == "the runner's own\n" and not (runner.settings.home / "run.log").exists()
    with pytest.raises(p.ProtocolError, match="cannot be read"):  # nor read out through the link
        await client.request(p.GetLog(experiment_id=ledger[0].id))
    workspace = Path((await runner.store.get_goal(goal)).workspace)
    assert (workspace / "log.rc").read_text() == "4\n" and "cannot be read" in (
        workspace / "log.out"
    ).read_text()


async def test_an_operator_socket_outside_the_runners_home_is_covered_too(start_runner, connect, tmp_path):
    """Wherever the operator socket lives (here /var/tmp, which the sandbox does not hide), an agent
    that dials it finds nothing answering — also after a runner restart recovers its goal."""
    directory = Path(tempfile.mkdtemp(prefix="gt-", dir="/var/tmp"))
    try:
        socket = directory / "runner.sock"
        script = f"while true; do goaltender --socket {socket} stop 1 >> tries.out 2>&1; echo $? >> tries.rc; sleep 0.2; done\n"
        agents = {"a": write_agent(tmp_path, "a.sh", script)}
        first = await start_runner(agents=agents, socket=socket)
        goal = await submit(await connect(first), "dial out, max 1 experiments", agent="a")
        workspace = Path((await first.store.get_goal(goal)).workspace)
        await eventually(lambda: (workspace / "tries.rc").exists())
        await first.close()
        second = await start_runner(agents=agents, socket=socket)  # the goal resumes in a new sandbox
        tries = len((workspace / "tries.rc").read_text().split())
        await eventually(lambda: len((workspace / "tries.rc").read_text().split()) > tries + 2)
        assert set((workspace / "tries.rc").read_text().split()) == {"4"}
        assert "Connection refused" in (workspace / "tries.out").read_text()
        assert (await second.store.get_goal(goal)).state == "running"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def test_a_runner_without_bubblewrap_fails_goals_clearly(start_runner, connect, tmp_path, monkeypatch):
    agent = write_agent(tmp_path, "a.sh", "goaltender milestone hi\n")
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", f"{BIN}:{empty}")
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal = await submit(client, "no sandbox here, max 1 experiments", agent="a")
    reason = await eventually(lambda: _state(runner, goal, lambda g: g.state == "failed" and g.end_reason))
    assert "install bubblewrap (apt install bubblewrap) or set GOALTENDER_SANDBOX=none" in reason
    assert "lets them control every goal" in reason


async def test_without_the_sandbox_an_agent_can_reach_the_operator_socket(
    start_runner, connect, tmp_path, caplog
):
    """GOALTENDER_SANDBOX=none is what docs/security.md and the log warn about: the goal's socket still
    refuses control verbs, but nothing stops an agent from dialling the operator socket instead."""
    script = """\
goaltender ask 'delete /data?' > ask.out &
until goaltender status | grep -q 'waiting for approval'; do sleep 0.1; done
goaltender approve 1 > own.out 2>&1; echo $? > own.rc
goaltender --socket {sock} approve 1
sleep 60
"""
    agent = [str(tmp_path / "a.sh")]
    runner = await start_runner(agents={"a": agent}, sandbox="none")
    assert "GOALTENDER_SANDBOX=none" in caplog.text and "control every goal" in caplog.text
    write_agent(tmp_path, "a.sh", script.format(sock=runner.settings.socket_path))
    client = await connect(runner)
    goal = await submit(client, "unsafe, max 1 experiments", agent="a")
    workspace = Path((await runner.store.get_goal(goal)).workspace)
    assert (
        await eventually(lambda: (workspace / "own.rc").exists() and (workspace / "own.rc").read_text())
    ) == "4\n"
    assert "an agent cannot decide approvals" in (workspace / "own.out").read_text()
    approval = await eventually(lambda: _decided(runner, 1))
    assert approval.state == "approved" and approval.decided_by == f"uid {os.getuid()} ({_user()})"


def test_control_verbs_are_denied_to_both_llm_agents():
    assert not set(ALLOWED_VERBS) & CONTROL_VERBS  # Codex runs none without asking; the socket refuses them


# ---- helpers ----


async def _cli(runner, *args: str) -> Ran:
    return await _run(f"{BIN}/goaltender", "--socket", str(runner.settings.socket_path), *args)


async def _as_nobody(socket: Path, *args: str) -> Ran:
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent"}
    return await _run(*NOBODY, f"{BIN}/goaltender", "--socket", str(socket), *args, env=env)


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


async def _run(*command: str, env: dict[str, str] | None = None) -> Ran:
    """A CLI process, awaited: the runner it talks to runs in this test's event loop."""
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


async def _state(runner, goal_id: int, check):
    goal = await runner.store.get_goal(goal_id)
    return check(goal)


async def _decided(runner, approval_id: int):
    approval = await runner.store.get_approval(approval_id)
    return approval if approval and approval.state != "pending" else None


async def _other_than(pending, approval_id: int):
    rest = [a for a in await pending() if a.id != approval_id]
    return rest or None


async def test_a_goals_caches_are_its_own_and_go_with_it(start_runner, connect, tmp_path, monkeypatch):
    """Even where the box names a cache of its own (GOALTENDER_CACHE_DIR in the runner's
    environment), a goal's runs cache in the goal's cache: kept for its next run, never another
    goal's to load, removed when the goal ends."""
    box_cache = tmp_path / "box-cache"
    monkeypatch.setenv("GOALTENDER_CACHE_DIR", str(box_cache))
    run = (
        "cat > c.sh <<'EOF'\n"
        'cat "$GOALTENDER_CACHE_DIR/made" 2>/dev/null || echo none\n'
        'echo "kept by $GOALTENDER_GOAL_ID" > "$GOALTENDER_CACHE_DIR/made"\necho \'acc: 1\'\nEOF\n'
    )
    twice = "goaltender experiment -d c --metric acc -- sh c.sh\n" * 2
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", run + twice)})
    client = await connect(runner)
    first = await submit(client, "cache, max 2 experiments", agent="a")
    await eventually(lambda: _state(runner, first, lambda g: g.state == "finished"))
    second = await submit(client, "cache again, max 2 experiments", agent="a")
    await eventually(lambda: _state(runner, second, lambda g: g.state == "finished"))
    for goal in (first, second):
        ledger = (await client.request(p.Summary(goal_id=goal))).ledger
        said = [Path(row.log_path).read_text().splitlines()[0] for row in ledger]
        assert said == ["none", f"kept by {goal}"], said  # its own first run's, never the other goal's
        assert not runner.settings.goal_cache(goal).exists()
    assert not box_cache.exists()


async def test_a_runner_home_inside_a_directory_the_sandbox_shows_stays_hidden(
    start_runner, connect, tmp_path
):
    """A checkout under /tmp with the demo's state inside it: the agent's command names a directory
    that holds the runner's home (as the package's own directory held a demo's), which the sandbox
    shows read-only. The home in it stays hidden, and the goal's workspace in that stays writable."""
    script = (
        'if [ -e "$1/home/runner.db" ]; then seen=yes; else seen=no; fi\n'
        "if echo x > made 2>/dev/null; then wrote=yes; else wrote=no; fi\n"
        'goaltender milestone "runner.db seen: $seen; workspace written: $wrote"\n'
    )
    agent = [*write_agent(tmp_path, "a.sh", script), str(tmp_path)]  # a word naming a directory: shown
    runner = await start_runner(agents={"a": agent})
    assert (tmp_path / "home" / "runner.db").exists() and tmp_path.resolve().is_relative_to("/tmp")
    client = await connect(runner)
    goal = await submit(client, "look around, max 1 experiments", agent="a")
    await eventually(lambda: _state(runner, goal, lambda g: g.state == "finished"))
    events = await runner.store.events_since(0, goal_id=goal)
    titles = [e.data.title for e in events if e.data.kind == "milestone"]
    assert titles == ["runner.db seen: no; workspace written: yes"]
