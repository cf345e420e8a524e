"""Files given to a goal, as the runner writes them (runner/inputs.py): whatever the name and size,
a file lands whole inside the workspace's inputs/ under a plain name, or is refused leaving
nothing behind; and through a real runner, PutInput is for operators only and holds its cap."""

from __future__ import annotations

import base64
import itertools
import os
import tempfile
from pathlib import Path

import pytest
from helpers import eventually, write_agent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.runner import inputs

CAP = 4096
names = st.one_of(
    st.text(min_size=1, max_size=300),
    st.lists(
        st.sampled_from(["..", ".", "", "a", "b.pdf", "~", "\\", "\x00", "é", " "]), min_size=1, max_size=6
    ).map("/".join),
)


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in folder.rglob("*") if f.is_file()}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=names, data=st.binary(min_size=1, max_size=CAP + 64), cuts=st.lists(st.integers(0, CAP + 64)))
def test_a_file_lands_whole_inside_inputs_or_nowhere(name, data, cuts):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        workspace = root / "goal-1"
        workspace.mkdir()
        (root / "outside.txt").write_bytes(b"keep")
        try:
            safe: str | None = inputs.safe_name(name)
        except inputs.InputRefused:
            safe = None
        bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
        path = None
        try:
            for start, end in itertools.pairwise(bounds):
                path = inputs.put_chunk(
                    workspace,
                    name,
                    offset=start,
                    data=data[start:end],
                    size=len(data),
                    cap=CAP,
                    last=end == len(data),
                )
        except inputs.InputRefused as refused:
            assert "\n" not in str(refused)
            assert len(data) > CAP or safe is None, refused
            assert files_under(workspace) == {}
        else:
            assert len(data) <= CAP and path == Path("inputs") / str(safe)
            assert "/" not in path.name and not path.name.startswith(".")
            assert len(path.name) <= inputs.MAX_NAME
            assert files_under(workspace) == {str(path): data}
        assert files_under(root) == {
            "outside.txt": b"keep",
            **{f"goal-1/{k}": v for k, v in files_under(workspace).items()},
        }


@settings(max_examples=50, deadline=None)
@given(name=st.text(alphabet="abc.", min_size=1, max_size=8).filter(lambda n: n.strip(".")))
def test_a_name_given_twice_keeps_both(name):
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        first = inputs.put_chunk(workspace, name, offset=0, data=b"one", size=3, cap=CAP, last=True)
        second = inputs.put_chunk(workspace, name, offset=0, data=b"two", size=3, cap=CAP, last=True)
        assert first != second
        assert (workspace / first).read_bytes() == b"one" and (workspace / second).read_bytes() == b"two"


def test_a_link_planted_for_inputs_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workspace = tmp_path / "goal"
    workspace.mkdir()
    (workspace / "inputs").symlink_to(elsewhere)
    with pytest.raises(inputs.InputRefused, match="is a link"):
        inputs.put_chunk(workspace, "a.txt", offset=0, data=b"x", size=1, cap=CAP, last=True)
    (workspace / "inputs").unlink()
    (workspace / "inputs").mkdir()
    os.symlink(elsewhere / "stolen", workspace / "inputs" / ".a.txt.part")
    with pytest.raises(OSError):
        inputs.put_chunk(workspace, "a.txt", offset=0, data=b"x", size=1, cap=CAP, last=True)
    assert list(elsewhere.iterdir()) == []


async def test_put_input_over_the_protocol_is_capped_and_for_people_only(start_runner, connect, tmp_path):
    agent = write_agent(tmp_path, "sleepy.sh", "sleep 120\n")
    runner = await start_runner(agents={"sleepy": agent}, default_agent="sleepy", max_input_mb=0.001)
    client = await connect(runner)
    goal = (await client.request(p.SubmitGoal(text="read the paper"))).status.goal
    who = p.Person(kind="slack", id="U0ALICE", name="Alice")

    def put(data: bytes, name: str = "paper.txt") -> dict:
        return {
            "goal_id": goal.id,
            "name": name,
            "size": len(data),
            "data": base64.b64encode(data).decode(),
            "by": who,
        }

    done = await client.request(p.PutInput(**put(b"hello\n", "../../notes.txt")))
    assert done.message == "inputs/notes.txt"
    assert (Path(goal.workspace) / "inputs" / "notes.txt").read_bytes() == b"hello\n"
    messages = await runner.store.read_inbox(goal.id, unread_only=False)
    assert messages[-1].author == "Alice" and "inputs/notes.txt" in messages[-1].text
    with pytest.raises(p.ProtocolError, match="GOALTENDER_MAX_INPUT_MB"):
        await client.request(p.PutInput(**put(b"x" * 2000)))

    await eventually(runner.settings.agent_socket(goal.id).exists)
    agent_client = await RunnerClient.connect_unix(runner.settings.agent_socket(goal.id), client="agent")
    try:
        with pytest.raises(p.ProtocolError, match="an agent cannot give goals files"):
            await agent_client.request(p.PutInput(**put(b"sneaky\n", "sneaky.txt")))
    finally:
        await agent_client.close()
    assert sorted(f.name for f in (Path(goal.workspace) / "inputs").iterdir()) == ["notes.txt"]
