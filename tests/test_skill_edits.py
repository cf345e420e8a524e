"""Skills that learn, through the real runner, sandbox (bubblewrap), CLI and socket.

An agent proposes an edit to one of the box's skills (`goaltender skills edit`; its old name
`skill-edit` still works); the humans see the diff as an approval of kind skill_edit; approved, the runner writes it into $GOALTENDER_HOME/skills
and commits it, and the next goal's agent reads the new text; rejected, nothing changes; an
operator's `goaltender skills revert` undoes it with a new commit. An agent cannot write the
folder itself, escape it with a path, nor read or revert its history.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

from fake_slack import ALICE, BOB
from helpers import BIN, blocks_text, eventually, pending_approval, submit, write_agent

from goaltender.protocol import messages as p
from goaltender.runner.skill_folder import SkillFolder
from goaltender.storage.records import MilestoneReported

LEARNED = "LEARNED: warm the learning rate up for 500 steps before any sweep"

# `attempt NAME CMD...` records the exit code and what the command said, one line each.
PROPOSER = """\
cd "$GOALTENDER_WORKSPACE"
attempt() {{ name=$1; shift; out=$("$@" 2>&1); rc=$?
  printf '%s\\t%s\\t%s\\n' "$name" "$rc" "$(printf '%s' "$out" | tr '\\n\\t' '  ' | cut -c1-600)" >> results.tsv; }}
skill="$GOALTENDER_HOME/skills/session-memory/SKILL.md"
cp "$skill" new.md && printf '\\n%s\\n' "{line}" >> new.md
{attempts}
attempt edit goaltender skills edit --skill session-memory --file new.md --why "{why}"
touch done
sleep 300
"""
REFUSED_ATTEMPTS = """\
printf 'x\\n' > escape.md
attempt write-folder sh -c "echo hacked >> '$skill'"
attempt escape goaltender skills edit --skill session-memory --path ../../etc/x --file escape.md
attempt absolute goaltender skills edit --skill session-memory --path /etc/passwd --file escape.md
attempt noop goaltender skill-edit --skill session-memory --file "$skill"  # the old name still works
attempt revert goaltender skills revert abc1234
attempt log goaltender skills log
"""

READER = """\
cd "$GOALTENDER_WORKSPACE"
{python} - > skill.txt 2>&1 <<'EOF'
from pathlib import Path
from goaltender.agents import briefing
print(briefing.skills_dir())
print(briefing.load_skill("session-memory"))
briefing.prepare_workspace(Path("."), "the brief")
print(Path(".agents/skills/session-memory/SKILL.md").read_text())
print("git copied:", Path(".agents/skills/.git").exists())
EOF
touch done
sleep 300
"""


async def test_an_approved_skill_edit_is_committed_read_by_the_next_goal_and_revertible(
    start_runner, connect, tmp_path
):
    runner = await start_runner(
        agents={
            "proposer": write_agent(
                tmp_path,
                "proposer.sh",
                PROPOSER.format(
                    line=LEARNED, why="three runs diverged without it", attempts=REFUSED_ATTEMPTS
                ),
            ),
            "reader": write_agent(tmp_path, "reader.sh", READER.format(python=sys.executable)),
        }
    )
    folder = runner.settings.home / "skills"
    skill = folder / "session-memory" / "SKILL.md"
    shipped = skill.read_text()
    assert git(folder, "log", "--format=%s") == "shipped skills 0.1.0"
    operator = await connect(runner, "operator")

    goal = await submit(operator, "learn something, max 3 experiments", agent="proposer")
    approval = await approval_awaited(operator, goal)
    assert approval.kind == "skill_edit" and "`session-memory/SKILL.md`" in approval.question
    assert "Why: three runs diverged without it" in approval.detail
    assert "```diff\n--- a/session-memory/SKILL.md\n+++ b/session-memory/SKILL.md" in approval.detail
    assert f"+{LEARNED}\n" in approval.detail
    assert skill.read_text() == shipped  # nothing written before a person decides

    workspace = Path((await runner.store.get_goal(goal)).workspace)
    results = read_results(workspace)
    rc, said = results["write-folder"]
    assert rc != 0 and "Read-only file system" in said, said
    for name, says in {
        "escape": "is not a file of a skill",
        "absolute": "is not a file of a skill",
        "noop": "already says exactly this",
        "revert": "an agent cannot revert skill edits",
        "log": "an agent cannot read the skill folder's history",
    }.items():
        rc, said = results[name]
        assert rc == 4 and says in said, (name, rc, said)

    await operator.request(p.Decide(approval_id=approval.id, approve=True, by="ana"))
    await eventually(lambda: (workspace / "done").exists())
    rc, said = read_results(workspace)["edit"]
    assert rc == 0 and "approved by ana via operator" in said and "applied as commit" in said, said
    commit = said.split("applied as commit ")[1].split()[0]
    assert skill.read_text() == shipped + f"\n{LEARNED}\n"
    assert git(folder, "rev-parse", "--short", "HEAD") == commit
    message = git(folder, "log", "-n", "1", "--format=%B")
    assert f"goal #{goal}" in message and "ana via operator" in message
    assert "three runs diverged without it" in message
    assert git(folder, "status", "--porcelain") == ""  # what is there is what was committed
    events = await runner.store.events_since(0, limit=1000, goal_id=goal)
    [applied] = [e.data for e in events if isinstance(e.data, MilestoneReported)]
    assert applied.title == f"Skill edit applied: session-memory (commit {commit})"
    assert f"goaltender skills revert {commit}" in applied.text

    # The next goal's agent reads the new text, through the brief's skill tools and its copy.
    reader = await submit(operator, "read the skills, max 3 experiments", agent="reader")
    reader_workspace = Path((await runner.store.get_goal(reader)).workspace)
    await eventually(lambda: (reader_workspace / "done").exists())
    said = (reader_workspace / "skill.txt").read_text()
    assert said.startswith(f"{folder}\n") and said.count(LEARNED) == 2 and "git copied: False" in said

    # An operator reads the history and reverts the edit: a new commit, the shipped text back.
    log = await cli(runner, "skills", "log")
    assert log.returncode == 0 and log.stdout.splitlines()[0].startswith(f"{commit}  ")
    assert "shipped skills" in log.stdout.splitlines()[-1]
    reverted = await cli(runner, "skills", "revert", commit)
    assert reverted.returncode == 0 and f"reverted {commit}" in reverted.stdout, reverted
    assert skill.read_text() == shipped
    assert git(folder, "log", "--format=%s").splitlines()[0].startswith("Revert")
    assert f"reverted by uid {os.getuid()}" in git(folder, "log", "-n", "1", "--format=%B")
    again = await cli(runner, "skills", "revert", commit)
    assert again.returncode == 4 and "undone already" in again.stderr, again
    audit = await operator.request(p.Audit())
    reverts = [e.outcome for e in audit.entries if e.action == "skill revert" and e.actor.startswith("uid ")]
    assert reverts == ["done", "refused"]
    refused = {e.action for e in audit.entries if e.actor == f"agent of goal {goal}"}
    assert {"skill_log", "skill revert"} <= refused


async def test_a_rejected_skill_edit_changes_nothing(start_runner, connect, tmp_path):
    agent = write_agent(tmp_path, "proposer.sh", PROPOSER.format(line=LEARNED, why="", attempts=""))
    runner = await start_runner(agents={"proposer": agent})
    folder = runner.settings.home / "skills"
    before = {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}
    head = git(folder, "rev-parse", "HEAD")
    operator = await connect(runner, "operator")

    goal = await submit(operator, "learn something, max 3 experiments", agent="proposer")
    approval = await approval_awaited(operator, goal)
    await operator.request(p.Decide(approval_id=approval.id, approve=False, comment="no"))
    workspace = Path((await runner.store.get_goal(goal)).workspace)
    await eventually(lambda: (workspace / "done").exists())
    rc, said = read_results(workspace)["edit"]
    assert rc == 1 and "rejected" in said and "nothing written" in said, said
    assert {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()} == before
    assert git(folder, "rev-parse", "HEAD") == head


async def test_new_skills_bad_paths_stale_edits_and_the_folder_kept_at_the_next_start(
    start_runner, connect, tmp_path
):
    runner = await start_runner(agents={})
    folder = runner.settings.home / "skills"
    first = git(folder, "rev-parse", "HEAD")
    skills = runner.skills
    good = "---\nname: warmup\ndescription: Warm up first.\n---\n\n# Warm up\n"
    edit = skills.propose("warmup", "SKILL.md", good)
    assert edit.diff.startswith("--- /dev/null\n+++ b/warmup/SKILL.md\n")
    commit = skills.apply(edit, "warmup: a new skill")
    for skill, path, content, says in [
        ("warmup", "SKILL.md", good.replace("name: warmup", "name: other"), "front matter naming it"),
        ("fresh", "references/x.md", "x", "a new skill starts with its SKILL.md"),
        ("Warm Up", "SKILL.md", good, "is not a skill name"),
        ("warmup", "scripts/run.sh", "x", "changes SKILL.md or references/<name>"),
        ("warmup", "references/.git", "x", "is not a file of a skill"),
        ("warmup", "references/big.md", "x" * (64 * 1024 + 1), "over the 65,536 a skill file may hold"),
    ]:
        try:
            skills.propose(skill, path, content)
        except ValueError as exc:
            assert says in str(exc), (skill, path, str(exc))
        else:
            raise AssertionError(f"{skill}/{path} was not refused")
    stale = skills.propose("warmup", "references/notes.md", "one\n")
    skills.apply(skills.propose("warmup", "references/notes.md", "two\n"), "notes")
    try:
        skills.apply(stale, "stale")
    except ValueError as exc:
        assert "changed since this edit was proposed" in str(exc)
    else:
        raise AssertionError("a stale edit was applied")
    SkillFolder(folder).ensure()  # as at the next start: the folder and its history are kept
    assert (folder / "warmup" / "SKILL.md").read_text() == good
    log = git(folder, "log", "--format=%h %s").splitlines()
    assert log[1] == f"{commit} warmup: a new skill" and log[-1].endswith("shipped skills 0.1.0")
    assert git(folder, "rev-list", "--max-parents=0", "HEAD") == first


async def test_in_slack_a_reaction_applies_the_diff_and_a_reply_reverts_it(
    fake, make_bot, start_runner, tmp_path
):
    agent = write_agent(
        tmp_path, "proposer.sh", PROPOSER.format(line=LEARNED, why="it diverged", attempts="")
    )
    runner = await start_runner(agents={"proposer": agent}, default_agent="proposer")
    skill = runner.settings.home / "skills" / "session-memory" / "SKILL.md"
    shipped = skill.read_text()
    await make_bot(runner.settings.socket_path)
    general = fake.general
    await fake.slash_command("/goal", "learn something, max 3 experiments", general, ALICE)
    card = await fake.wait_for_message(general, text="Goal #1", timeout=15)

    prompt = await fake.wait_for_message(general, thread_ts=card.ts, text="proposes a skill edit", timeout=30)
    assert LEARNED in blocks_text(prompt) and "it diverged" in blocks_text(prompt)
    assert prompt.action_ids() == ["approve", "reject"]
    await fake.user_reacts(general, prompt.ts, "white_check_mark", user=ALICE)
    applied = await fake.wait_for_message(general, thread_ts=card.ts, text="Skill edit applied", timeout=30)
    found = re.search(r"commit ([0-9a-f]{7,})", blocks_text(applied))
    assert found, blocks_text(applied)
    commit = found.group(1)
    assert LEARNED in skill.read_text()

    # Bob controls no goal here: told so, privately; nothing changes.
    await fake.user_replies(general, card.ts, f"revert skill {commit}", user=BOB)
    refusals = await fake.wait_for(lambda: fake.ephemerals(BOB), 10)
    assert "Only <@U0ALICE>" in refusals[-1].text and "revert skill edits" in refusals[-1].text
    assert LEARNED in skill.read_text()

    # The owner's reply reverts it on the runner, and the thread says so.
    reply = await fake.user_replies(general, card.ts, f"revert skill {commit}", user=ALICE)
    await fake.wait_for_message(
        general, thread_ts=card.ts, text=f"reverted {commit}", after=reply.ts, timeout=15
    )
    assert skill.read_text() == shipped
    assert f"slack:{ALICE}" in git(skill.parent.parent, "log", "-n", "1", "--format=%B")


# ---- helpers ----


async def approval_awaited(operator, goal: int):
    return await eventually(lambda: pending_approval(operator, goal), timeout=60)


def read_results(workspace: Path) -> dict[str, tuple[int, str]]:
    path = workspace / "results.tsv"
    lines = path.read_text().splitlines() if path.exists() else []
    return {name: (int(rc), said) for name, rc, said in (line.split("\t", 2) for line in lines)}


def git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=folder, capture_output=True, text=True, check=True
    ).stdout.strip()


class Ran:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr

    def __repr__(self) -> str:
        return f"Ran({self.returncode}, {self.stdout!r}, {self.stderr!r})"


async def cli(runner, *args: str) -> Ran:
    """The operator's CLI, awaited: the runner it talks to runs in this test's event loop."""
    proc = await asyncio.create_subprocess_exec(
        f"{BIN}/goaltender",
        "--socket",
        str(runner.settings.socket_path),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())
