"""Staged goals and cross-checks: the gates a campaign passes before it may run experiments.

A goal's words may declare stages ("stages: plan, implement, campaign", or the `paper-to-code`
template). The agent ends each stage with `goaltender stage-done`, which asks the humans in the
thread (the stage's summary and document in the prompt); the next stage starts only when they
approve. Experiments wait for the stage named "campaign" when there is one.

`goaltender cross-check` runs two independent implementations on the same toy input and compares
every number both print (`name: value` lines) within a tolerance; a disagreement blocks the goal's
experiments until a person decides it.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field

from goaltender.storage.records import Goal

TEMPLATES = {"paper-to-code": ["read", "plan", "implement", "cross-check", "campaign"]}
CAMPAIGN = "campaign"
_NAME = r"[a-z][a-z0-9-]{0,39}"
# No possessive quantifiers (3.11.0-3.11.4 mis-match them, see protocol/budget.py): each unbounded
# `\s*` is followed by what no space is, and the names' repeats are bounded.
_STAGES = re.compile(rf"\bstages?\s*:\s*({_NAME}(?:\s*(?:,|->|→)\s*{_NAME}){{0,11}})", re.I)


_NOT_STAGES = {
    "max",
    "maximum",
    "budget",
    "within",
    "deadline",
    "target",
    "with",
    "via",
    "timeout",
    "up",
    "at",
}


def parse_stages(text: str) -> list[str]:
    """The stages a goal's words declare, in order (none: an unstaged goal)."""
    m = _STAGES.search(text)
    if m is None:
        return []
    names = [name.lower() for name in re.split(r"\s*(?:,|->|→)\s*", m.group(1).strip())]
    # "stages: plan, campaign, max 2 experiments": the list ends where the budget's words begin.
    names = list(itertools.takewhile(lambda name: name not in _NOT_STAGES, names))
    if len(names) == 1 and names[0] in TEMPLATES:
        return list(TEMPLATES[names[0]])
    return list(dict.fromkeys(names))  # each once, in order


def experiments_refused(goal: Goal) -> str | None:
    """Why the goal may not start an experiment now, if it may not."""
    if goal.blocked:
        return goal.blocked
    if CAMPAIGN in goal.stages and goal.stage < goal.stages.index(CAMPAIGN):
        return (
            f"goal #{goal.id} is in stage '{goal.stage_name}' ({goal.stage + 1}/{len(goal.stages)}); "
            f"experiments start in stage '{CAMPAIGN}', once the humans have approved the stages "
            "before it. Run checks and tests as plain commands meanwhile, and end the stage with "
            "`goaltender stage-done`."
        )
    return None


def gate_question(goal: Goal) -> str:
    stage, total = goal.stage + 1, len(goal.stages)
    following = goal.stages[goal.stage + 1]
    return f"Stage {stage}/{total} '{goal.stage_name}' is done. Start '{following}'?"


DOCUMENT_SHOWN = 15_000  # characters of a stage's document shown in the prompt


def gate_detail(summary: str, document: str | None, document_name: str | None) -> str:
    """The prompt's body: the agent's summary, then its document (the plan, say), cut to fit."""
    detail = summary.strip()
    if document:
        shown = document if len(document) <= DOCUMENT_SHOWN else document[:DOCUMENT_SHOWN] + "\n\n…"
        cut = "" if len(document) <= DOCUMENT_SHOWN else f" (the first {DOCUMENT_SHOWN:,} characters)"
        detail += f"\n\n---\n**{document_name or 'document'}**{cut}\n\n{shown}"
    return detail + "\n\nApprove to start the next stage; reject (with a comment) to send it back."


@dataclass
class Comparison:
    """Two implementations' numbers side by side."""

    rtol: float
    atol: float
    agreed: list[str] = field(default_factory=list)
    differing: list[tuple[str, float | None, float | None]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.agreed) and not self.differing

    def table(self) -> str:
        """The disagreements as a markdown table (the prompt's diff)."""
        rows = ["| number | A | B | difference |", "|---|---:|---:|---:|"]
        for name, a, b in self.differing[:40]:
            shown_a = "missing" if a is None else f"{a:.8g}"
            shown_b = "missing" if b is None else f"{b:.8g}"
            diff = "—" if a is None or b is None else f"{abs(a - b):.3g}"
            rows.append(f"| {name} | {shown_a} | {shown_b} | {diff} |")
        if len(self.differing) > 40:
            rows.append(f"| … {len(self.differing) - 40} more | | | |")
        return "\n".join(rows)


def compare(a: dict[str, float], b: dict[str, float], rtol: float = 1e-5, atol: float = 1e-8) -> Comparison:
    """Every number either side printed: equal within max(rtol × the larger, atol) (math.isclose),
    or a disagreement; a number only one side printed disagrees too."""
    found = Comparison(rtol, atol)
    for name in sorted(set(a) | set(b)):
        left, right = a.get(name), b.get(name)
        if left is not None and right is not None and math.isclose(left, right, rel_tol=rtol, abs_tol=atol):
            found.agreed.append(name)
        else:
            found.differing.append((name, left, right))
    return found
