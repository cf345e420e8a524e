"""What every agent is told about its goal: the brief (AGENTS.md, and the built-in agent's system
prompt, re-injected after compaction or a restart) and the skills it may load."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Literal

from goaltender.protocol.messages import SummaryReply
from goaltender.storage.records import Goal

SKILLS_DIR = Path(__file__).resolve().parent.parent / "skills"  # the skills goaltender ships


def skills_dir() -> Path:
    """Where the skills are: the box's skill folder ($GOALTENDER_HOME/skills, runner/skill_folder.py:
    the shipped skills with the edits people approved) when the runner has made it, else the
    shipped ones."""
    home = os.environ.get("GOALTENDER_HOME")
    box = Path(home) / "skills" if home else Path.home() / ".goaltender" / "skills"
    return box if (box / ".git").exists() else SKILLS_DIR


def list_skills() -> dict[str, str]:
    """Skill name -> its description, from each SKILL.md's front matter."""
    skills = {}
    for path in sorted(skills_dir().glob("*/SKILL.md")):
        front = path.read_text().split("---")[1] if path.read_text().startswith("---") else ""
        name = re.search(r"^name:\s*(.+)$", front, re.M)
        description = re.search(r"^description:\s*(.+)$", front, re.M)
        if name:
            skills[name.group(1).strip()] = description.group(1).strip().strip("\"'") if description else ""
    return skills


def load_skill(name: str) -> str:
    """A skill's SKILL.md (`autoresearch`), or one of its files (`autoresearch/references/x.md`);
    KeyError names the skills that exist."""
    skill, _, rest = name.partition("/")
    path = skills_dir() / skill / (rest or "SKILL.md")
    if not re.fullmatch(r"[a-z0-9-]+(/[A-Za-z0-9_.-]+)*", name) or ".." in name or not path.is_file():
        raise KeyError(f"no skill file {name!r}; skills: {', '.join(list_skills())}")
    return path.read_text()


# How the brief names the runner's verbs: Codex runs `goaltender <verb>` in its shell; the built-in
# agent has them as function tools (agents/runner_verbs.py).
Terms = Literal["verbs", "tools"]

_MODEL_WORDS = re.compile(
    r"\bSFT\b|\bGRPO\b|\bnemo[- ]?rl\b|fine-?tun|\btrain(?:ing)? (?:a |the )?(?:model|LLM|VLM)\b|"
    r"\bcheckpoint|\bGPUs?\b|hugging ?face|\bhub\b|\bfetch|\bdownload|\bQwen|\bLlama\b",
    re.I,
)


def needs_models(goal: Goal) -> bool:
    """Does the goal train a model with NeMo RL or fetch one from the hub (and so need those tools
    and lines)? Its words say so, or it asks for GPUs; a CPU goal on star count does not."""
    return bool(goal.gpus_per_experiment) or bool(_MODEL_WORDS.search(goal.text))


def training_lines(terms: Terms) -> list[str]:
    """What a training campaign (the reference: Qwen3-VL-2B SFT on star count) runs, in order."""
    fetch, train = (
        ("`goaltender fetch`", "`goaltender nemo-rl`") if terms == "verbs" else ("fetch_from_hub", "nemo_rl")
    )
    run = (
        '`goaltender nemo-rl <recipe> --config … --eval "<held-out eval>" --eval-metric <metric> -- overrides`'
        if terms == "verbs"
        else "nemo_rl with `eval_command` (the held-out eval) and `eval_metric`"
    )
    return [
        "## Training runs",
        "",
        f"On a GPU box: `goaltender doctor` first (GPUs, disk, NeMo RL, Gym); models with {fetch};",
        "data exported into the workspace, its token lengths checked with `goaltender preflight`; a baseline",
        f"score of the untrained model; then each training run through {train} as {run}",
        "(never `uv run` yourself), so the runner scores its best checkpoint on the held-out split.",
        "The `nemo-rl` skill has the reference campaign step by step.",
    ]


def metric_lines(metric: str | None, direction: str, terms: Terms = "verbs") -> list[str]:
    """The goal's headline metric; before the first run, how it gets one."""
    flag = "`--metric`" if terms == "verbs" else "`metric`"
    if metric:
        return [f"Headline metric: `{metric}` ({direction}); pass the same {flag} on every run."]
    return [
        f"No headline metric yet: the first experiment's {flag} fixes it for the goal, so pass it on",
        "the baseline. For star count it is `exact_accuracy` on the fixed 64-example held-out split,",
        "measured by the runner through the eval command (not a training-time validation number).",
    ]


def how_to_work(terms: Terms) -> list[str]:
    if terms == "tools":
        return [
            "Run every experiment with run_experiment: `command` is the run itself (e.g. `python -m …`),",
            "`description` its hypothesis, `metric` the headline it prints as a last `name: value` line,",
            "`eval_command` the held-out evaluation when there is one. Post milestones with milestone, ask",
            "before costly or risky steps with ask_approval, and after each experiment write a diary",
            "handoff (write_diary, handoff=true). Put caches, checkpoints and logs on the big disk. When done,",
            "call finish with your summary.",
        ]
    return [
        'Run every experiment through `goaltender experiment -d "<hypothesis>" --metric <name> -- <command>`;',
        "report milestones with `goaltender milestone`, ask before costly or risky steps with `goaltender ask`,",
        "read steering with `goaltender inbox` between steps, and keep the diary",
        '(`goaltender diary write --handoff "..."`). Put caches, checkpoints and logs on the big disk.',
        "Finish with `goaltender report`.",
    ]


_STAR_COUNT = re.compile(r"\bstar[- _]?counts?\b|\bcount(?:ing)? (?:the )?stars\b", re.I)


def environment_lines(goal: Goal, terms: Terms) -> list[str]:
    """The goal's environment, when it names one the box ships (star count, on CPU): the workload,
    its knobs, its eval command and its metric, so a written goal needs none of them spelt out."""
    if not _STAR_COUNT.search(goal.text) or needs_models(goal):
        return []
    from goaltender.environments.star_count import space  # the standard library only

    module = "goaltender.environments.star_count"
    knobs = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in space.BASELINE.items())
    values = "; ".join(f"{k} {', '.join(map(str, sorted(v)))}" for k, v in space.SEARCH_SPACE.items())
    evaluate = f"python -m {module}.evaluate"
    how = (
        f'`goaltender experiment -d "<hypothesis>" --metric exact_accuracy --eval "{evaluate}" -- <workload>`'
        if terms == "verbs"
        else f"run_experiment with `metric` exact_accuracy and `eval_command` `{evaluate}`"
    )
    return [
        "## This environment: star count (CPU)",
        "",
        f"- workload (the baseline config): `python -m {module}.workload {knobs}`",
        f"- knobs: {values}",
        f"- held-out eval: `{evaluate}` scores the run's model on the fixed 64-example split",
        "- metric: `exact_accuracy` (maximize)",
        f"- each run: {how}",
        "",
    ]


def stage_lines(goal: Goal) -> list[str]:
    """A staged goal: where it is, and how a stage ends (at a gate the humans approve)."""
    if not goal.stages:
        return []
    path = " → ".join(f"**{name}**" if i == goal.stage else name for i, name in enumerate(goal.stages))
    return [
        f"Stages: {path} (now: {goal.stage_name}, {goal.stage + 1}/{len(goal.stages)}).",
        'End a stage with `goaltender stage-done "<summary>" [--attach plan.md]` (in the shell): the humans',
        "approve before the next one starts. Experiments start in the `campaign` stage. Before any campaign",
        'on a paper\'s method, `goaltender cross-check -d "..." --a "<cmd>" --b "<cmd>"` compares two',
        "independent implementations on a toy batch.",
        "",
    ]


def goal_brief(summary: SummaryReply, handoff: str | None = None, terms: Terms = "verbs") -> str:
    """The goal, its stop rule and budgets, how to work (in the agent's terms: `goaltender` verbs or
    tools), its environment, the skills, and the latest handoff."""
    goal, budget = summary.status.goal, summary.status.goal.budget
    limits = [
        f"deadline {budget.deadline:%Y-%m-%d %H:%M:%S} UTC" if budget.deadline else "no deadline",
        f"at most {budget.max_experiments} experiments (attempted)"
        if budget.max_experiments
        else "no experiment cap",
        f"{budget.compute_hours:g} compute-hours" if budget.compute_hours is not None else "no compute cap",
        f"{budget.experiment_timeout_s:.0f}s per experiment"
        if budget.experiment_timeout_s
        else "no per-run timeout",
    ]
    if budget.ask_to_continue:
        limits.append("no stop rule was given: baseline plus three experiments, then the runner asks")
    if budget.max_tokens is not None:
        limits.append(f"at most {budget.max_tokens:,} model tokens for you, the agent")
    skills = "\n".join(f"- `{name}`: {text}" for name, text in list_skills().items())
    lines = [
        f"# Goal #{goal.id}",
        "",
        goal.text,
        "",
        "## Stop rule and budgets (enforced by the runner)",
        "",
        *[f"- {limit}" for limit in limits],
        *([f"- target: {goal.target:g} on the headline metric"] if goal.target is not None else []),
        f"- now: {summary.status.stop_status}",
        "",
        "## How to work",
        "",
        *how_to_work(terms),
        "",
        *metric_lines(goal.metric, goal.direction, terms),
        "",
        *environment_lines(goal, terms),
        *stage_lines(goal),
        *(training_lines(terms) if needs_models(goal) else []),
        "",
        "## Skills",
        "",
        *(
            ["Skills are written for the goaltender CLI; load_skill says which tool each verb is.", ""]
            if terms == "tools"
            else []
        ),
        skills or "(none installed)",
    ]
    if summary.ledger:
        best = summary.status.best
        lines += [
            "",
            "## Ledger so far",
            "",
            f"{len(summary.ledger)} experiments attempted"
            + (f"; best #{best.index} {best.metric_name} = {best.metric_value}" if best else "")
            + ".",
        ]
    if handoff:
        lines += ["", "## Latest handoff from the diary", "", handoff.strip()]
    return "\n".join(lines) + "\n"


def prepare_workspace(workspace: Path, brief: str) -> None:
    """Write AGENTS.md and put the skills where Codex looks for them (.agents/skills)."""
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "AGENTS.md").write_text(brief)
    target = workspace / ".agents" / "skills"
    if (source := skills_dir()).is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
