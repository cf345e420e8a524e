"""What every agent is told about its goal: the brief (AGENTS.md, and the built-in agent's system
prompt, re-injected after compaction or a restart) and the skills it may load."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from goaltender.runner.protocol import SummaryReply
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


# What a training campaign (the reference: Qwen3-VL-2B SFT on star count) runs, in order.
TRAINING_LINES = [
    "## Training runs",
    "",
    "On a GPU box: `goaltender doctor` first (GPUs, disk, NeMo RL, Gym); models with `goaltender fetch`;",
    "data exported into the workspace, its token lengths checked with `goaltender preflight`; a baseline",
    "score of the untrained model; then each training run as",
    '`goaltender nemo-rl <recipe> --config … --eval "<held-out eval>" --eval-metric <metric> -- overrides`',
    "(never `uv run` yourself), so the runner scores its best checkpoint on the held-out split.",
    "The `nemo-rl` skill has the reference campaign step by step.",
]


def metric_lines(metric: str | None, direction: str) -> list[str]:
    """The goal's headline metric; before the first run, how it gets one."""
    if metric:
        return [f"Headline metric: `{metric}` ({direction}); pass the same `--metric` on every run."]
    return [
        "No headline metric yet: the first experiment's `--metric` fixes it for the goal, so pass it on",
        "the baseline. For star count it is `exact_accuracy` on the fixed 64-example held-out split,",
        "measured by the runner through `--eval` (not a training-time validation number).",
    ]


def stage_lines(goal: Goal) -> list[str]:
    """A staged goal: where it is, and how a stage ends (at a gate the humans approve)."""
    if not goal.stages:
        return []
    path = " → ".join(f"**{name}**" if i == goal.stage else name for i, name in enumerate(goal.stages))
    return [
        f"Stages: {path} (now: {goal.stage_name}, {goal.stage + 1}/{len(goal.stages)}).",
        'End a stage with `goaltender stage-done "<summary>" [--attach plan.md]`: the humans approve',
        "before the next one starts. Experiments start in the `campaign` stage. Before any campaign",
        'on a paper\'s method, `goaltender cross-check -d "..." --a "<cmd>" --b "<cmd>"` compares two',
        "independent implementations on a toy batch.",
        "",
    ]


def goal_brief(summary: SummaryReply, handoff: str | None = None) -> str:
    """The goal, its stop rule and budgets, how to report, the skills, and the latest handoff."""
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
        'Run every experiment through `goaltender experiment -d "<hypothesis>" --metric <name> -- <command>`;',
        "report milestones with `goaltender milestone`, ask before costly or risky steps with `goaltender ask`,",
        "read steering with `goaltender inbox` between steps, and keep the diary",
        '(`goaltender diary write --handoff "..."`). Put caches, checkpoints and logs on the big disk.',
        "Finish with `goaltender report`.",
        "",
        *metric_lines(goal.metric, goal.direction),
        "",
        *stage_lines(goal),
        *TRAINING_LINES,
        "",
        "## Skills",
        "",
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
