"""The runner mirrors goals, the ledger and series to MLflow: a real runner with a script agent, the
real MLflow client and a real SQLite tracking store in tmp (no server), read back with MlflowClient."""

from __future__ import annotations

import asyncio
import logging
import socket
import sqlite3
from pathlib import Path

import pytest
from helpers import events_until_report, eventually, submit, write_agent

from goaltender.protocol import messages as p
from goaltender.runner import mlflow_mirror
from goaltender.runner.config import RunnerSettings
from goaltender.runner.mlflow_mirror import CURSOR_NAME, mlflow_client_class, mlflow_key
from goaltender.runner.secrets import Redactor

pytest.importorskip("mlflow")  # the mlflow extra (in dev)


def series(scale: float) -> str:
    """Python that prints a loss series over steps 1 to 3, as JSON lines."""
    return f"import json; [print(json.dumps({{'step': s, 'loss': {scale} / s}})) for s in (1, 2, 3)]"


TOKEN = "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2"  # a token's shape: redacted on the way out, as always

AGENT = f"""
goaltender experiment -d "baseline" --param lr=0.1 --param layers=2 --metric acc -- \
    python -c "{series(1.0)}; print('acc: 0.50')"
goaltender experiment -d "broken idea" --param lr=9 --param hub={TOKEN} --metric acc -- \
    python -c "{series(2.0)}; raise SystemExit(3)"
goaltender report "lr=0.1 it is"
"""

# Runs one experiment, then waits for the test's go-ahead (a file in its workspace) for the second;
# after a restart it does not run the first again.
AGENT_WITH_A_PAUSE = f"""
if [ ! -f one.done ]; then
    goaltender experiment -d "one" --param lr=0.1 --metric acc -- \
        python -c "{series(1.0)}; print('acc: 0.50')"
    touch one.done
fi
while [ ! -f go ]; do sleep 0.1; done
goaltender experiment -d "two" --param lr=0.2 --metric acc -- \
    python -c "{series(0.5)}; print('acc: 0.60')"
"""


def tracked(uri: str) -> dict:
    """What the MLflow store holds: experiments by name, each with its tags and runs by index."""
    client = mlflow_client_class()(tracking_uri=uri)
    found = {}
    for experiment in client.search_experiments():
        if experiment.name == "Default":
            continue
        runs = {}
        for run in client.search_runs([experiment.experiment_id]):
            history = {
                key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
                for key in run.data.metrics
            }
            index = int(run.data.tags["goaltender.index"])
            assert index not in runs, f"two MLflow runs for ledger row #{index}"
            runs[index] = {
                "name": run.info.run_name,
                "status": run.info.status,
                "params": run.data.params,
                "tags": run.data.tags,
                "history": history,
            }
        found[experiment.name] = {"tags": experiment.tags, "runs": runs}
    return found


async def mirrored(runner) -> bool:
    """Has the mirror caught up with the runner's event log? (Waited for generously: MLflow's first
    import and store migrations take seconds, many more on a busy machine.)"""
    return await runner.store.cursor(CURSOR_NAME) >= await runner.store.head_seq()


async def test_a_goal_and_its_rows_are_mirrored(start_runner, connect, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runner = await start_runner(
        agents={"script": write_agent(tmp_path, "agent.sh", AGENT)}, mlflow_tracking_uri=uri
    )
    client = await connect(runner)
    goal_id = await submit(client, "find a good lr, max 5 experiments", owner="ana", agent="script")
    await events_until_report(client, goal_id)
    await eventually(lambda: mirrored(runner), timeout=120)

    store = await asyncio.to_thread(tracked, uri)
    [(name, experiment)] = store.items()
    assert name == f"goaltender/test-runner/goal-{goal_id}"
    assert experiment["tags"]["goaltender.goal"] == "find a good lr, max 5 experiments"
    assert experiment["tags"]["goaltender.owner"] == "ana"
    assert experiment["tags"]["goaltender.state"] == "finished"
    assert experiment["tags"]["goaltender.metric"] == "acc (maximize)"
    runs = experiment["runs"]
    assert sorted(runs) == [1, 2]

    baseline, broken = runs[1], runs[2]
    assert baseline["name"] == "#1 baseline"
    assert baseline["status"] == "FINISHED" and baseline["tags"]["goaltender.status"] == "keep"
    assert baseline["params"] == {"lr": "0.1", "layers": "2"}
    assert baseline["tags"]["mlflow.note.content"] == "baseline"
    assert baseline["tags"]["goaltender.runner"] == "test-runner"
    assert baseline["history"]["loss"] == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert baseline["history"]["ledger/acc"] == [(0, 0.5)]
    assert baseline["history"]["ledger/wall_seconds"][0][1] > 0

    assert broken["status"] == "FAILED" and broken["tags"]["goaltender.status"] == "crash"
    assert broken["tags"]["goaltender.note"] == "exit code 3"
    assert broken["params"]["lr"] == "9"
    assert TOKEN not in str(broken) and "redacted" in broken["params"]["hub"]
    assert broken["history"]["loss"] == [(1, 2.0), (2, 1.0), (3, pytest.approx(2 / 3))]
    assert "ledger/acc" not in broken["history"]

    summary = await client.request(p.Summary(goal_id=goal_id))
    ids = {str(row.id) for row in summary.ledger}
    assert {run["tags"]["goaltender.experiment_id"] for run in runs.values()} == ids


async def test_a_restart_mid_way_mirrors_nothing_twice(start_runner, connect, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = {
        "agents": {"a": write_agent(tmp_path, "a.sh", AGENT_WITH_A_PAUSE)},
        "mlflow_tracking_uri": uri,
    }
    runner = await start_runner(**settings)
    client = await connect(runner)
    goal_id = await submit(client, "two lrs, max 5 experiments", agent="a")

    async def first_row_done():
        rows = await runner.store.experiments(goal_id)
        return rows and rows[0].status != "running" and await mirrored(runner)

    await eventually(first_row_done)
    workspace = Path((await runner.store.get_goal(goal_id)).workspace)
    await runner.close()

    # The mirror kept its place in runner.db. Forget it, as if the runner had died before saving
    # it: the whole log is mirrored again, and must add nothing.
    with sqlite3.connect(runner.settings.db_path) as db:
        [(kept,)] = db.execute("SELECT acked_seq FROM cursors WHERE client = ?", (CURSOR_NAME,))
        assert kept > 0
        db.execute("DELETE FROM cursors WHERE client = ?", (CURSOR_NAME,))

    runner = await start_runner(**settings)
    client = await connect(runner)
    (workspace / "go").touch()
    await events_until_report(client, goal_id)
    await eventually(lambda: mirrored(runner), timeout=120)

    [experiment] = (await asyncio.to_thread(tracked, uri)).values()
    runs = experiment["runs"]
    assert sorted(runs) == [1, 2]
    assert runs[1]["history"]["loss"] == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert runs[1]["history"]["ledger/acc"] == [(0, 0.5)]
    assert runs[2]["history"]["loss"] == [(1, 0.5), (2, 0.25), (3, pytest.approx(1 / 6))]
    assert [runs[i]["status"] for i in (1, 2)] == ["FINISHED", "FINISHED"]
    assert experiment["tags"]["goaltender.state"] == "finished"


async def test_an_unreachable_tracking_server_does_not_touch_goals(start_runner, connect, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="goaltender.runner.mlflow")
    with socket.socket() as free:  # a port on this machine that nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    agent = write_agent(tmp_path, "agent.sh", AGENT)
    runner = await start_runner(agents={"script": agent}, mlflow_tracking_uri=f"http://127.0.0.1:{port}")
    client = await connect(runner)
    goal_id = await submit(client, "find a good lr, max 5 experiments", agent="script")
    await events_until_report(client, goal_id, timeout=30)

    summary = await client.request(p.Summary(goal_id=goal_id))
    assert summary.status.goal.state == "finished"
    assert [row.status for row in summary.ledger] == ["keep", "crash"]
    await eventually(lambda: f"mirroring to http://127.0.0.1:{port} is failing" in caplog.text)
    assert f"cannot reach 127.0.0.1:{port}" in caplog.text
    assert await runner.store.cursor(CURSOR_NAME) == 0  # the events wait in the log


def test_tracking_uri_settings(tmp_path):
    home = tmp_path / "home"
    assert RunnerSettings(home=home).mlflow_uri is None
    assert RunnerSettings(home=home, mlflow=True).mlflow_uri == f"sqlite:///{home}/mlflow.db"
    assert RunnerSettings(home=home, mlflow_tracking_uri="sqlite").mlflow_uri == f"sqlite:///{home}/mlflow.db"
    server = "http://mlflow.internal:5000"
    assert RunnerSettings(home=home, mlflow_tracking_uri=server).mlflow_uri == server


def test_tracking_uri_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GOALTENDER_HOME", str(tmp_path))
    monkeypatch.setenv("GOALTENDER_MLFLOW", "1")
    assert RunnerSettings().mlflow_uri == f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("GOALTENDER_MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert RunnerSettings().mlflow_uri == "http://mlflow.internal:5000"


def test_names_mlflow_would_refuse_are_made_acceptable():
    def key(name: str) -> str:
        return mlflow_key(name, Redactor())

    assert key("train/loss") == "train/loss"
    assert key("timing/train/total step-time:s") == "timing/train/total step-time:s"
    assert key("acc@1 (top)") == "acc_1 _top_"
    assert key("../escape") == "___escape"
    assert key("a//b") == "a__b"
    assert key("") == "_"
    assert len(key("x" * 400)) == 250
    # Redacted before its characters are made acceptable (which would change the secret).
    secret = "p@ss-w0rd/with:odd chars"
    assert mlflow_key(f"loss/{secret}", Redactor([("DB_PASSWORD", secret)])) == "loss/_redacted:DB_PASSWORD_"


def test_without_the_extra_the_runner_says_so_and_runs_unmirrored(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(mlflow_mirror.importlib.util, "find_spec", lambda name: None)
    settings = RunnerSettings(home=tmp_path, mlflow=True)
    assert mlflow_mirror.MlflowMirror.from_settings(settings, store=None, redactor=None) is None
    assert "mlflow-skinny is not installed (pip install 'goaltender[mlflow]')" in caplog.text


SECRET = "svc_PlantedMlflowSecret_0123"  # configured (a secret-looking variable), not a shape

LEAKY = f"""
goaltender experiment -d "about {SECRET}" --param {SECRET}=1 --param {SECRET}_lr={SECRET} --metric {SECRET} -- \
    python -c "import json; print(json.dumps({{'step': 1, '{SECRET}': 0.5, 'loss/{SECRET}': 1}})); print('{SECRET}: 0.5'); print('{SECRET}_x: 2')"
goaltender report "done"
"""


async def test_no_field_mlflow_gets_holds_a_secret(start_runner, connect, tmp_path, monkeypatch):
    """Keys as well as values: a param or metric named after a secret went into MLflow as it was
    (only values were redacted). Every byte of the tracking store is looked through."""
    monkeypatch.setenv("MY_SERVICE_TOKEN", SECRET)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    agent = write_agent(tmp_path, "leaky.sh", LEAKY)
    runner = await start_runner(
        agents={"script": agent}, mlflow_tracking_uri=uri, grants=["MY_SERVICE_TOKEN"]
    )
    client = await connect(runner)
    goal_id = await submit(client, f"leak {SECRET}, max 2 experiments", owner=SECRET, agent="script")
    await events_until_report(client, goal_id)
    await eventually(lambda: mirrored(runner), timeout=120)

    [experiment] = (await asyncio.to_thread(tracked, uri)).values()
    [run] = experiment["runs"].values()
    marker = "_redacted:MY_SERVICE_TOKEN_"  # the marker, as a key MLflow takes
    assert run["params"] == {marker: "1", f"{marker}_lr": "[redacted:MY_SERVICE_TOKEN]"}
    assert {marker, f"loss/{marker}", f"ledger/{marker}", f"ledger/{marker}_x"} <= set(run["history"])
    assert run["name"] == "#1 about [redacted:MY_SERVICE_TOKEN]"
    assert experiment["tags"]["goaltender.owner"] == "[redacted:MY_SERVICE_TOKEN]"
    # Every byte MLflow stored (the tracking database, its journal, any artifact) is free of it.
    tracking = [*tmp_path.glob("mlflow.db*"), *tmp_path.glob("mlflow-artifacts/**/*")]
    stored = b"".join(path.read_bytes() for path in tracking if path.is_file())
    assert stored and SECRET.encode() not in stored
