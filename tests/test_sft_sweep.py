"""The sweep agent's SFT mode (agents/sft_sweep.py): Qwen3-VL-2B on star count with NeMo RL.

End to end in a real runner (sandboxed): the goal's words choose the mode, the fake trainer
(tests/fake_nemo_rl_trainer.py, as GOALTENDER_NEMO_RL_COMMAND) stands in for NeMo RL and a fake
eval (tests/fake_star_count_eval.py) scores what `model-to-score` names: the base model first,
then SFT runs, each a `goaltender nemo-rl vlm-sft` request with the sweep's overrides. The parts
(planning with an untrained run, overrides, the config copy, what an eval scores) below."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import events_until_report, submit, write_agent

from goaltender.agents import sft_sweep
from goaltender.agents.bootstrap import Misconfigured
from goaltender.agents.sft_sweep import FIRST_SFT, UNTRAINED
from goaltender.agents.sweep_planner import Planner, Row
from goaltender.protocol import messages as p
from goaltender.storage.records import MilestoneReported

TESTS = Path(__file__).parent
TRAINER = f"{sys.executable} {TESTS / 'fake_nemo_rl_trainer.py'}"
EVAL = f"{sys.executable} {TESTS / 'fake_star_count_eval.py'}"
SWEEP = [sys.executable, "-m", "goaltender.agents.sweep"]
REFERENCE_GOAL = "train Qwen3-VL-2B on star count with SFT to 95% exact accuracy, budget 5h"


@pytest.fixture
def task(tmp_path, monkeypatch):
    monkeypatch.setenv("GOALTENDER_NEMO_RL_COMMAND", TRAINER)
    return sft_sweep.star_count_sft_task(tmp_path, EVAL, None, {"GOALTENDER_NEMO_RL_COMMAND": TRAINER})


def row(index: int, params: dict, status: str, value: float | None) -> Row:
    return Row(index=index, params=params, status=status, metric_value=value)


# ---- through the runner ----


async def test_a_goal_of_three_runs_the_base_model_then_two_sft_configs(start_runner, connect, monkeypatch):
    monkeypatch.setenv("GOALTENDER_NEMO_RL_COMMAND", TRAINER)
    runner = await start_runner(agents={"sweep": [*SWEEP, "--eval", EVAL]}, default_agent="sweep")
    client = await connect(runner)
    goal_id = await submit(client, "train Qwen3-VL-2B on star count with SFT, max 3 experiments")
    events = await events_until_report(client, goal_id, timeout=180)
    ledger = (await client.request(p.Summary(goal_id=goal_id))).ledger

    assert [(e.status, e.params, e.metric_value) for e in ledger] == [
        ("keep", UNTRAINED, 0.25),
        ("keep", FIRST_SFT, 0.6575),  # the fake's best checkpoint: step 80 of 160
        ("keep", {**FIRST_SFT, "steps": 320}, 0.8406),  # step 160 of 320
    ], [e.note for e in ledger]
    assert all(e.verified and e.metric_name == "exact_accuracy" for e in ledger)
    base, first, more_steps = ledger
    assert base.description.startswith("baseline: the base model (Qwen/Qwen3-VL-2B-Instruct)")
    assert first.description.startswith("first SFT run: steps=160 lr=2e-05 train_size=2048 lora_rank=0")
    assert more_steps.description.startswith("steps 160 → 320: twice the steps")
    # Each SFT run is the launcher with the sweep's overrides, scored by the eval on its best checkpoint.
    assert more_steps.command[1:5] == ["-m", "goaltender.training.nemo_rl", "run", "vlm-sft"]
    assert "sft.max_num_steps=320" in more_steps.command
    assert "policy.dtensor_cfg.lora_cfg.enabled=false" in more_steps.command
    assert more_steps.metrics["run/best_checkpoint_step"] == 160
    assert more_steps.metrics["mean_reward"] == pytest.approx((1 + 2 * 0.8406) / 3, abs=1e-4)
    eval_log = (Path(more_steps.log_path).parent / "eval.log").read_text()
    assert "checkpoints/step_160 on the 64 held-out examples" in eval_log

    titles = [e.data.title for e in events if isinstance(e.data, MilestoneReported)]
    assert titles[0] == "Plan: star_count_sft sweep on exact_accuracy"
    assert "Data: star-count SFT 2048/256/64 in star_count_sft_2048/" in titles
    report = events[-1].data.text
    assert "step_160 of experiment #3" in report  # the best checkpoint, named from run/ metrics
    assert "exact_accuracy = 0.8406" in report


async def test_sft_without_an_eval_command_says_what_is_missing(start_runner, connect, monkeypatch):
    monkeypatch.setenv("GOALTENDER_NEMO_RL_COMMAND", TRAINER)
    monkeypatch.delenv(sft_sweep.EVAL_VAR, raising=False)
    runner = await start_runner(agents={"sweep": [*SWEEP, "--nemo-rl"]}, default_agent="sweep")
    client = await connect(runner)
    goal_id = await submit(client, "star count, max 2 experiments")
    events = await events_until_report(client, goal_id, timeout=60)
    [milestone] = [e.data for e in events if isinstance(e.data, MilestoneReported)]
    assert milestone.title == "The sweep agent is misconfigured"
    assert "the SFT sweep needs an eval command (--eval CMD or GOALTENDER_SFT_EVAL)" in milestone.text


async def test_nemo_rl_with_eval_is_scored_on_the_held_out_split(start_runner, connect, tmp_path):
    """What an LLM agent runs in the reference campaign: the baseline through `goaltender
    experiment` fixes the goal's metric, then `goaltender nemo-rl vlm-sft --eval` is scored by the
    runner on that metric (not on validation loss), its best checkpoint still named."""
    script = f"""
goaltender experiment -d "baseline: the base model" --metric exact_accuracy --eval "{EVAL}" -- \
    python -m goaltender.agents.sft_sweep base-model Qwen/Qwen3-VL-2B-Instruct > base.out 2>&1
goaltender nemo-rl vlm-sft --config {sft_sweep.OVERLAY} --trainer "{TRAINER}" --eval "{EVAL}" \
    -- sft.max_num_steps=40 > sft.out 2>&1
echo $? > sft.rc
"""
    agent = write_agent(tmp_path, "agent.sh", script)
    runner = await start_runner(agents={"script": agent}, default_agent="script")
    client = await connect(runner)
    goal_id = await submit(client, REFERENCE_GOAL.replace("budget 5h", "max 2 experiments"))
    events = await events_until_report(client, goal_id, timeout=120)
    workspace = runner.settings.workspaces / f"goal-{goal_id}"
    assert (workspace / "sft.rc").read_text().strip() == "0", (workspace / "sft.out").read_text()
    base, sft = (await client.request(p.Summary(goal_id=goal_id))).ledger
    assert (base.metric_name, base.metric_value, base.verified) == ("exact_accuracy", 0.25, True)
    assert (sft.status, sft.metric_name, sft.metric_value, sft.verified) == (
        "keep",
        "exact_accuracy",
        0.3841,
        True,
    )
    assert sft.metrics["run/best_checkpoint_step"] == 20 and "run/validation/val_loss" in sft.metrics
    assert sft.params["sft.max_num_steps"] == 40
    assert "exact_accuracy = 0.3841 (verified by the runner)" in (workspace / "sft.out").read_text()
    assert "**Best checkpoint:** step_20 of experiment #2" in events[-1].data.text


# ---- the parts ----


def test_the_reference_goal_asks_for_sft_and_the_cpu_goal_does_not():
    assert sft_sweep.asks_for_sft(REFERENCE_GOAL)
    assert sft_sweep.asks_for_sft("supervised fine-tuning of the VLM with NeMo RL")
    assert not sft_sweep.asks_for_sft("train the star-count model to 95% exact accuracy, budget 2h")
    assert not sft_sweep.asks_for_sft("fine-tune lr and iters of the star-count model")


def test_the_untrained_model_then_the_first_sft_then_one_knob_from_the_best_trained(task):
    planner = Planner(task)
    assert planner.propose([]).config == UNTRAINED
    ledger = [row(1, UNTRAINED, "keep", 0.5)]
    first = planner.propose(ledger)
    assert first.config == FIRST_SFT and first.description.startswith("first SFT run")
    # Training that scores below the untrained model (a discard) is still where the search goes on.
    ledger.append(row(2, FIRST_SFT, "discard", 0.3))
    assert planner.propose(ledger).config == {**FIRST_SFT, "steps": 320}
    ledger.append(row(3, {**FIRST_SFT, "steps": 320}, "discard", 0.2))
    assert planner.propose(ledger).config == {**FIRST_SFT, "lr": 5e-5}
    assert planner.best(ledger).index == 1  # the report's best is still the base model


def test_an_untrained_model_that_cannot_be_scored_ends_the_search(task):
    planner = Planner(task)
    assert planner.propose([row(1, UNTRAINED, "crash", None)]) is None
    planner.rejected.add(planner.key(UNTRAINED))  # a person declined it: go on to training
    assert planner.propose([]).config == FIRST_SFT


def test_steering_words_reach_the_sft_knobs(task):
    planner = Planner(task)
    assert planner.apply_steer("only tune the learning rate and rank") == ["searching only lr, lora_rank"]
    assert planner.apply_steer("set steps to 320") == ["pinned steps=320"]


def test_overrides_name_the_data_steps_lr_and_lora(tmp_path):
    lora = sft_sweep.overrides(tmp_path, {**FIRST_SFT, "train_size": 4096, "lora_rank": 16, "lr": 5e-5})
    assert lora == [
        "sft.max_num_steps=160",
        "policy.optimizer.kwargs.lr=5e-05",
        f"data.train.data_path={tmp_path}/star_count_sft_4096/train.jsonl",
        f"data.validation.data_path={tmp_path}/star_count_sft_4096/validation.jsonl",
        "policy.dtensor_cfg.lora_cfg.enabled=true",
        "policy.dtensor_cfg.lora_cfg.dim=16",
    ]
    full = sft_sweep.overrides(tmp_path, FIRST_SFT)
    assert full[-1] == "policy.dtensor_cfg.lora_cfg.enabled=false"


def test_the_workspace_config_names_the_checkouts_defaults(tmp_path):
    checkout = tmp_path / "nemo-rl"
    config = sft_sweep.workspace_config(tmp_path, str(checkout))
    text = config.read_text()
    assert f"\ndefaults: {checkout}/examples/configs/sft_vlm_3B.yaml\n" in text
    assert "max_total_sequence_length: 1024" in text and sft_sweep.sequence_limit() == 1024
    assert "defaults: sft_vlm_3B.yaml" in sft_sweep.workspace_config(tmp_path, None).read_text()


def test_a_checkout_that_is_not_one_is_refused_before_any_run(tmp_path):
    with pytest.raises(Misconfigured, match=r"NeMo RL cannot run: .* is not a NeMo RL checkout"):
        sft_sweep.star_count_sft_task(tmp_path, EVAL, str(tmp_path), {})


def test_the_eval_scores_the_base_model_or_the_best_checkpoint(tmp_path, capsys):
    assert sft_sweep.main(["base-model", "Qwen/Qwen3-VL-2B-Instruct", "--dir", str(tmp_path)]) == 0
    assert sft_sweep.model_to_score(tmp_path) == "Qwen/Qwen3-VL-2B-Instruct"
    run = tmp_path / "run"
    for step, loss in ((20, 0.5), (40, 0.3), (60, 0.4)):
        (run / "checkpoints" / f"step_{step}").mkdir(parents=True)
        info = {"step": step, "val:val_loss": loss}
        (run / "checkpoints" / f"step_{step}" / "training_info.json").write_text(json.dumps(info))
    (run / "checkpoints" / "tmp_step_80").mkdir()
    assert sft_sweep.model_to_score(run) == str(run / "checkpoints" / "step_40")
    capsys.readouterr()
    assert sft_sweep.main(["model-to-score", str(tmp_path / "empty")]) == 1
    assert "holds no base-model note and no ranked checkpoint" in capsys.readouterr().err
